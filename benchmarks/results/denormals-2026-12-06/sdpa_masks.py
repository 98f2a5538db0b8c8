"""SDPA forward + backward, fp32, (32, 2 heads, 128, 64) as cpu-60m-avx2.yaml's model, with five masks, denormals
kept and flushed (torch.set_flush_denormal on the calling thread; the worker thread made before keeps them,
so the flushed figures are an upper bound): ms a call, 2 threads."""
import time

import torch
import torch.nn.functional as F

from bertkit.packing import alibi_bias

torch.set_num_threads(2)
B, H, T, D = 32, 2, 128, 64
q, k, v = (torch.randn(B, T, H, D).transpose(1, 2).requires_grad_() for _ in range(3))
g = torch.randn(B, H, T, D)
lens = torch.linspace(128, 64, B).round()
allowed = (torch.arange(T)[None, :] < lens[:, None])[:, None, None, :]
slopes = torch.tensor([1.0, 0.5])
masks = {"bool padding": allowed,
         "float 0 / -inf padding": torch.zeros(B, H, T, T).masked_fill(~allowed, float("-inf")),
         "ALiBi slopes 0.01, 0.005": alibi_bias(torch.tensor([0.01, 0.005]), T, q)[None].masked_fill(~allowed, float("-inf")),
         "ALiBi slopes 1, 0.5 (the model's)": alibi_bias(slopes, T, q)[None].masked_fill(~allowed, float("-inf")),
         "ALiBi 1, 0.5 broadcast, no padding": alibi_bias(slopes, T, q)[None].expand(B, H, T, T)}
for r in range(2):
    for name, m in masks.items():
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            F.scaled_dot_product_attention(q, k, v, attn_mask=m).backward(g)
            t0 = time.perf_counter()
            for _ in range(5):
                F.scaled_dot_product_attention(q, k, v, attn_mask=m).backward(g)
            if r:
                print(f"{name:36s} flushed={flush!s:5s} {(time.perf_counter() - t0) / 5 * 1e3:6.2f} ms", flush=True)
torch.set_flush_denormal(False)
