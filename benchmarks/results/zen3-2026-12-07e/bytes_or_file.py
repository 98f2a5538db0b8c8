"""The short-batch engine's session loaded from the graph's bytes (as the Predictor does) or from a file
(as the benchmark's contenders are), interleaved, at 1 x 16 and 8 x 128. usage: python bytes_or_file.py ROUNDS"""
import sys, time, tempfile
from pathlib import Path
import numpy as np, onnxruntime as ort, torch
IM = torch.inference_mode(); IM.__enter__()
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import graph
from bertkit.infer.engines import encoder_of
g = graph.encoder_graph(encoder_of(load_model(minilm_dir()).eval()), False, fused=True)
f = Path(tempfile.mkdtemp()) / "g.onnx"; f.write_bytes(g)
def options():
    so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    return so
S = {"bytes": ort.InferenceSession(g, options(), providers=["CPUExecutionProvider"]),
     "file": ort.InferenceSession(str(f), options(), providers=["CPUExecutionProvider"])}
for L in (16, 128):
    ids = np.array([[101] + list(range(2000, 2000 + L - 2)) + [102]] * (1 if L == 16 else 8))
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    res = {k: ([], []) for k in S}; names = list(S)
    for r in range(int(sys.argv[1])):
        for k in (names if r % 2 == 0 else names[::-1]):
            s = S[k]; time.sleep(0.2); t = [time.perf_counter()]
            for _ in range(10 if L == 16 else 3):
                s.run(None, feed); t.append(time.perf_counter())
            res[k][0].append((t[-1] - t[0]) / (len(t) - 1) * 1e3); res[k][1].append((t[-1] - t[1]) / (len(t) - 2) * 1e3)
    a, b = np.array(res["bytes"][0]), np.array(res["file"][0])
    print(f"{ids.shape}: mean of calls, median over rounds: bytes {np.median(a):.3f} file {np.median(b):.3f} ms; "
          f"bytes/file per round median {np.median(a / b):.4f}, rounds where file faster {np.mean(b < a):.2f}; "
          f"in a row bytes {np.median(res['bytes'][1]):.3f} file {np.median(res['file'][1]):.3f}")
