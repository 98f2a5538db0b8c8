"""In one process: the short-input OpenVINO engine as it was at 2d3ca30 (PyTorch embeddings -> graph of the
blocks) against the graph that takes token ids, both inside the same Predictor, 1 x 16 and 4 texts of 8-16 tokens.
Run from the repository root: python benchmarks/results/amx-2026-12-06/ids_graph_ab.py /tmp/graph_before.py"""
import importlib.util, io, sys, time, threading
sys.path.insert(0, "benchmarks")
import numpy as np, torch
import openvino as ov
from infer_vs_hf import minilm_dir
from bertkit.infer.predictor import Predictor
from bertkit.infer import engines
torch.set_num_threads(2)
# argv[1]: graph.py as it was before (git show 2d3ca30:src/bertkit/infer/graph.py > /tmp/graph_before.py)
spec = importlib.util.spec_from_file_location("bertkit.infer.graph_old", sys.argv[1])
old_graph = importlib.util.module_from_spec(spec); spec.loader.exec_module(old_graph)
pred = Predictor.from_dir(minilm_dir())
new = pred.small
fp32 = Predictor.from_dir(minilm_dir(), precision="fp32", small_batches=False, prepack=False).encoder

class OldRunner:
    def __init__(self, g, threads):
        core = ov.Core()
        self.compiled = core.compile_model(core.read_model(io.BytesIO(g)), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads})
        self.request = self.compiled.create_infer_request(); self.lock = threading.Lock(); self.precision = "bfloat16"
    def run(self, embeddings, mask):
        with self.lock:
            out = self.request.infer({0: embeddings, 1: mask}, share_inputs=True, share_outputs=True)
            return np.array(out[0])

class OldEngine(engines.GraphEngine):
    def hidden(self, tensors, p):
        x = self.bert.embeddings(tensors["input_ids"], tensors["token_type_ids"], tensors["position_ids"])
        dtype, x = x.dtype, x.detach().float()
        if p.batch_size == 1:
            return torch.from_numpy(self.runner.run(x[None].numpy(), np.ones((1, x.shape[0]), np.int64))[0]).to(dtype)
        buf = x.new_zeros(p.batch_size * p.max_seqlen, x.shape[-1]); buf[p.pad_indices] = x
        h = self.runner.run(buf.view(p.batch_size, p.max_seqlen, -1).numpy(), p.key_mask.long().numpy())
        return torch.from_numpy(h).flatten(0, 1)[p.pad_indices].to(dtype)

old = OldEngine(OldRunner(old_graph.encoder_graph(fp32), new.runner.threads), "openvino", new.bert, max_tokens=new.max_tokens, threads=new.threads)
work = {"1x16": [(list(range(1000, 1016)), [0] * 16)],
        "4x8-16": [(list(range(1000, 1000 + n)), [0] * n) for n in (16, 13, 10, 8)]}
eng = {"before (embeddings in PyTorch)": old, "after (ids into the graph)": new}
for k, rows in work.items():
    b0 = pred.batches(rows)[0]
    a = old.run(b0)["last_hidden_state"].float(); c = new.run(b0)["last_hidden_state"].float()
    print(k, "token cosine min between the two", float(torch.nn.functional.cosine_similarity(a, c, dim=-1).min()))
    res = {n: [] for n in eng}
    for r in range(11):
        for n in (list(eng)[r % 2:] + list(eng)[:r % 2]):
            e = eng[n]; pred.small = e
            f = lambda: pred.hidden(pred.batches(rows)[0])
            time.sleep(0.1)
            for _ in range(20): f()
            t0 = time.perf_counter()
            for _ in range(200): f()
            res[n].append((time.perf_counter() - t0) / 200 * 1e3)
    med = {n: float(np.median(v)) for n, v in res.items()}
    print(k, " | ".join(f"{n}: {m:.3f} ms" for n, m in med.items()), f"| after/before {med['after (ids into the graph)'] / med['before (embeddings in PyTorch)']:.3f}")
