import time, torch
torch.set_num_threads(2)
cut = round(0.1 * 65536); s = 65536 / (65536 - cut)
def keepmask(x):
    words = torch.randint(-2 ** 63, 2 ** 63 - 1, ((x.numel() + 3) // 4,), dtype=torch.int64)
    return words.view(torch.int16)[:x.numel()].view(x.shape) >= cut - 32768
variants = {
 "where": lambda x, k: torch.where(k, x * s, 0),
 "mul_mask": lambda x, k: x * (k.to(x.dtype) * s),
 "mul_mask_inplace": lambda x, k: x * k.to(x.dtype).mul_(s),
 "mul_bool": lambda x, k: torch.mul(x, k) * s,
 "masked_fill": lambda x, k: x.masked_fill(~k, 0) * s,
 "scale_then_mask": lambda x, k: (x * s) * k.to(x.dtype),
 "mask_then_scale": lambda x, k: (x * k.to(x.dtype)) * s,
}
for shape, dtype in (((32, 128, 256), torch.bfloat16), ((32, 4, 128, 128), torch.float32), ((32, 4, 128, 128), torch.bfloat16)):
    x0 = torch.randn(shape, dtype=dtype)
    k = keepmask(x0)
    g = torch.randn(shape, dtype=dtype)
    ref = None
    res = {}
    for rnd in range(3):
        for name, f in variants.items():
            x = x0.clone().requires_grad_()
            y = f(x, k); y.backward(g)
            if ref is None: ref = (y.detach(), x.grad)
            assert torch.equal(y.detach(), ref[0]) or name, name
            t0 = time.perf_counter()
            for _ in range(10):
                x.grad = None
                y = f(x, k); y.backward(g)
            res.setdefault(name, []).append((time.perf_counter() - t0) / 10 * 1e3)
    y_ok = {n: torch.equal(f(x0, k), ref[0]) for n, f in variants.items()}
    print(shape, dtype, {n: f"{min(v):.2f}ms" for n, v in res.items()}, "same as where:", y_ok)
t0 = time.perf_counter()
x = torch.randn(32,4,128,128)
for _ in range(10): keepmask(x)
print("mask draw 2M", (time.perf_counter()-t0)/10*1e3, "ms")
