"""Dynamic int8 for the CPU (`Predictor(int8=True)`): the encoder blocks' Linear layers as `Int8Linear`
(int8 weights per output channel, activations per token at run time; `quantize_int8`), the weights'
range where the CPU's int8 kernel would overflow 8 bits (`int8_weight_levels`). Apart from `choose`,
which decides at load whether it runs and checks it against fp32.
"""
from __future__ import annotations

import copy
import warnings

import torch
from torch import Tensor, nn

from .. import hardware
from ..model import Block, FeedForward, SelfAttention
from .prepack import FusedSelfAttention, PrepackedFeedForward, PrepackedLinear, model_gelu, prepack_linear, qkv_linear


def quantize_int8(model: nn.Module, down_dtype: torch.dtype = torch.float32, prepack: bool = True) -> nn.Module:
    """Dynamic int8 quantisation of the encoder blocks' nn.Linear layers (`Int8Linear`): weights
    int8 with one scale per output channel, activations with one scale per token at run time.
    The FFN's down projection, whose input (GELU outputs, heavy-tailed) loses most to 8 bits,
    stays in `down_dtype` (bf16 where bf16 GEMMs are fast, else fp32; prepacked). The embeddings,
    the pooler and the task head stay fp32. Q, K and V are one Int8Linear (`prepack.FusedSelfAttention`),
    the FFN a `prepack.PrepackedFeedForward` (GELU in place): the same numbers as an Int8Linear per
    projection, faster (docs/serve-measurements.md). Returns a copy.

    all-MiniLM-L6-v2's mean-pooled states against fp32, min cosine over the 23 sample texts (AVX2
    EPYC): one activation scale per batch 0.984 (torch's default, one weight scale and 7-bit
    activations: ~0.97); one per token 0.990; one per token with the down projection int8 too
    0.987 (docs/serve-measurements.md)."""
    model = copy.deepcopy(model)
    levels, gelu = int8_weight_levels(), model_gelu(model)
    for block in (m for m in model.modules() if isinstance(m, Block)):
        a, ff = block.attn, block.mlp
        if type(a) is SelfAttention:           # Q, K and V in one GEMM: the tokens' scales found once, not 3 times
            block.attn = FusedSelfAttention(a.num_heads, a.causal, Int8Linear(qkv_linear(a), levels),
                                            Int8Linear(a.out, levels), a.slopes, a.kernel)
        else:
            for name in ("query", "key", "value", "out"):
                setattr(a, name, Int8Linear(getattr(a, name), levels))
        up, down = Int8Linear(ff.up, levels), prepack_linear(ff.down.to(down_dtype), prepack=prepack)
        if type(ff) is FeedForward and gelu is not None and isinstance(down, PrepackedLinear):
            block.mlp = PrepackedFeedForward(up, down, ff.act, gelu)    # the GELU in place, rows padded once
        else:
            ff.up, ff.down = up, down
    return model


def int8_weight_levels() -> int:
    """The largest |int8 weight| `Int8Linear` uses here: 127 where the CPU has AVX512-VNNI (its int8
    dot products sum in int32); 63 on the others, where fbgemm's AVX2 kernel adds pairs of u8 x s8
    products in saturating int16 (255 x 127 x 2 > 32,767; 255 x 63 x 2 is not). On random weights
    the saturation left 0.19 relative error per row against 0.013 with 7-bit weights; on
    all-MiniLM-L6-v2 (Zen 3) the sample's min cosine to fp32 went 0.9900 -> 0.9911."""
    return 127 if "avx512_vnni" in hardware.cpu_flags() else 63


class Int8Linear(nn.Module):
    """x W^T + b on fbgemm's (or oneDNN's) dynamic int8 GEMM, W int8 with one scale per output
    channel (|W| up to `levels`: `int8_weight_levels`). The GEMM quantizes its whole input with one
    scale; each token's row is divided by its largest |value| first and multiplied back after, so
    every token gets its own scale (a token with large activations no longer coarsens every other
    token's)."""

    def __init__(self, linear: nn.Linear, levels: int = 127):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        scale = (w.abs().amax(1).clamp_min(1e-12) / levels).double()
        with warnings.catch_warnings():     # torch's quantized tensors are deprecated in favour of torchao
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(w, scale, torch.zeros(len(scale), dtype=torch.long), 0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(q, None)
        self.bias = linear.bias.detach().float().clone() if linear.bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        r = x.abs().amax(-1, keepdim=True).clamp_min_(1e-12)                 # (N, 1); vector_norm(inf): 15x slower
        y = torch.ops.quantized.linear_dynamic(x / r, self.packed, reduce_range=False)
        return y.mul_(r) if self.bias is None else torch.addcmul(self.bias, y, r, out=y)    # in place: no fresh pages

    def rows(self, x: Tensor, post: str = "none", algorithm: str = "") -> Tensor:
        """`PrepackedLinear.rows`' contract (`PrepackedFeedForward`): `post` "gelu" runs it in place after."""
        y = self(x)
        return torch._C._nn.gelu_(y, approximate=algorithm) if post == "gelu" else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel and token"
