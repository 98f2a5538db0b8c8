"""Sentences -> word-piece ids, fast: a word cache in front of the Rust tokenizer.

BERT's tokenization of printable-ASCII text is simple enough to do exactly with one regex: the
normalizer only lower-cases (when uncased) and the pre-tokenizer splits on whitespace and isolates
each punctuation character (every printable ASCII character that is not a letter or digit), and
WordPiece maps each word on its own. So for an ASCII sentence without control characters we split
it with the regex and look each word up in a cache of word -> ids; words not yet seen go to the
Rust tokenizer in one batch. All fast sentences are joined with a mark ('\\r', which never occurs in
a sentence that takes this path) and split by one regex call. Any other sentence (non-ASCII,
control characters) goes to the Rust tokenizer whole. The result equals `Tokenizer.encode_ids`
exactly (tests compare them on the shared corpus and on hard cases); natural text repeats its
words, so most of the work is dictionary lookups done at C speed.
"""
from __future__ import annotations

import re
from itertools import chain

import numpy as np

# control chars, tab, CR, LF, and special tokens written in the text (the Rust tokenizer matches
# those as added tokens): the Rust path
_CONTROL = re.compile(r"[\x00-\x1f\x7f]|\[(?:PAD|UNK|CLS|SEP|MASK)\]")
_WORDS_UNCASED = re.compile(r"[a-z0-9]+|[!-/:-@\[-`{-~]|\r")
_WORDS_CASED = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]|\r")
_MARK = "\r"                                                # sentence boundary in the joined text


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
        if not texts:
            return []
        # one regex pass over all fast texts joined by the mark; marks split them again
        fast = [t.isascii() and _CONTROL.search(t) is None for t in texts]
        joined = _MARK.join(t if f else "" for t, f in zip(texts, fast))
        words = self._words.findall(joined.lower() if self.lowercase else joined)
        if len(self.rows) > self.max_cache:              # bound memory on corpora with huge vocabularies
            self._reset()
        rows = self.rows
        missing = list(set(words).difference(rows))
        for w, ids in zip(missing, self._slow(missing)):
            rows[w] = len(self._start)
            self._start.append(len(self._flat))
            self._length.append(len(ids))
            self._flat.extend(ids)
        flat_table = np.asarray(self._flat, dtype=np.int64)
        row = np.fromiter(map(rows.__getitem__, words), dtype=np.int64, count=len(words))
        length = np.asarray(self._length, dtype=np.int64)[row]
        ends = np.cumsum(length)
        total = int(ends[-1]) if len(ends) else 0
        # piece k of word w sits at flat_table[start[w] + k]; k = position - (offset of word w)
        gather = np.repeat(np.asarray(self._start, dtype=np.int64)[row] - (ends - length), length)
        ids = flat_table[gather + np.arange(total)]
        out = np.split(ids, ends[row == 0] if len(ends) else np.zeros(0, dtype=np.int64))
        slow = [k for k, f in enumerate(fast) if not f]
        for k, piece_ids in zip(slow, self._slow([texts[k] for k in slow])):
            out[k] = np.asarray(piece_ids, dtype=np.int64)
        return out
