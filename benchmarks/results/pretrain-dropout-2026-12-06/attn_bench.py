import time, torch, torch.nn.functional as F
torch.set_num_threads(2)
from bertkit.packing import dropout
def old(q, k, v, mask, p):
    scores = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(-1)
    probs = dropout(probs, p)
    return probs.to(v.dtype) @ v
def new(q, k, v, mask, p):
    scores = (q @ k.transpose(-1, -2)).float().mul_(q.shape[-1] ** -0.5)
    bias = torch.zeros(mask.shape, dtype=scores.dtype).masked_fill_(~mask, float("-inf"))
    probs = scores.add_(bias).softmax(-1)
    probs = dropout(probs, p)
    return probs.to(v.dtype) @ v
def new2(q, k, v, mask, p):
    scores = (q @ k.transpose(-1, -2)).float().mul_(q.shape[-1] ** -0.5)
    probs = scores.masked_fill_(~mask, float("-inf")).softmax(-1)
    probs = dropout(probs, p)
    return probs.to(v.dtype) @ v
B, H, T, D = 32, 4, 128, 64
g = torch.Generator().manual_seed(0)
q0, k0, v0 = (torch.randn(B, H, T, D, generator=g).to(torch.bfloat16) for _ in range(3))
lens = torch.randint(60, 129, (B,), generator=g)
mask = (torch.arange(T)[None, :] < lens[:, None])[:, None, None, :]
go = torch.randn(B, H, T, D, generator=g).to(torch.bfloat16)
res, outs = {}, {}
for rnd in range(4):
    for name, f in (("old", old), ("new_add", new), ("new_inplace_fill", new2)):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        torch.manual_seed(5); y = f(q, k, v, mask, 0.1); y.backward(go)
        outs[name] = (y.detach(), q.grad, k.grad, v.grad)
        t0 = time.perf_counter()
        for _ in range(10):
            q.grad = k.grad = v.grad = None
            y = f(q, k, v, mask, 0.1); y.backward(go)
        res.setdefault(name, []).append((time.perf_counter() - t0) / 10 * 1e3)
print({n: f"{min(v):.2f}ms" for n, v in res.items()})
for n in outs: print(n, all(torch.equal(a, b) for a, b in zip(outs[n], outs["old"])))
