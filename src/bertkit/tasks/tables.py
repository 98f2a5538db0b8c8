"""A task's data from tables: dataset names, Parquet, Arrow, JSON Lines and CSV (`bertkit.sources`).

Every task also reads its data as the Hugging Face Hub copies lay it out, so these are the same
data for `bertkit finetune --task sst2`:

    --data nyu-mll/glue:sst2                        the datasets library (train + validation splits)
    --data sst2/   (train.parquet, validation.parquet; or train-00000-of-00001.parquet, ...)
    --train-file train.jsonl --dev-file validation.jsonl      (Dataset.to_json)
    --data sst2_saved/   (a DatasetDict.save_to_disk folder: train/, validation/)

Columns by task (the Hub's; GLUE's own TSV header names work too):

    GLUE (nyu-mll/glue, CONFIG = task)   text and pair: sentence | sentence1, sentence2 | question1,
                                         question2 | premise, hypothesis | question, sentence;
                                         label; idx
    CoNLL-2003 (eriktks/conll2003)       tokens, ner_tags (class ids or tag strings); id
    SQuAD (rajpurkar/squad, squad_v2)    id, title, context, question, answers {text, answer_start}
    SWAG (allenai/swag, regular)         sent1, sent2, ending0..ending3, label

Labels are stored as the task's own files spell them: GLUE's "0"/"1" (SST-2, MRPC, QQP, CoLA,
WNLI) and "entailment"/"not_entailment"/... (MNLI, QNLI, RTE), whatever the table holds (class
ids, whose names come from the ClassLabel feature, or names), so a model fine-tuned from a
dataset is scored against the official files and the other way round. A test split's label -1
means "no reference". The split a command asks for maps to the Hub's names: dev -> validation
(MNLI: validation_matched / validation_mismatched).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ..sources import ARROW_SUFFIXES, dataset_name, is_saved_dataset, open_table
from . import BadRows, DataError, Task, finite_number, open_text, require_examples
from .glue import BINARY, ENTAIL, NLI, TextExample
from .ner import TAG, TaggedExample
from .squad import _read_question
from .swag import ChoiceExample, ENDINGS

HF_SPLITS: dict[str, dict[str, str]] = {
    "mnli": {"dev": "validation_matched", "test": "test_matched"},
    "mnli-mm": {"dev": "validation_mismatched", "test": "test_mismatched"},
}


def hub_split(task: Task, split: str) -> str:
    """The Hub's name of a task split: dev -> validation (MNLI: validation_matched / _mismatched)."""
    return HF_SPLITS.get(task.name, {}).get(split, {"dev": "validation"}.get(split, split))


def reads(task: Task) -> bool:
    return task.name in CONVERTERS


def is_table_source(task: Task, path: str | Path) -> bool:
    """Whether `path` is a dataset name or a table rather than the task's own file format."""
    if not reads(task):
        return False
    s = str(path)
    if dataset_name(s) is not None or is_saved_dataset(s):
        return True
    name = s.lower().removesuffix(".gz")
    native = {Path(f).suffix for f in task.files.values()}
    if name.endswith((".parquet", *ARROW_SUFFIXES, ".jsonl")):
        return True
    if name.endswith(".csv"):
        return ".csv" not in native
    if name.endswith(".json"):
        return ".json" not in native or _json_lines(Path(s))
    return False


def _json_lines(path: Path) -> bool:
    """A .json file of one object per line (Dataset.to_json), not SQuAD's single document."""
    try:
        with open_text(path) as f:
            first = f.readline(1 << 20)
        obj = json.loads(first)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and "data" not in obj and "version" not in obj


def find_split(task: Task, folder: Path, split: str) -> Path | None:
    """A split stored as a table in a folder: validation.parquet, train-00000-of-00002.parquet (the Hub's
    layout, read as one glob), dev.jsonl, validation/ (DatasetDict.save_to_disk), ..."""
    if not reads(task):
        return None
    own = task.files.get(split)
    stems = [hub_split(task, split), split] + ([own.split(".")[0]] if own else [])
    for stem in dict.fromkeys(stems):
        if is_saved_dataset(folder / stem):
            return folder / stem
        for ext in (".parquet", ".arrow", ".jsonl", ".jsonl.gz", ".json", ".csv", ".csv.gz"):
            if (folder / (stem + ext)).is_file() and is_table_source(task, folder / (stem + ext)):
                return folder / (stem + ext)
        for ext in (".parquet", ".arrow"):
            if any(folder.glob(f"{stem}-*{ext}")):
                return folder / f"{stem}-*{ext}"
    return None


def read_examples(task: Task, path: str | Path, bad: BadRows | None = None) -> list:
    """The task's examples from a dataset name or table (problems go to `bad`, as for files)."""
    bad = bad or BadRows()
    table = open_table(path)
    examples = CONVERTERS[task.name](task, table, bad)
    return require_examples(examples, table.name, bad)


def _column(table, candidates: tuple[str, ...], what: str, task: Task, required: bool = True) -> str | None:
    for c in candidates:
        if c in table.columns:
            return c
    if required:
        raise DataError(f"{table.name}: no {' / '.join(candidates)} column for the {what} (has: "
                        f"{', '.join(table.columns) or 'no columns'}); is this {task.name}'s data?")
    return None


# ---- GLUE ----------------------------------------------------------------------------------------
HUB_NLI = ["entailment", "neutral", "contradiction"]
HUB_ENTAIL = ["entailment", "not_entailment"]
# task: (text columns, second-text columns or None, allowed labels (None: regression), the Hub's class
# order for tables that hold class ids without their ClassLabel names); the Hub's names, then GLUE's TSV's
GLUE_COLUMNS = {
    "cola": (("sentence",), None, BINARY, None),
    "sst2": (("sentence",), None, BINARY, None),
    "mrpc": (("sentence1", "#1 String"), ("sentence2", "#2 String"), BINARY, None),
    "stsb": (("sentence1",), ("sentence2",), None, None),
    "qqp": (("question1",), ("question2",), BINARY, None),
    "mnli": (("premise", "sentence1"), ("hypothesis", "sentence2"), NLI, HUB_NLI),
    "mnli-mm": (("premise", "sentence1"), ("hypothesis", "sentence2"), NLI, HUB_NLI),
    "qnli": (("question",), ("sentence",), ENTAIL, HUB_ENTAIL),
    "rte": (("sentence1",), ("sentence2",), ENTAIL, HUB_ENTAIL),
    "wnli": (("sentence1",), ("sentence2",), BINARY, None),
}


def glue_label(value, allowed: tuple[str, ...] | None, names: list[str] | None) -> tuple[object, str | None]:
    """(label as the task's files spell it, or None for no reference; error message or None)."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == -1):
        return None, None
    if allowed is None:                                   # regression
        x = finite_number(value)
        return (x, None) if x is not None else (None, f"label {value!r} is not a finite number")
    if isinstance(value, bool) or (isinstance(value, float) and value.is_integer()):
        value = int(value)
    if isinstance(value, int):
        if str(value) in allowed:
            return str(value), None
        if names and 0 <= value < len(names) and names[value] in allowed:
            return names[value], None
        return None, f"label {value} is not a class of this task ({', '.join(allowed)})"
    text = str(value).strip()
    if text in allowed:
        return text, None
    if names and text in names and str(names.index(text)) in allowed:
        return str(names.index(text)), None
    return None, f"label {text!r} is not a class of this task ({', '.join(allowed)})"


def _glue(task: Task, table, bad: BadRows) -> list:
    texts, pairs, allowed, hub_names = GLUE_COLUMNS[task.name]
    text_col = _column(table, texts, "text", task)
    pair_col = _column(table, pairs, "second text", task) if pairs else None
    label_col = _column(table, ("label", "gold_label", "Quality", "is_duplicate", "score"), "label", task, False)
    id_col = _column(table, ("idx", "index", "id"), "id", task, False)
    names = table.label_names.get(label_col) or hub_names
    examples = []
    for n, (where, row) in enumerate(table.rows()):
        text, pair = row.get(text_col), row.get(pair_col) if pair_col else None
        if not isinstance(text, str) or not text.strip() or (pair_col and (not isinstance(pair, str) or not pair.strip())):
            bad(table.name, where, f"empty {text_col if not isinstance(text, str) or not text.strip() else pair_col}")
            continue
        label, err = glue_label(row.get(label_col), allowed, names) if label_col else (None, None)
        if err:
            bad(table.name, where, err)
            continue
        ex_id = str(row[id_col]) if id_col and row.get(id_col) is not None else str(n)
        examples.append(TextExample(ex_id, text, pair, label, f"{table.name}: {where}"))
    return examples


# ---- CoNLL-2003 ----------------------------------------------------------------------------------
CONLL_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
"""eriktks/conll2003's ner_tags class names, for tables that hold the ids without them."""


def _conll(task: Task, table, bad: BadRows) -> list:
    words_col = _column(table, ("tokens", "words"), "words", task)
    tags_col = _column(table, ("ner_tags", "tags"), "tags", task, False)
    id_col = _column(table, ("id",), "id", task, False)
    names = table.label_names.get(tags_col) or CONLL_TAGS
    examples = []
    for n, (where, row) in enumerate(table.rows()):
        words, tags = row.get(words_col), row.get(tags_col) if tags_col else None
        if not isinstance(words, list) or not words or not all(isinstance(w, str) for w in words):
            bad(table.name, where, f"{words_col!r} must be a non-empty list of words")
            continue
        if tags is not None:
            if not isinstance(tags, list) or len(tags) != len(words):
                bad(table.name, where, f"{tags_col!r} must hold one tag per word ({len(words)})")
                continue
            tags = [names[t] if isinstance(t, int) and 0 <= t < len(names) else t for t in tags]
            wrong = next((t for t in tags if not isinstance(t, str) or not TAG.match(t)), None)
            if wrong is not None:
                bad(table.name, where, f"tag {wrong!r} is not O or B-/I-/E-/S-TYPE (or a class id of {tags_col})")
                continue
        ex_id = str(row[id_col]) if id_col and row.get(id_col) is not None else str(n)
        examples.append(TaggedExample(ex_id, list(words), tags, f"{table.name}: {where}"))
    return examples


# ---- SQuAD ---------------------------------------------------------------------------------------
def _squad(task: Task, table, bad: BadRows) -> list:
    version = 2 if task.name == "squad2" else 1
    for col in ("id", "question", "context", "answers"):
        _column(table, (col,), col, task)
    examples, seen = [], set()
    for where, row in table.rows():
        answers = row.get("answers")
        if isinstance(answers, dict):                    # the Hub's {"text": [...], "answer_start": [...]}
            texts, starts = answers.get("text") or [], answers.get("answer_start") or []
            answers = [{"text": t, "answer_start": s} for t, s in zip(texts, starts)]
        context = row.get("context")
        if not isinstance(context, str):
            bad(table.name, where, "needs a \"context\" string")
            continue
        qa = {"id": row.get("id"), "question": row.get("question"), "answers": answers}
        ex = _read_question(qa, context, str(row.get("title") or ""), version, bad, table.name, where, seen)
        if ex is not None:
            examples.append(ex)
    return examples


# ---- SWAG ----------------------------------------------------------------------------------------
def _swag(task: Task, table, bad: BadRows) -> list:
    for col in ("sent1", "sent2", *ENDINGS):
        _column(table, (col,), col, task)
    examples = []
    for n, (where, row) in enumerate(table.rows()):
        endings = [row.get(e) for e in ENDINGS]
        if not isinstance(row.get("sent1"), str) or not row["sent1"].strip() or \
                any(not isinstance(e, str) or not e.strip() for e in endings):
            bad(table.name, where, "empty sent1 or ending")
            continue
        label = row.get("label")
        if isinstance(label, str) and label.strip().lstrip("-").isdigit():
            label = int(label)
        if label is not None and label != -1 and label not in (0, 1, 2, 3):
            bad(table.name, where, f"label {label!r} is not 0, 1, 2 or 3")
            continue
        examples.append(ChoiceExample(str(n), row["sent1"], str(row.get("sent2") or ""), endings,
                                      None if label in (None, -1) else int(label), f"{table.name}: {where}"))
    return examples


CONVERTERS: dict[str, Callable] = {
    **dict.fromkeys(GLUE_COLUMNS, _glue),
    "conll2003": _conll, "squad": _squad, "squad2": _squad, "swag": _swag,
}

__all__ = ["hub_split", "is_table_source", "find_split", "read_examples", "glue_label", "CONLL_TAGS"]
