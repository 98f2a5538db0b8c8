"""In one process, alternating: the Predictor's ragged batch (32 texts of 8-128 tokens) with attention split at the
measured group overhead against the fixed 1,000 pairs. Usage: python groups_ab.py 15"""
import sys, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # benchmarks/
import numpy as np, torch
from bertkit.heap import Heap; Heap().keep_freed()
import infer_vs_hf as B
from bertkit.infer import Predictor
from bertkit.infer.prepack import FusedSelfAttention
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
pred = Predictor.from_dir(B.minilm_dir(), small_batches=False)
print(pred.describe()["attention"])
fused = [m for m in pred.model.modules() if isinstance(m, FusedSelfAttention)]
chosen = fused[0].group_overhead
spread = np.random.default_rng(0).permutation(np.linspace(8, 128, 32).round().astype(int)).tolist()
W = {"ragged 32": B.make_inputs(pred.tokenizer, spread), "ragged 8": B.make_inputs(pred.tokenizer, spread[:8])}
run = B.bertkit_runner(pred)
t = {(c, k): [] for c in ("fixed 1000", "chosen") for k in W}
with torch.inference_mode():
    for b in W.values(): run(b)
    for rep in range(int(sys.argv[1])):
        for k, b in W.items():
            for c in (("fixed 1000", "chosen") if rep % 2 else ("chosen", "fixed 1000")):
                for m in fused: m.group_overhead = 1000 if c == "fixed 1000" else chosen
                time.sleep(0.05); t0 = time.perf_counter(); run(b); t[(c, k)].append((time.perf_counter() - t0) * 1e3)
for k in W:
    a, b = t[("fixed 1000", k)], t[("chosen", k)]
    print("%-10s 1000: %.1f ms, chosen (%d): %.1f ms, 1000/chosen per round %.3f" % (k, statistics.median(a), chosen, statistics.median(b), statistics.median([x / y for x, y in zip(a, b)])))
