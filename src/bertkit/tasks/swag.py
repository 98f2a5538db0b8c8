"""SWAG (Zellers et al. 2018): pick the most plausible of four endings (multiple choice).

File: the CSV of rowanz/swagaf's data/ (train.csv, val.csv, test.csv) with the header
``,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label``
(the first, unnamed column is pandas' row index; test.csv has no label). Columns are found by
name. The id of an example is the 0-based index of its data row (header excluded).

Features, as in the paper (section 4.4): four sequences [CLS] sent1 [SEP] sent2 + ending_k [SEP];
the head scores each from its [CLS] vector and a softmax runs over the four. Metric: accuracy.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from . import BadRows, DataError, Task, open_text, predicted, require_examples
from .metrics import accuracy

ENDINGS = ("ending0", "ending1", "ending2", "ending3")
REQUIRED = ("sent1", "sent2", *ENDINGS)


@dataclass
class ChoiceExample:
    """A context (sent1), the start of its continuation (sent2) and the candidate endings."""
    id: str
    context: str
    start: str
    endings: list[str]
    label: int | None = None
    where: str | None = None


def read_swag(path: str | Path, bad: BadRows | None = None) -> list[ChoiceExample]:
    """Rows of a SWAG CSV file -> examples (quoted CSV fields, as pandas writes them)."""
    bad = bad or BadRows()
    with open_text(path) as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None:
            raise DataError(f"{path}: empty file")
        col = {name: i for i, name in enumerate(header)}
        missing = [c for c in REQUIRED if c not in col]
        if missing:
            raise DataError(f"{path}:1: no {', '.join(missing)} column{'s' * (len(missing) > 1)} in the header "
                            f"({', '.join(header)}); expected SWAG's video-id,fold-ind,startphrase,sent1,sent2,"
                            f"gold-source,ending0..3,label")
        has_label = "label" in col
        examples: list[ChoiceExample] = []
        for n, row in enumerate(rows):
            lineno = rows.line_num
            if not row:
                continue
            if len(row) != len(header):
                bad(path, lineno, f"expected {len(header)} comma-separated columns, found {len(row)}")
                continue
            endings = [row[col[e]] for e in ENDINGS]
            if not row[col["sent1"]].strip() or any(not e.strip() for e in endings):
                bad(path, lineno, "empty sent1 or ending")
                continue
            label = None
            if has_label:
                raw = row[col["label"]].strip()
                if raw not in ("0", "1", "2", "3"):
                    bad(path, lineno, f"label {raw!r} is not 0, 1, 2 or 3")
                    continue
                label = int(raw)
            examples.append(ChoiceExample(str(n), row[col["sent1"]], row[col["sent2"]], endings, label,
                                          f"{path}:{lineno}"))
    return require_examples(examples, path, bad)


def parse_choices(obj: dict, where: str) -> ChoiceExample:
    """A `bertkit predict` line: {"context" (or "sent1"), "start" (or "sent2", optional), "endings": [..]}."""
    context = obj.get("context", obj.get("sent1"))
    start = obj.get("start", obj.get("sent2", ""))
    endings = obj.get("endings")
    if not isinstance(context, str) or not context.strip() or not isinstance(start, str):
        raise DataError(f"{where}: needs a non-empty \"context\" string (and optionally \"start\")")
    if not isinstance(endings, list) or len(endings) < 2 or not all(isinstance(e, str) and e.strip() for e in endings):
        raise DataError(f"{where}: needs \"endings\", a list of at least two non-empty strings")
    return ChoiceExample(str(obj.get("id", "")), context, start, list(endings), None, where)


def featurize_choices(examples: Sequence[ChoiceExample], tokenizer, labels=None, max_length: int = 128,
                      stride: int | None = None, train: bool = False) -> list[dict]:
    """One feature per example holding K sequences [CLS] context [SEP] start ending_k [SEP]
    (longest-first truncation to max_length, counted in tokenizer.stats)."""
    firsts = [ex.context for ex in examples for _ in ex.endings]
    seconds = [f"{ex.start} {ending}".strip() for ex in examples for ending in ex.endings]
    before = tokenizer.stats.counts()
    encodings = tokenizer.encode_batch(firsts, seconds, max_length)
    tokenizer.stats.report(before, f"{len(examples)} examples ({len(firsts)} context-ending sequences) at "
                                   f"max_length {max_length}")
    sequences, feats = iter(encodings), []
    for i, ex in enumerate(examples):
        encs = [next(sequences) for _ in ex.endings]
        feats.append({"input_ids": [e.input_ids for e in encs], "token_type_ids": [e.token_type_ids for e in encs],
                      "example_index": i, "labels": ex.label})
    return feats


def postprocess_choices(outputs: Sequence[np.ndarray], features: Sequence[dict],
                        examples: Sequence[ChoiceExample], labels=None) -> dict:
    """{id: index of the highest-scoring ending}."""
    return {examples[f["example_index"]].id: int(np.argmax(out)) for out, f in zip(outputs, features)}


def metrics_choices(predictions: dict, examples: Sequence[ChoiceExample]) -> dict:
    pred = predicted(predictions, examples)
    unlabelled = next((ex for ex in examples if ex.label is None), None)
    if unlabelled is not None:
        raise DataError(f"{unlabelled.where}: no label to score against (a test file?)")
    return {"accuracy": accuracy([ex.label for ex in examples], [int(p) for p in pred])}


SWAG = Task(name="swag", head="multiple_choice", description="SWAG: the most plausible of four endings (accuracy)",
            read=read_swag, featurize=featurize_choices, postprocess=postprocess_choices, metrics=metrics_choices,
            main_metric="accuracy", parse=parse_choices,
            files={"train": "train.csv", "dev": "val.csv", "test": "test.csv"}, max_length=128, packed=False)
