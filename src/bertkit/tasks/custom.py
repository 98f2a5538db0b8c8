"""Your own data: text(-pair) classification, regression and token classification.

    bertkit finetune --task classify --train-file train.csv --dev-file dev.csv \\
        --text-column review --label-column stars --model DIR --out runs/reviews

* classify / regress: CSV (header line, RFC 4180 quoting), TSV (header line, split on tabs) or
  JSONL (one object per line). Columns by name: text, optional pair, label (a class name, or a
  number for regress), optional id (default: the 0-based index of the data row, header excluded).
* tokens: JSONL with a list of words and a list of tags per line, or a CoNLL column file.

Metrics: accuracy and macro F1 (classify; F1 of the positive class too when the labels are
0/1), Pearson/Spearman (regress), entity-level F1 (tokens).
"""
from __future__ import annotations

import csv
from pathlib import Path

from ..sources import ARROW_SUFFIXES, dataset_name, is_saved_dataset, jsonl_objects, open_table
from . import BadRows, DataError, Task, finite_number, open_text, require_examples
from .glue import TextExample, sentence_metrics, sentence_task
from .ner import TAG, TaggedExample, read_conll, tagging_task

FORMATS = ("csv", "tsv", "jsonl", "conll")


def guess_format(path: Path, fmt: str | None) -> str:
    if fmt:
        if fmt not in FORMATS:
            raise DataError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
        return fmt
    if dataset_name(path) is not None or is_saved_dataset(path) or path.name.endswith(
            (".parquet", *ARROW_SUFFIXES)) or "*" in path.name:
        return "table"                     # bertkit.sources: a dataset name, Parquet, Arrow, a save_to_disk folder
    name = path.name.removesuffix(".gz")
    for suffix, kind in ((".csv", "csv"), (".tsv", "tsv"), (".jsonl", "jsonl"), (".json", "jsonl"),
                         (".conll", "conll"), (".txt", "conll")):
        if name.endswith(suffix):
            return kind
    raise DataError(f"{path}: cannot tell the format from the name; give --format csv/tsv/jsonl/conll")


def _rows(path: Path, fmt: str, bad: BadRows):
    """(line number, {column: value}) for each data row of a CSV, TSV or JSONL file (or "row N" of a table)."""
    if fmt == "table":
        yield from _table_rows(path)
        return
    with open_text(path) as f:
        if fmt == "jsonl":
            yield from jsonl_objects(f, path, lambda lineno, message: bad(path, lineno, message))
            return
        reader = csv.reader(f) if fmt == "csv" else (line.rstrip("\r\n").split("\t") for line in f)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file")
        for n, row in enumerate(reader):
            lineno = (reader.line_num if fmt == "csv" else n + 2)
            if not row or row == [""]:
                continue
            if len(row) != len(header):
                bad(path, lineno, f"expected {len(header)} columns ({', '.join(header)}), found {len(row)}")
                continue
            yield lineno, dict(zip(header, row))


def data_rows(path: str | Path, fmt: str | None = None, bad: BadRows | None = None):
    """(line number or "row N", {column: value}) for each row of a CSV / TSV / JSONL file (plain or
    .gz), a Parquet / Arrow table or a dataset name (`fmt`: None = from the name)."""
    path = Path(path)
    return _rows(path, guess_format(path, fmt), bad or BadRows())


def _table_rows(path: Path):
    """Rows of a dataset name or Parquet/Arrow table; class ids of ClassLabel columns become their names."""
    table = open_table(str(path))
    for where, row in table.rows():
        for col, names in table.label_names.items():
            v = row.get(col)
            if isinstance(v, int) and 0 <= v < len(names):
                row[col] = names[v]
            elif isinstance(v, list):
                row[col] = [names[x] if isinstance(x, int) and 0 <= x < len(names) else x for x in v]
        yield where, row


def read_texts(path: str | Path, bad: BadRows | None, text_column: str, pair_column: str | None,
               label_column: str, id_column: str | None, fmt: str | None, regression: bool) -> list[TextExample]:
    bad = bad or BadRows()
    path = Path(path)
    examples = []
    for index, (lineno, row) in enumerate(data_rows(path, fmt, bad)):
        missing = [c for c in (text_column, pair_column) if c is not None and c not in row]
        if missing:
            bad(path, lineno, f"no {missing[0]!r} field (has: {', '.join(map(str, row))})")
            continue
        text, pair = row[text_column], row[pair_column] if pair_column else None
        if not isinstance(text, str) or not text.strip():
            bad(path, lineno, f"empty or non-text {text_column!r}")
            continue
        label = row.get(label_column)
        if label is not None:
            if isinstance(label, str):
                label = label.strip()
            if label == "":
                bad(path, lineno, f"missing {label_column!r}")
                continue
            if regression:
                if (number := finite_number(label)) is None:
                    bad(path, lineno, f"{label_column} {label!r} is not a number")
                    continue
                label = number
            else:
                label = str(label)
        ex_id = str(row[id_column]) if id_column and id_column in row else str(index)
        examples.append(TextExample(ex_id, text, pair, label, f"{path}:{lineno}"))
    return require_examples(examples, path, bad)


def read_tagged(path: str | Path, bad: BadRows | None, tokens_column: str, tags_column: str,
                id_column: str | None, fmt: str | None) -> list[TaggedExample]:
    bad = bad or BadRows()
    path = Path(path)
    fmt = guess_format(path, fmt)
    if fmt == "conll":
        return read_conll(path, bad)
    if fmt not in ("jsonl", "table"):
        raise DataError(f"{path}: token classification reads JSONL or CoNLL columns, not {fmt}")
    examples = []
    for index, (lineno, row) in enumerate(_rows(path, fmt, bad)):
        words, tags = row.get(tokens_column), row.get(tags_column)
        if not isinstance(words, list) or not words:
            bad(path, lineno, f"{tokens_column!r} must be a non-empty list of words")
            continue
        if tags is not None:
            if not isinstance(tags, list) or len(tags) != len(words):
                bad(path, lineno, f"{tags_column!r} must be a list with one tag per word ({len(words)})")
                continue
            wrong = next((t for t in tags if not isinstance(t, str) or not TAG.match(t)), None)
            if wrong is not None:
                bad(path, lineno, f"tag {wrong!r} is not O or B-/I-/E-/S-TYPE")
                continue
        ex_id = str(row[id_column]) if id_column and id_column in row else str(index)
        examples.append(TaggedExample(ex_id, [str(w) for w in words], tags, f"{path}:{lineno}"))
    return require_examples(examples, path, bad)


def custom_task(kind: str, text_column: str = "text", pair_column: str | None = None, label_column: str = "label",
                id_column: str | None = None, tokens_column: str = "tokens", tags_column: str = "tags",
                format: str | None = None) -> Task:
    """A `Task` over your own files; `kind` is classify, regress or tokens."""
    files = {"train": "train." + (format or "jsonl"), "dev": "dev." + (format or "jsonl")}
    if kind == "tokens":
        return tagging_task("tokens", "token classification of your own JSONL/CoNLL data", lambda path, bad=None:
                            read_tagged(path, bad, tokens_column, tags_column, id_column, format), files)
    if kind not in ("classify", "regress"):
        raise DataError(f"unknown custom task {kind!r}: classify, regress or tokens")
    regression = kind == "regress"
    return sentence_task(kind, f"{kind} your own CSV/TSV/JSONL data", lambda path, bad=None: read_texts(
        path, bad, text_column, pair_column, label_column, id_column, format, regression),
        sentence_metrics("pearson" if regression else "macro_f1"), "spearman" if regression else "accuracy",
        regression, files)


__all__ = ["custom_task", "read_texts", "read_tagged", "data_rows"]
