"""onnxruntime on bertkit's graphs (fused fp32; int8 all-int8 as the Predictor's engine): one session on
2 threads against two sessions of one thread, the batch's rows cut between them, run in two threads."""
import random, statistics, sys, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np, torch
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import graph, engines
from bertkit.infer.engines import encoder_of
from bertkit.infer.int8 import int8_weight_levels
enc = encoder_of(load_model(minilm_dir(), random_init=False).eval())
graphs = {"fp32": graph.encoder_graph(enc, fused=True),
          "int8": graph.encoder_graph(enc, True, fused=True, levels=int8_weight_levels(), down_int8=True)}
pool = ThreadPoolExecutor(1)
rng = np.random.default_rng(0)
def feed(B, T):
    ids = rng.integers(1000, 29000, (B, T)); ids[:, 0] = 101
    return ids.astype(np.int64), np.ones((B, T), np.int64), np.zeros((B, T), np.int64)
cases = {}
for name, g in graphs.items():
    one = engines.OnnxRuntimeGraph(g, 2, "int8" if name == "int8" else "float32")
    two = [engines.OnnxRuntimeGraph(g, 1, "int8" if name == "int8" else "float32") for _ in range(2)]
    for B, T in [(32, 128), (8, 128)]:
        f = feed(B, T); h = B // 2
        cases[f"{name} {B}x{T} one"] = lambda one=one, f=f: one.run(*f)
        def split(two=two, f=f, h=h):
            fut = pool.submit(two[1].run, *(x[h:] for x in f))
            a = two[0].run(*(x[:h] for x in f))
            return np.concatenate([a, fut.result()])
        cases[f"{name} {B}x{T} two"] = split
        print(name, B, T, "max diff one vs split", float(np.abs(cases[f"{name} {B}x{T} one"]() - split()).max()))
times = {k: [] for k in cases}
for rd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 9):
    order = list(cases); random.Random(rd).shuffle(order)
    for k in order:
        cases[k](); time.sleep(0.1)
        n = 2 if "32x" in k else 6
        t = time.perf_counter()
        for _ in range(n): cases[k]()
        times[k].append((time.perf_counter() - t) / n * 1e3)
for k, v in times.items():
    print(f"{k:18s} median {statistics.median(v):8.2f} ms  min {min(v):8.2f}")
