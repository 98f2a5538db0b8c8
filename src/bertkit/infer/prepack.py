"""CPU inference: the encoder's Linear layers prepacked for oneDNN (`prepack_linears`, used by `Predictor`).

The encoder's Linear weights are reordered once into oneDNN's blocked layout, as inductor does
when it freezes a model. The model code is unchanged; the same numbers come out (checked when the
weights are packed). Also here: oneDNN's kernels built ahead for the few GEMM row counts of
`packing.gemm_rows` (`warm_gemm_shapes`) and `CastLinear` (a Linear in another precision than its
activations). `PredictorOptions.prepack=False` keeps the plain layers.
"""
from __future__ import annotations

import logging
from contextlib import suppress

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import first_line
from ..model import GELU_APPROXIMATE, Block, SelfAttention, attention_bias
from ..packing import GROUP_OVERHEAD_PAIRS, Packed, attention, gemm_rows, on_gemm_rows, packed_attention

log = logging.getLogger("bertkit")
FUSED_GELU_ROWS = 32     # the FFN's GELU inside its first GEMM up to this many rows (PrepackedFeedForward)


class PrepackedLinear(nn.Module):
    """x W^T + b with W reordered once into oneDNN's blocked layout; inference only, CPU, fp32 or
    bf16 (input, weight and output of the Linear's dtype). The packed weight is opaque: keep the
    original module if you need to train or save."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = linear.bias.detach().clone() if linear.bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        # rows padded to few sizes (`packing.on_gemm_rows`): a server seeing every packed length
        # 1..2048 grew by GBs of oneDNN kernels (~0.7 MB each), fp32 weights included (they are oneDNN's)
        return on_gemm_rows(x, self.rows, always=True)

    def rows(self, x: Tensor, post: str = "none", algorithm: str = "") -> Tensor:
        """The GEMM on x as it is (no rounding of its row count); `post` a pointwise op oneDNN runs
        on the result before writing it ("gelu", `algorithm` "none" = erf or "tanh")."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, post, [], algorithm)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class PrepackedFeedForward(nn.Module):
    """`model.FeedForward` on two PrepackedLinear: the rows padded to `gemm_rows` once for both
    GEMMs, not once each (the 4C-wide intermediate, padded again, cost more than the GEMM on a VM
    where fresh memory faults in page by page).

    A GELU (`gelu`: its `approximate`) runs inside the first GEMM (oneDNN's post-op) on at most
    FUSED_GELU_ROWS rows, and above that in place on the GEMM's output: on large inputs the post-op
    slowed the GEMM more than the separate GELU costs, on 16 rows less (docs/serve-measurements.md)."""

    def __init__(self, up: PrepackedLinear, down: PrepackedLinear, act, gelu: str | None = None):
        super().__init__()
        self.up, self.down, self.act, self.gelu = up, down, act, gelu

    def forward(self, x: Tensor) -> Tensor:
        return on_gemm_rows(x, self.rows, always=True)

    def rows(self, x: Tensor) -> Tensor:
        if self.gelu is None:
            h = self.act(self.up.rows(x))
        elif x.shape[0] <= FUSED_GELU_ROWS:
            h = self.up.rows(x, "gelu", self.gelu)
        else:                    # torch's binding: `torch.ops.aten.gelu_` costs 8 us more a call
            h = torch._C._nn.gelu_(self.up.rows(x), approximate=self.gelu)
        return self.down.rows(h)


def warm_gemm_shapes(model: nn.Module, max_rows: int) -> int:
    """Run each distinct PrepackedLinear of `model` once at every `gemm_rows` size up to max_rows,
    so oneDNN builds its kernels now (a server: before traffic, memory flat from the first
    request, no first-time kernel build in a request's latency), and the FFN's first GEMM with
    its GELU at the sizes that fuse it. Returns the GEMMs run."""
    distinct = {}
    for m in model.modules():
        if isinstance(m, PrepackedLinear):
            distinct.setdefault((m.in_features, m.out_features, m.packed.dtype, "none", ""), m)
        if isinstance(m, PrepackedFeedForward) and m.gelu is not None and isinstance(m.up, PrepackedLinear):
            distinct.setdefault((m.up.in_features, m.up.out_features, m.up.packed.dtype, "gelu", m.gelu), m.up)
    sizes = sorted({gemm_rows(n) for n in range(1, max_rows + 1)})
    runs = [(key, rows) for key in distinct for rows in sizes if key[3] == "none" or rows <= FUSED_GELU_ROWS]
    with torch.inference_mode():
        for key, rows in runs:
            lin = distinct[key]
            lin.rows(torch.zeros(rows, lin.in_features, dtype=lin.packed.dtype), *key[3:])
    return len(runs)


def can_prepack(model: nn.Module) -> bool:
    """Whether `prepack_linears` applies: x86 oneDNN build, fp32 (or bf16, where oneDNN has bf16
    kernels) weights on the CPU."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    params = list(model.parameters())
    dtypes = {t.dtype for t in params}
    if dtypes == {torch.bfloat16}:
        try:
            if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
                return False
        except (RuntimeError, AttributeError):
            return False
    elif dtypes != {torch.float32}:
        return False
    return all(t.device.type == "cpu" for t in params)


class CastLinear(nn.Module):
    """A Linear in another precision than the activations around it: x cast to the weights'
    dtype, the result cast back (the int8 model's bf16 FFN down projection)."""

    def __init__(self, linear: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.linear, self.dtype = linear, dtype

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.to(self.dtype)).to(x.dtype)


def prepack_linear(linear: nn.Linear, prepack: bool = True) -> nn.Module:
    """One Linear prepacked for oneDNN where that applies (and `prepack`) and agrees with F.linear,
    else as it is; wrapped to take and return fp32 activations whatever its own dtype."""
    out: nn.Module = linear
    if prepack and can_prepack(linear):      # a torch build without these oneDNN ops: as it is
        with suppress(RuntimeError, NotImplementedError, AttributeError), torch.no_grad():
            out = _checked(linear, torch.Generator().manual_seed(0)) or linear
    if linear.weight.dtype != torch.float32:
        out = CastLinear(out, linear.weight.dtype)
    return out


class FusedSelfAttention(nn.Module):
    """`model.SelfAttention` for inference with Q, K and V from one GEMM, x [W_q; W_k; W_v]^T: one
    weight read and one kernel call instead of three (`prepack_linears`; int8: `int8.quantize_int8`)."""

    def __init__(self, num_heads: int, causal: bool, qkv: nn.Module, out: nn.Module,
                 slopes: torch.Tensor | None = None, kernel: str = "sdpa"):
        super().__init__()
        self.num_heads, self.causal, self.qkv, self.out, self.slopes = num_heads, causal, qkv, out, slopes
        self.kernel = kernel                               # packing.attention's
        self.group_overhead = GROUP_OVERHEAD_PAIRS         # packing.packed_attention's (choose_attention)

    def forward(self, x: Tensor, layout: Tensor | Packed | None) -> Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, -1)).unbind(-3)      # (..., H, D) each
        if isinstance(layout, Packed):                     # (N, H, D)
            y = packed_attention(q, k, v, layout, causal=self.causal, slopes=self.slopes, kernel=self.kernel,
                                 group_overhead=self.group_overhead)
        else:                                              # (B, T, H, D) -> (B, H, T, D), as SelfAttention
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            mask = attention_bias(layout, q, self.causal, self.slopes)
            y = attention(q, k, v, mask, 0.0, self.causal and layout is None and self.slopes is None,
                          self.kernel).transpose(1, 2)
        return self.out(y.flatten(-2))                     # (..., C)


def prepack_linears(model: nn.Module) -> bool:
    """Swap the encoder blocks' Linear layers for PrepackedLinear (in place): attention's Q, K and
    V as one GEMM (`FusedSelfAttention`), the FFN's GELU with its first GEMM (`PrepackedFeedForward`).
    Each packed GEMM (and the first FFN GEMM with its GELU) is checked against F.linear on a random
    input (rtol: 1e-4 in fp32, 2e-2 in bf16, about 5 bf16 ulps); on any error or disagreement the
    model is left as it was. Returns whether the swap happened."""
    if not can_prepack(model):
        return False
    gelu = model_gelu(model)
    swaps = []                                  # (block, FusedSelfAttention, up, down)
    try:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for block in (m for m in model.modules() if isinstance(m, Block)):
                attn, ff = block.attn, block.mlp
                layers = [getattr(attn, n, None) for n in ("query", "key", "value", "out")] + [ff.up, ff.down]
                if type(attn) is not SelfAttention or any(type(m) is not nn.Linear for m in layers):
                    return False
                out, up, down = layers[3:]
                qkv = qkv_linear(attn)
                packed = [_checked(lin, gen, gelu if lin is up else None) for lin in (qkv, out, up, down)]
                if any(p is None for p in packed):
                    return False
                swaps.append((block, FusedSelfAttention(attn.num_heads, attn.causal, packed[0], packed[1], attn.slopes,
                                                       attn.kernel), packed[2], packed[3]))
    except (RuntimeError, NotImplementedError, AttributeError) as e:   # a torch build without these oneDNN ops
        log.info("oneDNN prepacked Linear unavailable (%s); kept the plain layers", first_line(e))
        return False
    for block, attn, up, down in swaps:
        block.attn = attn
        block.mlp = PrepackedFeedForward(up, down, block.mlp.act, gelu)
    return True


def model_gelu(model: nn.Module) -> str | None:
    """The `approximate` of the model's GELU ('none' = erf, 'tanh'), or None for another activation."""
    return GELU_APPROXIMATE.get(getattr(getattr(model, "config", None), "hidden_act", None))


def qkv_linear(attn: SelfAttention) -> nn.Linear:
    """One Linear for attention's Q, K and V: x [W_q; W_k; W_v]^T + [b_q; b_k; b_v] (`FusedSelfAttention`)."""
    q, k, v = attn.query, attn.key, attn.value
    qkv = nn.Linear(q.in_features, 3 * q.out_features, dtype=q.weight.dtype)
    with torch.no_grad():
        qkv.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
        qkv.bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
    return qkv


def _checked(lin: nn.Linear, gen: torch.Generator, gelu: str | None = None) -> PrepackedLinear | None:
    """`lin` prepacked, or None if it (or, with `gelu`, it with oneDNN's GELU) disagrees with F.linear."""
    rtol = 1e-4 if lin.weight.dtype == torch.float32 else 2e-2       # about 5 bf16 ulps in bf16
    new = PrepackedLinear(lin)
    x = torch.randn(7, lin.in_features, generator=gen).to(lin.weight.dtype)
    want = F.linear(x.float(), lin.weight.float(), lin.bias.float() if lin.bias is not None else None)
    pairs = [(new(x).float(), want)]
    if gelu is not None:
        pairs.append((new.rows(x, "gelu", gelu).float(), F.gelu(want, approximate=gelu)))
    for got, ref in pairs:
        if not torch.allclose(got, ref, rtol=rtol, atol=rtol * float(ref.abs().max())):
            log.warning("prepacked Linear disagrees with F.linear (max diff %.3g); kept the plain layers",
                        float((got - ref).abs().max()))
            return None
    return new
