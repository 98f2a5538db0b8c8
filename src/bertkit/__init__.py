"""bertkit: BERT (Devlin et al., 2019) end to end, in PyTorch.

The names below are imported on first use (PEP 562), so commands that need no torch (prepare,
tokenizer, data) start in a fraction of a second; `from bertkit import BertModel` works as before.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "BertConfig": "config", "PRESETS": "config", "preset": "config",
    "Tokenizer": "tokenizer", "Encoding": "tokenizer",
    "load_model": "checkpoint", "save_model": "checkpoint", "CheckpointError": "checkpoint",
    "BertModel": "model", "BertForPreTraining": "model", "BertForMaskedLM": "model",
    "BertForSequenceClassification": "model", "BertForTokenClassification": "model",
    "BertForQuestionAnswering": "model", "BertForMultipleChoice": "model",
}

__all__ = [*_EXPORTS, "load_tokenizer"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    try:                                   # `bertkit.model` etc. without importing them first
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError:
        raise AttributeError(f"module 'bertkit' has no attribute {name!r}") from None


def load_tokenizer(path):
    """The tokenizer of a checkpoint or tokenizer folder (vocab.txt or tokenizer.json)."""
    from .tokenizer import Tokenizer
    return Tokenizer.from_dir(path)
