"""Is the default's short-batch engine the same computation as the benchmark's "onnxruntime fused"
contender? Both graphs after onnxruntime's optimisations, node by node (operator, domain, attributes,
initializer shapes), their outputs on one 16-token input, and 1 x 16 latency of four sessions with the
Predictor's session options (2 threads, spinning stopped at the end of a run), interleaved, order
alternating: graph.py's graph loaded from bytes (as the Predictor does) and from a file, and
transformers' graph with onnxruntime's BERT fusions from a file and from bytes. One timing: a 0.3 s
pause, then 10 calls; 'first' is the first call, 'row' the mean of the other 9; medians over rounds.
usage: python same_graph_1x16.py [ROUNDS]"""
import logging, sys, tempfile, time
from pathlib import Path
import numpy as np, onnx, onnxruntime as ort, torch
IM = torch.inference_mode(); IM.__enter__()
sys.path.insert(0, "benchmarks")
from infer_vs_hf import export_transformers_graph, minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import graph
from bertkit.infer.engines import encoder_of
from onnxruntime.transformers.optimizer import optimize_model

tmp = Path(tempfile.mkdtemp()); path = minilm_dir()
logging.getLogger("onnxruntime").setLevel(logging.ERROR)
export_transformers_graph(path, tmp / "t.onnx")
optimize_model(str(tmp / "t.onnx"), model_type="bert", num_heads=12, hidden_size=384).save_model_to_file(str(tmp / "fused.onnx"))
(tmp / "ours.onnx").write_bytes(graph.encoder_graph(encoder_of(load_model(path).eval()), False, fused=True))


def options(saved: Path | None = None):
    so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    so.log_severity_level = 3
    if saved:
        so.optimized_model_filepath = str(saved)
    return so


def signature(p: Path) -> list:
    m = onnx.load(str(p)); shapes = {i.name: tuple(i.dims) for i in m.graph.initializer}
    out = []
    for n in m.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute if a.name != "saturate"}
        out.append((n.op_type, n.domain, tuple(shapes.get(i) for i in n.input if i in shapes), sorted(attrs.items())))
    return out


sig = {}
for name in ("ours", "fused"):
    ort.InferenceSession(str(tmp / f"{name}.onnx"), options(tmp / f"{name}_opt.onnx"), providers=["CPUExecutionProvider"])
    sig[name] = signature(tmp / f"{name}_opt.onnx")
diff = [(a, b) for a, b in zip(sig["ours"], sig["fused"]) if a != b]
print(f"optimized graphs: {len(sig['ours'])} and {len(sig['fused'])} nodes; nodes that differ in operator, attributes "
      f"or weight shapes: {len(diff) + abs(len(sig['ours']) - len(sig['fused']))}")
for a, b in diff[:3]:
    print("  ours ", a, "\n  fused", b)
S = {"graph.py's, from bytes": ort.InferenceSession((tmp / "ours.onnx").read_bytes(), options(), providers=["CPUExecutionProvider"]),
     "graph.py's, from a file": ort.InferenceSession(str(tmp / "ours.onnx"), options(), providers=["CPUExecutionProvider"]),
     "fused, from a file": ort.InferenceSession(str(tmp / "fused.onnx"), options(), providers=["CPUExecutionProvider"]),
     "fused, from bytes": ort.InferenceSession((tmp / "fused.onnx").read_bytes(), options(), providers=["CPUExecutionProvider"])}
ids = np.array([[101] + list(range(2000, 2014)) + [102]]); feed = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                                                  "token_type_ids": np.zeros_like(ids)}
outs = [s.run(None, feed)[0] for s in S.values()]
print("largest difference between the four sessions' outputs:", max(float(abs(o - outs[0]).max()) for o in outs))
res = {k: ([], []) for k in S}; names = list(S)
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
    for k in (names if r % 2 == 0 else names[::-1]):
        s = S[k]; time.sleep(0.3); t = [time.perf_counter()]
        for _ in range(10):
            s.run(None, feed); t.append(time.perf_counter())
        res[k][0].append((t[1] - t[0]) * 1e3); res[k][1].append((t[-1] - t[1]) / 9 * 1e3)
for k, (a, b) in res.items():
    print(f"{k:26} first {np.median(a):.2f} ms  in a row {np.median(b):.3f} ms")
