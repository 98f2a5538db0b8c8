"""OpenVINO on bertkit's graph, 1 x 16: the dynamic-shape model against one reshaped to static [1, 16]."""
import random, statistics, sys, time, tempfile
from pathlib import Path
import numpy as np, torch
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import graph
from bertkit.infer.engines import encoder_of
import openvino as ov
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
g = graph.encoder_graph(encoder_of(load_model(minilm_dir(), random_init=False).eval()))
d = Path(tempfile.mkdtemp()); (d / "e.onnx").write_bytes(g)
core = ov.Core()
cfg = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2}
m0 = rss()
dyn = core.compile_model(core.read_model(str(d / "e.onnx")), "CPU", cfg).create_infer_request()
m1 = rss()
sm = core.read_model(str(d / "e.onnx")); sm.reshape({i.get_any_name(): ov.PartialShape([1, 16]) for i in sm.inputs})
sta = core.compile_model(sm, "CPU", cfg).create_infer_request()
m2 = rss()
sm2 = core.read_model(str(d / "e.onnx")); sm2.reshape({i.get_any_name(): ov.PartialShape([1, ov.Dimension(1, 16)]) for i in sm2.inputs})
bnd = core.compile_model(sm2, "CPU", cfg).create_infer_request()
print(f"rss dynamic +{m1-m0:.0f} MB, static +{m2-m1:.0f} MB")
rng = np.random.default_rng(0)
ids = rng.integers(1000, 29000, (1, 16)).astype(np.int64); ids[0, 0], ids[0, -1] = 101, 102
f = {0: ids, 1: np.ones((1, 16), np.int64), 2: np.zeros((1, 16), np.int64)}
a = dyn.infer(f)[0]; b = sta.infer(f)[0]; c = bnd.infer(f)[0]
print("max diff static", float(np.abs(a - b).max()), "bounded", float(np.abs(a - c).max()))
cases = {"dynamic": lambda: dyn.infer(f, share_inputs=True, share_outputs=True),
         "static 1x16": lambda: sta.infer(f, share_inputs=True, share_outputs=True),
         "bounded 1x(1..16)": lambda: bnd.infer(f, share_inputs=True, share_outputs=True)}
times = {k: [] for k in cases}
for rd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30):
    order = list(cases); random.Random(rd).shuffle(order)
    for k in order:
        time.sleep(0.1); t = time.perf_counter()
        for _ in range(10): cases[k]()
        times[k].append((time.perf_counter() - t) / 10 * 1e3)
for k, v in times.items():
    print(f"{k:20s} median {statistics.median(v):.3f} ms  min {min(v):.3f}")
