"""BERT (Devlin et al., 2019): the whole forward pass, one screen per idea.

Shape letters used in comments:
  B batch, T tokens per sequence, C hidden size, H heads, D head dim (C = H*D),
  N non-padding tokens of a packed batch, K answer choices, V vocabulary, M masked positions.

Two layouts flow through the same blocks:
  * padded: x is (B, T, C) and `layout` is the (B, T) attention mask (1 = real token) or None;
  * packed: x is (N, C), all real tokens of the batch back to back, and `layout` is a
    `packing.Packed` (cumulative sequence lengths). Only attention needs to know which one it
    is; that single boundary is `packing.packed_attention`. Everything else is per token.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import BertConfig
from .packing import (KERNELS, Dropout, Packed, alibi_bias, attention, cross_entropy, linears, on_gemm_rows,
                      packed_attention, segment_ids, unpack)


# Hugging Face's GELUs by F.gelu's `approximate`: "none" is exact, x * Phi(x); "tanh" its tanh approximation
GELU_APPROXIMATE = {"gelu": "none", "gelu_python": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh",
                    "gelu_python_tanh": "tanh", "gelu_fast": "tanh", "gelu_accurate": "tanh"}


def activation(name: str):
    """The feed-forward nonlinearity named by Hugging Face's `hidden_act`."""
    if name in GELU_APPROXIMATE:
        how = GELU_APPROXIMATE[name]
        return F.gelu if how == "none" else lambda x: F.gelu(x, approximate=how)
    return {
        "gelu_10": lambda x: F.gelu(x).clamp(-10, 10), "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
        "relu": F.relu, "relu2": lambda x: F.relu(x).square(), "relu6": F.relu6, "leaky_relu": F.leaky_relu,
        "silu": F.silu, "swish": F.silu, "mish": F.mish, "hardswish": F.hardswish, "tanh": torch.tanh,
        "sigmoid": torch.sigmoid, "linear": lambda x: x,
        "laplace": lambda x: 0.5 * (1.0 + torch.erf((x - 0.707107) / (0.282095 * math.sqrt(2.0)))),
    }[name]


class Embeddings(nn.Module):
    """e_i = E_token(x_i) + E_segment(s_i) + E_position(i), then LayerNorm and dropout. With ALiBi
    there is no position table: order enters through attention's distance penalty."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size) \
            if cfg.position_embedding_type == "absolute" else None
        self.segment = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.hidden_dropout)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor) -> Tensor:
        x = self.word(input_ids) + self.segment(token_type_ids)
        if self.position is not None:
            x = x + self.position(position_ids)
        return self.drop(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention, softmax(QK^T / sqrt(D)) V, then a projection."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        C = cfg.hidden_size
        self.num_heads, self.causal, self.dropout = cfg.num_heads, cfg.causal, cfg.attention_dropout
        self.query, self.key, self.value = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
        self.out = nn.Linear(C, C)
        self.slopes = alibi_slopes(cfg)                    # (H,) or None
        self.kernel = "sdpa"                               # how training computes it (packing.attention)

    def forward(self, x: Tensor, layout: Tensor | Packed | None) -> Tensor:
        H, p = self.num_heads, self.dropout if self.training else 0.0
        split = lambda t: t.unflatten(-1, (H, -1))         # (..., C) -> (..., H, D)
        q, k, v = (split(t) for t in linears(x, self.query, self.key, self.value))   # (one GEMM under CPU autocast)
        if isinstance(layout, Packed):                     # (N, H, D): the padding-free path
            y = packed_attention(q, k, v, layout, causal=self.causal, dropout_p=p, slopes=self.slopes,
                                 kernel=self.kernel)
        else:                                              # (B, T, H, D) -> (B, H, T, D)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            mask = attention_bias(layout, q, self.causal, self.slopes)
            y = attention(q, k, v, mask, p, self.causal and layout is None and self.slopes is None, self.kernel)
            y = y.transpose(1, 2)                          # (B, T, H, D)
        return self.out(y.flatten(-2))                     # (..., C)


def set_attention_kernel(model: nn.Module, kernel: str) -> None:
    """Every attention layer of `model` (its own or inference's fused one) computes with `kernel`
    ('sdpa', 'math' or 'chunked': `packing.attention`)."""
    if kernel not in KERNELS:
        raise ValueError(f"attention kernel {kernel!r}: expected one of {', '.join(KERNELS)}")
    for m in model.modules():
        if isinstance(m, SelfAttention) or hasattr(m, "kernel") and hasattr(m, "num_heads"):
            m.kernel = kernel


def alibi_slopes(cfg: BertConfig) -> Tensor | None:
    """ALiBi: head h's score for key j falls by slope_h * |i - j| (bidirectional, as MosaicBERT).
    Slopes 1, 1/2, 1/4, ...: the first heads look at the neighbours, the last ones far (Press et
    al. start at 2^(-8/H); on a 2-4 head model that is almost flat, and a start at 1 measured best
    here: docs/pretrain-measurements.md, the levers at matched wall time)."""
    if cfg.position_embedding_type != "alibi":
        return None
    return torch.tensor([2.0 ** -h for h in range(cfg.num_heads)], device="cpu")    # not a parameter: never on meta


def attention_bias(mask: Tensor | None, q: Tensor, causal: bool, slopes: Tensor | None = None) -> Tensor | None:
    """(B, T) padding mask -> boolean (B, 1, T|1, T) 'may attend' mask for SDPA (None = all); with
    ALiBi slopes, an additive float mask (B|1, H, T, T) with -inf where attention is not allowed."""
    allowed = None
    if mask is not None:
        allowed = mask.bool()[:, None, None, :]            # keys that are real tokens
    if causal:
        T = q.shape[-2]
        tril = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        allowed = tril if allowed is None else allowed & tril
        if mask is None and slopes is None:
            return None                                    # SDPA's is_causal does it
    if slopes is None:
        return allowed
    bias = alibi_bias(slopes, q.shape[-2], q)[None]       # (1, H, T, T)
    return bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))


class FeedForward(nn.Module):
    """FFN(x) = W_2 act(W_1 x + b_1) + b_2, with W_1: C -> 4C."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.up = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    """A Transformer encoder block: post-LN as BERT, or pre-LN (`norm_position='pre'`)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn, self.norm1 = SelfAttention(cfg), nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp, self.norm2 = FeedForward(cfg), nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.hidden_dropout)
        self.pre_norm = cfg.norm_position == "pre"

    def forward(self, x: Tensor, layout: Tensor | Packed | None) -> Tensor:
        if self.pre_norm:
            x = x + self.drop(self.attn(self.norm1(x), layout))
            return x + self.drop(self.mlp(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attn(x, layout)))
        return self.norm2(x + self.drop(self.mlp(x)))


class BertModel(nn.Module):
    """The encoder: embeddings, L blocks and (optionally) the pooler, tanh(W h_[CLS] + b)."""

    # what a checkpoint and an ONNX graph know about a model (the heads below say theirs)
    head = "encoder"
    architecture = "BertModel"         # Hugging Face class name in config.json
    weight_prefixes: tuple[str, ...] = ()   # the head's own weights (bertkit names, outside 'bert.')
    output_names: tuple[str, ...] = ()      # the keys of the head's `outputs` (ONNX: after last_hidden_state)

    def __init__(self, cfg: BertConfig, add_pooler: bool = True):
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        # pre-LN leaves the residual stream un-normalised: one LayerNorm after the last block
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if cfg.norm_position == "pre" else None
        self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size) if add_pooler else None

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                packed: Packed | None = None, all_layers: bool = False) -> Tensor | list[Tensor]:
        """Padded: input_ids (B, T) -> (B, T, C). Packed: input_ids (N,) with `packed` -> (N, C).

        all_layers=True returns the embedding output and every block's output (L+1 tensors).
        """
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            if packed is not None:
                raise ValueError("a packed batch needs explicit position_ids (see packing.pack)")
            T = input_ids.shape[-1]
            if self.embeddings.position is not None and T > self.config.max_position_embeddings:
                raise ValueError(f"sequence of {T} tokens is longer than max_position_embeddings "
                                 f"({self.config.max_position_embeddings}); truncate the input")
            position_ids = torch.arange(T, device=input_ids.device).expand_as(input_ids)
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        layout = packed if packed is not None else attention_mask
        states = [x]
        for block in self.blocks:
            x = block(x, layout)
            if all_layers:
                states.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if all_layers:
                states[-1] = x
        return states if all_layers else x

    def pool(self, hidden: Tensor, packed: Packed | None = None, attention_mask: Tensor | None = None) -> Tensor:
        """Each sequence's summary through dense + tanh: (B, C). The summary is the [CLS] state
        (BERT), or the mean over its tokens where config.classifier_pooling is 'mean'."""
        if self.pooler is None:
            raise ValueError("this model was built without a pooler")
        return torch.tanh(self.pooler(pool_tokens(hidden, self.pooling, packed, attention_mask)))

    @property
    def pooling(self) -> str:
        """What `pool` summarises: 'cls', 'last' (a causal encoder) or 'mean' (`pool_tokens`)."""
        return "mean" if self.config.classifier_pooling == "mean" else "last" if self.config.causal else "cls"


def summary_token(hidden: Tensor, causal: bool, packed: Packed | None = None,
                  attention_mask: Tensor | None = None) -> Tensor:
    """(B, C): the [CLS] state of each sequence, or, under a causal mask (where [CLS] sees only
    itself), the last real token's, the one state that has seen the whole input."""
    if packed is not None:
        starts = packed.cu_seqlens[:-1].long()
        return hidden[packed.cu_seqlens[1:].long() - 1] if causal else hidden[starts]
    if not causal:
        return hidden[:, 0]
    if attention_mask is None:
        return hidden[:, -1]
    last = attention_mask.long().sum(-1) - 1                                   # (B,)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def pool_tokens(hidden: Tensor, how: str, packed: Packed | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
    """(B, T, C) or packed (N, C) states -> (B, C): the [CLS] state ('cls'), the last real token's
    ('last') or the mean over real tokens ('mean'; [CLS]/[SEP] included, as sentence-transformers)."""
    if how in ("cls", "last"):
        return summary_token(hidden, how == "last", packed, attention_mask)
    if packed is not None:
        seg = segment_ids(packed)                                   # (N,); rows past N (`pad_rows`) belong to none
        sums = hidden.new_zeros(packed.batch_size, hidden.shape[-1]).index_add_(0, seg, hidden[:len(seg)])
        return sums / (packed.cu_seqlens[1:] - packed.cu_seqlens[:-1])[:, None].to(hidden.dtype)
    if attention_mask is None:
        return hidden.mean(1)
    m = attention_mask[..., None].to(hidden.dtype)                                 # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


class MaskedLMHead(nn.Module):
    """p(x_i | x_\\M) = softmax(E LayerNorm(act(W h_i)) + b): the decoder is tied to the word embeddings E."""

    def __init__(self, cfg: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.decoder = word_embeddings                     # tied weights: (V, C)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, hidden: Tensor) -> Tensor:
        return F.linear(self.norm(self.act(self.dense(hidden))), self.decoder.weight, self.bias)  # (..., V)


def select_masked(hidden: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Keep only the positions with a label (!= -100): (..., C) -> (M, C), labels -> (M,).

    Running the vocabulary projection on M masked tokens instead of every token is most of
    the pre-training speed-up (the (B*T, V) logits tensor is never built)."""
    keep = (labels != -100).flatten()
    return hidden.flatten(0, -2)[keep], labels.flatten()[keep]


def classification_loss(logits: Tensor, labels: Tensor, problem: str) -> Tensor:
    if problem == "regression":
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    if problem == "multi_label":
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten())


class Head(nn.Module):
    """A task head on the encoder `self.bert`. `outputs(hidden, packed, attention_mask)` maps the
    encoder's states to {name: tensor} for each of `output_names`, per token ((B, T, ...) padded,
    (N, ...) packed) where `per_token`, else per sequence ((B, ...)); `forward` = encoder + `outputs`
    + loss. Inference (`infer.Predictor`), ONNX export and serving call `outputs` on the encoder's
    states and read it by those names, whatever the head."""

    all_layers = False      # `outputs` reads the last layer's states (a probe reads all L+1: True)
    head: str
    architecture: str
    weight_prefixes: tuple[str, ...]
    output_names: tuple[str, ...] = ()
    per_token = False


class BertForPreTraining(Head):
    """L = L_MLM + L_NSP. With mlm_labels given, the MLM head runs on the labelled positions only."""

    head = "pretraining"
    architecture = "BertForPreTraining"
    weight_prefixes = ("mlm.", "nsp.")
    output_names = ("mlm_logits",)     # training adds mlm_targets (with mlm_labels) and nsp_logits (B, 2)
    per_token = True

    def __init__(self, cfg: BertConfig, nsp: bool = True):
        super().__init__()
        self.config = cfg
        self.bert = BertModel(cfg, add_pooler=nsp)
        self.mlm = MaskedLMHead(cfg, self.bert.embeddings.word)
        self.nsp = nn.Linear(cfg.hidden_size, 2) if nsp else None

    def outputs(self, h: Tensor, packed: Packed | None = None, attention_mask: Tensor | None = None,
                mlm_labels: Tensor | None = None, padded: bool = False) -> dict:
        """mlm_logits (B, T, V), or (M, V) on the positions mlm_labels marks (with their mlm_targets;
        padded=True: with the rows `on_gemm_rows` added past M, as the loss reads them); nsp_logits
        (B, 2) when the model has the NSP head."""
        out: dict[str, Tensor] = {}
        if mlm_labels is not None:
            h_masked, out["mlm_targets"] = select_masked(h, mlm_labels)      # (M, C), (M,)
            out["mlm_logits"] = on_gemm_rows(h_masked, self.mlm, cut=not padded)   # M rounded up (bf16 CPU)
        else:
            out["mlm_logits"] = self.mlm(h)                                 # (B, T, V)
        if self.nsp is not None:
            out["nsp_logits"] = self.nsp(self.bert.pool(h, packed, attention_mask))   # (B, 2)
        return out

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, mlm_labels: Tensor | None = None,
                nsp_labels: Tensor | None = None, packed: Packed | None = None, position_ids=None) -> dict:
        h = self.bert(input_ids, token_type_ids, attention_mask, position_ids, packed)
        out = self.outputs(h, packed, attention_mask, mlm_labels, padded=True)
        if mlm_labels is not None:
            M = len(out["mlm_targets"])
            out["mlm_loss"] = cross_entropy(out["mlm_logits"], out["mlm_targets"])   # rows past M: padding
            out["mlm_logits"] = out["mlm_logits"][:M]
        if "nsp_logits" in out and nsp_labels is not None:
            out["nsp_loss"] = F.cross_entropy(out["nsp_logits"].float(), nsp_labels)
        if "mlm_loss" in out:
            out["loss"] = out["mlm_loss"] + out.get("nsp_loss", 0.0)
        return out


class BertForMaskedLM(BertForPreTraining):
    """The MLM objective alone (no pooler, no NSP head), as in Hugging Face's BertForMaskedLM."""

    head = "masked_lm"
    architecture = "BertForMaskedLM"
    weight_prefixes = ("mlm.",)

    def __init__(self, cfg: BertConfig):
        super().__init__(cfg, nsp=False)


class BertForSequenceClassification(Head):
    """softmax(W tanh(pooled [CLS]) ); num_labels=1 is regression (MSE), as for STS-B."""

    head = "sequence_classification"
    architecture = "BertForSequenceClassification"
    weight_prefixes = ("classifier.",)
    output_names = ("logits",)

    def __init__(self, cfg: BertConfig, num_labels: int = 2, problem: str | None = None):
        super().__init__()
        self.config, self.num_labels = cfg, num_labels
        self.problem = problem or ("regression" if num_labels == 1 else "single_label")
        self.bert = BertModel(cfg)
        self.drop = Dropout(cfg.head_dropout)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)

    def outputs(self, h: Tensor, packed: Packed | None = None, attention_mask: Tensor | None = None
                ) -> dict[str, Tensor]:
        return {"logits": self.classifier(self.drop(self.bert.pool(h, packed, attention_mask)))}   # (B, num_labels)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                packed: Packed | None = None, position_ids=None) -> tuple[Tensor, Tensor | None]:
        logits = self.outputs(self.bert(input_ids, token_type_ids, attention_mask, position_ids, packed),
                              packed, attention_mask)["logits"]
        return logits, classification_loss(logits, labels, self.problem) if labels is not None else None


class BertForTokenClassification(Head):
    """A label per token: W h_i (NER). Labels of -100 (later sub-words, specials) are ignored."""

    head = "token_classification"
    architecture = "BertForTokenClassification"
    weight_prefixes = ("classifier.",)
    output_names = ("logits",)
    per_token = True

    def __init__(self, cfg: BertConfig, num_labels: int = 2):
        super().__init__()
        self.config, self.num_labels = cfg, num_labels
        self.bert = BertModel(cfg, add_pooler=False)
        self.drop = Dropout(cfg.head_dropout)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)

    def outputs(self, h: Tensor, packed: Packed | None = None, attention_mask: Tensor | None = None
                ) -> dict[str, Tensor]:
        return {"logits": self.classifier(self.drop(h))}                     # (B, T, num_labels) or (N, num_labels)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                packed: Packed | None = None, position_ids=None) -> tuple[Tensor, Tensor | None]:
        logits = self.outputs(self.bert(input_ids, token_type_ids, attention_mask, position_ids, packed))["logits"]
        return logits, classification_loss(logits, labels, "single_label") if labels is not None else None


class BertForQuestionAnswering(Head):
    """Extractive QA: a start and an end logit per token, S.h_i and E.h_i."""

    head = "question_answering"
    architecture = "BertForQuestionAnswering"
    weight_prefixes = ("qa.",)
    output_names = ("start_logits", "end_logits")
    per_token = True

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.bert = BertModel(cfg, add_pooler=False)
        self.qa = nn.Linear(cfg.hidden_size, 2)

    def outputs(self, h: Tensor, packed: Packed | None = None,
                attention_mask: Tensor | None = None) -> dict[str, Tensor]:
        start, end = self.qa(h).unbind(-1)                                   # (B, T) or (N,) each
        return {"start_logits": start, "end_logits": end}

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, start_positions=None,
                end_positions=None, position_ids=None, packed: Packed | None = None
                ) -> tuple[tuple[Tensor, Tensor], Tensor | None]:
        """Padded: (B, T) start and end logits. Packed: (N,) each; the softmax of the loss then
        runs over each window's own tokens (padded: over its padding too, as the reference does)."""
        out = self.outputs(self.bert(input_ids, token_type_ids, attention_mask, position_ids, packed))
        start, end = out["start_logits"], out["end_logits"]
        loss = None
        if start_positions is not None and end_positions is not None:
            s, e = start.float(), end.float()
            if packed is not None:                # (N,) -> (B, T), -inf outside each window
                s, e = unpack(s, packed, float("-inf")), unpack(e, packed, float("-inf"))
            T = s.shape[1]                        # positions outside the window are ignored
            loss = (F.cross_entropy(s, start_positions.clamp(0, T), ignore_index=T)
                    + F.cross_entropy(e, end_positions.clamp(0, T), ignore_index=T)) / 2
        return (start, end), loss


class BertForMultipleChoice(Head):
    """One score per (context, choice) pair from the pooled [CLS]; softmax over the K choices."""

    head = "multiple_choice"
    architecture = "BertForMultipleChoice"
    weight_prefixes = ("classifier.",)
    output_names = ("logits",)

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.bert = BertModel(cfg)
        self.drop = Dropout(cfg.head_dropout)
        self.classifier = nn.Linear(cfg.hidden_size, 1)

    def outputs(self, h: Tensor, packed: Packed | None = None, attention_mask: Tensor | None = None
                ) -> dict[str, Tensor]:
        """The score of each (context, choice) sequence: (B*K, 1)."""
        return {"logits": self.classifier(self.drop(self.bert.pool(h, packed, attention_mask)))}

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                position_ids=None) -> tuple[Tensor, Tensor | None]:
        B, K = input_ids.shape[:2]
        flat = lambda t: t.flatten(0, 1) if t is not None else None          # (B, K, T) -> (B*K, T)
        h = self.bert(flat(input_ids), flat(token_type_ids), flat(attention_mask), flat(position_ids))
        logits = self.outputs(h, None, flat(attention_mask))["logits"].view(B, K)      # (B, K)
        return logits, F.cross_entropy(logits.float(), labels) if labels is not None else None


HEADS = {cls.head: cls for cls in (BertForPreTraining, BertForMaskedLM, BertForSequenceClassification,
                                   BertForTokenClassification, BertForQuestionAnswering,
                                   BertForMultipleChoice)}


def init_weights(model: nn.Module, cfg: BertConfig) -> nn.Module:
    """normal(0, initializer_range) for weights, zeros for biases, ones for LayerNorm scales."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=cfg.initializer_range)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=cfg.initializer_range)
            if m.padding_idx is not None:
                m.weight.data[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, MaskedLMHead):
            nn.init.zeros_(m.bias)
    return model


@torch.no_grad()
def sinusoidal_positions_(table: torch.Tensor, std: float) -> torch.Tensor:
    """Fill a (positions, hidden) table in place with the Transformer's sin/cos encoding
    (Vaswani et al. 2017, section 3.5), scaled to `std` per entry so it sits beside the token
    embeddings as a normal init would."""
    n, d = table.shape
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq[: d // 2])
    table.copy_((pe * (std / pe.std())).to(table.dtype))
    return table


@torch.no_grad()
def neighbour_attention_(bert: "BertModel", gap: float = 6.0, offsets: tuple[int, ...] = (-1, 1, -2, 2)) -> None:
    """Start every head attending to one neighbour (head h of a layer at offsets[h], cycling): the
    position table becomes sin/cos pairs at frequencies spread evenly over (0, pi), so that
    p(i) . p(j) peaks at i = j (a Dirichlet kernel), and a head's key reads its share of the pairs
    while its query reads them rotated by its offset d, so that q_i . k_j peaks at j = i + d. `gap`:
    the attention logit at the neighbour minus the mean over the others, measured on the model's own
    embeddings. The small normal init stays on top; all of it is learned, and the checkpoint is a
    plain BERT. Why: an MLM head learns nothing from context until attention finds the neighbours
    (a [MASK] carries no information itself), and random heads take long to find them."""
    table, cfg = bert.embeddings.position.weight, bert.config
    n, C = table.shape
    H, D = cfg.num_heads, C // cfg.num_heads
    freq = (torch.arange(C // 2, dtype=torch.float64) + 0.5) * math.pi / (C // 2)       # (C/2,) in (0, pi)
    angle = torch.arange(n, dtype=torch.float64)[:, None] * freq                         # (n, C/2)
    pe = torch.stack([angle.sin(), angle.cos()], -1).flatten(1)                          # (n, C): pairs
    table.copy_(pe * (cfg.initializer_range / pe.std()))
    # the pairs each head reads (k = h, h + H, ...: every head spans the whole frequency range)
    pairs = [torch.arange(h, C // 2, H)[: D // 2] for h in range(H)]
    T = min(n, 128)
    i = torch.arange(T)
    words = bert.embeddings.word.weight[torch.randint(0, bert.embeddings.word.num_embeddings, (T,))]
    x = bert.embeddings.norm(words + table[:T] + bert.embeddings.segment.weight[0])     # (T, C) as layer 0 sees it
    for layer, block in enumerate(bert.blocks):
        attn = block.attn
        for h in range(H):
            d = offsets[(layer * H + h) % len(offsets)]
            k_rows = torch.zeros(D, C, dtype=torch.float64)
            q_rows = torch.zeros(D, C, dtype=torch.float64)
            for r, k in enumerate(pairs[h].tolist()):
                c, s = math.cos(d * freq[k].item()), math.sin(d * freq[k].item())
                k_rows[2 * r, 2 * k] = k_rows[2 * r + 1, 2 * k + 1] = 1.0
                # (sin, cos) at i -> at i + d: [[c, s], [-s, c]]
                q_rows[2 * r, 2 * k], q_rows[2 * r, 2 * k + 1] = c, s
                q_rows[2 * r + 1, 2 * k], q_rows[2 * r + 1, 2 * k + 1] = -s, c
            q = x.double() @ q_rows.T                                                    # (T, D)
            kk = x.double() @ k_rows.T
            logits = q @ kk.T / math.sqrt(D)                                             # (T, T)
            j = i + d
            ok = (j >= 0) & (j < T)
            measured = logits[i[ok], j[ok]].mean() - logits.mean()                      # at the neighbour
            scale = math.sqrt(max(gap / measured.item(), 0.0)) if measured > 0 else 1.0
            rows = slice(h * D, (h + 1) * D)
            attn.query.weight[rows] += (scale * q_rows).to(table.dtype)
            attn.key.weight[rows] += (scale * k_rows).to(table.dtype)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())         # tied weights once: parameters() skips repeats


__all__ = ["BertModel", "Head", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
           "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice", "HEADS",
           "init_weights", "neighbour_attention_", "num_parameters", "pool_tokens", "select_masked", "sinusoidal_positions_"]
