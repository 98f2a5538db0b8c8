"""packing.dropout alone on BERT-mini's two dropout shapes (hidden states 32 x 128 x 256 in bf16, attention
probabilities 32 x 4 x 128 x 128 in fp32), p = 0.1, 2 threads, forward only, mean of 20 calls, 3 rounds:
F.dropout, the draw before (torch.randint, 16 bits an element, code at d2c042c) and now (numpy PCG64).

    PYTHONPATH=src python benchmarks/results/mlm-loss-2026-12-06/dropout_micro.py
"""
import time

import torch
import torch.nn.functional as F

from bertkit.packing import dropout


def before(x, p):
    cut = round(p * 65536)
    words = torch.randint(-2 ** 63, 2 ** 63 - 1, ((x.numel() + 3) // 4,), dtype=torch.int64)
    keep = words.view(torch.int16)[:x.numel()].view(x.shape) >= cut - 32768
    return x * keep.to(x.dtype) * (65536 / (65536 - cut))


if __name__ == "__main__":
    torch.set_num_threads(2)
    for shape, dt in (((32, 128, 256), torch.bfloat16), ((32, 4, 128, 128), torch.float32)):
        x = torch.randn(shape).to(dt)
        ms = {"F.dropout": [], "before (torch.randint)": [], "now (PCG64)": []}
        for r in range(3):
            for name, f in zip(ms, (F.dropout, before, dropout)):
                f(x, 0.1)
                t = time.perf_counter()
                for _ in range(20):
                    f(x, 0.1)
                ms[name].append((time.perf_counter() - t) / 20 * 1e3)
        print(tuple(shape), dt, "; ".join(f"{k} " + "/".join(f"{v:.2f}" for v in vs) + " ms" for k, vs in ms.items()))
