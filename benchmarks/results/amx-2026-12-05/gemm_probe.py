import torch, time
torch.set_num_threads(2)
a = torch.randn(2048, 2048, dtype=torch.bfloat16); b = torch.randn(2048, 2048, dtype=torch.bfloat16)
af, bf = a.float(), b.float()
for x, y, n in ((a, b, "bf16"), (af, bf, "fp32")):
    x @ y
    best = 1e9
    for _ in range(10):
        t0 = time.perf_counter(); x @ y; best = min(best, time.perf_counter() - t0)
    print(n, "%.0f GFLOP/s" % (2 * 2048**3 / best / 1e9), end="  ")
print()
