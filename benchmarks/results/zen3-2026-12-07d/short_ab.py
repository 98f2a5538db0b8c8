"""1 x 16 on onnxruntime, interleaved: the Predictor's short-batch runner (graph.py's fused graph, spinning
stopped at the end of a run), the same graph in a session with onnxruntime's default spinning, the whole
Predictor call, and transformers' graph with onnxruntime's BERT fusions (the benchmark's "onnxruntime fused").
Each timing: a 0.3 s pause, then 10 calls; 'first' is the first call, 'row' the mean of the other 9."""
import json, logging, os, sys, tempfile, time
from pathlib import Path
import numpy as np, torch
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
import onnxruntime as ort
from infer_vs_hf import export_transformers_graph, minilm_dir
from bertkit.infer import Predictor, choose, graph
from bertkit.infer.engines import load_session, encoder_of
from bertkit.checkpoint import load_model
path = minilm_dir()
p = Predictor.from_dir(path)
print(p.small_reason[:160])
tmp = Path(tempfile.mkdtemp())
export_transformers_graph(path, tmp / "t.onnx")
from onnxruntime.transformers.optimizer import optimize_model
logging.getLogger("onnxruntime").setLevel(logging.ERROR)
optimize_model(str(tmp / "t.onnx"), model_type="bert", num_heads=12, hidden_size=384).save_model_to_file(str(tmp / "f.onnx"))
fused = load_session(tmp / "f.onnx", threads=2)
g = graph.encoder_graph(encoder_of(load_model(path).eval()), False, fused=True)
so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
spin = ort.InferenceSession(g, so, providers=["CPUExecutionProvider"])
so.optimized_model_filepath = str(tmp / "ours_opt.onnx"); ort.InferenceSession(g, so, providers=["CPUExecutionProvider"])
so2 = ort.SessionOptions(); so2.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so2.optimized_model_filepath = str(tmp / "fused_opt.onnx"); ort.InferenceSession(str(tmp / "f.onnx"), so2, providers=["CPUExecutionProvider"])
import onnx
from collections import Counter
for n in ("ours_opt.onnx", "fused_opt.onnx"):
    m = onnx.load(str(tmp / n)); print(n, len(m.graph.node), dict(Counter(x.op_type for x in m.graph.node)))
ids = np.array([[101] + list(range(2000, 2014)) + [102]]); mask = np.ones_like(ids); types = np.zeros_like(ids)
rows = [(list(ids[0]), [0] * 16)]
runner = p.small.runner
fns = {"engine runner": lambda: runner.run(ids, mask, types),
       "same graph, default spinning": lambda: spin.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}),
       "Predictor (batches + hidden)": lambda: [p.hidden(b, torch.float32) for b in p.batches(rows)],
       "onnxruntime fused (transformers' graph)": lambda: fused.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})}
for f in fns.values(): f(); f()
res = {k: ([], []) for k in fns}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
for r in range(rounds):
    for k, f in fns.items():
        time.sleep(0.3)
        t = [time.perf_counter()]
        for _ in range(10):
            f(); t.append(time.perf_counter())
        res[k][0].append((t[1] - t[0]) * 1e3); res[k][1].append((t[-1] - t[1]) / 9 * 1e3)
for k, (a, b) in res.items():
    print(f"{k:42} first {np.median(a):.2f} ms  in a row {np.median(b):.2f} ms")
