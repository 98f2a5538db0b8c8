"""fbgemm dynamic int8 Linear (bertkit's Int8Linear) against oneDNN's qlinear_pointwise on fixed-scale u8/s8 rows and
fp32 prepacked, at the encoder's GEMM shapes (8-bit weights: both int8 paths saturate on AVX2; see int8_sat.py)."""
import time, torch, numpy as np, warnings
from torch import nn
from bertkit.infer.choose import Int8Linear
from bertkit.infer.prepack import PrepackedLinear
warnings.simplefilter("ignore")
torch.set_num_threads(2)
torch.manual_seed(0)
def bench(fs, reps=5, rounds=9):
    ts = {n: [] for n in fs}
    for r in range(rounds):
        for n, f in fs.items():
            t = time.perf_counter()
            for _ in range(reps): f()
            ts[n].append((time.perf_counter() - t) / reps)
    return {n: "%.2f ms" % (1e3 * np.median(v)) for n, v in ts.items()}
for M, K, N in ((4096, 384, 1536), (4096, 1536, 384), (2176, 384, 1152)):
    lin = nn.Linear(K, N); x = torch.randn(M, K)
    if K == 1536: x = torch.nn.functional.gelu(x * 2)
    q8 = Int8Linear(lin); pk = PrepackedLinear(lin)
    w = lin.weight.detach(); ws = (w.abs().amax(1) / 127)
    qw = torch.round(w / ws[:, None]).clamp(-127, 127).to(torch.int8)
    pw = torch.ops.onednn.qlinear_prepack(qw, [M, K])
    wz = torch.zeros(N, dtype=torch.int64)
    b = lin.bias.detach()
    def onednn_u8():
        r = x.abs().amax(-1, keepdim=True).clamp_min_(1e-12)
        qx = torch.quantize_per_tensor(x / r, 1 / 127, 128, torch.quint8).int_repr()
        y = torch.ops.onednn.qlinear_pointwise(qx, 1 / 127, 128, pw, ws, wz, None, 1.0, 0, torch.float32, "none", [], "")
        return torch.addcmul(b, y, r, out=y)
    def onednn_s8():
        r = x.abs().amax(-1, keepdim=True).clamp_min_(1e-12)
        qx = torch.quantize_per_tensor(x / r, 1 / 127, 0, torch.qint8).int_repr()
        y = torch.ops.onednn.qlinear_pointwise(qx, 1 / 127, 0, pw, ws, wz, None, 1.0, 0, torch.float32, "none", [], "")
        return torch.addcmul(b, y, r, out=y)
    with torch.inference_mode():
        ref = lin(x)
        outs = {"fbgemm": q8(x), "fp32": pk(x)}
        for n, f in (("onednn_u8", onednn_u8), ("onednn_s8", onednn_s8)):
            try: outs[n] = f()
            except Exception as e: print(n, "failed", str(e)[:200])
        for n, y in outs.items():
            print(M, K, N, n, "rel err %.4f" % float(((y - ref).norm(dim=1) / ref.norm(dim=1)).max()))
        fs = {"fbgemm": lambda: q8(x), "fp32": lambda: pk(x)}
        fs.update({n: f for n, f in (("onednn_u8", onednn_u8), ("onednn_s8", onednn_s8)) if n in outs})
        print(M, K, N, bench(fs))
