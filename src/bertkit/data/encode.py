"""Sentences -> word-piece ids, fast: a word cache in front of the Rust tokenizer.

BERT's tokenization of printable-ASCII text is simple enough to do exactly with array operations:
the normalizer only lower-cases (when uncased), the pre-tokenizer splits on whitespace and isolates
each punctuation character (every printable ASCII character that is not a letter or digit), and
WordPiece maps each word on its own. So all sentences are joined with a mark ('\\n') into one
byte string; numpy finds the sentences that need the Rust tokenizer (non-ASCII bytes, control
characters, special tokens written out, a sentence holding the mark) and blanks them; then it
finds the words of the rest (runs of letters and digits, single punctuation characters), hashes
them, and looks the hashes up in a cache of word -> piece ids. A word seen for the first time goes
to the Rust WordPiece model once. The result equals `Tokenizer.encode_ids` exactly (tests compare
them on the shared corpus, on hard cases, on 70,000 distinct words, cased and uncased); natural
text repeats its words, so nearly all the work is array operations.
"""
from __future__ import annotations

import re
from itertools import chain

import numpy as np

# non-ASCII, control chars (tab, CR...), and special tokens written in the text (the Rust tokenizer
# matches those as added tokens): the Rust path. '\n' is the mark between texts.
_SPECIAL = re.compile(rb"\[(?:PAD|UNK|CLS|SEP|MASK)\]")
_MARK = "\n"


class CachedEncoder:
    """`encode(sentences) -> list of int64 id arrays`, equal to the backend's ids without specials.

    Words are found and hashed with numpy on the bytes of the text (a 64-bit polynomial hash of
    the word and its length), so no Python string is made per word. The cache is an open-addressing
    hash table hash -> row, probed with numpy; row r's pieces are flat[start[r]:start[r] + length[r]]. A word seen for the first
    time is decoded and looked up in the Rust WordPiece model once. (Two different words with the
    same 64-bit hash would share ids; with a million distinct words the chance is ~1e-8.)"""

    _P = np.uint64(1099511628211)                       # odd multiplier (FNV prime)
    _MIX = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, backend, lowercase: bool = True, max_cache: int = 2_000_000):
        self.backend, self.lowercase, self.max_cache = backend, lowercase, max_cache
        code = np.arange(256)
        digit = (code >= 48) & (code <= 57)
        lower = (code >= 97) & (code <= 122)
        upper = (code >= 65) & (code <= 90)
        self._alnum = digit | lower | (upper if not lowercase else False)
        self._single = ((code >= 33) & (code <= 126) & ~(digit | lower | upper)) | (code == ord(_MARK))
        self._odd = ((code < 32) | (code >= 127)) & (code != ord(_MARK))
        self._pow = np.ones(1, dtype=np.uint64)
        self._reset()

    def _reset(self) -> None:
        self._keys = np.zeros(1 << 16, dtype=np.uint64)  # open addressing, linear probing; 0 = empty
        self._rows = np.zeros(1 << 16, dtype=np.int64)
        self._used = 0
        self._flat: list[int] = []
        self._start: list[int] = [0]                   # row 0: the mark between texts, no pieces
        self._length: list[int] = [0]

    def _slots(self, h: np.ndarray) -> np.ndarray:
        return (h >> np.uint64(64 - (len(self._keys).bit_length() - 1))).astype(np.int64)

    def _lookup(self, h: np.ndarray) -> np.ndarray:
        """Row of each hash, -1 where absent (vectorised probing: a few rounds)."""
        slot, row = self._slots(h), np.full(len(h), -1, dtype=np.int64)
        todo = np.arange(len(h))
        mask = len(self._keys) - 1
        while len(todo):
            k = self._keys[slot[todo]]
            hit = k == h[todo]
            row[todo[hit]] = self._rows[slot[todo[hit]]]
            todo = todo[~hit & (k != 0)]
            slot[todo] = (slot[todo] + 1) & mask
        return row

    def _insert(self, h: np.ndarray, rows: np.ndarray) -> None:
        """Add distinct new hashes (never 0: hashes are made odd)."""
        if 2 * (self._used + len(h)) > len(self._keys):  # keep the load under 1/2: grow and re-insert
            old = self._keys != 0
            keys, vals = np.concatenate([self._keys[old], h]), np.concatenate([self._rows[old], rows])
            size = len(self._keys)
            while 2 * len(keys) > size:
                size *= 2
            self._keys, self._rows, self._used = np.zeros(size, np.uint64), np.zeros(size, np.int64), 0
            h, rows = keys, vals
        slot, mask = self._slots(h), len(self._keys) - 1
        todo = np.arange(len(h))
        while len(todo):
            s = slot[todo]
            free = self._keys[s] == 0
            cand = todo[free]
            first = np.unique(slot[cand], return_index=True)[1]   # one writer per free slot
            won = cand[first]
            self._keys[slot[won]], self._rows[slot[won]] = h[won], rows[won]
            done = np.zeros(len(h), dtype=bool)
            done[won] = True
            todo = todo[~done[todo]]
            slot[todo] = (slot[todo] + 1) & mask
        self._used += len(h)

    def _powers(self, n: int) -> np.ndarray:
        if len(self._pow) < n:                          # P^0, P^1, ... (mod 2^64)
            m = max(n, 2 * len(self._pow))
            self._pow = np.concatenate([[np.uint64(1)], np.cumprod(np.full(m - 1, self._P, dtype=np.uint64))])
        return self._pow

    def _slow(self, texts: list[str], batch: int = 8192) -> list[list[int]]:
        return [e.ids for k in range(0, len(texts), batch)
                for e in self.backend.encode_batch_fast(texts[k:k + batch], add_special_tokens=False)]

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """One id array per text."""
        ids, lengths = self.encode_flat(texts)
        return np.split(ids, np.cumsum(lengths)[:-1]) if len(texts) else []

    def _words(self, raw: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(word starts, word lengths, word hashes) of printable-ASCII bytes: runs of letters and
        digits, and each other printable character (and each mark) on its own."""
        a = np.frombuffer(raw, dtype=np.uint8)
        alnum, single = self._alnum[a], self._single[a]
        begin = single | (alnum & ~np.concatenate([[False], alnum[:-1]]))
        end = single | (alnum & ~np.concatenate([alnum[1:], [False]]))
        starts = np.flatnonzero(begin)
        lens = np.flatnonzero(end) + 1 - starts
        chars = a[alnum | single].astype(np.uint64)     # the words' bytes, word after word
        first = np.cumsum(lens) - lens                  # where each word starts in `chars`
        k = np.arange(len(chars)) - np.repeat(first, lens)
        h = np.add.reduceat(chars * self._powers(int(lens.max()) if len(lens) else 1)[k], first) \
            if len(chars) else np.zeros(0, dtype=np.uint64)
        return starts, lens, (h ^ (lens.astype(np.uint64) * self._MIX)) * self._MIX | np.uint64(1)

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids in one int64 array, and the number of ids of each text."""
        n = len(texts)
        if n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        # texts for the Rust path: found by one scan of the bytes of all texts joined by the mark
        joined = _MARK.join(texts)
        slow = set()
        if joined.count(_MARK) != n - 1:                 # a text holds the mark itself: Rust path
            slow = {k for k, t in enumerate(texts) if _MARK in t}
            joined = _MARK.join("" if k in slow else t for k, t in enumerate(texts))
        b = joined.encode("utf-8", "surrogatepass")
        a = np.frombuffer(b, dtype=np.uint8)
        bad = np.flatnonzero(self._odd[a])               # non-ASCII and control bytes
        if b"[" in b:
            bad = np.concatenate([bad, [m.start() for m in _SPECIAL.finditer(b)]]).astype(np.int64)
        if len(bad):
            slow |= set(np.searchsorted(np.flatnonzero(a == ord(_MARK)), bad).tolist())
            joined = _MARK.join("" if k in slow else t for k, t in enumerate(texts))
        raw = (joined.lower() if self.lowercase else joined).encode("ascii")
        starts, lens, h = self._words(raw)
        is_mark = np.frombuffer(raw, dtype=np.uint8)[starts] == ord(_MARK) if len(starts) else np.zeros(0, bool)
        if len(self._start) > self.max_cache:            # bound memory on corpora with huge vocabularies
            self._reset()
        row = self._lookup(h)
        new = (row < 0) & ~is_mark
        if new.any():                                    # words not seen before: WordPiece, once each
            new_h, where = np.unique(h[new], return_index=True)
            pos = np.flatnonzero(new)[where]
            wordpiece = self.backend.model.tokenize
            rows = np.arange(len(self._start), len(self._start) + len(new_h), dtype=np.int64)
            for s, l in zip(starts[pos].tolist(), lens[pos].tolist()):
                ids = [t.id for t in wordpiece(raw[s:s + l].decode("ascii"))]
                self._start.append(len(self._flat))
                self._length.append(len(ids))
                self._flat.extend(ids)
            self._insert(new_h, rows)
            row = self._lookup(h)
        row[is_mark] = 0
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
