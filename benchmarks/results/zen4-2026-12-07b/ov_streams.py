"""32 x 128 and 32 ragged (8-128, padded as one) on OpenVINO: one request on 2 threads (LATENCY) against
2 streams of 1 thread (halves at once); bf16 graph and int8-weight graph (groups of 128). Also compile time, RSS."""
import random, statistics, sys, time, tempfile, resource, os
from pathlib import Path
import numpy as np, torch
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
from bertkit.checkpoint import load_model
from bertkit.infer import graph
from bertkit.infer.engines import encoder_of
import openvino as ov
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
enc = encoder_of(load_model(minilm_dir(), random_init=False).eval())
d = Path(tempfile.mkdtemp())
(d / "e.onnx").write_bytes(graph.encoder_graph(enc)); (d / "q.onnx").write_bytes(graph.encoder_graph(enc, True))
core = ov.Core()
comp = {}
for name, f, extra in [("bf16", "e", {}), ("int8", "q", {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "128"})]:
    for mode, cfg in [("one", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2}),
                      ("two", {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2, "INFERENCE_NUM_THREADS": 2})]:
        m0, t = rss(), time.perf_counter()
        cm = core.compile_model(core.read_model(str(d / f"{f}.onnx")), "CPU", {**cfg, **extra})
        reqs = [cm.create_infer_request() for _ in range(1 if mode == "one" else 2)]
        print(f"{name} {mode}: compile {time.perf_counter()-t:.2f} s, rss +{rss()-m0:.0f} MB")
        comp[name, mode] = reqs
rng = np.random.default_rng(0)
def feed(B, T, ragged=False):
    ids = rng.integers(1000, 29000, (B, T)); ids[:, 0] = 101
    n = np.sort(rng.integers(8, T + 1, B))[::-1] if ragged else np.full(B, T)
    mask = (np.arange(T)[None] < n[:, None]).astype(np.int64)
    return ids.astype(np.int64) * mask, mask, np.zeros((B, T), np.int64)
def mk(reqs, f):
    if len(reqs) == 1:
        return lambda: reqs[0].infer({0: f[0], 1: f[1], 2: f[2]}, share_inputs=True, share_outputs=True)
    h = f[0].shape[0] // 2
    parts = [{i: x[:h] for i, x in enumerate(f)}, {i: x[h:] for i, x in enumerate(f)}]
    def go():
        for r, p in zip(reqs, parts): r.start_async(p, share_inputs=True)
        for r in reqs: r.wait()
    return go
cases = {}
fixed, ragged = feed(32, 128), feed(32, 128, True)
for (name, mode), reqs in comp.items():
    cases[f"{name} fixed {mode}"] = mk(reqs, fixed)
    cases[f"{name} ragged {mode}"] = mk(reqs, ragged)
times = {k: [] for k in cases}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 9):
    order = list(cases); random.Random(r).shuffle(order)
    for k in order:
        cases[k]()
        t = time.perf_counter()
        for _ in range(3): cases[k]()
        times[k].append((time.perf_counter() - t) / 3 * 1e3)
for k, v in times.items():
    print(f"{k:20s} median {statistics.median(v):8.2f} ms  min {min(v):8.2f}")
