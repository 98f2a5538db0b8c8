"""OpenVINO on bertkit's graph (all-MiniLM-L6-v2, 2 threads) in bf16 (its default here) and in f32, one
sequence of 16, 32, 64 and 128 tokens: which precision answers a short request faster. One timing: a
0.2 s pause, then 10 calls in a row (mean); medians over ROUNDS, order random each round.
usage (from the repository root): python benchmarks/results/zen4-2026-12-07/ov_precision_short.py [ROUNDS]"""
import random, statistics, sys, time
import numpy as np, torch
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import engines, graph
from bertkit.infer.engines import encoder_of

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
g = graph.encoder_graph(encoder_of(load_model(minilm_dir(), random_init=False).eval()))
runners = {"bf16": engines.load_runner("openvino", g, 2, None), "f32": engines.load_runner("openvino", g, 2, "float32")}
print({k: r.precision for k, r in runners.items()})
rng = np.random.default_rng(0)
feeds = {}
for T in (16, 32, 64, 128):
    ids = rng.integers(1000, 29000, (1, T)); ids[:, 0], ids[:, -1] = 101, 102
    feeds[T] = (ids.astype(np.int64), np.ones((1, T), np.int64), np.zeros((1, T), np.int64))
times = {(k, T): [] for k in runners for T in feeds}
for r in range(rounds):
    order = list(times); random.Random(r).shuffle(order)
    for k, T in order:
        time.sleep(0.2); t = time.perf_counter()
        for _ in range(10):
            runners[k].run(*feeds[T])
        times[(k, T)].append((time.perf_counter() - t) / 10 * 1e3)
for T in feeds:
    print(f"1 x {T:3d}: " + "  ".join(f"{k} {statistics.median(times[(k, T)]):.2f} ms" for k in runners))
