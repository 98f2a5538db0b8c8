"""The nine GLUE tasks, read exactly as distributed (tab-separated, GLUE's headers and columns).

Each task is a `Spec` of column names (which column is the text, the pair, the label, the id)
plus the official metrics. Rows are split on tabs only - GLUE's files contain quote characters
that are part of the text (the official readers use `quotechar=None`). Test files (no label
column) read fine; their examples have `label=None`.

Sentence-level classification (and regression, STS-B) is shared with `bertkit.tasks.custom`:
`featurize_classification` builds [CLS] A [SEP] (B [SEP]) features. An input longer than
`max_length` is cut by longest-first truncation by default (the paper's and run_classifier.py's
way, counted and logged), or, when a stride is given, read in overlapping windows whose logits
`postprocess_classification` averages. A window's overlap is capped at half the room left for the
text (`windows`), so an input of n tokens never gives more than about 2n / room windows.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..tokenizer import longest_first
from . import BadRows, DataError, Task, finite_number, metrics as M, open_text, predicted, require_examples

log = logging.getLogger("bertkit")


@dataclass
class TextExample:
    """A sentence (or sentence pair) with a class name or a score."""
    id: str
    text: str
    pair: str | None = None
    label: str | float | None = None
    where: str | None = None     # file:line, for error messages


@dataclass(frozen=True)
class Spec:
    """Where a GLUE file keeps its fields (by header name; `columns` for files without a header)."""
    text: str
    pair: str | None
    label: str
    id: str | None = None
    labels: tuple[str, ...] | None = None   # allowed class names; None = regression
    columns: tuple[str, ...] | None = None  # for files without a header line (CoLA)
    label_last: bool = False                # MNLI: gold_label is the last column


def read_glue(path: str | Path, spec: Spec, bad: BadRows | None = None) -> list[TextExample]:
    """Rows of a GLUE TSV file -> examples; problems go to `bad` (raises by default)."""
    bad = bad or BadRows()
    examples: list[TextExample] = []
    with open_text(path) as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not any(line.strip() for line in lines):
        raise DataError(f"{path}: no examples (empty file)")
    first = lines[0].rstrip("\r").split("\t")
    if spec.columns is not None and first[0] not in ("index", "id"):
        header, start = list(spec.columns), 0          # CoLA train/dev: no header line
    else:
        header, start = first, 1
    col = {name: i for i, name in enumerate(header)}
    for name in (spec.text, spec.pair):
        if name is not None and name not in col:
            raise DataError(f"{path}:1: no {name!r} column in the header ({', '.join(header)}); "
                            f"is this the right task's file?")
    has_label = spec.label in col
    for n, raw in enumerate(lines[start:]):
        lineno = n + start + 1
        row = raw.rstrip("\r").split("\t")
        if len(row) != len(header):
            bad(path, lineno, f"expected {len(header)} tab-separated columns ({', '.join(header)}), found {len(row)}")
            continue
        text = row[col[spec.text]]
        pair = row[col[spec.pair]] if spec.pair else None
        if not text.strip() or (pair is not None and not pair.strip()):
            bad(path, lineno, f"empty {spec.text if not text.strip() else spec.pair}")
            continue
        label: str | float | None = None
        if has_label:
            label = row[-1] if spec.label_last else row[col[spec.label]]
            label = label.strip()
            if label == "":
                bad(path, lineno, f"missing {spec.label}")
                continue
            if spec.labels is None:
                if (number := finite_number(label)) is None:
                    bad(path, lineno, f"{spec.label} {label!r} is not a number")
                    continue
                label = number
            elif label not in spec.labels:
                bad(path, lineno, f"unknown {spec.label} {label!r} (expected {' or '.join(spec.labels)})")
                continue
        ex_id = row[col[spec.id]] if spec.id in col else str(n)
        examples.append(TextExample(ex_id, text, pair, label, f"{path}:{lineno}"))
    return require_examples(examples, path, bad)


# ---- features -----------------------------------------------------------------------------------
def windows(n: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """Spans [start, end) of length <= size covering range(n), consecutive spans overlapping by
    `overlap` tokens, capped at half a window: a step is never shorter than half the window, so
    the count stays below about 2n / size (an overlap close to the window would step 1 token at a
    time: RTE at max_length 64 once became 43,015 windows from 2,213 examples)."""
    if n <= size:
        return [(0, n)]
    step = size - min(max(overlap, 0), size // 2)
    spans, start = [], 0
    while True:
        end = min(start + size, n)
        spans.append((start, end))
        if end == n:
            return spans
        start += step


def featurize_classification(examples: Sequence[TextExample], tokenizer, labels: Sequence[str] | None,
                             max_length: int = 128, stride: int | None = None, train: bool = False) -> list[dict]:
    """[CLS] A [SEP] (B [SEP]) features. A label index (or float score when labels is None).

    Longer than max_length: without `stride`, longest-first truncation (counted in
    tokenizer.stats); with it (overlap in tokens) the longer side is cut into overlapping windows
    (the shorter side, capped at half the budget, repeated in each; what the cap cuts is counted
    as truncation) and their logits are averaged in `postprocess_classification`."""
    index = {name: i for i, name in enumerate(labels)} if labels is not None else None
    ids_a = tokenizer.encode_ids([ex.text for ex in examples])
    encoded_b = iter(tokenizer.encode_ids([ex.pair for ex in examples if ex.pair is not None]))
    ids_b = [next(encoded_b) if ex.pair is not None else None for ex in examples]
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    feats, truncated, cut, capped = [], 0, 0, 0
    for i, ex in enumerate(examples):
        a, b = ids_a[i], ids_b[i]
        budget = max_length - (3 if b is not None else 2)
        if budget < 1:
            raise DataError(f"max_length {max_length} leaves no room for text after [CLS] and [SEP]")
        target = None if ex.label is None else float(ex.label) if index is None else index[ex.label]
        nb = len(b) if b is not None else 0
        if len(a) + nb <= budget or stride is None:
            keep_a, keep_b = longest_first(len(a), nb, budget)
            if keep_a + keep_b < len(a) + nb:
                truncated += 1
                cut += len(a) + nb - keep_a - keep_b
            parts = [(a[:keep_a], b[:keep_b] if b is not None else None)]
        else:
            slide_a = b is None or len(a) >= nb       # slide over the longer side
            long, short = (a, b) if slide_a else (b, a)
            kept = short[:min(len(short), budget // 2)] if short is not None else None
            if kept is not None and len(kept) < len(short):
                truncated += 1
                cut += len(short) - len(kept)
            room = budget - (len(kept) if kept is not None else 0)
            capped += stride > room // 2                # `windows` overlaps by half a window at most
            spans = windows(len(long), room, stride)
            parts = [(long[s:e], kept) if slide_a else (kept, long[s:e]) for s, e in spans]
        for pa, pb in parts:
            ids = [cls, *pa, sep] + ([*pb, sep] if pb is not None else [])
            types = [0] * (len(pa) + 2) + ([1] * (len(pb) + 1) if pb is not None else [])
            feats.append({"input_ids": ids, "token_type_ids": types, "example_index": i, "labels": target})
    if truncated:
        log.warning("truncated %d of %d inputs to %d tokens (%d tokens cut)%s", truncated, len(examples),
                    max_length, cut, "" if stride is not None else "; --windows reads them in overlapping "
                    "windows instead")
    if capped:
        log.warning("stride %d is more than half the room left for the text in %d long inputs at max_length %d: "
                    "their windows overlap by half a window instead", stride, capped, max_length)
    tokenizer.stats.add(len(examples), truncated, cut)
    return feats


def mean_window_logits(outputs: Sequence[np.ndarray], features: Sequence[dict]) -> dict[int, np.ndarray]:
    """{example index: its windows' logits averaged} (a long input is several windows)."""
    windows: dict[int, list] = {}
    for out, f in zip(outputs, features):
        windows.setdefault(f["example_index"], []).append(out)
    return {i: np.asarray(w, dtype=np.float64).mean(0) for i, w in windows.items()}


def postprocess_classification(outputs: Sequence[np.ndarray], features: Sequence[dict],
                               examples: Sequence[TextExample], labels: Sequence[str] | None) -> dict:
    """Average each example's window logits; the arg-max label name (or the score, regression)."""
    return {examples[i].id: float(mean[0]) if labels is None else labels[int(mean.argmax())]
            for i, mean in mean_window_logits(outputs, features).items()}


def class_probabilities(outputs, features, examples, labels) -> dict:
    """{id: {label: probability}} from averaged logits (used by `bertkit predict`)."""
    result = {}
    for i, z in mean_window_logits(outputs, features).items():
        p = np.exp(z - z.max())
        p /= p.sum()
        result[examples[i].id] = {name: round(float(q), 6) for name, q in zip(labels, p)}
    return result


def labels_from(examples: Sequence[TextExample]) -> list[str]:
    return sorted({ex.label for ex in examples if ex.label is not None})


def parse_text(obj: dict, where: str) -> TextExample:
    """A `bertkit predict` line: {"text": .., "text_pair": ..} (also "sentence", "sentence1/2"), optional "id"."""
    text = obj.get("text", obj.get("sentence", obj.get("sentence1")))
    pair = obj.get("text_pair", obj.get("pair", obj.get("sentence2")))
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"{where}: needs a non-empty \"text\" field")
    if pair is not None and not isinstance(pair, str):
        raise DataError(f"{where}: \"text_pair\" must be a string")
    return TextExample(str(obj.get("id", "")), text, pair, None, where)


# ---- metrics ------------------------------------------------------------------------------------
def sentence_metrics(kind: str):
    """The metrics of a sentence task: pearson (and spearman), or accuracy with f1 (of class 1), mcc,
    or macro_f1 (your own classes, `tasks.custom`: with the f1 of class 1 where they are 0/1)."""
    def compute(predictions: dict, examples: Sequence[TextExample]) -> dict:
        pred, ref = predicted(predictions, examples), [ex.label for ex in examples]
        if kind == "pearson":
            return M.pearson_spearman([float(r) for r in ref], [float(p) for p in pred])
        pred, ref = [str(p) for p in pred], [str(r) for r in ref]
        out = {"accuracy": M.accuracy(ref, pred)}
        if kind == "macro_f1":
            classes = sorted(set(ref) | set(pred))
            out["macro_f1"] = sum(M.f1_binary(ref, pred, pos_label=c) for c in classes) / len(classes)
        if kind == "f1" or (kind == "macro_f1" and set(classes) <= {"0", "1"}):
            out["f1"] = M.f1_binary(ref, pred, pos_label="1")
        if kind == "mcc":
            out["mcc"] = M.matthews_corrcoef(ref, pred)
        return out
    return compute


def sentence_task(name: str, description: str, read, metrics, main: str, regression: bool, files: dict) -> Task:
    """A sentence(-pair) classification or regression task (GLUE's, or your own data's: `tasks.custom`)."""
    return Task(name=name, head="sequence_classification", description=description, read=read,
                featurize=featurize_classification, postprocess=postprocess_classification, metrics=metrics,
                main_metric=main, labels=(lambda ex: None) if regression else labels_from, parse=parse_text,
                problem="regression" if regression else "single_label", files=files, stride=None)


def _task(name: str, spec: Spec, kind: str, main: str, description: str, **files: str) -> Task:
    return sentence_task(name, description, lambda path, bad=None: read_glue(path, spec, bad), sentence_metrics(kind),
                         main, spec.labels is None,
                         files or {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"})


BINARY = ("0", "1")
NLI = ("contradiction", "entailment", "neutral")
ENTAIL = ("entailment", "not_entailment")

COLA = _task("cola", Spec("sentence", None, "label", labels=BINARY,
                          columns=("source", "label", "orig_label", "sentence")),
             "mcc", "mcc", "CoLA: is the sentence grammatical? (Matthews correlation)")
SST2 = _task("sst2", Spec("sentence", None, "label", labels=BINARY), "accuracy", "accuracy",
             "SST-2: sentiment of a movie-review sentence (accuracy)")
MRPC = _task("mrpc", Spec("#1 String", "#2 String", "Quality", labels=BINARY), "f1", "f1",
             "MRPC: are the two sentences paraphrases? (F1 of class 1, accuracy)")
STSB = _task("stsb", Spec("sentence1", "sentence2", "score", id="index"), "pearson", "spearman",
             "STS-B: similarity score 0-5 (Pearson, Spearman)")
QQP = _task("qqp", Spec("question1", "question2", "is_duplicate", id="id", labels=BINARY), "f1", "f1",
            "QQP: are the two questions duplicates? (F1 of class 1, accuracy)")
MNLI_SPEC = Spec("sentence1", "sentence2", "gold_label", id="index", labels=NLI, label_last=True)   # both MNLIs
MNLI = _task("mnli", MNLI_SPEC, "accuracy", "accuracy", "MNLI matched: entailment / neutral / contradiction (accuracy)",
             train="train.tsv", dev="dev_matched.tsv", test="test_matched.tsv")
MNLI_MM = _task("mnli-mm", MNLI_SPEC, "accuracy", "accuracy", "MNLI mismatched (accuracy)",
                train="train.tsv", dev="dev_mismatched.tsv", test="test_mismatched.tsv")
QNLI = _task("qnli", Spec("question", "sentence", "label", id="index", labels=ENTAIL), "accuracy", "accuracy",
             "QNLI: does the sentence answer the question? (accuracy)")
RTE = _task("rte", Spec("sentence1", "sentence2", "label", id="index", labels=ENTAIL), "accuracy", "accuracy",
            "RTE: textual entailment (accuracy)")
WNLI = _task("wnli", Spec("sentence1", "sentence2", "label", id="index", labels=BINARY), "accuracy", "accuracy",
             "WNLI: Winograd NLI (accuracy)")
