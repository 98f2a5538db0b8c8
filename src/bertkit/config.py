"""BertConfig: the architecture as a typed dataclass, read from and written to HF `config.json`.

Only the fields that change the computation live here. Hugging Face keys that do not
(`use_cache`, `gradient_checkpointing`, ...) are kept in `extra` so a round trip loses nothing.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import BertkitError

ACTIVATIONS = ("gelu", "gelu_python", "gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_fast",
               "gelu_accurate", "gelu_10", "quick_gelu", "relu", "relu2", "relu6", "leaky_relu", "silu", "swish",
               "mish", "hardswish", "tanh", "sigmoid", "linear", "laplace")


class ConfigError(BertkitError, ValueError):
    """A configuration value or key is wrong; the message names it."""


BERTKIT_MODEL_TYPE = "bertkit"
"""config.json's model_type for an architecture transformers' BERT does not compute (`bertkit_only`)."""

# config.json's key -> BertConfig's field, in the order config.json lists them
_HF_FIELDS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
    "intermediate_size": "intermediate_size", "hidden_act": "hidden_act",
    "hidden_dropout_prob": "hidden_dropout", "attention_probs_dropout_prob": "attention_dropout",
    "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
    "layer_norm_eps": "layer_norm_eps", "initializer_range": "initializer_range",
    "pad_token_id": "pad_token_id", "position_embedding_type": "position_embedding_type",
    "classifier_dropout": "classifier_dropout",
}


def architecture_name(name: Any, bertkit_only: bool) -> Any:
    """transformers' class name ('BertForMaskedLM') <-> bertkit's for a model only bertkit computes
    ('BertkitForMaskedLM'); other names as they are."""
    if not isinstance(name, str):
        return name
    plain = "Bert" + name[len("Bertkit"):] if name.startswith("Bertkit") else name
    return "Bertkit" + plain[len("Bert"):] if bertkit_only and plain.startswith("Bert") else plain


@dataclass
class BertConfig:
    vocab_size: int = 30522
    """Rows of the word-embedding table (= WordPiece vocabulary size)."""
    hidden_size: int = 768
    """Width C of every token state."""
    num_layers: int = 12
    """Number of encoder blocks L."""
    num_heads: int = 12
    """Attention heads A; hidden_size must be divisible by it."""
    intermediate_size: int = 3072
    """Width of the feed-forward layer (4C in the paper)."""
    hidden_act: str = "gelu"
    """Feed-forward activation: 'gelu' (exact erf), 'gelu_new' (tanh approximation), 'relu', ..."""
    hidden_dropout: float = 0.1
    """Dropout on embeddings and on each residual branch."""
    attention_dropout: float = 0.1
    """Dropout on attention probabilities."""
    max_position_embeddings: int = 512
    """Longest sequence the position table covers."""
    type_vocab_size: int = 2
    """Number of segment (token type) ids."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon."""
    initializer_range: float = 0.02
    """Std of the normal initialisation of weights."""
    pad_token_id: int = 0
    """Id of [PAD]; its embedding row starts at zero."""
    causal: bool = False
    """Attention pattern: False = bidirectional (BERT), True = causal (left-to-right, for comparison)."""
    norm_position: str = "post"
    """LayerNorm placement: 'post' (BERT, x = norm(x + f(x)); the Hugging Face layout) or 'pre'
    (x = x + f(norm(x)), a final LayerNorm after the last block; later stacks use it for stability).
    Pre-LN checkpoints load in bertkit only: transformers' BertModel is post-LN."""
    position_embedding_type: str = "absolute"
    """Where order comes from: 'absolute' (BERT: a learned position table added to the embeddings)
    or 'alibi' (Press et al. 2022, as MosaicBERT: no table; each head's attention score falls by
    slope_h * |i - j|, slopes 1, 1/2, 1/4, ...). ALiBi checkpoints load in bertkit only."""
    classifier_dropout: float | None = None
    """Dropout before task heads; None = hidden_dropout (as in Hugging Face)."""
    classifier_pooling: str = "cls"
    """What the pooler (dense + tanh) of sentence heads and NSP reads: 'cls' (BERT: the [CLS] state;
    the Hugging Face layout) or 'mean' (the mean over the sequence's tokens, as ModernBERT's
    classifier_pooling; bertkit only: transformers' BertModel pools [CLS])."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Hugging Face config keys that do not change the computation (kept for the round trip)."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.norm_position not in ("post", "pre"):
            raise ConfigError(f"norm_position {self.norm_position!r}: expected 'post' or 'pre'")
        if self.position_embedding_type not in ("absolute", "alibi"):
            raise ConfigError(f"position_embedding_type {self.position_embedding_type!r}: expected 'absolute' "
                              "or 'alibi' (bertkit does not implement transformers' relative_key variants)")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ConfigError(f"classifier_pooling {self.classifier_pooling!r}: expected 'cls' or 'mean'")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported; use one of {ACTIVATIONS}")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def head_dropout(self) -> float:
        """The dropout before task heads: classifier_dropout, else hidden_dropout."""
        return self.classifier_dropout if self.classifier_dropout is not None else self.hidden_dropout

    @property
    def bertkit_only(self) -> list[str]:
        """What of this architecture transformers' BERT classes would not compute (and would load
        without a word): [] for plain BERT. Such a checkpoint is saved as model_type 'bertkit'."""
        return [what for what, differs in (
            ("pre-LN (norm_position 'pre')", self.norm_position != "post"),
            ("ALiBi positions", self.position_embedding_type != "absolute"),
            ("causal attention", self.causal),
            ("mean pooling (classifier_pooling 'mean')", self.classifier_pooling != "cls")) if differs]

    # ---- Hugging Face config.json ------------------------------------------------------------
    def to_hf_dict(self, architectures: list[str] | None = None, **more: Any) -> dict[str, Any]:
        """config.json's keys. A plain BERT says model_type 'bert' and names transformers' class;
        one with `bertkit_only` features says 'bertkit' and names bertkit's (BertkitForMaskedLM, ...),
        so that transformers' AutoConfig / AutoModel / pipeline refuse it instead of computing
        something else, and says why in `bertkit_only`."""
        d: dict[str, Any] = dict(self.extra)
        only = self.bertkit_only
        d.update({"model_type": BERTKIT_MODEL_TYPE if only else "bert",
                  **{key: getattr(self, name) for key, name in _HF_FIELDS.items()}})
        differs = {"bertkit_causal": True if self.causal else None,       # keys present only where not BERT's
                   "bertkit_norm_position": None if self.norm_position == "post" else self.norm_position,
                   "classifier_pooling": None if self.classifier_pooling == "cls" else self.classifier_pooling,
                   "bertkit_only": f"{', '.join(only)}: transformers' BERT would compute something else; "
                                   "load it with bertkit" if only else None}
        for key, value in differs.items():
            if value is None:
                d.pop(key, None)
            else:
                d[key] = value
        archs = architectures or d.get("architectures")
        if isinstance(archs, list):
            d["architectures"] = [architecture_name(a, bool(only)) for a in archs]
        d.update(more)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> "BertConfig":
        if d.get("model_type", "bert") not in ("bert", BERTKIT_MODEL_TYPE):
            raise ConfigError(f"{source}: model_type is {d.get('model_type')!r}, bertkit loads 'bert' models "
                              f"(and its own '{BERTKIT_MODEL_TYPE}')")
        pet = d.get("position_embedding_type", "absolute")
        if pet not in (None, "absolute", "alibi"):
            raise ConfigError(f"{source}: position_embedding_type {pet!r} is not supported (only 'absolute', "
                              "or bertkit's 'alibi')")
        if d.get("is_decoder") or d.get("add_cross_attention"):
            raise ConfigError(f"{source}: decoder / cross-attention BERT variants are not supported")
        mapping = {**_HF_FIELDS, "classifier_pooling": "classifier_pooling"}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in d.items():
            if k in mapping:
                if v is not None or k == "classifier_dropout":      # position_embedding_type null: absolute
                    kwargs[mapping[k]] = v
            elif k == "bertkit_causal":
                kwargs["causal"] = bool(v)
            elif k == "bertkit_norm_position":
                kwargs["norm_position"] = v
            elif k not in ("model_type", "bertkit_only"):      # both follow from the architecture
                extra[k] = v
        if isinstance(kwargs.get("hidden_act"), str):
            kwargs["hidden_act"] = kwargs["hidden_act"].lower()
        elif "hidden_act" in kwargs:
            raise ConfigError(f"{source}: hidden_act must be a string, got {kwargs['hidden_act']!r}")
        try:
            return cls(**kwargs, extra=extra)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    def replace(self, **changes: Any) -> "BertConfig":
        known = {f.name for f in fields(self)}
        for k in changes:
            if k not in known:
                hint = difflib.get_close_matches(k, known, n=1)
                raise ConfigError(f"unknown BertConfig field {k!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
        return dataclasses.replace(self, **changes)


# The paper's sizes (Devlin et al. 2019) and the small ones of Turc et al. 2019: layers/hidden/heads,
# intermediate = 4 x hidden.
PRESETS: dict[str, dict[str, int]] = {
    "tiny":   dict(num_layers=2,  hidden_size=128,  num_heads=2,  intermediate_size=512),
    "mini":   dict(num_layers=4,  hidden_size=256,  num_heads=4,  intermediate_size=1024),
    "small":  dict(num_layers=4,  hidden_size=512,  num_heads=8,  intermediate_size=2048),
    "medium": dict(num_layers=8,  hidden_size=512,  num_heads=8,  intermediate_size=2048),
    "base":   dict(num_layers=12, hidden_size=768,  num_heads=12, intermediate_size=3072),
    "large":  dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096),
}
SHAPE = tuple(PRESETS["base"])          # the fields a size preset sets


def preset(name: str, **overrides: Any) -> BertConfig:
    """A BertConfig for one of PRESETS, with any field overridden."""
    if name not in PRESETS:
        hint = difflib.get_close_matches(name, PRESETS, n=1)
        raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}"
                          + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    return BertConfig(**{**PRESETS[name], **overrides})
