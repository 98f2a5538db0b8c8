import torch, random, sys
from bertkit.packing import gemm_rows   # run from the repository root with bertkit installed
torch.set_num_threads(2)
w = torch.randn(8000, 256, requires_grad=True)
d = torch.nn.Linear(256, 256)
rng = random.Random(0)
fixed = len(sys.argv) > 1 and sys.argv[1] == "fixed"
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20
for i in range(601):
    m = 4096 if fixed else rng.randint(3000, 4096)
    if len(sys.argv) > 1 and sys.argv[1] == "round": m = gemm_rows(m)
    x = torch.randn(m, 256, requires_grad=True)
    with torch.autocast("cpu", torch.bfloat16):
        y = torch.nn.functional.linear(d(x), w)
    y.float().sum().backward()
    if i % 100 == 0: print(i, rss(), "MB", flush=True)
