"""Dropout's random words drawn in two halves at once (numpy SFC64, the second half on a worker thread) against
the current draw, swapped in within one process on the BERT-mini bf16 step. Result (01:45 UTC): cur 435.0, par 445.0 ms
a step, par/cur 1.023."""
import runpy, sys
import numpy as np, torch
from concurrent.futures import ThreadPoolExecutor
sys.argv = ["x", "/tmp/old_packing.py"]
import subprocess
subprocess.run("git show 0c3aa66:src/bertkit/packing.py > /tmp/old_packing.py", shell=True)
g = runpy.run_path("benchmarks/results/zen4-2026-12-08/step_ab.py")
bm, bp, arms, step, batches = g["bm"], g["bp"], g["arms"], g["step"], g["batches"]
bm.BertForPreTraining.forward, cur = arms["new"]
pool = ThreadPoolExecutor(1)
def par(x, p, training=True):
    cut = round(p * 65536)
    if not training or not 0 < cut < 65536:
        return torch.nn.functional.dropout(x, p, training)
    seed = int(torch.randint(-2 ** 63, 2 ** 63 - 1, (), dtype=torch.int64)) & (2 ** 64 - 1)
    n = x.numel(); words = (n + 3) // 4
    keep = torch.empty(x.shape, dtype=x.dtype); flat = keep.view(-1)
    if words >= 1 << 16:
        s1, s2 = np.random.SeedSequence(seed).spawn(2)
        h = words // 2
        fut = pool.submit(np.random.SFC64(s2).random_raw, words - h)
        parts = [np.random.SFC64(s1).random_raw(h), fut.result()]
    else:
        parts = [np.random.SFC64(seed).random_raw(words)]
    a = 0
    for w in parts:
        d = torch.from_numpy(w.view(np.int16))[:n - a]
        torch.ge(d, cut - 32768, out=flat[a:a + len(d)]); a += len(d)
    scale = 65536 / (65536 - cut)
    if x.dtype in (torch.float32, torch.float64):
        return x * keep.mul_(scale)
    return x * keep * scale
variants = {"cur": cur, "par": par}
med = g["alternate"](variants, lambda d: setattr(bp, "dropout", d), 21)
print(f"par/cur {med['par'] / med['cur']:.3f}")
