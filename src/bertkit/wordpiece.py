"""Learning a WordPiece vocabulary, deterministically (`Tokenizer.train` calls it).

    count_words()      how often each word occurs in text files (plain, .gz, or a table's text
                       column), words as BERT's normalizer and pre-tokenizer make them
    learn_wordpiece()  the `tokenizers` WordPiece trainer's rules with ties broken by id, so the same
                       text and options give byte-identical vocabularies (its trainer breaks ties in
                       hash-map order)
"""
from __future__ import annotations

import gzip
import heapq
import logging
import re
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Sequence

from tokenizers import normalizers, pre_tokenizers

from .sources import is_table_file, table_lines

log = logging.getLogger("bertkit")

MAX_WORD_CHARS = 100          # WordPiece reads longer words as [UNK] (max_input_chars_per_word)


def count_words(files: Sequence[str | Path], lowercase: bool = True) -> dict[str, int]:
    """How often each word occurs, words as the tokenizer sees them (BERT normalizer + pre-tokenizer)."""
    split = _WordSplitter(lowercase)
    counts: Counter = Counter()
    for lines in _iter_lines(files):
        counts.update(split(_cut_long(lines)))
    return counts


def _iter_lines(files: Sequence[str | Path], batch: int = 1000):
    for f in files:
        f = Path(f)
        if is_table_file(f):                   # Parquet / Arrow / JSONL / CSV: the text column's lines
            yield from table_lines(f, batch)
            continue
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt", encoding="utf-8", errors="replace") as fh:
            lines = (line for line in fh if line.strip())
            while buf := list(islice(lines, batch)):
                yield buf


def _cut_long(lines: list[str], size: int = 1 << 20) -> list[str]:
    """Lines over ~1 MB cut at a space (memory stays bounded; a word that long is [UNK] anyway)."""
    if all(len(line) <= size for line in lines):
        return lines
    out = []
    for line in lines:
        while len(line) > size:
            cut = line.rfind(" ", 0, size)
            cut = size if cut <= 0 else cut
            out.append(line[:cut])
            line = line[cut:]
        out.append(line)
    return out


class _WordSplitter:
    """The words of some lines as BertNormalizer + BertPreTokenizer make them, fast.

    ASCII lines (most of most corpora) are normalised here: control characters dropped, whitespace
    to ' ', lower-cased (no accents or CJK characters to handle); other lines by the normalizer
    itself. The pre-tokenizer's split (at spaces, around each punctuation character) is one
    regular expression, whose punctuation class is asked of the pre-tokenizer, once per character
    seen. The words equal `pre_tokenize_str(normalize_str(line))`'s (a test checks), several times
    faster, since no offsets are built."""

    def __init__(self, lowercase: bool):
        self.lowercase = lowercase
        self.norm = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None)
        self.pre = pre_tokenizers.BertPreTokenizer()
        # as BertNormalizer's clean_text: control characters go (\x0b and \x0c too), \t \n \r become ' '
        self.ascii = {i: None for i in [*range(32), 127]} | {ord(c): " " for c in "\t\n\r"}
        self.seen: set[str] = {" "}      # the normalizer turns every whitespace character into " "
        self.punct: set[str] = set()
        self.pattern = re.compile(r"[^ ]+")

    def __call__(self, lines: list[str]) -> list[str]:
        plain = " ".join(line for line in lines if line.isascii()).translate(self.ascii)
        other = [line for line in lines if not line.isascii()]
        text = (plain.lower() if self.lowercase else plain) + " " + (self.norm.normalize_str(" ".join(other))
                                                                  if other else "")
        new = set(text) - self.seen
        if new:
            found = {ch for ch in new if len(self.pre.pre_tokenize_str(f"a{ch}a")) == 3}
            self.seen |= new
            if found:
                self.punct |= found
                cls = "".join(re.escape(ch) for ch in sorted(self.punct))
                self.pattern = re.compile(f"[{cls}]|[^ {cls}]+")
        return self.pattern.findall(text)


def learn_wordpiece(word_counts: dict[str, int], vocab_size: int, min_frequency: int = 2,
                    limit_alphabet: int = 1000, *, special_tokens: Sequence[str]) -> list[str]:
    """A WordPiece vocabulary as the `tokenizers` WordPiece trainer learns it, made deterministic.

    The vocabulary is: the special tokens (the tokenizer's `SPECIAL_TOKENS`); the `limit_alphabet` most frequent characters (in code
    point order); '##c' for each of them seen inside a word; then merges. Each merge joins the
    adjacent pair of pieces that occurs most often (weighted by word counts) into a new piece,
    until `vocab_size` or until no pair occurs `min_frequency` times. Ties go to the pair of lower
    ids, so the result depends on nothing but the counts. Words longer than 100 characters or with a
    character outside the alphabet are left out (WordPiece reads them as [UNK] whatever the vocabulary).
    """
    chars: dict[str, int] = {}
    for w, n in word_counts.items():
        if len(w) <= MAX_WORD_CHARS:
            for ch in w:
                chars[ch] = chars.get(ch, 0) + n
    kept = sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))[:max(limit_alphabet, 0)]
    alphabet = {ch for ch, _ in kept}
    tokens = list(dict.fromkeys([*special_tokens, *sorted(alphabet)]))
    items = sorted((w, n) for w, n in word_counts.items() if len(w) <= MAX_WORD_CHARS and alphabet.issuperset(w))
    tokens += [t for t in ("##" + ch for ch in sorted({ch for w, _ in items for ch in w[1:]})) if t not in tokens]
    index = {t: i for i, t in enumerate(tokens)}
    words = [[index[w[0]], *(index["##" + ch] for ch in w[1:])] for w, _ in items]
    counts = [n for _, n in items]
    pairs: dict[tuple[int, int], int] = {}            # pair of piece ids -> weighted count
    where: dict[tuple[int, int], set[int]] = {}        # pair -> words that (may) hold it
    for wi, w in enumerate(words):
        for p in zip(w, w[1:]):
            pairs[p] = pairs.get(p, 0) + counts[wi]
            where.setdefault(p, set()).add(wi)
    heap = [(-c, a, b) for (a, b), c in pairs.items()]   # stale entries are skipped when popped
    heapq.heapify(heap)
    while len(tokens) < vocab_size and heap:
        negc, a, b = heapq.heappop(heap)
        if pairs.get((a, b), 0) != -negc:
            continue
        if -negc < min_frequency:
            break
        new = tokens[a] + tokens[b][2:]               # b is always a '##' piece
        nid = index.setdefault(new, len(tokens))
        if nid == len(tokens):
            tokens.append(new)
        for p in _merge_pair(a, b, nid, words, counts, pairs, where):
            c = pairs.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, *p))
            else:
                pairs.pop(p, None)
    if len(tokens) > vocab_size:
        log.warning("the special tokens and the alphabet alone are %d tokens, more than vocab_size %d",
                    len(tokens), vocab_size)
    return tokens


def _merge_pair(a: int, b: int, nid: int, words: list[list[int]], counts: list[int],
                pairs: dict, where: dict) -> set:
    """Replace every (a, b) in the words that hold it by `nid`; update pair counts; return the pairs changed.

    Only the neighbours of each merged occurrence change: (x, a) -> (x, nid) and (b, y) -> (nid, y),
    with x taken from the merged word so far (a run 'a b a b' gives one (nid, nid))."""
    delta: dict[tuple[int, int], int] = {}
    for wi in where.pop((a, b), ()):
        w, cnt = words[wi], counts[wi]
        i = -1
        while True:
            try:
                i = w.index(a, i + 1)
            except ValueError:
                break
            if i + 1 == len(w) or w[i + 1] != b:
                continue
            if i:
                x = w[i - 1]
                delta[(x, a)] = delta.get((x, a), 0) - cnt
                delta[(x, nid)] = delta.get((x, nid), 0) + cnt
                where.setdefault((x, nid), set()).add(wi)
            if i + 2 < len(w):
                y = w[i + 2]
                delta[(b, y)] = delta.get((b, y), 0) - cnt
                delta[(nid, y)] = delta.get((nid, y), 0) + cnt
                where.setdefault((nid, y), set()).add(wi)
            w[i:i + 2] = (nid,)                       # in place; the search goes on after it
    pairs.pop((a, b), None)
    for p, d in delta.items():
        if d:
            pairs[p] = pairs.get(p, 0) + d
    return {p for p, d in delta.items() if d}
