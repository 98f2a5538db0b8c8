"""fbgemm (Int8Linear, 7-bit weights) against oneDNN's static qlinear on fixed-scale rows, 384 -> 1152, by row count."""
import time, torch, numpy as np, warnings
from torch import nn
from bertkit.infer.choose import Int8Linear
warnings.simplefilter("ignore")
torch.set_num_threads(2)
torch.manual_seed(0)
lin = nn.Linear(384, 1152)
q8 = Int8Linear(lin, 63)
w = q8.packed.unpack()[0]
ws = w.q_per_channel_scales().float(); pw = torch.ops.onednn.qlinear_prepack(w.int_repr(), None); wz = torch.zeros(len(ws), dtype=torch.int64)
def one(x):
    r = x.abs().amax(-1, keepdim=True).clamp_min_(1e-12)
    qx = torch.quantize_per_tensor(x / r, 1 / 127, 128, torch.quint8).int_repr()
    y = torch.ops.onednn.qlinear_pointwise(qx, 1 / 127, 128, pw, ws, wz, None, 1.0, 0, torch.float32, "none", [], "")
    return torch.addcmul(q8.bias, y, r, out=y)
with torch.inference_mode():
    for M in (16, 64, 128, 256, 512, 1024, 2048):
        x = torch.randn(M, 384)
        fs = {"fbgemm": lambda: q8(x), "onednn": lambda: one(x)}
        for f in fs.values(): f()
        ts = {n: [] for n in fs}
        reps = max(2, 4000 // M)
        for r in range(9):
            for n, f in fs.items():
                t = time.perf_counter()
                for _ in range(reps): f()
                ts[n].append((time.perf_counter() - t) / reps)
        print(M, {n: "%.3f ms" % (1e3 * np.median(v)) for n, v in ts.items()}, "onednn speed-up %.2f" % (np.median(ts["fbgemm"]) / np.median(ts["onednn"])))
