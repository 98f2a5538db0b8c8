"""bertkit: BERT (Devlin et al., 2019) end to end, in PyTorch."""
from .config import BertConfig, PRESETS, preset
from .tokenizer import Tokenizer, Encoding
from .checkpoint import load_model, save_model, CheckpointError
from .model import (BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification,
                    BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice)

__version__ = "0.1.0"

__all__ = ["BertConfig", "PRESETS", "preset", "Tokenizer", "Encoding", "load_model", "save_model",
           "CheckpointError", "BertModel", "BertForPreTraining", "BertForMaskedLM",
           "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
           "BertForMultipleChoice", "load_tokenizer"]


def load_tokenizer(path) -> Tokenizer:
    """The tokenizer of a checkpoint or tokenizer folder (vocab.txt or tokenizer.json)."""
    return Tokenizer.from_dir(path)
