"""Attention alone, packed_attention with kernel sdpa vs chunked (one sequence at a time on views since
this change), 25 alternating rounds; `python attention_kernels.py [bf16]`."""
import torch, time, numpy as np, sys
from bertkit.packing import packing, packed_attention
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
heads, head_dim, length, batch = 12, 32, 128, 32
dtype = torch.bfloat16 if "bf16" in sys.argv else torch.float32
cases = {}
for name, lengths in (("fixed", torch.full((batch,), length)), ("ragged", torch.linspace(length, 8, batch).round().long()), ("1x16", torch.tensor([16]))):
    qkv = torch.randn(int(lengths.sum()), 3, heads, head_dim, generator=g).to(dtype)
    cases[name] = (*qkv.unbind(1), packing(torch.arange(int(lengths.max()))[None, :] < lengths[:, None]))
with torch.inference_mode():
    for name, (q, k, v, p) in cases.items():
        ts = {"sdpa": [], "chunked": []}
        reps = 50 if name == "1x16" else 3
        for r in range(25):
            for kern in ("sdpa", "chunked") if r % 2 else ("chunked", "sdpa"):
                t = time.perf_counter()
                for _ in range(reps): packed_attention(q, k, v, p, kernel=kern)
                ts[kern].append((time.perf_counter() - t) / reps)
        print(name, {k: "%.3f ms" % (1e3 * np.median(x)) for k, x in ts.items()}, "min", {k: "%.3f ms" % (1e3 * np.min(x)) for k, x in ts.items()},
              "ratio sdpa/chunked median %.3f" % np.median(np.array(ts["sdpa"]) / np.array(ts["chunked"])))
