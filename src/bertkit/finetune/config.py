"""`FinetuneConfig`: the settings of `bertkit finetune` (and of `probe`'s and ablate's fine-tuning
runs), values only. The flag, the YAML key and the attribute are one name (`bertkit.cliconfig`);
choices are `Literal` types and ranges `Annotated[..., Rule]` on the fields (`runconfig.check_fields`;
a limit of None uses all the examples: 0 or a negative number is an error, not "no limit")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch

from ..errors import BertkitError
from ..probe import DEFAULT_FEATURES, probe_layers
from ..runconfig import (AT_LEAST_1, HALF_OPEN_UNIT, NON_NEGATIVE, POSITIVE, PROBABILITY, SEED, THREADS,
                         check_fields)
from ..tasks import SkipBadRows, get_task
from ..tasks.plumbing import CUSTOM, Columns


@dataclass
class FinetuneConfig(Columns, SkipBadRows):
    task: str = "sst2"
    """Task name (sst2, mrpc, stsb, cola, qqp, mnli, mnli-mm, qnli, rte, wnli, conll2003, squad,
    squad2, swag) or your own data: classify, regress, tokens (see the *_column fields); or
    embedding: sentence embeddings trained by contrast, a bi-encoder (see the embedding_* fields)."""
    model: str = ""
    """Pre-trained checkpoint folder (Hugging Face format; its tokenizer is used)."""
    out: str = "runs/finetune"
    """Output folder: the best checkpoint on dev, with its tokenizer, run card and metrics."""
    data: str | None = None
    """Folder with the task's files as distributed (train.tsv, dev.tsv, ... or .gz) or as tables
    (train.parquet, validation.jsonl, ...), or a dataset name NAME:CONFIG as datasets.load_dataset
    takes it (e.g. nyu-mll/glue:sst2)."""
    train_file: str | None = None
    """Training file (overrides `data`)."""
    dev_file: str | None = None
    """Dev file used to pick the best checkpoint (overrides `data`); none = keep the last."""
    init: Literal["pretrained", "random"] = "pretrained"
    """'pretrained' (the checkpoint's weights) or 'random' (same shape, freshly initialised: a baseline)."""
    max_length: Annotated[int | None, AT_LEAST_1] = None
    """Tokens per input window (None = the task's default: 128, or 384 for SQuAD)."""
    stride: Annotated[int | None, AT_LEAST_1] = None
    """Long inputs are read in windows: the overlap between windows (tokens; capped at half a
    window), or SQuAD's doc stride (the step between window starts). None = the task's default."""
    windows: bool | None = None
    """Sentence(-pair) classification and regression: read inputs longer than max_length in
    overlapping windows whose logits are averaged (True), or cut them by longest-first truncation
    as the paper and run_classifier.py do (False). None = truncation unless a stride is given.
    Tagging and SQuAD always read long inputs in windows."""
    batch_size: Annotated[int, AT_LEAST_1] = 32
    """Training examples (or windows) per update."""
    lr: Annotated[float, POSITIVE] = 5e-5
    """Peak learning rate (the paper's grid: 5e-5, 3e-5, 2e-5)."""
    epochs: Annotated[float, POSITIVE] = 3.0
    """Passes over the training data (a fraction stops part-way)."""
    warmup: Annotated[float, NON_NEGATIVE] = 0.1
    """Warm-up as a fraction of the updates (< 1) or a number of updates."""
    weight_decay: Annotated[float, NON_NEGATIVE] = 0.01
    """Decoupled weight decay (not on biases and LayerNorm weights)."""
    layer_lr_decay: Annotated[float, HALF_OPEN_UNIT] = 1.0
    """Layer-wise learning-rate decay (as ELECTRA fine-tunes): the task head, pooler and top
    LayerNorm train at lr, block l of L at lr x decay^(L+1-l), the embeddings at lr x decay^(L+1),
    so the lower layers' pre-trained features move least. 1.0 = one rate for all (the paper)."""
    optimizer: Literal["adamw", "adamw_google", "lamb"] = "adamw"
    """'adamw', 'adamw_google' (no bias correction, eps 1e-6) or 'lamb'."""
    clip_norm: Annotated[float, NON_NEGATIVE] = 1.0
    """Global gradient-norm clipping (0 = off)."""
    seed: Annotated[int, SEED] = 0
    """Seeds the head's initialisation, the data order and dropout."""
    train_limit: Annotated[int | None, AT_LEAST_1] = None
    """Use only the first N >= 1 training examples (for CPU budgets; say so when reporting); None = all."""
    dev_limit: Annotated[int | None, AT_LEAST_1] = None
    """Use only the first N >= 1 dev examples; None = all."""
    eval_every: Annotated[int, NON_NEGATIVE] = 0
    """Also evaluate every N updates (0 = at epoch ends only)."""
    freeze: bool = False
    """Frozen-feature probe: only a linear head trains, on `probe_features` of the frozen encoder."""
    probe_features: str | None = None
    """With freeze: embeddings, second_to_last, last, sum_last_four, concat_last_four (default:
    the paper's best, Table 7), sum_all, or pooler (sentence tasks, pre-trained pooler only);
    concat_last_N / sum_last_N for other depths (`bertkit.probe`)."""
    probe_pooling: Literal["cls", "last", "mean"] | None = None
    """With freeze, sentence tasks: read the features at [CLS] ('cls', the default), at the last
    real token ('last', the default on a causal model) or averaged over the tokens ('mean', the
    default for embeddings, whose [CLS] vector is constant)."""
    dropout: Annotated[float | None, PROBABILITY] = None
    """Dropout while fine-tuning, on the embeddings, each residual branch, the attention
    probabilities and before the head (the paper: 0.1). None = the checkpoint's (config.json's
    hidden/attention/classifier dropout; a model pre-trained with dropout off, as the CPU recipes
    are, then fine-tunes without it: give 0.1 to fine-tune as the paper does)."""
    pooling: Literal["cls", "mean"] | None = None
    """Sentence(-pair) and multiple-choice heads: what the pooler reads, the [CLS] state ('cls',
    BERT's and the Hugging Face layout) or the mean over the tokens ('mean'; bertkit only: it
    serves a model pre-trained without a sentence objective, whose [CLS] state learned nothing of
    its own). None = the checkpoint's (config.json's classifier_pooling; 'cls' when absent).
    Task embedding: the sentence vector, the mean over the tokens (None: the default) or [CLS]."""
    embedding_columns: str | None = None
    """Task embedding: the columns to read, comma-separated: anchor,positive[,negative], or
    sentence1,sentence2,score (a numeric third column is a score). None = by name (anchor /
    positive / negative, sentence1 / sentence2 / score, query, question / context, ...), else the
    first text columns in order. A SQuAD file gives (question, paragraph) pairs."""
    embedding_loss: Literal["mnrl", "cosent", "cosine"] | None = None
    """Task embedding: 'mnrl' (in-batch negatives: sentence-transformers' MultipleNegativesRankingLoss),
    'cosent' or 'cosine' (scored pairs: CoSENTLoss, CosineSimilarityLoss). None = mnrl for pairs and
    triplets, cosent for scored pairs."""
    embedding_scale: Annotated[float, POSITIVE] = 20.0
    """Task embedding: what mnrl and cosent multiply cosines by, 1 / temperature (20: temperature 0.05)."""
    packed: bool = True
    """Padding-free training batches (`bertkit.packing.pack`) on heads that accept them (evaluation
    runs through `infer.Predictor`, always padding-free)."""
    threads: Annotated[int, THREADS] = 0
    """torch CPU threads (0 = default)."""
    device: str = "auto"
    """'auto' (cuda when available, else cpu), 'cpu', 'cuda', 'cuda:1', ..."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Autocast dtype of the training steps (weights, optimizer and dev evaluation stay fp32):
    'auto' = bf16 on a GPU that has it and on a CPU where a bf16 GEMM of the model's shape is
    measured faster than fp32 (AMX, AVX-512 BF16), fp32 elsewhere (`hardware.choose_precision`)."""
    attention: Literal["auto", "sdpa", "math"] = "auto"
    """What computes attention while training, as pre-training's `train.attention`: 'sdpa', 'math' (the
    formula written out, `packing.attention`) or 'auto' (SDPA, except on a CPU where the formula is
    measured faster, once per machine). With `precision`, what gives the same numbers on every machine."""
    deterministic: bool = False
    """On a GPU, torch's deterministic algorithms (`hardware.deterministic`): the same command gives the
    same model bit for bit, at some cost in speed. Off, two GPU runs differ (GPU atomics). The CPU path
    is deterministic either way."""
    log_every: Annotated[int, AT_LEAST_1] = 20
    """Log the training loss every N updates."""
    progress: bool = True
    """Show a progress bar."""
    eval_batch_size: Annotated[int, AT_LEAST_1] = 64
    """Examples per batch when evaluating on dev."""

    def __post_init__(self) -> None:
        check_fields(self)                          # the choices and ranges on the fields
        if self.task not in (*CUSTOM, "embedding"):
            get_task(self.task)                     # an unknown name: one line with the known ones
        check_device_name(self.device)
        if self.freeze and self.pooling is not None:
            raise BertkitError("pooling chooses what a fine-tuned head's pooler reads; a frozen probe "
                               "takes probe_pooling")
        if (self.probe_features, self.probe_pooling) != (None, None) and not self.freeze:
            raise BertkitError("probe_features / probe_pooling choose a frozen probe's features: give freeze too "
                               "(--freeze)")
        if self.probe_features is not None:
            probe_layers(self.probe_features, 10 ** 6)          # the name only; depth is checked on the model

    @property
    def features(self) -> str | None:
        """The probe's feature choice (None: full fine-tuning)."""
        if not self.freeze:
            return None
        return self.probe_features if self.probe_features is not None else DEFAULT_FEATURES


def check_device_name(device: str) -> None:
    """'auto', 'cpu', 'cuda', 'cuda:N' or 'mps' (whether this machine has it is checked when the run starts)."""
    try:
        ok = device == "auto" or torch.device(device).type in ("cpu", "cuda", "mps")
    except (RuntimeError, ValueError, TypeError):
        ok = False
    if not ok:
        raise BertkitError(f"device {device!r} is not auto, cpu, cuda, cuda:N or mps")
