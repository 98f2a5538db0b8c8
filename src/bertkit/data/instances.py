"""Token ids of documents -> pre-training instances.

A document is `Doc(flat, off)`: the ids of all its sentences in one array, sentence j being
flat[off[j]:off[j + 1]]. Segments are slices of it (sentences of a segment are consecutive), so
an instance is a list of views, concatenated once for the whole shard.

`nsp_instances` is google-research/bert's `create_instances_from_document`, step for step (the
same draws from the same `random.Random`, checked against a transcription of Google's code):
one target length per document (max_length - 3, or with probability short_seq_prob a random
length in [2, max]); sentences are accumulated until the target is reached or the document ends;
A = the first a_end of them (a_end random in [1, len - 1]); B = the rest (is-next), or with
probability 0.5 (always when only one sentence was accumulated) sentences of a random *other*
document from a random start until B reaches its share of the target (up to 10 draws to find
another document), and then the accumulated sentences not used for A are put back; finally the
pair is truncated one token at a time from the longer side, front or back at random.

Departures, each for scale and each documented: the rng is seeded per chunk (see prepare.py);
the "other document" is drawn from the documents of the same chunk (a few MB of text) rather
than from the whole corpus, so a chunk can be processed alone; truncation counts the cuts and
slices once. And one switch, `lone_segment` (see `nsp_instances`).

`packed_instances` is RoBERTa's FULL-SENTENCES for --no-nsp: whole sentences, contiguous, packed
up to max_length - 2 tokens across document boundaries with a [SEP] between documents; a
sentence longer than that is cut into pieces (counted). With `fill` (prepare --fill) the sentence
that does not fit is cut there and its rest opens the next instance, so every instance but the last
is max_length tokens (one less where a document ends a token short of it): no padding for the model
to compute on (counted as sentences_cut).
"""
from __future__ import annotations

import random
from bisect import bisect_left
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class Doc(NamedTuple):
    flat: np.ndarray           # ids of all sentences
    off: list[int]             # sentence j = flat[off[j]:off[j + 1]]


@dataclass
class Instance:
    parts: list[np.ndarray]    # concatenated: [CLS] A [SEP] B [SEP] (or [CLS] packed [SEP])
    length: int
    b_start: int               # first index of segment B (== length when single segment)
    nsp_label: int             # 0 is-next, 1 random, -1 none
    short: bool

    @property
    def tokens(self) -> np.ndarray:
        return np.concatenate(self.parts)


@dataclass
class BuildCounts:
    random_next: int = 0
    short: int = 0
    one_sentence_documents: int = 0
    sentences_split: int = 0
    tokens_truncated: int = 0
    pairs_truncated: int = 0        # pairs that lost tokens to truncate_pair
    lone_segments_next: int = 0
    sentences_cut: int = 0          # fill: sentences cut at an instance's end, their rest opening the next


def truncate_pair(len_a: int, len_b: int, max_num_tokens: int, rng: random.Random
                  ) -> tuple[tuple[int, int], tuple[int, int]]:
    """Google's truncate_seq_pair on lengths: ((front_a, back_a), (front_b, back_b)) tokens cut.

    One token at a time from the longer side (B on ties), from the front or the back by a coin,
    with the same draws as Google; we count the cuts and slice once instead of deleting."""
    cut = [[0, 0], [0, 0]]
    while len_a + len_b > max_num_tokens:
        side = 0 if len_a > len_b else 1
        cut[side][0 if rng.random() < 0.5 else 1] += 1
        if side == 0:
            len_a -= 1
        else:
            len_b -= 1
    return (cut[0][0], cut[0][1]), (cut[1][0], cut[1][1])


def _target_length(max_length: int, short_seq_prob: float, rng: random.Random) -> tuple[int, int, bool]:
    """(max_num_tokens, target_seq_length, short): Google's target, now and then a shorter one."""
    max_num_tokens = max_length - 3
    if rng.random() < short_seq_prob:
        return max_num_tokens, rng.randint(2, max_num_tokens), True
    return max_num_tokens, max_num_tokens, False


def _truncated(tokens_a: np.ndarray, tokens_b: np.ndarray, max_num_tokens: int, rng: random.Random,
               counts: BuildCounts) -> tuple[np.ndarray, np.ndarray]:
    (fa, ba), (fb, bb) = truncate_pair(len(tokens_a), len(tokens_b), max_num_tokens, rng)
    counts.tokens_truncated += fa + ba + fb + bb
    counts.pairs_truncated += fa + ba + fb + bb > 0
    return tokens_a[fa:len(tokens_a) - ba], tokens_b[fb:len(tokens_b) - bb]


def _pair(cls: np.ndarray, a: np.ndarray, sep: np.ndarray, b: np.ndarray, label: int, short: bool,
          counts: BuildCounts) -> Instance:
    """[CLS] A [SEP] B [SEP], counted (`label` 1: random next, or swapped)."""
    counts.random_next += label
    counts.short += int(short)
    return Instance([cls, a, sep, b, sep], len(a) + len(b) + 3, len(a) + 2, label, short)


def _document(docs: list[Doc], doc_index: int, counts: BuildCounts) -> tuple[np.ndarray, np.ndarray, int]:
    """(token ids, sentence offsets, number of sentences) of one document; one-sentence documents counted."""
    flat, off = docs[doc_index]
    if len(off) == 2:
        counts.one_sentence_documents += 1
    return flat, off, len(off) - 1


def nsp_instances(docs: list[Doc], doc_index: int, max_length: int, short_seq_prob: float,
                  rng: random.Random, cls_id: int, sep_id: int, counts: BuildCounts,
                  lone_segment: str = "next") -> list[Instance]:
    """Instances of one document (create_instances_from_document).

    `lone_segment`: what to do when only one sentence was accumulated (a one-sentence document, or
    a sentence as long as the target). 'random' is Google: B is always random then, which pushes
    the random-next share over 50% (about 59% on the shared corpus). 'next' (default) flips the
    same fair coin as for longer chunks and, for is-next, takes the next sentence as B (or, in a
    one-sentence document, splits the sentence at a random token), keeping the share at 50%."""
    flat, off, n_sent = _document(docs, doc_index, counts)
    cls, sep = np.array([cls_id]), np.array([sep_id])
    max_num_tokens, target_seq_length, short = _target_length(max_length, short_seq_prob, rng)
    instances: list[Instance] = []
    count, current_length, i = 0, 0, 0          # count = len(current_chunk): sentences i - count + 1 .. i
    while i < n_sent:
        count += 1
        current_length += off[i + 1] - off[i]
        if i == n_sent - 1 or current_length >= target_seq_length:
            first = i - count + 1
            a_end = rng.randint(1, count - 1) if count >= 2 else 1
            a_lo, a_hi = off[first], off[first + a_end]
            if count >= 2 or lone_segment == "random":
                is_random_next = count == 1 or rng.random() < 0.5
            else:
                is_random_next = rng.random() < 0.5
                if not is_random_next:
                    if i + 1 < n_sent:                                  # B = the next sentence
                        i += 1
                        count += 1
                    elif a_hi - a_lo >= 2:                              # B = the sentence's tail
                        a_hi = a_lo + rng.randint(1, a_hi - a_lo - 1)
                    else:
                        is_random_next = True
                    counts.lone_segments_next += int(not is_random_next)
            if is_random_next:
                target_b_length = target_seq_length - (a_hi - a_lo)
                for _ in range(10):
                    random_document_index = rng.randint(0, len(docs) - 1)
                    if random_document_index != doc_index:
                        break
                rflat, roff = docs[random_document_index]
                random_start = rng.randint(0, len(roff) - 2)
                # sentences random_start..j, j the first where B reaches target_b_length (or the last)
                j = min(bisect_left(roff, roff[random_start] + target_b_length, random_start + 1) - 1, len(roff) - 2)
                tokens_b = rflat[roff[random_start]:roff[j + 1]]
                i -= count - a_end                                      # put back the unused
            else:
                tokens_b = flat[a_hi:off[first + count]]
            tokens_a, tokens_b = _truncated(flat[a_lo:a_hi], tokens_b, max_num_tokens, rng, counts)
            assert len(tokens_a) >= 1 and len(tokens_b) >= 1
            instances.append(_pair(cls, tokens_a, sep, tokens_b, int(is_random_next), short, counts))
            count, current_length = 0, 0
        i += 1
    return instances


def packed_instances(docs: list[Doc], max_length: int, cls_id: int, sep_id: int,
                     counts: BuildCounts, fill: bool = False) -> list[Instance]:
    """FULL-SENTENCES packing of the documents in order (no NSP); `fill`: cut the sentence that does
    not fit and carry its rest into the next instance (every instance full)."""
    budget = max_length - 2
    out: list[Instance] = []
    cls, sep = np.array([cls_id]), np.array([sep_id])
    buf: list[np.ndarray] = []
    length = 0

    def emit():
        nonlocal buf, length
        if buf and buf[-1] is sep:                     # no separator at the very end
            buf.pop()
            length -= 1
        if buf:
            out.append(Instance([cls, *buf, sep], length + 2, length + 2, -1, False))
        buf, length = [], 0

    for d, (flat, off) in enumerate(docs):
        if d > 0 and buf:
            if length + 1 >= budget:
                emit()
            else:
                buf.append(sep)                        # document boundary
                length += 1
        for j in range(len(off) - 1):
            sent = flat[off[j]:off[j + 1]]
            if len(sent) > budget:
                counts.sentences_split += 1
                pieces = [sent[k:k + budget] for k in range(0, len(sent), budget)]
            else:
                pieces = [sent]
            for p in pieces:
                if fill and length + len(p) > budget and budget - length > 0:
                    room = budget - length                 # what fits of it ends this instance
                    buf.append(p[:room])
                    length += room
                    counts.sentences_cut += 1
                    emit()
                    p = p[room:]
                if length + len(p) > budget:
                    emit()
                buf.append(p)
                length += len(p)
    emit()
    return out


# ---- sentence-order prediction (PrepareConfig.pair_mode = 'sop') --------------------------------------
def sop_instances(docs: list[Doc], doc_index: int, max_length: int, short_seq_prob: float,
                  rng: random.Random, cls_id: int, sep_id: int, counts: BuildCounts) -> list[Instance]:
    """Sentence-order prediction (ALBERT, Lan et al. 2020), the replacement for NSP the paper note
    mentions: A and B are always consecutive text of the same document, and with probability 0.5
    they are swapped; the label (stored where NSP's is) is 1 = swapped, 0 = in order. Target lengths,
    accumulation, the split point and truncation are those of `nsp_instances`. A lone sentence takes
    the next sentence as B, or (the document's last) is split at a random token; a one-token
    sentence left alone is dropped. `counts.random_next` counts the swapped pairs."""
    flat, off, n_sent = _document(docs, doc_index, counts)
    cls, sep = np.array([cls_id]), np.array([sep_id])
    max_num_tokens, target_seq_length, short = _target_length(max_length, short_seq_prob, rng)
    instances: list[Instance] = []
    count, current_length, i = 0, 0, 0
    while i < n_sent:
        count += 1
        current_length += off[i + 1] - off[i]
        if i == n_sent - 1 or current_length >= target_seq_length:
            first = i - count + 1
            if count == 1 and i + 1 < n_sent:                 # B = the next sentence
                i += 1
                count = 2
            a_lo, b_hi = off[first], off[first + count]
            if count >= 2:
                a_hi = off[first + rng.randint(1, count - 1)]
            elif b_hi - a_lo >= 2:                              # the last sentence alone: split it
                a_hi = a_lo + rng.randint(1, b_hi - a_lo - 1)
            else:
                count, current_length, i = 0, 0, i + 1
                continue
            tokens_a, tokens_b = _truncated(flat[a_lo:a_hi], flat[a_hi:b_hi], max_num_tokens, rng, counts)
            swapped = rng.random() < 0.5
            if swapped:
                tokens_a, tokens_b = tokens_b, tokens_a
            instances.append(_pair(cls, tokens_a, sep, tokens_b, int(swapped), short, counts))
            count, current_length = 0, 0
        i += 1
    return instances
