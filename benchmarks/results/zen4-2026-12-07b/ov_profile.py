import sys, tempfile, collections
from pathlib import Path
import numpy as np, torch
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import graph
from bertkit.infer.engines import encoder_of
import openvino as ov
g = graph.encoder_graph(encoder_of(load_model(minilm_dir(), random_init=False).eval()))
d = Path(tempfile.mkdtemp()); (d / "e.onnx").write_bytes(g)
core = ov.Core()
B, T = [int(x) for x in sys.argv[1:3]]
cm = core.compile_model(core.read_model(str(d / "e.onnx")), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2, "PERF_COUNT": True})
r = cm.create_infer_request()
rng = np.random.default_rng(0)
ids = rng.integers(1000, 29000, (B, T)).astype(np.int64)
f = {0: ids, 1: np.ones((B, T), np.int64), 2: np.zeros((B, T), np.int64)}
for _ in range(3): r.infer(f)
tot = collections.Counter(); cnt = collections.Counter()
N = 5
for _ in range(N):
    r.infer(f)
    for p in r.profiling_info:
        if p.status == p.Status.EXECUTED:
            k = (p.node_type, p.exec_type)
            tot[k] += p.real_time.total_seconds() * 1e3 / N; cnt[k] += 1 / N
s = sum(tot.values())
print(f"total {s:.2f} ms")
for k, v in tot.most_common(25):
    print(f"{v:8.3f} ms {v/s*100:5.1f}%  x{cnt[k]:.0f}  {k}")
