"""Does a two-stream OpenVINO model in the process slow the latency model's 1 x 16? Phase 1: only the
latency model A (a 32 x 128 batch on A, 0.3 s, then 10 calls of 1 x 16 on A). Phase 2: the streams model S
compiled too; rounds alternate 'the batch on S' and 'the batch on A' before the same 1 x 16 timing."""
import random, statistics, sys, time, tempfile
from pathlib import Path
import numpy as np, torch
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import graph, engines
from bertkit.infer.engines import encoder_of
g = graph.encoder_graph(encoder_of(load_model(minilm_dir(), random_init=False).eval()))
A = engines.load_runner("openvino", g, 2)
rng = np.random.default_rng(0)
def feed(B, T):
    ids = rng.integers(1000, 29000, (B, T)).astype(np.int64); ids[:, 0] = 101
    return ids, np.ones((B, T), np.int64), np.zeros((B, T), np.int64)
big, short = feed(32, 128), feed(1, 16)
def lat():
    time.sleep(0.3); t = time.perf_counter()
    for _ in range(10): A.run(*short)
    return (time.perf_counter() - t) / 10 * 1e3
R = int(sys.argv[1]) if len(sys.argv) > 1 else 15
res = {"phase 1: batch on A": [], "phase 2: batch on A": [], "phase 2: batch on S": []}
for _ in range(R):
    A.run(*big); res["phase 1: batch on A"].append(lat())
S = engines.load_runner("openvino", g, 2, streams=2)
for r in range(R):
    for k in random.Random(r).sample(["A", "S"], 2):
        (A if k == "A" else S).run(*big); res[f"phase 2: batch on {k}"].append(lat())
for k, v in res.items():
    print(f"{k:24s} 1 x 16 median {statistics.median(v):.3f} ms  min {min(v):.3f}")
