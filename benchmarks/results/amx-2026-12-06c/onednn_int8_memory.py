"""Process growth of torch's dynamic int8 matrix multiply with weights packed by oneDNN, by row count.
Part 1: one Linear(384, 1536), row counts 1..3000 (every count new). Part 2: all-MiniLM-L6-v2's 30 int8
Linear shapes (24 x 384->384, 6 x 384->1536), row counts rounded as `packing.gemm_rows` rounds them
(80 counts up to 2,048), two passes. The x86 engine (fbgemm) grew 1 MB on the first part's first 400 counts."""
import warnings

import torch
from torch.ao.quantization import quantize_dynamic
from torch.ao.quantization.qconfig import per_channel_dynamic_qconfig

from bertkit.packing import gemm_rows

warnings.simplefilter("ignore")
torch.set_num_threads(2)


def rss() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20


def packed(i: int, o: int):
    return quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(i, o)), {"0": per_channel_dynamic_qconfig})[0] \
        ._packed_params._packed_params


torch.backends.quantized.engine = "onednn"
one, r0 = packed(384, 1536), rss()
for m0 in range(1, 3001, 500):
    for m in range(m0, m0 + 500):
        torch.ops.quantized.linear_dynamic(torch.randn(m, 384), one, reduce_range=False)
    print(f"one Linear, row counts up to {m0 + 499}: RSS +{rss() - r0:.0f} MB", flush=True)
pps = [packed(384, 384) for _ in range(24)] + [packed(384, 1536) for _ in range(6)]
ms, x0, r0 = sorted({gemm_rows(m) for m in range(1, 2049)}), torch.randn(2048, 384), rss()
for rep in range(2):
    for m in ms:
        for pp in pps:
            torch.ops.quantized.linear_dynamic(x0[:m], pp, reduce_range=False)
    print(f"30 Linears, {len(ms)} rounded row counts, pass {rep}: RSS +{rss() - r0:.0f} MB", flush=True)
