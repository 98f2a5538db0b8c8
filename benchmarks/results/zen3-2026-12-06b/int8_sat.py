import torch, warnings
from torch import nn
warnings.simplefilter("ignore")
torch.manual_seed(0)
def packed(w, levels):
    s = (w.abs().amax(1).clamp_min(1e-12) / levels).double()
    q = torch.quantize_per_channel(w, s, torch.zeros(len(s), dtype=torch.long), 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, None)
for K, N in ((384, 1536), (1536, 384)):
    lin = nn.Linear(K, N); x = torch.randn(512, K)
    if K == 1536: x = torch.nn.functional.gelu(x * 2)
    with torch.inference_mode():
        ref = lin(x); w = lin.weight.detach()
        r = x.abs().amax(-1, keepdim=True)
        for name, levels, rr in (("8-bit w, 8-bit x", 127, False), ("7-bit w, 8-bit x", 63, False), ("8-bit w, 7-bit x", 127, True), ("6-bit w", 31, False)):
            y = torch.ops.quantized.linear_dynamic(x / r, packed(w, levels), reduce_range=rr) * r + lin.bias
            e = (y - ref).norm(dim=1) / ref.norm(dim=1)
            print(K, N, name, "rel err max %.4f mean %.4f" % (float(e.max()), float(e.mean())))
