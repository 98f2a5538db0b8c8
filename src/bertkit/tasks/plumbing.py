"""A task around a model, as fine-tuning, `evaluate` and `predict` all use it.

Which task (a name from the table, your own columns, or the one a checkpoint records in its
config.json), `predict`'s JSON rows as the task's examples (`parse_rows`), how long inputs are
read (`input_stride`; a checkpoint's own in `inference_stride`), features and how examples became
them (`featurize`), reference labels checked against the model's, scores on a predictor
(`evaluate`) and the predictions file. Training (`bertkit.finetune`) and
inference (`bertkit.predict`, the `evaluate` command) import these from here, so prediction never
imports fine-tuning; this module imports neither, and nothing of the model.
"""
from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, Sequence

from ..errors import BertkitError
from . import Task, check_labels, get_task
from .custom import custom_task
from .ner import check_tags
from .squad import qa_settings

log = logging.getLogger("bertkit")

# Tasks over your own files
CUSTOM = ("classify", "regress", "tokens")


@dataclass
class Columns:
    """Which columns of your own data hold what (`--task classify / regress / tokens`): fields of
    FinetuneConfig, flags of finetune, evaluate and predict, and custom_task's keywords alike."""
    text_column: str = "text"
    """classify/regress: the column (CSV/TSV header name or JSONL key) holding the text."""
    pair_column: str | None = None
    """classify/regress: the second text of a pair (None = single texts)."""
    label_column: str = "label"
    """classify/regress: the class name or score."""
    id_column: str | None = None
    """Your data's id column (None = the 0-based row index)."""
    tokens_column: str = "tokens"
    """tokens (JSONL): the list of words."""
    tags_column: str = "tags"
    """tokens (JSONL): the list of tags, one per word."""
    format: Literal["csv", "tsv", "jsonl", "conll"] | None = None
    """Your data's format: csv, tsv, jsonl or conll (None = from the file name)."""


COLUMN_KEYS = tuple(f.name for f in fields(Columns))


# ---- which task --------------------------------------------------------------------------------
def resolve_task(name: str, columns: dict | None = None) -> Task:
    """A task from the table, or classify/regress/tokens over your own columns."""
    if name in CUSTOM:
        return custom_task(name, **(columns or {}))
    return get_task(name)


def task_of_checkpoint(raw: dict) -> Task | None:
    """The task a fine-tuned checkpoint was trained on (config.json `bertkit_task`; None for
    checkpoints from elsewhere)."""
    rec = raw.get("bertkit_task")
    if not isinstance(rec, dict) or "name" not in rec:
        return None
    return resolve_task(rec["name"], rec.get("columns"))


def default_task(head: str, raw: dict) -> Task | None:
    """The task for a checkpoint that does not name one (trained elsewhere)."""
    if head == "sequence_classification":
        return resolve_task("regress" if raw.get("problem_type") == "regression" else "classify")
    name = {"token_classification": "tokens", "question_answering": "squad", "multiple_choice": "swag"}.get(head)
    return resolve_task(name) if name else None


def checkpoint_task(raw: dict, head: str, where: str, task_name: str | None = None,
                    columns: dict | None = None) -> Task | None:
    """The task a checkpoint with this `head` runs: `task_name` (with `columns`) if given, else
    the one its config.json records, else the usual one for its head; None for a bare encoder."""
    task = (resolve_task(task_name, columns) if task_name else task_of_checkpoint(raw)) or default_task(head, raw)
    if task is not None and task.head != head:
        raise BertkitError(f"{where}: a {head} checkpoint cannot run task {task.name} ({task.head})")
    return task


# ---- how inputs are read ----------------------------------------------------------------------
def parse_rows(task: Task, rows: Sequence[tuple[str, dict]], where: str) -> list:
    """`bertkit predict`'s input: each (where, JSON object) row as the task's example (`task.parse`),
    its id the row's own or its 0-based index; ids must be unique."""
    examples = [task.parse(obj, at) for at, obj in rows]
    for i, ex in enumerate(examples):
        ex.id = ex.id or str(i)
    if len({ex.id for ex in examples}) != len(examples):
        raise BertkitError(f"{where}: ids must be unique")
    return examples


def input_stride(task: Task, windows: bool | None, stride: int | None, max_length: int) -> int | None:
    """The `stride` handed to `task.featurize`: None = longest-first truncation (classification
    only), otherwise the windows' overlap (SQuAD: the doc stride). Classification windows asked
    for without a stride overlap by a quarter of max_length."""
    if stride is not None and stride < 1:               # (a doc stride of 0 never moves)
        raise BertkitError(f"stride must be at least 1 (tokens), got {stride}")
    if task.head != "sequence_classification":
        if windows is False:
            raise BertkitError(f"--no-windows applies to sentence classification and regression; {task.name} "
                               f"reads long inputs in windows")
        return stride if stride is not None else task.stride
    if windows is False and stride is not None:
        raise BertkitError("--no-windows (truncation) and --stride (window overlap) exclude each other")
    if windows is False or (windows is None and stride is None):
        return None
    return stride if stride is not None else (task.stride or max_length // 4)


def inference_stride(task: Task, raw: dict, where: str, max_length: int, windows: bool | None = None,
                     stride: int | None = None) -> int | None:
    """`stride` / `windows`, else how the checkpoint was fine-tuned to read long inputs (config.json
    `bertkit_stride`), else the task's default."""
    saved = raw.get("bertkit_stride", task.stride)
    if saved is not None and (isinstance(saved, bool) or not isinstance(saved, int) or saved < 0):
        raise BertkitError(f"{where}/config.json: bertkit_stride must be a non-negative integer or null, "
                           f"got {saved!r}")
    if windows is None and stride is None:
        return saved
    if windows and stride is None and saved is not None:
        stride = saved
    return input_stride(task, windows, stride, max_length)


def input_summary(features: Sequence[dict], n_examples: int, truncated: int = 0, tokens_cut: int = 0) -> dict:
    """How examples became model inputs: windows per example and truncation (metrics, run card)."""
    per_example = Counter(f["example_index"] for f in features)
    multi = [c for c in per_example.values() if c > 1]
    return {"examples": n_examples, "features": len(features),
            "windows_per_example": round(len(features) / max(n_examples, 1), 3),
            "windowed_examples": len(multi), "max_windows": max(per_example.values(), default=0),
            "truncated_examples": truncated, "tokens_cut": tokens_cut}


def featurize(task: Task, examples: list, tokenizer, labels, max_length: int, stride: int | None,
              split: str, train: bool = False) -> tuple[list[dict], dict]:
    """`task.featurize` plus its `input_summary`, logged in one line when inputs were windowed or cut."""
    before = (tokenizer.stats.truncated_inputs, tokenizer.stats.tokens_cut)
    feats = task.featurize(examples, tokenizer, labels, max_length=max_length, stride=stride, train=train)
    summary = input_summary(feats, len(examples), tokenizer.stats.truncated_inputs - before[0],
                            tokenizer.stats.tokens_cut - before[1])
    if summary["windowed_examples"]:
        log.info("%s: %d examples -> %d windows of <= %d tokens (%d examples in 2..%d windows, %.2f per example)",
                 split, len(examples), len(feats), max_length, summary["windowed_examples"],
                 summary["max_windows"], summary["windows_per_example"])
    return feats, summary


def qa_options(task: Task | None, raw: dict, where: str, null_threshold: float | None = None) -> dict:
    """Postprocess options of a QA checkpoint: SQuAD v2.0's null threshold (`null_threshold`, else
    the one fine-tuning found best on dev, config.json `bertkit_null_threshold`, else 0)."""
    if task is None or task.head != "question_answering":
        if null_threshold is not None:
            raise BertkitError("--null-threshold applies to SQuAD v2.0 question answering")
        return {}
    if null_threshold is not None and task.name != "squad2":
        raise BertkitError(f"--null-threshold applies to SQuAD v2.0 models; this one answers {task.name}")
    try:
        saved = qa_settings(raw)["null_threshold"]
    except BertkitError as e:
        raise BertkitError(f"{where}/{e}") from None
    if null_threshold is not None and (null_threshold != null_threshold or abs(null_threshold) == float("inf")):
        raise BertkitError(f"--null-threshold must be a finite number, got {null_threshold}")
    return {"null_threshold": saved if null_threshold is None else null_threshold}


# ---- references, scores, predictions ----------------------------------------------------------
def check_references(task: Task, examples: list, labels, where: str) -> None:
    """An evaluation label or tag the model was not trained with is an error."""
    if labels is None:
        return
    if task.head == "token_classification":
        check_tags(examples, labels)
    else:
        check_labels(examples, labels, where)


def evaluate(predictor, task: Task, examples: list, features: list, labels, batch_size: int = 64,
             progress: bool = False, post: dict | None = None) -> tuple[dict, dict]:
    """(metrics, predictions) on examples that carry references: `predictor` (`infer.Predictor`,
    the one inference engine) runs the features; `post`: options of the task's postprocess (SQuAD
    v2.0: null_threshold). Fine-tuning evaluates its training model through `finetune.evaluating`."""
    outputs = predictor.outputs(features, batch_size, desc="evaluate" if progress else None)
    predictions = task.postprocess(outputs, features, examples, labels, **(post or {}))
    return task.metrics(predictions, examples), predictions


def write_predictions(predictions: dict, path: Path) -> None:
    """{id, prediction} JSONL (what `bertkit score` reads); SQuAD 2.0 null odds go next to it
    as <name>_null_odds.json (evaluate-v2.0.py's --na-prob-file)."""
    path = Path(path)
    with open(path, "w", encoding="utf-8") as f:
        for pid, pred in predictions.items():
            f.write(json.dumps({"id": pid, "prediction": pred}, ensure_ascii=False) + "\n")
    odds = getattr(predictions, "null_odds", None)
    if odds:
        path.with_name(path.stem + "_null_odds.json").write_text(json.dumps(odds) + "\n", encoding="utf-8")
