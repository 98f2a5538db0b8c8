"""Sentences -> word-piece ids, fast: a word cache in front of the Rust tokenizer.

BERT's tokenization of printable-ASCII text is simple enough to do exactly with one regex: the
normalizer only lower-cases (when uncased) and the pre-tokenizer splits on whitespace and isolates
each punctuation character (every printable ASCII character that is not a letter or digit), and
WordPiece maps each word on its own. So for an ASCII sentence without control characters we split
it with the regex and look each word up in a cache of word -> ids; words not yet seen go to the
Rust WordPiece model. All sentences are joined with a mark ('\\n'; a text holding one
takes the Rust path) and scanned by two regex calls, one to find the texts for the Rust path, one
to split the others into words. Any other sentence (non-ASCII, control characters, special tokens
written out) goes to the Rust tokenizer whole. The result equals `Tokenizer.encode_ids`
exactly (tests compare them on the shared corpus and on hard cases); natural text repeats its
words, so most of the work is dictionary lookups done at C speed.
"""
from __future__ import annotations

import re
from itertools import chain, compress, repeat

import numpy as np

# non-ASCII, control chars (tab, CR...), and special tokens written in the text (the Rust tokenizer
# matches those as added tokens): the Rust path. '\n' is the mark between texts.
_SLOW = re.compile(r"[^\x20-\x7e\n]|\[(?:PAD|UNK|CLS|SEP|MASK)\]")
_WORDS_UNCASED = re.compile(r"[a-z0-9]+|[!-/:-@\[-`{-~]|\n")
_WORDS_CASED = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]|\n")
_MARK = "\n"


class CachedEncoder:
    """`encode(sentences) -> list of int64 id arrays`, equal to the backend's ids without specials.

    The cache is a table: word -> row; row r's pieces are flat[start[r]:start[r] + length[r]]; so a
    chunk's words become one array of rows, expanded to piece ids with numpy, no Python per token."""

    def __init__(self, backend, lowercase: bool = True, max_cache: int = 2_000_000):
        self.backend, self.lowercase, self.max_cache = backend, lowercase, max_cache
        self._words = _WORDS_UNCASED if lowercase else _WORDS_CASED
        self._reset()

    def _reset(self) -> None:
        self.rows: dict[str, int] = {_MARK: 0}          # row 0: the sentence mark, no pieces
        self._flat: list[int] = []
        self._start: list[int] = [0]
        self._length: list[int] = [0]

    def _slow(self, texts: list[str], batch: int = 8192) -> list[list[int]]:
        out: list[list[int]] = []
        for k in range(0, len(texts), batch):
            out.extend(e.ids for e in self.backend.encode_batch_fast(texts[k:k + batch], add_special_tokens=False))
        return out

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """One id array per text."""
        ids, lengths = self.encode_flat(texts)
        return np.split(ids, np.cumsum(lengths)[:-1]) if len(texts) else []

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids in one int64 array, and the number of ids of each text."""
        n = len(texts)
        if n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        # texts for the Rust path: found by one scan of all texts joined by '\n' (the mark)
        joined = _MARK.join(texts)
        slow = set()
        if joined.count(_MARK) != n - 1:                 # a text holds the mark itself: Rust path
            slow = {k for k, t in enumerate(texts) if _MARK in t}
            joined = _MARK.join("" if k in slow else t for k, t in enumerate(texts))
        hits = [m.start() for m in _SLOW.finditer(joined)]
        if hits:
            widths = np.fromiter(map(len, texts), dtype=np.int64, count=n) + 1
            widths[list(slow)] = 1
            starts = np.concatenate([[0], np.cumsum(widths)])
            slow |= set((np.searchsorted(starts, hits, side="right") - 1).tolist())
            joined = _MARK.join("" if k in slow else t for k, t in enumerate(texts))
        words = self._words.findall(joined.lower() if self.lowercase else joined)
        if len(self.rows) > self.max_cache:              # bound memory on corpora with huge vocabularies
            self._reset()
        rows = self.rows
        row = np.fromiter(map(rows.get, words, repeat(-1)), dtype=np.int64, count=len(words))
        unknown = np.flatnonzero(row < 0)
        if len(unknown):                                 # words not seen before: Rust, once each
            # a regex word is already normalised (lower-cased ASCII) and pre-tokenised: WordPiece only
            wordpiece = self.backend.model.tokenize
            occurrences = list(compress(words, (row < 0).tolist()))
            for w in set(occurrences):
                ids = [t.id for t in wordpiece(w)]
                rows[w] = len(self._start)
                self._start.append(len(self._flat))
                self._length.append(len(ids))
                self._flat.extend(ids)
            row[unknown] = np.fromiter(map(rows.__getitem__, occurrences), dtype=np.int64, count=len(unknown))
        flat_table = np.asarray(self._flat, dtype=np.int64)
        length = np.asarray(self._length, dtype=np.int64)[row]
        ends = np.cumsum(length)
        total = int(ends[-1]) if len(ends) else 0
        # piece k of word w sits at flat_table[start[w] + k]; k = position - (offset of word w)
        gather = np.repeat(np.asarray(self._start, dtype=np.int64)[row] - (ends - length), length)
        ids = flat_table[gather + np.arange(total)]
        lengths = np.diff(np.concatenate([[0], ends[row == 0], [total]]))     # n texts (marks: n - 1)
        if slow:
            order = sorted(slow)
            slow_ids = self._slow([texts[k] for k in order])
            lengths[order] = [len(x) for x in slow_ids]
            out = np.empty(int(lengths.sum()), dtype=np.int64)
            is_fast = np.ones(n, dtype=bool)
            is_fast[order] = False
            fast_tok = np.repeat(is_fast, lengths)
            out[fast_tok] = ids
            out[~fast_tok] = np.fromiter(chain.from_iterable(slow_ids), dtype=np.int64, count=int((~fast_tok).sum()))
            ids = out
        return ids, lengths
