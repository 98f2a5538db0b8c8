import time, torch, statistics
from bertkit.packing import attention
from bertkit.model import alibi_bias
def run(threads, masktype, B=8, H=4, T=128, D=64, dtype=torch.float32, p=0.1):
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=g).to(dtype).transpose(1, 2).requires_grad_() for _ in range(3))
    grad = torch.randn(B, H, T, D, generator=g).to(dtype)
    if masktype == "alibi":
        mask = alibi_bias(torch.ones(H), T, q)[None].expand(B, H, T, T).contiguous()
    else:
        lens = torch.randint(60, 129, (B,), generator=g)
        mask = (torch.arange(T)[None, :] < lens[:, None])[:, None, None, :]
    res = {}
    for r in range(7):
        for kern in ("sdpa", "math"):
            t0 = time.perf_counter()
            for _ in range(3):
                attention(q, k, v, mask, p, kernel=kern).backward(grad)
            res.setdefault(kern, []).append(time.perf_counter() - t0)
    print(threads, masktype, B, dtype, "math speedup", round(min(res["sdpa"]) / min(res["math"]), 3), {k: round(min(v)/3*1e3, 2) for k, v in res.items()})
for th in (1, 2):
    for m in ("alibi", "bool"):
        for B in (8, 32):
            run(th, m, B)
