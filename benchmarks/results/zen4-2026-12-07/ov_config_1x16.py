"""OpenVINO configurations for one 16-token request on bertkit's graph (all-MiniLM-L6-v2, bf16, 2 threads):
the Predictor's (LATENCY hint), CPU pinning on and off, denormals optimisation, the THROUGHPUT hint with
one stream. One timing: a 0.2 s pause, 10 calls (mean); medians over ROUNDS, order random each round.
usage (from the repository root): python benchmarks/results/zen4-2026-12-07/ov_config_1x16.py [ROUNDS]"""
import random, statistics, sys, time, tempfile
from pathlib import Path
import numpy as np, torch
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import engines, graph
from bertkit.infer.engines import encoder_of
import openvino as ov
g = graph.encoder_graph(encoder_of(load_model(minilm_dir(), random_init=False).eval()))
d = Path(tempfile.mkdtemp()); (d / "e.onnx").write_bytes(g)
core = ov.Core()
base = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2}
cfgs = {"base": base, "pin": {**base, "ENABLE_CPU_PINNING": True}, "nopin": {**base, "ENABLE_CPU_PINNING": False},
        "denorm": {**base, "CPU_DENORMALS_OPTIMIZATION": True}, "tput": {"PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_NUM_THREADS": 2, "NUM_STREAMS": 1}}
reqs = {}
for k, c in cfgs.items():
    try:
        cm = core.compile_model(core.read_model(str(d / "e.onnx")), "CPU", c)
        reqs[k] = cm.create_infer_request()
        print(k, cm.get_property("ENABLE_CPU_PINNING"), cm.get_property("NUM_STREAMS"), cm.get_property("INFERENCE_NUM_THREADS"))
    except Exception as e:
        print(k, "failed", e)
rng = np.random.default_rng(0)
T = 16
ids = rng.integers(1000, 29000, (1, T)); ids[:, 0], ids[:, -1] = 101, 102
feed = {0: ids.astype(np.int64), 1: np.ones((1, T), np.int64), 2: np.zeros((1, T), np.int64)}
times = {k: [] for k in reqs}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
    order = list(reqs); random.Random(r).shuffle(order)
    for k in order:
        time.sleep(0.2); t = time.perf_counter()
        for _ in range(10):
            reqs[k].infer(feed, share_inputs=True, share_outputs=True)
        times[k].append((time.perf_counter() - t) / 10 * 1e3)
for k, v in times.items():
    print(f"{k:8s} median {statistics.median(v):.2f} ms  min {min(v):.2f}")
