"""The one speed boundary of the model: padding-free (packed) batches and the attention that runs on them.

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
Both are numerically the padded path: tests compare them. Dropout (`dropout`, the model's `Dropout`)
lives here too: on the CPU torch's Bernoulli draw costs more than the layer it follows; and the
few GEMM row counts (`gemm_rows`) that a row count changing with every batch is padded to on the CPU.

`model.py` imports this file; nothing here knows the model. The CPU inference speed-up
(prepacked oneDNN weights) is in `infer/prepack.py`.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

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


def pad_rows(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Packed (N,) tensors of `pack`, under CPU autocast with rows up to `gemm_rows(N)` appended that belong
    to no sequence (token, position and type 0, label -100): they run through the per-token layers,
    attention gives them 0, pooling and the loss ignore them, and oneDNN sees few GEMM row counts
    (see `on_gemm_rows`: training has a new N every batch). Elsewhere the tensors as they are."""
    first = next(iter(tensors.values()))                  # token ids: only autocast can say bf16 here
    n = first.shape[0]
    m = gemm_rows(n) if kept_per_row_count(first) else n
    if m == n:
        return tensors
    return {k: F.pad(t, (0, m - n), value=-100 if k == "labels" else 0) for k, t in tensors.items()}


def pack_rows(rows) -> tuple[dict, Packed]:
    """Token-id rows [(input_ids, token_type_ids), ...] -> packed (N,) tensors and the layout,
    as `pack` of the rows right-padded to the longest, without building the padded batch (the
    per-request cost of a short input). Built in numpy and handed to torch without a copy: between
    two short requests the caches are cold, and torch's dispatch then costs several times what the
    same layout costs in numpy (docs/serve-measurements.md)."""
    t = torch.from_numpy
    B = len(rows)
    if B == 1:                                              # one sequence: the fewest calls (half the time)
        ids, types = np.asarray(rows[0][0], np.int64), np.asarray(rows[0][1], np.int64)
        T = len(ids)
        positions = t(np.arange(T))
        return ({"input_ids": t(ids), "position_ids": positions, "token_type_ids": t(types)},
                Packed(t(np.array([0, T], np.int32)), T, positions, 1, T, positions, t(np.ones((1, T), bool))))
    lengths = np.fromiter((len(r[0]) for r in rows), np.int64, B)
    T = int(lengths.max())
    ids = np.fromiter(chain.from_iterable(r[0] for r in rows), np.int64)
    types = np.fromiter(chain.from_iterable(r[1] for r in rows), np.int64)
    cu = np.zeros(B + 1, np.int32)
    np.cumsum(lengths, out=cu[1:])
    if lengths.min() == T:                                  # no padding: one (B, T) block
        positions = np.tile(np.arange(T), B)
        indices = np.arange(B * T)
        key_mask = np.ones((B, T), bool)
    else:
        seq = np.repeat(np.arange(B), lengths)              # (N,) row of each token
        positions = np.arange(len(ids)) - cu[:-1][seq]
        indices = seq * T + positions
        key_mask = np.arange(T)[None, :] < lengths[:, None]
    tensors = {"input_ids": t(ids), "position_ids": t(positions), "token_type_ids": t(types)}
    return tensors, Packed(t(cu), T, t(indices), B, T, t(indices), t(key_mask))


def unpack(x: Tensor, p: Packed, fill: float = 0.0) -> Tensor:
    """(N, ...) -> (B, T, ...) at the original padded positions, `fill` elsewhere."""
    out = x.new_full((p.batch_size * p.padded_len, *x.shape[1:]), fill)
    out[p.indices] = x
    return out.view(p.batch_size, p.padded_len, *x.shape[1:])


def segment_ids(p: Packed) -> Tensor:
    """(N,) index of the sequence each packed token belongs to."""
    lengths = (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(p.batch_size, device=lengths.device), lengths)


def varlen_runs(device: torch.device, dtype: torch.dtype, dropout_p: float, alibi: bool = False) -> str | None:
    """None when `packed_attention` runs torch's varlen flash attention for these, else why not."""
    if _varlen_attn is None:
        return "this torch has no varlen flash attention"
    if device.type != "cuda":
        return "varlen flash attention runs on CUDA only"
    if dtype not in (torch.float16, torch.bfloat16):
        return "varlen flash attention needs bf16/fp16"
    if dropout_p > 0:
        return f"attention dropout {dropout_p} - varlen flash attention has none"
    if alibi:
        return "ALiBi - varlen flash attention takes no score bias"
    return None


def alibi_bias(slopes: Tensor, T: int, q: Tensor) -> Tensor:
    """(H, T, T) additive scores -slope_h * |i - j| in q's dtype and device."""
    pos = torch.arange(T, device=q.device)
    distance = (pos[:, None] - pos[None, :]).abs().to(q.dtype)                  # (T, T)
    return -slopes.to(device=q.device, dtype=q.dtype)[:, None, None] * distance


def linears(x: Tensor, *layers: torch.nn.Linear) -> tuple[Tensor, ...]:
    """Each of `layers` (nn.Linear with bias, the same input) applied to x. Under CPU autocast as one
    GEMM on their weights put side by side: x is cast to bf16 once instead of once a layer, and its
    gradient cast back once (a small gain on BERT-mini's bf16 training step; in fp32, where nothing is
    cast, none, so each layer runs as written: benchmarks/results/mlm-loss-2026-12-06/)."""
    if (len(layers) < 2 or x.device.type != "cpu" or not torch.is_autocast_enabled("cpu")
            or any(layer.bias is None for layer in layers)):
        return tuple(layer(x) for layer in layers)
    y = F.linear(x, torch.cat([layer.weight for layer in layers]), torch.cat([layer.bias for layer in layers]))
    return y.split([layer.out_features for layer in layers], -1)


def on_gemm_rows(x: Tensor, fn, always: bool = False, cut: bool = True) -> Tensor:
    """fn on x's rows padded with zeros to `gemm_rows` where that bounds memory (`kept_per_row_count`;
    always=True: on the CPU whatever the dtype, for oneDNN's prepacked fp32 weights too), cut back to
    x's (a 2-D x; others as they are; cut=False: the padding rows kept, for a loss that ignores them:
    a cut's backward zero-fills a gradient of all the rows). oneDNN builds and keeps a kernel per GEMM
    row count (MBs each, never given back), so a row count that changes with every batch grows the
    process by GBs: the MLM head on the masked positions of each batch (a next-token run: 12 GB in 6
    minutes), a server's packed lengths."""
    n = x.shape[0]
    pad = x.dim() == 2 and ((always and x.device.type == "cpu") or kept_per_row_count(x))
    m = gemm_rows(n) if pad else n
    if m == n:
        return fn(x)
    y = fn(torch.cat([x, x.new_zeros(m - n, x.shape[1])]))
    return y[:n] if cut else y


def kept_per_row_count(x: Tensor) -> bool:
    """Whether x's GEMMs run on oneDNN kernels kept per row count: on the CPU in bf16/fp16 or under
    CPU autocast. fp32 GEMMs go to MKL, which keeps nothing per shape (measured flat), so padding
    them would only cost time."""
    return x.device.type == "cpu" and (torch.is_autocast_enabled("cpu") or x.dtype in (torch.bfloat16, torch.float16))


def gemm_rows(n: int) -> int:
    """n rounded up to one of few GEMM row counts: exact up to 32, then 8 sizes per power of two
    (at most 1/8 more rows)."""
    if n <= 32:
        return n
    step = 1 << (n.bit_length() - 4)
    return -(-n // step) * step


KERNELS = ("sdpa", "math", "chunked")   # what `attention` can compute with
_NOT_CUDNN = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def sdpa_backends(device_type: str, masked: bool, grad: bool) -> list[SDPBackend] | None:
    """The SDPA kernels a call may use (None: torch's choice). Training on a GPU with a mask leaves out
    cuDNN attention: its backward returns NaN in dQ when the length is 64 mod 128 and a row's
    log-sum-exp falls below ln(FLT_MAX) (pytorch/pytorch#196678, H100/H200, torch >= 2.11). The
    GPU ablation grid hit it: every fine-tuning loss that went NaN was the update after a batch
    padded to 64 tokens (docs/REPRODUCTION.md). The memory-efficient kernel takes the same masks."""
    return list(_NOT_CUDNN) if device_type == "cuda" and masked and grad else None


def _recording(*tensors: Tensor) -> bool:
    """Whether autograd records an op on these tensors."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, kernel: str = "sdpa") -> Tensor:
    """softmax(Q K^T / sqrt(D) + mask) V on (B, H, T, D) tensors; `mask` is SDPA's (boolean 'may
    attend' or additive float, broadcast to (B, H, T, T)).

    kernel 'sdpa': torch's scaled_dot_product_attention. kernel 'math', used only while autograd
    records: the same formula written out, Q K^T and P V as bf16/fp32 batched GEMMs in q's dtype,
    the scores, mask and softmax in fp32. On CPUs whose bf16 flash-attention backward is slow this
    trains faster (docs/pretrain.md); `hardware.attention_kernel` measures which one a run takes. Without autograd
    (evaluation, inference) SDPA's forward is the faster one, so 'math' falls back to it.

    kernel 'chunked', for inference on packed tokens (`packed_attention`; the Predictor takes it where it
    times faster than SDPA's forward at load, `hardware.attention_forward_speedup`): the formula one
    sequence at a time; on a padded batch as here, SDPA's forward, and with autograd 'math'."""
    recording = _recording(q, k, v)
    if kernel == "sdpa" or not recording:
        backends = sdpa_backends(q.device.type, mask is not None, torch.is_grad_enabled())
        if backends is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
    scores = (q @ k.transpose(-1, -2)).float().mul_(q.shape[-1] ** -0.5)      # (B, H, T, T), fp32
    # masks are added in place as 0 / -inf: the same scores as masked_fill, and a backward that is a no-op
    # (masked_fill's is one more pass; softmax's gradient is already 0 where the mask is -inf)
    if is_causal:
        T = q.shape[-2]
        scores.add_(torch.full((T, T), float("-inf"), device=q.device).triu(1))
    if mask is not None:
        scores.add_(mask.float() if mask.dtype != torch.bool else
                    torch.zeros(mask.shape, device=q.device).masked_fill_(~mask, float("-inf")))
    probs = scores.softmax(-1)
    if dropout_p > 0:
        probs = dropout(probs, dropout_p)
    return probs.to(v.dtype) @ v


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout: each element zeroed with probability p, the kept ones scaled by 1 / (1 - p).
    On a GPU `F.dropout`. On the CPU torch draws one Bernoulli an element from its scalar generator:
    here each element gets 16 bits of 64-bit draws from numpy's PCG64 (faster than `torch.randint`
    on torch's Mersenne Twister), seeded by one draw from torch's generator (so
    torch's seed, and a resumed run's restored state, give the same masks), p rounded to a multiple
    of 1/65,536 (0.1 drops 0.1000061) and the scale taken from that p: unbiased, and several times
    F.dropout's speed (benchmarks/results/mlm-loss-2026-12-06/). A p that rounds to 0 or 1 there (finer than
    1/65,536 from either end) goes to `F.dropout` too, so it is never silently changed."""
    cut = round(p * 65536)
    if not training or not 0 < cut < 65536 or x.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(x, p, training)                   # (under torch.compile: inductor's own fused draw)
    seed = int(torch.randint(-2 ** 63, 2 ** 63 - 1, (), dtype=torch.int64)) & (2 ** 64 - 1)
    words = np.random.PCG64(seed).random_raw((x.numel() + 3) // 4)          # 64-bit draws, 4 elements each
    draws = torch.from_numpy(words.view(np.int16)[:x.numel()]).view(x.shape)
    keep = torch.ge(draws, cut - 32768, out=torch.empty_like(x))    # 1 / 0 in x's dtype, written by the compare
    scale = 65536 / (65536 - cut)
    if x.dtype in (torch.float32, torch.float64):        # {0, scale} exact in x's dtype: one multiply each way
        return x * keep.mul_(scale)
    return x * keep * scale           # bf16/fp16 would round the scale: it goes on as the scalar it is


CE_ROWS = 16       # rows of logits per step of the CPU's `cross_entropy` (their fp32 copy stays in cache)
TINY = 1e-30       # a target's softmax below this takes its log from log_softmax (fp32 underflow)


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """`F.cross_entropy(logits[:M].float(), targets)` for M targets, the mean over (M, V) logits, in fp32;
    rows of logits past M are padding (`on_gemm_rows(cut=False)`): no loss, a gradient of 0, so the
    loss reads the logits as the GEMM wrote them and no (rows, V) zero-filled gradient of a cut is
    made. On the CPU `_RowsCrossEntropy` goes CE_ROWS rows at a time: the (M, V) fp32 copy,
    log-probabilities and zero-filled gradient that F.cross_entropy writes are never made, and the
    gradient is written with the loss (a third of F.cross_entropy's time or less on BERT's masked
    positions: benchmarks/results/mlm-loss-2026-12-06/). Targets must be classes (no ignore_index)
    there; otherwise F.cross_entropy."""
    M = len(targets)
    if logits.device.type != "cpu" or logits.dim() != 2 or not M or int(targets.min()) < 0:
        return F.cross_entropy(logits[:M].float(), targets)
    return _RowsCrossEntropy.apply(logits, targets, torch.is_grad_enabled() and logits.requires_grad)


class _RowsCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over the rows with a target, fp32 inside: loss = -log softmax(x)[target],
    the softmax torch's fused kernel. With `grad`, the gradient (softmax - one-hot) / M is written in
    the forward pass from that same softmax, in the logits' dtype (one pass over the logits instead of
    two), and 0 on padding rows; the backward scales it by the loss's gradient (1 in training, so it
    returns it as it is). A target whose probability underflows fp32 (below TINY) takes its loss from
    log_softmax instead, so a confidently wrong row gives its true loss, not inf."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, grad: bool) -> Tensor:
        M = len(targets)
        picked = torch.empty(M, dtype=torch.float32)                      # softmax at each target
        g = torch.empty_like(logits) if grad else None
        if g is not None:
            g[M:].zero_()
        direct = g is not None and logits.dtype == torch.float32           # softmax straight into g
        for a in range(0, M, CE_ROWS):
            b = min(a + CE_ROWS, M)
            rows, t, at = logits[a:b].float(), targets[a:b], torch.arange(b - a)
            p = torch.softmax(rows, -1, out=g[a:b]) if direct else torch.softmax(rows, -1)
            picked[a:b] = p[at, t]
            if g is not None:
                p[at, t] -= 1
                torch.mul(p, 1 / M, out=g[a:b])
        loss = -picked.log()
        low = (picked < TINY).nonzero()[:, 0]
        if len(low):
            loss[low] = -torch.log_softmax(logits[low].float(), -1).gather(1, targets[low, None])[:, 0]
        ctx.save_for_backward(g)
        return loss.mean()

    @staticmethod
    def backward(ctx, upstream: Tensor) -> tuple[Tensor, None, None]:
        g, = ctx.saved_tensors
        return (g if bool(upstream == 1) else g * upstream), None, None


class Dropout(torch.nn.Dropout):
    """nn.Dropout through `dropout` (the CPU's faster draw)."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


# One more attention call (its call, scatter and gather) costs about as much as this many padded
# (query, key) pairs at width H*D = 384 on one CPU thread.
GROUP_OVERHEAD_PAIRS = 1000


def packed_attention(q: Tensor, k: Tensor, v: Tensor, p: Packed, causal: bool = False,
                     dropout_p: float = 0.0, slopes: Tensor | None = None, kernel: str = "sdpa",
                     group_overhead: int = GROUP_OVERHEAD_PAIRS) -> Tensor:
    """Attention of (N, H, D) queries/keys/values within each sequence of the batch -> (N, H, D).
    `slopes` (H,): ALiBi's distance penalty (positions counted within each sequence); `kernel`:
    what runs the padded buffers on the CPU (`attention`); `group_overhead`: what one more length
    group costs in padded pairs (`attention_groups`; inference measures its own per machine). Rows
    past the layout's N tokens (`pad_rows`) belong to no sequence: their output is 0."""
    n = p.indices.numel()
    if q.shape[0] > n:
        rest = q.shape[0] - n
        (q, _), (k, _), (v, _) = (t.split([n, rest]) for t in (q, k, v))
        y = packed_attention(q, k, v, p, causal, dropout_p, slopes, kernel, group_overhead)
        return torch.cat([y, y.new_zeros(rest, *y.shape[1:])])
    if varlen_runs(q.device, q.dtype, dropout_p, slopes is not None) is None:
        return _varlen_attn(q, k, v, p.cu_seqlens, p.cu_seqlens, p.max_seqlen, p.max_seqlen,
                            **_VARLEN_DIRECTION[causal])
    if kernel == "chunked" and not (q.is_cuda or dropout_p or _recording(q, k, v)):
        return _sequence_attention(q, k, v, p, causal, slopes)
    # Length groups pay on the CPU, where an extra attention call costs about as much as a thousand
    # padded pairs; on a GPU every group is a launch sequence and a new kernel shape for a few us of
    # work (an unsorted batch splits into dozens of groups, far slower than padded): one padded call there.
    groups = [] if q.is_cuda else attention_groups(p, q.shape[1] * q.shape[2], group_overhead)
    if groups:                           # sequences of very different lengths: each group padded to its own longest
        # split, not q[a:b]: the backward of a split is one cat, that of each slice a zero-filled (N, H, D)
        sizes = [b - a for a, b, _ in groups]
        return torch.cat([_padded_attention(*qkv, g, causal, dropout_p, slopes, kernel)
                          for *qkv, (_, _, g) in zip(q.split(sizes), k.split(sizes), v.split(sizes), groups)])
    return _padded_attention(q, k, v, p, causal, dropout_p, slopes, kernel)


def _sequence_attention(q: Tensor, k: Tensor, v: Tensor, p: Packed, causal: bool = False,
                        slopes: Tensor | None = None) -> Tensor:
    """Kernel 'chunked' on packed tokens, for inference: `attention`'s formula one sequence at a time
    on views of the (N, H, D) projections: no padding, no key mask and no copy of Q, K or V; one
    sequence's H x L x L scores stay in cache, the softmax in fp32. ALiBi's distances and the causal
    mask start the scores (one (H, T, T) bias per batch, each sequence its corner of it). Faster
    than SDPA on padded length groups, most on ragged batches (docs/serve-measurements.md)."""
    cu = p.scratch.get("cu")
    if cu is None:                                       # (planned once per batch, kept for every layer)
        cu = p.scratch["cu"] = p.cu_seqlens.tolist()
    bias = None
    if causal or slopes is not None:
        key = ("bias", None if slopes is None else tuple(slopes.tolist()), q.dtype, causal)
        bias = p.scratch.get(key)
        if bias is None:
            T = p.max_seqlen
            bias = alibi_bias(slopes, T, q) if slopes is not None else q.new_zeros(1, T, T)
            if causal:
                bias = bias.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
            p.scratch[key] = bias
    out, scale = torch.empty_like(q), q.shape[-1] ** -0.5
    for a, b in zip(cu, cu[1:]):
        qs, ks, vs = q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1)   # (H, L, D) views
        kt, n = ks.transpose(1, 2), b - a
        scores = (torch.baddbmm(q.new_empty(len(qs), n, n), qs, kt, beta=0, alpha=scale) if bias is None else
                  torch.baddbmm(bias[:, :n, :n], qs, kt, alpha=scale))
        out[a:b] = torch.bmm(scores.softmax(-1, dtype=torch.float32).to(v.dtype), vs).transpose(0, 1)
    return out


def attention_groups(p: Packed, width: int,
                     overhead_pairs: int = GROUP_OVERHEAD_PAIRS) -> list[tuple[int, int, Packed]]:
    """Contiguous runs of sequences whose attention is cheaper padded each to its own longest
    sequence than all to the batch's longest: [(first token, end token, layout of the run)], or
    [] for one run. Attention on a padded buffer costs B * T_max^2 pairs; a batch sorted by
    length (as `Predictor` makes them) of 8..128 tokens needs less than half that. Greedy:
    a sequence opens a new run when padding it to the run's longest costs more pairs than a new
    call (`overhead_pairs` at width 384). Planned once per batch (kept on the layout for every layer)."""
    key = ("groups", overhead_pairs)
    if key in p.scratch:
        return p.scratch[key]
    lengths = (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).tolist()
    overhead = overhead_pairs * 384 / max(width, 1)
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
    p.scratch[key] = groups
    return groups


def _padded_attention(q: Tensor, k: Tensor, v: Tensor, p: Packed, causal: bool, dropout_p: float,
                      slopes: Tensor | None = None, kernel: str = "sdpa") -> Tensor:
    """(N, H, D) -> (N, H, D) through SDPA on a (B, H, T_max, D) buffer with a key mask."""
    N, H, D = q.shape
    B, L = p.batch_size, p.max_seqlen
    if N == B * L:                       # every sequence is L long: the packed tokens ARE a (B, L) batch
        view = lambda t: t.view(B, L, H, D).transpose(1, 2)            # (B, H, L, D), no copy, no mask
        bias = alibi_bias(slopes, L, q)[None] if slopes is not None else None      # (1, H, L, L)
        if bias is not None and causal:
            bias = bias.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=q.device).tril(), float("-inf"))
        y = attention(view(q), view(k), view(v), bias, dropout_p, causal and bias is None, kernel)
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
    mask = allowed
    if slopes is not None:               # ALiBi: one (B, H, L, L) float mask, built once per batch for every layer
        key = ("alibi", tuple(slopes.tolist()), q.dtype, causal)
        mask = p.scratch.get(key)
        if mask is None:
            mask = p.scratch[key] = alibi_bias(slopes, L, q)[None].masked_fill(~allowed, float("-inf"))
    y = attention(to_buffer(q, "q"), to_buffer(k, "k"), to_buffer(v, "v"), mask, dropout_p, False, kernel)
    return y.transpose(1, 2).reshape(B * L, H * D).index_select(0, p.pad_indices).view(N, H, D)
