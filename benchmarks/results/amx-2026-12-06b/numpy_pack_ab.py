"""In one process, one Predictor: the short-input path as it was at d4ba506 ("HEAD": rows packed with torch ops,
the graph's inputs padded with torch ops, states cast to bf16) against the one after (rows packed and padded in
numpy, float32 states for pooling), as benchmarks/infer_vs_hf.py's bertkit runner times them; OpenVINO on
transformers' graph beside. Run from the repository root, at the commit after d4ba506:
  git show d4ba506:src/bertkit/packing.py > /tmp/packing_old.py
  git show d4ba506:src/bertkit/infer/engines.py | sed -n '/    @staticmethod/,/    def describe/p' | head -n -1 > /tmp/padded_old_body.txt
  python benchmarks/results/amx-2026-12-06b/numpy_pack_ab.py"""
import sys, time, tempfile, types as _t
from pathlib import Path
sys.path.insert(0, "benchmarks")
import numpy as np, torch
torch.set_num_threads(2)
import openvino as ov
from infer_vs_hf import minilm_dir, export_transformers_graph
from bertkit.infer import Predictor, engines
import bertkit.packing as P
src = open("/tmp/packing_old.py").read().replace("from __future__ import annotations", "")
old_mod = _t.ModuleType("packing_old"); old_mod.__dict__["__name__"] = "packing_old"
exec(compile(src, "packing_old.py", "exec"), old_mod.__dict__)
ns = {"torch": torch, "np": np, "Tensor": torch.Tensor, "Packed": P.Packed}
body = open("/tmp/padded_old_body.txt").read()
import textwrap
exec(textwrap.dedent(body).replace("@staticmethod\n", ""), ns)
old_padded, new_padded = staticmethod(ns["_padded"]), engines.GraphEngine.__dict__["_padded"]
def old_pack(rows):
    t, p = old_mod.pack_rows(rows); return t, P.Packed(p.cu_seqlens, p.max_seqlen, p.indices, p.batch_size, p.padded_len, p.pad_indices, p.key_mask)
new_pack = engines.pack_rows
path = minilm_dir()
pred = Predictor.from_dir(path, device="cpu")
tmp = Path(tempfile.mkdtemp()); export_transformers_graph(path, tmp / "t.onnx")
comp = ov.Core().compile_model(ov.Core().read_model(str(tmp / "t.onnx")), "CPU", {"INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY"})
from bertkit.infer.engines import torch_threads, make_batches
def old_batches(rows, batch_size=32):
    with torch_threads(pred.small.threads):
        return make_batches(rows, batch_size, pred.device)
def variant(pack, padded, batches, dtype):
    def f(rows):
        engines.pack_rows = pack; engines.GraphEngine._padded = padded
        return [pred.hidden(b, dtype) for b in batches(rows)]
    return f
rng = np.random.default_rng(0)
work0 = {"1x16": [(list(range(1000, 1016)), [0] * 16)],
        "4x8-16": [(list(range(1000, 1000 + n)), [0] * n) for n in (16, 13, 10, 8)],
        "32 ragged": [(list(rng.integers(1000, 20000, n)), [0] * n) for n in rng.integers(8, 128, 32)]}
work = work0
vs = {"HEAD": variant(old_pack, old_padded, old_batches, None), "numpy": variant(new_pack, new_padded, pred.batches, torch.float32)}
for k, rows in work.items():
    a, b = [torch.cat(v(rows)).float() for v in vs.values()]
    assert torch.allclose(a, b, atol=0.05, rtol=0.02), (k, (a - b).abs().max())
    npb = {"input_ids": np.zeros((len(rows), max(len(r[0]) for r in rows)), np.int64)}
    npb["attention_mask"] = np.zeros_like(npb["input_ids"]); npb["token_type_ids"] = np.zeros_like(npb["input_ids"])
    for i, r in enumerate(rows):
        npb["input_ids"][i, :len(r[0])] = r[0]; npb["attention_mask"][i, :len(r[0])] = 1
    c = dict(vs); c["OpenVINO (transformers graph)"] = lambda rows, npb=npb: comp(npb)[0]
    n = 200 if k != "32 ragged" else 10
    res = {x: [] for x in c}
    with torch.inference_mode():
        for r in range(15):
            ks = list(c); ks = ks[r % len(ks):] + ks[:r % len(ks)]
            for x in ks:
                time.sleep(0.1)
                for _ in range(max(2, n // 10)): c[x](rows)
                t0 = time.perf_counter()
                for _ in range(n): c[x](rows)
                res[x].append((time.perf_counter() - t0) / n * 1e3)
    med = {x: float(np.median(v)) for x, v in res.items()}
    print(k, " | ".join(f"{x}: {m:.3f} ms" for x, m in med.items()),
          f"| numpy/HEAD {med['numpy'] / med['HEAD']:.3f} | numpy/OpenVINO {med['numpy'] / med['OpenVINO (transformers graph)']:.3f}", flush=True)
