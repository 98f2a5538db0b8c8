"""Frozen-feature probes: a linear head on what a frozen encoder computes (`finetune --freeze`).

The paper's feature-based approach (section 5.4, Table 7: CoNLL-2003 dev F1 of BERT-base features
under a BiLSTM) compares which token states to read. The same choices, over every token (tagging)
or the [CLS] token (sentence tasks):

    embeddings        the embedding layer's output                                  (Table 7: 91.0)
    second_to_last    the second-to-last layer's output                             (95.6)
    last              the last layer's output                                       (94.9)
    sum_last_four     the last four layers, weighted by learned softmax weights     (95.9)
    concat_last_four  the last four layers concatenated: 4C features (the default)  (96.1; fine-tuning 96.4)
    sum_all           all L layers, weighted by learned softmax weights             (95.5)
    pooler            sentence tasks: tanh(W h_[CLS] + b), only from a checkpoint whose pooler was
                      pre-trained (NSP); an MLM-only checkpoint's pooler is random, so it is refused

`concat_last_N` / `sum_last_N` name other depths. Sentence tasks read the chosen states at the
[CLS] token (`pooling="cls"`, the paper's sentence-level output; the default), at the last real
token (`"last"`: the default for a causal model, whose [CLS] sees only itself) or averaged over the
input's tokens (`"mean"`; the [CLS] state of a model pre-trained without NSP has no sentence-level
objective behind it; the default for `embeddings`, whose [CLS] vector is constant). The encoder never trains: no gradients, and it
stays in eval mode (no dropout) while the head trains. A probe checkpoint is the encoder's weights
unchanged plus `classifier.weight` / `classifier.bias` (and `classifier.layer_weights` for the
weighted sums), with `bertkit_probe` in config.json; `bertkit.load_model` rebuilds it. transformers
cannot run it as the head it names (it would read the pooler, not these features).
"""
from __future__ import annotations

import re
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import BertkitError
from .model import BertModel, Head, classification_loss, pool_tokens

POOLINGS = ("cls", "last", "mean")
FEATURES = ("embeddings", "second_to_last", "last", "sum_last_four", "concat_last_four", "sum_all", "pooler")
DEFAULT_FEATURES = "concat_last_four"
_LAST_N = re.compile(r"^(concat|sum)_last_(\d+|four)$")
PROBE_HEADS = ("sequence_classification", "token_classification")


def probe_layers(features: str, num_layers: int) -> tuple[str, list[int]]:
    """(how to combine, which states) for a feature choice: 'concat', 'sum' or 'pooler', and
    indices into the encoder's L+1 states (0 = embeddings, L = last layer)."""
    L = num_layers
    if features == "second_to_last" and L < 2:
        raise BertkitError(f"probe features second_to_last need 2 or more layers; the model has {L}")
    named = {"embeddings": ("concat", [0]), "second_to_last": ("concat", [L - 1]), "last": ("concat", [L]),
             "sum_all": ("sum", list(range(1, L + 1))), "pooler": ("pooler", [L])}
    if features in named:
        return named[features]
    m = _LAST_N.match(features)
    if m is None:
        raise BertkitError(f"probe features {features!r}: choose from {', '.join(FEATURES)} "
                           f"(or concat_last_N / sum_last_N)")
    n = 4 if m.group(2) == "four" else int(m.group(2))
    if not 1 <= n <= L:
        raise BertkitError(f"probe features {features}: the model has {L} layer{'s' * (L != 1)}, not {n}; "
                           f"choose fewer (e.g. last, or {m.group(1)}_last_{L})")
    return m.group(1), list(range(L - n + 1, L + 1))


class ProbeHead(nn.Module):
    """logits = W dropout(x) + b, where x is the chosen states concatenated or, with
    layer_weights, their softmax(layer_weights)-weighted sum (ELMo's scalar mix)."""

    def __init__(self, width: int, num_labels: int, mix: int, dropout: float, std: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_labels, width).normal_(0.0, std))
        self.bias = nn.Parameter(torch.zeros(num_labels))
        self.layer_weights = nn.Parameter(torch.zeros(mix)) if mix else None
        self.drop = nn.Dropout(dropout)

    def forward(self, states: Sequence[Tensor]) -> Tensor:
        if self.layer_weights is None:
            x = torch.cat(list(states), dim=-1)                                # (..., K*C)
        else:
            w = self.layer_weights.softmax(0)
            x = sum(wk * h for wk, h in zip(w, states))                        # (..., C)
        return F.linear(self.drop(x), self.weight, self.bias)


class ProbeModel(Head):
    """A classification or tagging head on chosen states of a frozen `BertModel` (module doc)."""

    all_layers = True           # `outputs` reads the encoder's L+1 states
    output_names = ("logits",)  # either kind; its checkpoint names the head it stands for (self.head)

    def __init__(self, encoder: BertModel, head: str, num_labels: int, features: str = DEFAULT_FEATURES,
                 problem: str | None = None, pooling: str | None = None):
        super().__init__()
        if head not in PROBE_HEADS:
            raise BertkitError(f"a frozen-feature probe needs a classification or tagging task, not {head}")
        cfg = encoder.config
        self.config, self.head, self.num_labels, self.features = cfg, head, num_labels, features
        self.per_token = head == "token_classification"
        self.problem = (problem or ("regression" if num_labels == 1 else "single_label")
                        if head == "sequence_classification" else "single_label")
        self.combine, self.layers = probe_layers(features, cfg.num_layers)
        self.pooling = check_pooling(head, features, pooling, cfg.causal)
        if self.combine == "pooler":
            if head != "sequence_classification":
                raise BertkitError("probe features 'pooler' are for sentence tasks; tagging reads token states")
            if encoder.pooler is None:
                raise BertkitError("probe features 'pooler': the checkpoint has no pre-trained pooler (an MLM-only "
                                   "model); a frozen random pooler is not a feature. Use concat_last_four or last")
        self.bert = encoder.requires_grad_(False)
        width = cfg.hidden_size * (len(self.layers) if self.combine == "concat" else 1)
        self.classifier = ProbeHead(width, num_labels, len(self.layers) if self.combine == "sum" else 0,
                                    cfg.head_dropout, cfg.initializer_range)

    def train(self, mode: bool = True) -> "ProbeModel":
        super().train(mode)
        self.bert.eval()                                   # frozen: never dropout in the encoder
        return self

    def record(self) -> dict:
        """config.json's `bertkit_probe`."""
        rec = {"features": self.features, "combine": self.combine, "layers": self.layers}
        return rec if self.pooling is None else {**rec, "pooling": self.pooling}

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None, packed=None,
                position_ids=None) -> tuple[Tensor, Tensor | None]:
        """Padded: (B, num_labels) or (B, T, num_labels) logits. Packed: (B, ...) or (N, ...)."""
        with torch.no_grad():
            states = self.bert(input_ids, token_type_ids, attention_mask, position_ids, packed, all_layers=True)
        logits = self.outputs(states, packed, attention_mask)["logits"]
        return logits, None if labels is None else classification_loss(logits, labels, self.problem)

    def outputs(self, states: Sequence[Tensor], packed=None, attention_mask: Tensor | None = None
                ) -> dict[str, Tensor]:
        """The head on the encoder's L+1 states (`BertModel(..., all_layers=True)`)."""
        with torch.no_grad():
            if self.combine == "pooler":
                chosen = [self.bert.pool(states[-1], packed, attention_mask)]  # (B, C)
            else:
                chosen = [states[i] for i in self.layers]                      # (..., C) each
                if self.head == "sequence_classification":                     # one vector per input: (B, C)
                    chosen = [pool_tokens(h, self.pooling, packed, attention_mask) for h in chosen]
        return {"logits": self.classifier(chosen)}


def check_pooling(head: str, features: str, pooling: str | None, causal: bool = False) -> str | None:
    """A sentence probe's pooling: 'cls' by default, 'last' on a causal model, 'mean' for the
    embeddings (the [CLS] token's embedding is the same vector for every input); None for tagging
    and the pooler."""
    if head != "sequence_classification" or features == "pooler":
        if pooling is not None:
            raise BertkitError(f"probe pooling {pooling!r} applies to sentence tasks over token states, not to "
                               f"{'the pooler' if features == 'pooler' else 'tagging'}")
        return None
    pooling = pooling or ("mean" if features == "embeddings" else "last" if causal else "cls")
    if pooling not in POOLINGS:
        raise BertkitError(f"probe pooling {pooling!r}: choose cls, last or mean")
    if pooling in ("cls", "last") and features == "embeddings":
        raise BertkitError("probe features 'embeddings' at one token are the same vector for every input "
                           "at that position; use probe pooling mean")
    if pooling == "cls" and causal:
        raise BertkitError("probe pooling cls on a causal model: its [CLS] sees only itself; use last or mean")
    return pooling
