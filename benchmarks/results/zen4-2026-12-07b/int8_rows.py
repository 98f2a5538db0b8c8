"""onnxruntime's int8 engine graph on 2 threads: a batch padded as one call against its rows one call each
(each at its own length): 8 x 16, 8 x 128, 32 ragged 8-128 (padded to the longest), medians of rounds."""
import random, statistics, sys, time
import numpy as np, torch
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import graph, engines
from bertkit.infer.engines import encoder_of
from bertkit.infer.int8 import int8_weight_levels
enc = encoder_of(load_model(minilm_dir(), random_init=False).eval())
r = engines.OnnxRuntimeGraph(graph.encoder_graph(enc, True, fused=True, levels=int8_weight_levels(), down_int8=True), 2, "int8")
rng = np.random.default_rng(0)
def batch(lengths):
    T = max(lengths); ids = rng.integers(1000, 29000, (len(lengths), T)).astype(np.int64)
    mask = (np.arange(T)[None] < np.array(lengths)[:, None]).astype(np.int64)
    return ids * mask, mask, np.zeros_like(ids)
def rows(ids, mask, types):
    out = np.zeros((*ids.shape, 384), np.float32)
    for i, n in enumerate(mask.sum(1)):
        out[i, :n] = r.run(ids[i:i+1, :n], mask[i:i+1, :n], types[i:i+1, :n])[0]
    return out
cases = {}
for name, L in [("8x16", [16] * 8), ("2x16", [16, 12]), ("8x128", [128] * 8), ("32 ragged", sorted(rng.integers(8, 129, 32).tolist(), reverse=True))]:
    b = batch(L)
    cases[f"{name} one call"] = lambda b=b: r.run(*b)
    cases[f"{name} per row"] = lambda b=b: rows(*b)
times = {k: [] for k in cases}
for rd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 11):
    order = list(cases); random.Random(rd).shuffle(order)
    for k in order:
        cases[k](); time.sleep(0.05)
        n = 2 if ("128" in k or "ragged" in k) else 10
        t = time.perf_counter()
        for _ in range(n): cases[k]()
        times[k].append((time.perf_counter() - t) / n * 1e3)
for k, v in times.items():
    print(f"{k:22s} median {statistics.median(v):8.2f} ms  min {min(v):8.2f}")
