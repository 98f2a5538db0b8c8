"""CoNLL-2003 named-entity recognition (and any BIO/IOB-tagged column file).

File format: one token per line, space- (or tab-) separated columns with the word first and
the tag last (CoNLL-2003: `word POS chunk NER`), a blank line between sentences; `-DOCSTART-`
lines are skipped. Tags may be IOB1 or BIO2 (or IOBES); the metric is entity-level micro F1
with seqeval's default (conlleval) semantics.

Features (as in the paper, section 5.3): each word is split into word pieces and only the first
piece carries the word's label (the rest get -100, ignored by the loss); predictions are read
at first pieces and mapped back to words. A sentence longer than `max_length` is cut into
overlapping windows; each word takes its prediction from the window in which it has the most
context on both sides (not silently truncated).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from . import BadRows, DataError, Task, open_text, predicted, require_examples
from .glue import windows
from .metrics import conll_f1

log = logging.getLogger("bertkit")
TAG = re.compile(r"^(O|[BIES]-\S+)$")


@dataclass
class TaggedExample:
    """A sentence as words, with one tag per word (None when the file carries no tags)."""
    id: str
    words: list[str]
    tags: list[str] | None = None
    where: str | None = None

    @property
    def label(self):   # no sentence-level label; `check_labels` looks at tags via check_tags
        return None


def read_conll(path: str | Path, bad: BadRows | None = None) -> list[TaggedExample]:
    """Sentences of a CoNLL column file; the id of a sentence is its 0-based index in the file."""
    bad = bad or BadRows()
    examples: list[TaggedExample] = []
    words: list[str] = []
    tags: list[str] = []
    ncols, start, broken, skipped = None, 0, False, 0

    def flush() -> None:                  # a sentence ends: kept, or counted as skipped (its id stays used)
        nonlocal words, tags, broken, skipped
        if broken:
            skipped += 1
        elif words:
            examples.append(TaggedExample(str(len(examples) + skipped), words, tags, f"{path}:{start}"))
        words, tags, broken = [], [], False

    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                flush()
                continue
            if line.startswith("-DOCSTART-"):
                continue
            cols = line.split()
            if not words and not broken:
                start = lineno
            if ncols is None:
                ncols = len(cols)
                if ncols < 2:
                    raise DataError(f"{path}:{lineno}: expected 'word ... tag' columns, found one column "
                                    f"({line[:40]!r}); is this a CoNLL file?")
            if len(cols) != ncols:
                bad(path, lineno, f"expected {ncols} columns like the first line, found {len(cols)}")
                broken = True
                continue
            tag = cols[-1]
            if not TAG.match(tag):
                bad(path, lineno, f"tag {tag!r} is not O or B-/I-/E-/S-TYPE")
                broken = True
                continue
            words.append(cols[0])
            tags.append(tag)
    flush()
    return require_examples(examples, path, bad)


def labels_from(examples: Sequence[TaggedExample]) -> list[str]:
    return sorted({t for ex in examples for t in (ex.tags or ())})


def check_tags(examples: Sequence[TaggedExample], labels: Sequence[str]) -> None:
    known = set(labels)
    for ex in examples:
        for w, t in enumerate(ex.tags or ()):
            if t not in known:
                raise DataError(f"{ex.where or 'sentence ' + ex.id} (word {w + 1}): tag {t!r} was not seen in "
                                f"training; the model knows {', '.join(labels)}")


def featurize_tokens(examples: Sequence[TaggedExample], tokenizer, labels: Sequence[str] | None,
                     max_length: int = 128, stride: int | None = 32, train: bool = False) -> list[dict]:
    """Word pieces with the label on each word's first piece; overlapping windows for long sentences."""
    index = {name: i for i, name in enumerate(labels)} if labels is not None else {}
    encodings = tokenizer.backend.encode_batch([ex.words for ex in examples], is_pretokenized=True,
                                               add_special_tokens=False)
    size = max_length - 2
    if size < 1:
        raise DataError(f"max_length {max_length} leaves no room for words after [CLS] and [SEP]")
    feats, truncated, cut = [], 0, 0
    for i, (ex, enc) in enumerate(zip(examples, encodings)):
        ids, word_ids = enc.ids, enc.word_ids
        # each piece's word where it is the word's first piece, else None
        first_of = [w if j == 0 or w != word_ids[j - 1] else None for j, w in enumerate(word_ids)]
        if stride is not None or len(ids) <= size:
            spans = windows(len(ids), size, stride or 0)     # overlap capped at half a window
        else:                                                 # no stride: truncated (words past it tagged O)
            spans, truncated, cut = [(0, size)], truncated + 1, cut + len(ids) - size
        for s, e in spans:
            feat = {"input_ids": [tokenizer.cls_id, *ids[s:e], tokenizer.sep_id],
                    "token_type_ids": [0] * (e - s + 2), "example_index": i, "word_ids": [None, *first_of[s:e], None],
                    "window": (s, e, len(ids))}
            if ex.tags is not None and labels is not None:
                feat["labels"] = [index[ex.tags[w]] if w is not None else -100 for w in feat["word_ids"]]
            feats.append(feat)
    if truncated:
        log.warning("truncated %d of %d sentences to %d tokens (%d pieces cut; their words are tagged O); "
                    "give a stride to read them in windows", truncated, len(examples), max_length, cut)
    tokenizer.stats.add(len(examples), truncated, cut)
    return feats


def postprocess_tokens(outputs: Sequence[np.ndarray], features: Sequence[dict],
                       examples: Sequence[TaggedExample], labels: Sequence[str]) -> dict:
    """{id: [tag per word]}: each word's first piece, from the window where it has most context."""
    best: dict[int, dict[int, tuple[float, int]]] = {}
    for out, f in zip(outputs, features):
        s, e, n = f["window"]
        chosen = best.setdefault(f["example_index"], {})
        for pos, w in enumerate(f["word_ids"]):
            if w is None:
                continue
            tok = s + pos - 1                          # index of the piece in the whole sentence
            context = min(tok - s, e - 1 - tok)        # pieces to the nearer window edge
            if w not in chosen or context > chosen[w][0]:
                chosen[w] = (context, int(np.argmax(out[pos])))
    outside = labels.index("O") if "O" in labels else 0
    preds = {}
    for i, ex in enumerate(examples):
        chosen = best.get(i, {})
        # a word with no word piece (e.g. only control characters) is tagged O
        preds[ex.id] = [labels[chosen[w][1]] if w in chosen else labels[outside] for w in range(len(ex.words))]
    return preds


def ner_metrics(predictions: dict, examples: Sequence[TaggedExample]) -> dict:
    pred = [list(p) for p in predicted(predictions, examples)]
    ref = [list(ex.tags) for ex in examples]
    result = conll_f1(ref, pred)
    result["token_accuracy"] = result.pop("accuracy")
    return result


def parse_words(obj: dict, where: str) -> TaggedExample:
    """A `bertkit predict` line: {"tokens": [...]} (pre-split words) or {"text": ...} (split on spaces)."""
    words = obj.get("tokens", obj.get("words"))
    if words is None and isinstance(obj.get("text"), str):
        words = obj["text"].split()
    if not isinstance(words, list) or not words or not all(isinstance(w, str) for w in words):
        raise DataError(f"{where}: needs \"tokens\" (a non-empty list of words) or \"text\"")
    return TaggedExample(str(obj.get("id", "")), list(words), None, where)


def tagging_task(name: str, description: str, read, files: dict) -> Task:
    """A tagging task (CoNLL-2003's, or your own data's: `tasks.custom`) reading its files with `read`."""
    return Task(name=name, head="token_classification", description=description, read=read,
                featurize=featurize_tokens, postprocess=postprocess_tokens, metrics=ner_metrics,
                main_metric="f1", labels=labels_from, parse=parse_words, files=files, stride=32)


CONLL2003 = tagging_task("conll2003", "CoNLL-2003 English NER: PER, LOC, ORG, MISC (entity-level F1)", read_conll,
                         {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"})
