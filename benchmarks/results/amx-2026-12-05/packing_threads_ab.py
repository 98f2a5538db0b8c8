"""In one process, alternating: Predictor.embed of 2-text requests with packing on the short engine's thread
(new) against packing on torch's two threads (old). Usage: python packing_threads_ab.py 12"""
import sys, time, random, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # benchmarks/
import torch
from bertkit.heap import Heap; Heap().keep_freed()
import serve_load, infer_vs_hf as B
from bertkit.infer import Predictor
from bertkit.infer.engines import make_batches
torch.set_num_threads(2)
pred = Predictor.from_dir(B.minilm_dir())
new_batches = pred.batches
old_batches = lambda rows, batch_size=32: make_batches(rows, batch_size, pred.device)
pool = serve_load.texts_pool(); rng = random.Random(0)
reqs = [rng.sample(pool, 2) for _ in range(50)]
one = B.make_inputs(pred.tokenizer, [16]); run1 = B.bertkit_runner(pred)
t = {(m, k): [] for m in ("old", "new") for k in ("embed 2 texts", "1x16 runner")}
with torch.inference_mode():
    for r in reqs: pred.embed(r)
    for rep in range(int(sys.argv[1])):
        for m in (("old", "new") if rep % 2 else ("new", "old")):
            pred.batches = old_batches if m == "old" else new_batches
            t0 = time.perf_counter()
            for r in reqs: pred.embed(r, normalize=True)
            t[(m, "embed 2 texts")].append((time.perf_counter() - t0) / len(reqs) * 1e3)
            t0 = time.perf_counter()
            for _ in range(50): run1(one)
            t[(m, "1x16 runner")].append((time.perf_counter() - t0) / 50 * 1e3)
for k in ("embed 2 texts", "1x16 runner"):
    o, n = t[("old", k)], t[("new", k)]
    print("%-14s old %.2f ms  new %.2f ms  old/new per round %.3f (min %.3f max %.3f)" % (k, statistics.median(o), statistics.median(n),
          statistics.median([a / b for a, b in zip(o, n)]), min(a / b for a, b in zip(o, n)), max(a / b for a, b in zip(o, n))))
