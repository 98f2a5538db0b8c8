"""Fine-tuning tasks: each one is a handful of plain functions, collected in one table.

A task turns files into examples, examples into model features, and the head's outputs back
into predictions and metrics. The fine-tuning loop (`bertkit.finetune`) and the commands
`finetune / evaluate / predict` only ever talk to a task through this `Task` record (and what they
share around it, which task, strides, features, scores, is `bertkit.tasks.plumbing`):

    examples = task.read(path, bad)                 # list of examples, each with an `.id` (str)
    labels   = task.labels(train_examples)          # label names from the training data, or None
    feats    = task.featurize(examples, tokenizer, labels, max_length=.., stride=.., train=..)
    batch    = task.collate(feats[i:j])             # dict of tensors: model kwargs + targets
    outputs  = [...]                                # one numpy output per feature (see below)
    preds    = task.postprocess(outputs, feats, examples, labels)   # {example id: prediction}
    scores   = task.metrics(preds, examples)        # {"accuracy": .., "f1": ..}; main_metric picks one

Contracts
---------
* ``read(path, bad)``: reads the file as distributed (plain or ``.gz``). Every problem in the
  data is reported through ``bad(path, line, message)`` (a `BadRows`): by default it raises a
  `DataError` naming ``file:line`` (or the id); with ``--skip-bad-rows`` it counts and skips.
  An empty file (no examples) is always a `DataError`.
* Examples are the task's own dataclasses; all have ``id: str`` (the id column, or the 0-based
  index of the data row, header excluded; for CoNLL the index of the sentence) and, when the
  file carries references, whatever `metrics` needs (``label``, ``tags``, ``answers``, ...).
* ``labels(examples)``: the sorted label names seen in training data (saved with the model as
  ``id2label``); None for regression, QA and multiple choice. At evaluation an example whose
  label is not in the saved list is a `DataError` (`check_labels`).
* ``featurize(...)`` returns a list of plain dicts, one per model input window, each with
  ``input_ids`` and ``token_type_ids`` (lists of ints; for multiple choice a list of K lists),
  ``example_index`` (position in `examples`; several windows may share it: sliding windows for
  long documents), targets when the examples carry them (``labels`` - an int, a float or a
  per-token list with -100 for ignored positions -, or ``start_positions``/``end_positions``),
  and any bookkeeping postprocess needs (``word_ids``, ``offsets``, ...).
* ``collate(features)`` pads to the longest feature: the model's keyword arguments
  (``input_ids``, ``token_type_ids``, ``attention_mask``) and targets. `collate` below does
  this for every head.
* Model outputs handed to ``postprocess`` are one numpy array per feature, trimmed to the
  feature's real length: sequence classification ``(num_labels,)`` (regression ``(1,)``),
  token classification ``(T, num_labels)``, question answering a pair ``(start (T,), end (T,))``,
  multiple choice ``(K,)``.
* ``postprocess`` returns ``{example id: prediction}``; a prediction is what `bertkit score`
  reads in its ``{"id", "prediction"}`` JSONL lines: a label name, a float (regression), a
  list of tags (NER), an answer string (SQuAD), a choice index (SWAG).
* ``metrics(predictions, examples)`` computes the official metrics with `bertkit.tasks.metrics`.
* ``parse(obj, where)``: one JSON object of `bertkit predict` input -> an example (no reference
  needed), e.g. ``{"text": .., "text_pair": ..}``, ``{"tokens": [..]}``, ``{"question", "context"}``.

The table `TASKS` maps a task name to the module and attribute holding its `Task` (imported
only when used, like the CLI's command table). Tasks built from options (your own CSV/JSONL
columns) come from `bertkit.tasks.custom.custom_task(...)`.
"""
from __future__ import annotations

import difflib
import importlib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..errors import BertkitError, DataError
from ..sources import dataset_name, is_saved_dataset, is_table_file, open_text

log = logging.getLogger("bertkit")


@dataclass
class Task:
    name: str
    """Short name used on the command line (``sst2``, ``conll2003``, ``squad``, ...)."""
    head: str
    """Checkpoint head: sequence_classification, token_classification, question_answering, multiple_choice."""
    read: Callable[..., list]
    """read(path, bad: BadRows) -> examples."""
    featurize: Callable[..., list[dict]]
    """featurize(examples, tokenizer, labels, max_length=128, stride=None, train=False) -> features."""
    postprocess: Callable[..., dict]
    """postprocess(outputs, features, examples, labels) -> {id: prediction}."""
    metrics: Callable[[dict, list], dict]
    """metrics(predictions, examples) -> {name: value}."""
    main_metric: str
    """The metric the best checkpoint is chosen by (higher is better)."""
    labels: Callable[[list], list[str] | None] = lambda examples: None
    """Label names from training examples (None: regression / QA / multiple choice)."""
    parse: Callable[[dict, str], Any] | None = None
    """parse(json_object, where) -> example, for `bertkit predict` input."""
    collate: Callable[[list[dict]], dict] = None  # type: ignore[assignment]  (set in __post_init__)
    """Features -> padded tensors; default `collate`."""
    files: dict[str, str] = field(default_factory=lambda: {"train": "train.tsv", "dev": "dev.tsv"})
    """File name of each split inside a data folder (a ``.gz`` next to it is found too)."""
    problem: str | None = None
    """For sequence classification: 'single_label' or 'regression'."""
    max_length: int = 128
    """Default maximum sequence length."""
    stride: int | None = None
    """Default overlap (tokens) between sliding windows of long inputs; None = no windows."""
    packed: bool = True
    """Whether the head accepts padding-free packed batches (`bertkit.packing.pack`)."""
    description: str = ""

    def __post_init__(self) -> None:
        if self.collate is None:
            self.collate = collate
        if not getattr(self.read, "reads_tables", False):
            self.read = _reading_tables(self, self.read)

    def head_args(self, labels: Sequence[str] | None) -> dict:
        """Keyword arguments that build this task's head (`bertkit.checkpoint.load_model`)."""
        if self.head == "sequence_classification":
            if self.problem == "regression":
                return {"num_labels": 1, "problem": "regression"}
            return {"num_labels": len(labels or ()), "problem": self.problem or "single_label"}
        if self.head == "token_classification":
            return {"num_labels": len(labels or ())}
        return {}

    def split_path(self, data: str | Path, split: str) -> Path:
        """The file of `split` ('train', 'dev', ...) in a data folder, or `data` itself if it is a file.

        Also: a dataset name (``nyu-mll/glue:sst2`` -> ``nyu-mll/glue:sst2:validation`` for dev; one
        that names its split is used as is) and a split stored as a table in the folder
        (``validation.parquet``, ``train-*.parquet``, a save_to_disk folder): `bertkit.tasks.tables`."""
        from .tables import find_split, hub_split, reads

        named = dataset_name(data) if reads(self) else None
        if named is not None:
            return Path(str(named if named.split else named.with_split(hub_split(self, split))))
        if reads(self) and is_table_file(data) and any(c in str(data) for c in "*?["):
            return Path(data)                    # a glob of table files (train-*.parquet) reads as one split
        data = Path(data)
        if data.is_file() or (reads(self) and is_saved_dataset(data)):
            return data
        name = self.files.get(split)
        if name is None:
            raise DataError(f"task {self.name} has no {split!r} split; it knows {', '.join(self.files)}")
        for candidate in (data / name, data / (name + ".gz")):
            if candidate.is_file():
                return candidate
        if not data.exists():
            raise DataError(f"{data}: no such file or directory")
        table = find_split(self, data, split) if data.is_dir() else None
        if table is not None:
            return table
        also = f" or {hub_split(self, split)}.parquet/.jsonl/..." if reads(self) else ""
        raise DataError(f"{data}: no {name} (or {name}.gz{also}) for the {split} split of {self.name}")


def _reading_tables(task: "Task", read_file: Callable[..., list]) -> Callable[..., list]:
    """`task.read` that also takes dataset names and tables (`bertkit.tasks.tables`); the task's own
    files still go to its own reader. (A wrapper so that every caller of `read` gets both.)"""
    def read(path, bad=None):
        from .tables import is_table_source, read_examples
        if is_table_source(task, path):
            return read_examples(task, path, bad)
        return read_file(path, bad)
    read.reads_tables = True  # type: ignore[attr-defined]
    return read


# name -> (module under bertkit.tasks, attribute). Aliases point at the same entry.
TASKS: dict[str, tuple[str, str]] = {
    "cola":      ("glue", "COLA"),
    "sst2":      ("glue", "SST2"),
    "mrpc":      ("glue", "MRPC"),
    "stsb":      ("glue", "STSB"),
    "qqp":       ("glue", "QQP"),
    "mnli":      ("glue", "MNLI"),
    "mnli-mm":   ("glue", "MNLI_MM"),
    "qnli":      ("glue", "QNLI"),
    "rte":       ("glue", "RTE"),
    "wnli":      ("glue", "WNLI"),
    "conll2003": ("ner", "CONLL2003"),
    "squad":     ("squad", "SQUAD_V1"),
    "squad2":    ("squad", "SQUAD_V2"),
    "swag":      ("swag", "SWAG"),
}
ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "ner": "conll2003", "squad1": "squad",
           "squad-v1": "squad", "squad-v2": "squad2", "mnli_mm": "mnli-mm"}


def get_task(name: str) -> Task:
    """The `Task` called `name` (case-insensitive; aliases such as 'sst-2' accepted)."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in TASKS:
        close = difflib.get_close_matches(key, list(TASKS) + list(ALIASES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise BertkitError(f"unknown task {name!r}{hint}; choose from {', '.join(TASKS)}, or use "
                           f"--task classify/regress/tokens with your own columns")
    module, attr = TASKS[key]
    try:
        mod = importlib.import_module(f"bertkit.tasks.{module}")
    except ModuleNotFoundError as e:
        if e.name == f"bertkit.tasks.{module}":
            raise BertkitError(f"task {key!r} is not available in this version (no bertkit.tasks.{module})") from None
        raise
    return getattr(mod, attr)


# ---- reading helpers shared by the readers ------------------------------------------------------
@dataclass
class BadRows:
    """Where readers report bad rows: raise (default) or, with skip=True, count and go on."""
    skip: bool = False
    count: int = 0
    first: str | None = None

    def __call__(self, path: str | Path, line: int | str, message: str) -> None:
        where = f"{path}:{line}" if isinstance(line, int) else f"{path}: {line}"
        msg = f"{where}: {message}"
        if not self.skip:
            raise DataError(msg + " (--skip-bad-rows skips such rows)")
        self.count += 1
        if self.first is None:
            self.first = msg
        log.debug("skipped %s", msg)

    def report(self, path: str | Path) -> None:
        if self.count:
            log.warning("%s: skipped %d bad row%s (first: %s)", path, self.count, "s" * (self.count > 1), self.first)


@dataclass
class SkipBadRows:
    """The one declaration of every labelled-row reader's setting (finetune, evaluate, score, embed-eval)."""
    skip_bad_rows: bool = False
    """Skip (and count) malformed rows instead of stopping at the first."""


def finite_number(value) -> float | None:
    """`value` as a finite float; None for anything else (not a number, NaN, infinite)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def require_examples(examples: list, path: str | Path, bad: BadRows | None = None) -> list:
    """`examples`, once `bad` has logged the rows it skipped; none at all is a DataError."""
    if bad is not None:
        bad.report(path)
    if not examples:
        raise DataError(f"{path}: no examples (empty file?)")
    return examples


def predicted(predictions: dict, examples: Sequence) -> list:
    """Each example's prediction, in order; a DataError when one has none."""
    missing = [ex.id for ex in examples if ex.id not in predictions]
    if missing:
        raise DataError(f"no prediction for {len(missing)} examples (first id {missing[0]!r})")
    return [predictions[ex.id] for ex in examples]


def check_labels(examples: Sequence, labels: Sequence[str], where: str = "") -> None:
    """Every example's `label` must be one the model was trained with (a DataError otherwise)."""
    known = set(labels)
    for ex in examples:
        lab = getattr(ex, "label", None)
        if lab is not None and lab not in known:
            loc = getattr(ex, "where", None) or f"{where} id {ex.id}"
            raise DataError(f"{loc}: label {lab!r} was not seen in training; the model knows "
                            f"{', '.join(map(str, labels))}")


# ---- batching ----------------------------------------------------------------------------------
def collate(features: Sequence[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad a list of features into tensors: (B, T) or, for multiple choice, (B, K, T).

    input_ids pad with `pad_id`, token_type_ids with 0, per-token labels with -100; scalar
    targets (int class, float score, start/end positions) become (B,) tensors."""
    first = features[0]
    choices = bool(first["input_ids"]) and isinstance(first["input_ids"][0], list)
    # every feature as K rows (K = 1 for a single sequence), padded to the longest row
    rows = [f["input_ids"] if choices else [f["input_ids"]] for f in features]
    types = [f["token_type_ids"] if choices else [f["token_type_ids"]] for f in features]
    T = max(len(r) for f in rows for r in f)
    batch = {"input_ids": torch.tensor([[r + [pad_id] * (T - len(r)) for r in f] for f in rows]),
             "token_type_ids": torch.tensor([[r + [0] * (T - len(r)) for r in f] for f in types]),
             "attention_mask": torch.tensor([[[1] * len(r) + [0] * (T - len(r)) for r in f] for f in rows])}
    if not choices:                                       # (B, 1, T) -> (B, T)
        batch = {k: v[:, 0] for k, v in batch.items()}
    for key in ("labels", "start_positions", "end_positions"):
        if key not in first or first[key] is None:
            continue
        values = [f[key] for f in features]
        if isinstance(values[0], list):
            batch[key] = torch.tensor([v + [-100] * (T - len(v)) for v in values])
        else:
            batch[key] = torch.tensor(values, dtype=torch.float if isinstance(values[0], float) else torch.long)
    return batch


__all__ = ["Task", "TASKS", "ALIASES", "get_task", "BadRows", "DataError", "open_text", "require_examples",
           "finite_number", "predicted", "check_labels", "collate"]
