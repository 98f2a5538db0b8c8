"""The one speed boundary: padding-free (packed) batches and the attention that runs on them.

A padded batch (B, T) with attention mask becomes the N real tokens back to back, plus
`cu_seqlens` (B+1,), the offsets where each sequence starts. Linear layers, LayerNorm and the
FFN then run on N tokens instead of B*T (on a ragged batch that is 40% less work); attention is
the only operation that needs to know where sequences start and end:

  * CUDA, fp16/bf16, with torch's variable-length flash attention: `varlen_attn` on (N, H, D);
  * otherwise (CPU, fp32, older torch): the N tokens are scattered into a (B, T_max, H, D)
    buffer - T_max the longest sequence of this batch, not the padded width - SDPA runs with a
    key mask, and the real rows are gathered back. When every sequence has the same length
    (a fixed-length batch) the packed tokens already are a (B, T) batch: a view, no mask. The scatter/gather costs a few copies of
    (N, C); attention itself is small next to the linear layers.
Both are numerically the padded path: tests compare them.

The second speed-up here is for inference on the CPU (`prepack_linears`, used by `Predictor`):
the encoder's Linear weights are reordered once into oneDNN's blocked layout, and the FFN's
GELU runs inside the first FFN GEMM, as inductor does when it freezes a model. The model code is
unchanged; the same numbers come out (checked when the weights are packed).
"""
from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

try:  # torch >= 2.10 ships variable-length flash attention
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except Exception:  # pragma: no cover - older torch
    _varlen_attn = None


def _varlen_direction_args(fn, causal: bool) -> dict:
    """How this torch spells the attention direction: torch 2.10 takes `is_causal`, later ones a
    `window_size` (-1, 0 for causal); read from the signature, not from the version."""
    params = inspect.signature(fn).parameters
    if "window_size" in params:
        return {"window_size": (-1, 0) if causal else (-1, -1)}
    return {"is_causal": causal}


_VARLEN_DIRECTION = {c: _varlen_direction_args(_varlen_attn, c) for c in (False, True)} if _varlen_attn is not None else {}


@dataclass
class Packed:
    """Where each sequence of a packed batch lives."""
    cu_seqlens: Tensor      # (B+1,) int32: sequence b is tokens cu_seqlens[b]:cu_seqlens[b+1]
    max_seqlen: int         # longest sequence in the batch
    indices: Tensor         # (N,) int64: position of each packed token in the flattened (B, T) batch
    batch_size: int
    padded_len: int         # T of the padded batch the tokens came from
    pad_indices: Tensor     # (N,) int64: position of each packed token in a (B, max_seqlen) buffer
    key_mask: Tensor        # (B, max_seqlen) bool: real tokens of that buffer
    scratch: dict = field(default_factory=dict, repr=False)   # padded buffers reused across layers (no grad)


def packing(attention_mask: Tensor) -> Packed:
    """The Packed layout of a right- or left-padded (B, T) mask (1 = real token)."""
    mask = attention_mask.bool()
    B, T = mask.shape
    seqlens = mask.sum(1, dtype=torch.int32)
    indices = mask.flatten().nonzero().flatten()
    cu = F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    max_len = int(seqlens.max()) if B else 0
    # rank of each real token inside its sequence -> its slot in the (B, max_len) buffer
    rank = mask.long().cumsum(1) - 1                                   # (B, T)
    slot = torch.arange(B, device=mask.device)[:, None] * max_len + rank
    pad_indices = slot.flatten()[indices]
    key_mask = torch.arange(max_len, device=mask.device)[None, :] < seqlens[:, None]
    return Packed(cu, max_len, indices, B, T, pad_indices, key_mask)


def pack(input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None,
         labels: Tensor | None = None) -> tuple[dict, Packed]:
    """(B, T) tensors -> packed (N,) tensors with per-sequence position ids, and the layout."""
    p = packing(attention_mask)
    flat = lambda t: t.flatten()[p.indices]
    positions = (attention_mask.long().cumsum(1) - 1).clamp(min=0)      # counts real tokens only
    batch = {"input_ids": flat(input_ids), "position_ids": flat(positions),
             "token_type_ids": flat(token_type_ids) if token_type_ids is not None
             else torch.zeros_like(flat(input_ids))}
    if labels is not None:
        batch["labels"] = flat(labels)
    return batch, p


def pack_rows(rows) -> tuple[dict, Packed]:
    """Token-id rows [(input_ids, token_type_ids), ...] -> packed (N,) tensors and the layout,
    as `pack` of the rows right-padded to the longest, without building the padded batch (the
    per-request cost of a short input)."""
    lengths = [len(r[0]) for r in rows]
    B, T = len(rows), max(lengths)
    ids = torch.tensor([i for r in rows for i in r[0]], dtype=torch.long)
    types = torch.tensor([t for r in rows for t in r[1]], dtype=torch.long)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    cu = F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    if min(lengths) == T:                                   # no padding: one (B, T) block
        positions = torch.arange(T).repeat(B)
        indices = torch.arange(B * T)
        key_mask = torch.ones(B, T, dtype=torch.bool)
    else:
        seq = torch.repeat_interleave(torch.arange(B), seqlens.long())             # (N,) row of each token
        positions = torch.arange(len(ids)) - cu[:-1].long()[seq]
        indices = seq * T + positions
        key_mask = torch.arange(T)[None, :] < seqlens[:, None]
    tensors = {"input_ids": ids, "position_ids": positions, "token_type_ids": types}
    return tensors, Packed(cu, T, indices, B, T, indices, key_mask)


def unpack(x: Tensor, p: Packed, fill: float = 0.0) -> Tensor:
    """(N, ...) -> (B, T, ...) at the original padded positions, `fill` elsewhere."""
    out = x.new_full((p.batch_size * p.padded_len, *x.shape[1:]), fill)
    out[p.indices] = x
    return out.view(p.batch_size, p.padded_len, *x.shape[1:])


def packed_attention(q: Tensor, k: Tensor, v: Tensor, p: Packed, causal: bool = False,
                     dropout_p: float = 0.0) -> Tensor:
    """Attention of (N, H, D) queries/keys/values within each sequence of the batch -> (N, H, D)."""
    if (_varlen_attn is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
            and dropout_p == 0.0):
        return _varlen_attn(q, k, v, p.cu_seqlens, p.cu_seqlens, p.max_seqlen, p.max_seqlen,
                            **_VARLEN_DIRECTION[causal])
    # Length groups pay on the CPU, where an extra attention call costs ~40 us against ~39 ns per
    # padded pair; on a GPU every group is a launch sequence and a new kernel shape for a few us of
    # work (an unsorted pre-training batch of 256 split into dozens of groups ran BERT-base 4.6x
    # slower than padded on an H200, 2026-11-30): one padded call there.
    groups = [] if q.is_cuda else attention_groups(p, q.shape[1] * q.shape[2])
    if groups:                           # sequences of very different lengths: each group padded to its own longest
        return torch.cat([_padded_attention(q[a:b], k[a:b], v[a:b], g, causal, dropout_p) for a, b, g in groups])
    return _padded_attention(q, k, v, p, causal, dropout_p)


# One more attention call costs about as much as this many padded (query, key) pairs at width
# H*D = 384 (CPU, one thread: ~40 us of call, scatter and gather against ~39 ns per pair; a
# ragged batch of 8..128 tokens took 20 ms per layer in one call, 11.5 ms in 13 runs, 12 ms in 7).
GROUP_OVERHEAD_PAIRS = 1000


def attention_groups(p: Packed, width: int) -> list[tuple[int, int, Packed]]:
    """Contiguous runs of sequences whose attention is cheaper padded each to its own longest
    sequence than all to the batch's longest: [(first token, end token, layout of the run)], or
    [] for one run. Attention on a padded buffer costs B * T_max^2 pairs; a batch sorted by
    length (as `Predictor` makes them) of 8..128 tokens needs less than half that. Greedy:
    a sequence opens a new run when padding it to the run's longest costs more pairs than a new
    call. Planned once per batch (kept on the layout for every layer)."""
    if "groups" in p.scratch:
        return p.scratch["groups"]
    lengths = (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).tolist()
    overhead = GROUP_OVERHEAD_PAIRS * 384 / max(width, 1)
    runs, start, top = [], 0, lengths[0] if lengths else 0
    for i, n in enumerate(lengths[1:], 1):
        if (i - start + 1) * max(top, n) ** 2 - (i - start) * top ** 2 > n * n + overhead:
            runs.append((start, i))
            start, top = i, n
        else:
            top = max(top, n)
    runs.append((start, len(lengths)))
    groups = []
    if len(runs) > 1:
        cu = p.cu_seqlens.tolist()
        for a, b in runs:
            seq = torch.tensor(lengths[a:b], device=p.cu_seqlens.device)
            mask = torch.arange(int(seq.max()), device=seq.device)[None, :] < seq[:, None]   # (b - a, T_run)
            groups.append((cu[a], cu[b], packing(mask)))
    p.scratch["groups"] = groups
    return groups


def _padded_attention(q: Tensor, k: Tensor, v: Tensor, p: Packed, causal: bool, dropout_p: float) -> Tensor:
    """(N, H, D) -> (N, H, D) through SDPA on a (B, H, T_max, D) buffer with a key mask."""
    N, H, D = q.shape
    B, L = p.batch_size, p.max_seqlen
    if N == B * L:                       # every sequence is L long: the packed tokens ARE a (B, L) batch
        view = lambda t: t.view(B, L, H, D).transpose(1, 2)            # (B, H, L, D), no copy, no mask
        y = F.scaled_dot_product_attention(view(q), view(k), view(v), dropout_p=dropout_p, is_causal=causal)
        return y.transpose(1, 2).reshape(N, H, D)

    def to_buffer(t: Tensor, slot: str) -> Tensor:                     # (N, H, D) -> (B, H, L, D)
        # Without autograd the zeroed buffers are kept on the layout and reused by every layer:
        # the real rows are overwritten, the padding rows stay zero. A fresh multi-MB buffer per
        # layer costs page faults that, on CPU, took longer than the attention itself.
        buf = None if torch.is_grad_enabled() else p.scratch.get(slot)
        if buf is None or buf.shape != (B * L, H * D) or buf.dtype != t.dtype or buf.device != t.device:
            buf = t.new_zeros(B * L, H * D)
            if not torch.is_grad_enabled():
                p.scratch[slot] = buf
        buf.index_copy_(0, p.pad_indices, t.reshape(N, H * D))   # rows of H*D values (2-D: fast on CPU)
        return buf.view(B, L, H, D).transpose(1, 2)

    allowed = p.key_mask[:, None, None, :]                              # (B, 1, 1, L)
    if causal:
        allowed = allowed & torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    y = F.scaled_dot_product_attention(to_buffer(q, "q"), to_buffer(k, "k"), to_buffer(v, "v"),
                                       attn_mask=allowed, dropout_p=dropout_p)
    return y.transpose(1, 2).reshape(B * L, H * D).index_select(0, p.pad_indices).view(N, H, D)


# ---- CPU inference: prepacked Linear layers ------------------------------------------------------
log = logging.getLogger("bertkit")

_FUSED_GELU = {"gelu": "none", "gelu_python": "none",              # oneDNN's exact (erf) GELU
               "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_python_tanh": "tanh",
               "gelu_fast": "tanh", "gelu_accurate": "tanh"}


class PrepackedLinear(nn.Module):
    """act(x W^T + b) with W reordered once into oneDNN's blocked layout; inference only, CPU,
    fp32 or bf16 (input, weight and output of the Linear's dtype).

    `post` is a pointwise op fused into the GEMM ("none" or "gelu" with `algorithm` "none" =
    erf, "tanh" = tanh approximation). The packed weight is opaque: keep the original module if
    you need to train or save."""

    def __init__(self, linear: nn.Linear, post: str = "none", algorithm: str = ""):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.post, self.algorithm = post, algorithm
        w = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        self.bias = linear.bias.detach().clone() if linear.bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        # oneDNN builds and caches kernels per row count, ~0.7 MB each and never given back: a
        # server seeing every packed length 1..2048 grew by GBs. Rows padded to one of ~100
        # sizes (`gemm_rows`) bound that memory and reuse the kernels, for ~2% more arithmetic.
        n = x.shape[0]
        m = gemm_rows(n) if x.dim() == 2 else n
        if m != n:
            x = F.pad(x, (0, 0, 0, m - n))
        y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, self.post, [], self.algorithm)
        return y[:n] if m != n else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, post={self.post!r}"


def gemm_rows(n: int) -> int:
    """n rounded up to one of few GEMM row counts: exact up to 32, then 8 sizes per power of two
    (at most 1/8 more rows)."""
    if n <= 32:
        return n
    step = 1 << (n.bit_length() - 4)
    return -(-n // step) * step


def warm_gemm_shapes(model: nn.Module, max_rows: int) -> int:
    """Run each distinct PrepackedLinear of `model` once at every `gemm_rows` size up to max_rows,
    so oneDNN builds its kernels now (a server: before traffic, memory flat from the first
    request, no first-time kernel build in a request's latency). Returns the GEMMs run."""
    distinct = {}
    for m in model.modules():
        if isinstance(m, PrepackedLinear):
            distinct.setdefault((m.in_features, m.out_features, m.post, m.algorithm, m.packed.dtype), m)
    sizes = sorted({gemm_rows(n) for n in range(1, max_rows + 1)})
    with torch.inference_mode():
        for lin in distinct.values():
            for rows in sizes:
                lin(torch.zeros(rows, lin.in_features, dtype=lin.packed.dtype))
    return len(distinct) * len(sizes)


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


def prepack_disabled() -> bool:
    """`BERTKIT_PREPACK=0` (or false/no/off) turns prepacking off everywhere: a switch to run the
    same code (the test suite, a server, an evaluation) on the plain Linear layers."""
    return os.environ.get("BERTKIT_PREPACK", "1").strip().lower() in ("0", "false", "no", "off")


class CastLinear(nn.Module):
    """A Linear in another precision than the activations around it: x cast to the weights'
    dtype, the result cast back (the int8 model's bf16 FFN down projection)."""

    def __init__(self, linear: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.linear, self.dtype = linear, dtype

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.to(self.dtype)).to(x.dtype)


def prepack_linear(linear: nn.Linear, cast: bool = False) -> nn.Module:
    """One Linear prepacked for oneDNN where that applies and agrees with F.linear, else as it
    is; cast=True: wrapped to take and return fp32 activations whatever its own dtype."""
    out: nn.Module = linear
    if not prepack_disabled() and can_prepack(linear):
        dtype = linear.weight.dtype
        try:
            with torch.no_grad():
                out = _checked(linear, "none", "", torch.Generator().manual_seed(0),
                               1e-4 if dtype == torch.float32 else 2e-2) or linear
        except (RuntimeError, NotImplementedError, AttributeError):
            out = linear
    if cast and linear.weight.dtype != torch.float32:
        out = CastLinear(out, linear.weight.dtype)
    return out


class FusedSelfAttention(nn.Module):
    """`model.SelfAttention` for inference with Q, K and V from one prepacked GEMM,
    x [W_q; W_k; W_v]^T: one weight read and one kernel call instead of three (`prepack_linears`)."""

    def __init__(self, num_heads: int, causal: bool, qkv: PrepackedLinear, out: PrepackedLinear):
        super().__init__()
        self.num_heads, self.causal, self.qkv, self.out = num_heads, causal, qkv, out

    def forward(self, x: Tensor, layout: Tensor | Packed | None) -> Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, -1)).unbind(-3)      # (..., H, D) each
        if isinstance(layout, Packed):                     # (N, H, D)
            y = packed_attention(q, k, v, layout, causal=self.causal)
        else:                                              # (B, T, H, D) -> (B, H, T, D), as SelfAttention
            from .model import attention_bias
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_bias(layout, q, self.causal),
                                               is_causal=self.causal and layout is None).transpose(1, 2)
        return self.out(y.flatten(-2))                     # (..., C)


def prepack_linears(model: nn.Module, rtol: float | None = None) -> bool:
    """Swap the encoder blocks' Linear layers for PrepackedLinear (in place): attention's Q, K and
    V as one GEMM (`FusedSelfAttention`), GELU fused into the FFN's first GEMM. Each packed
    GEMM is checked against F.linear on a random input (rtol: 1e-4 in fp32, 2e-2 in bf16, about
    5 bf16 ulps); on any error or disagreement the model is left as it was. Returns whether the
    swap happened (never under BERTKIT_PREPACK=0)."""
    if prepack_disabled() or not can_prepack(model):
        return False
    from .model import Block, SelfAttention     # a runtime import: model.py imports this file
    fused = _FUSED_GELU.get(getattr(getattr(model, "config", None), "hidden_act", None))
    dtype = next(model.parameters()).dtype
    rtol = rtol if rtol is not None else (1e-4 if dtype == torch.float32 else 2e-2)
    swaps = []                                  # (block, FusedSelfAttention, up, down, GELU fused)
    try:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for block in (m for m in model.modules() if isinstance(m, Block)):
                attn, ff = block.attn, block.mlp
                layers = [getattr(attn, n, None) for n in ("query", "key", "value", "out")] + [ff.up, ff.down]
                if type(attn) is not SelfAttention or any(type(m) is not nn.Linear for m in layers):
                    return False
                q, k, v, out, up, down = layers
                qkv = nn.Linear(q.in_features, 3 * q.out_features).to(dtype)
                qkv.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
                qkv.bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
                act = ("gelu", fused) if fused else ("none", "")
                packed = [_checked(lin, *post, gen, rtol) for lin, post in
                          ((qkv, ("none", "")), (out, ("none", "")), (up, act), (down, ("none", "")))]
                if any(p is None for p in packed):
                    return False
                swaps.append((block, FusedSelfAttention(attn.num_heads, attn.causal, packed[0], packed[1]),
                               packed[2], packed[3], bool(fused)))
    except (RuntimeError, NotImplementedError, AttributeError) as e:   # a torch build without these oneDNN ops
        log.info("oneDNN prepacked Linear unavailable (%s); kept the plain layers", str(e).splitlines()[0])
        return False
    for block, attn, up, down, fused_act in swaps:
        block.attn, block.mlp.up, block.mlp.down = attn, up, down
        if fused_act:
            block.mlp.act = _identity
    return True


def _checked(lin: nn.Linear, post: str, algorithm: str, gen: torch.Generator, rtol: float) -> PrepackedLinear | None:
    """`lin` prepacked (GELU fused when post is 'gelu'), or None if it disagrees with F.linear."""
    new = PrepackedLinear(lin, post, algorithm)
    x = torch.randn(7, lin.in_features, generator=gen).to(lin.weight.dtype)
    want = F.linear(x.float(), lin.weight.float(), lin.bias.float() if lin.bias is not None else None)
    if post == "gelu":
        want = F.gelu(want, approximate=algorithm)
    got = new(x).float()
    if not torch.allclose(got, want, rtol=rtol, atol=rtol * float(want.abs().max())):
        log.warning("prepacked Linear disagrees with F.linear (max diff %.3g); kept the plain layers",
                    float((got - want).abs().max()))
        return None
    return new


def _identity(x: Tensor) -> Tensor:
    return x
