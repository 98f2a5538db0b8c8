"""Token ids of documents -> pre-training instances.

`nsp_instances` is google-research/bert's `create_instances_from_document`, step for step:
one target length per document (max_seq_length - 3, or with probability short_seq_prob a random
length in [2, max]); sentences are accumulated until the target is reached or the document ends;
A = the first a_end of them (a_end random in [1, len - 1]); B = the rest (is-next), or with
probability 0.5 (always when only one sentence was accumulated) sentences of a random *other*
document from a random start until B reaches its share of the target (up to 10 draws to find
another document), and then the accumulated sentences not used for A are put back; finally the
pair is truncated one token at a time from the longer side, front or back at random.

Departures, each for scale: the rng (Python's random.Random, as Google) is seeded per chunk (see
prepare.py), and the
"other document" is drawn from the documents of the same chunk (a few MB of text) rather than the
whole corpus, so a chunk can be processed alone; truncation counts the cuts and slices once.

`packed_instances` is RoBERTa's FULL-SENTENCES for --no-nsp: whole sentences, contiguous, packed
up to max_seq_length - 2 tokens across document boundaries with a [SEP] between documents; a
sentence longer than that is cut into pieces (counted).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from .masking import MaskingConfig, mask_sequence


@dataclass
class Instance:
    tokens: np.ndarray         # int64: [CLS] A [SEP] B [SEP] (or [CLS] packed [SEP])
    b_start: int               # first index of segment B (== len(tokens) when single segment)
    nsp_label: int             # 0 is-next, 1 random, -1 none
    short: bool
    masked_positions: np.ndarray | None = None
    masked_ids: np.ndarray | None = None


@dataclass
class BuildCounts:
    instances: int = 0
    random_next: int = 0
    short: int = 0
    one_sentence_documents: int = 0
    sentences_split: int = 0
    tokens_truncated: int = 0
    lone_segments_next: int = 0
    separators: dict = field(default_factory=dict)


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


def nsp_instances(docs: list[list[np.ndarray]], doc_index: int, max_seq_length: int, short_seq_prob: float,
                  rng: random.Random, cls_id: int, sep_id: int, counts: BuildCounts,
                  lone_segment: str = "next") -> list[Instance]:
    """Instances of one document (create_instances_from_document).

    `lone_segment`: what to do when only one sentence was accumulated (a one-sentence document, or
    a sentence as long as the target). 'random' is Google: B is always random then, which pushes
    the random-next share over 50% (about 60% on the shared corpus). 'next' (default) flips the
    same fair coin as for longer chunks and, for is-next, takes the next sentence as B (or, in a
    one-sentence document, splits the sentence at a random token), keeping the share at 50%."""
    document = docs[doc_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    short = False
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
        short = True
    if len(document) == 1:
        counts.one_sentence_documents += 1
    instances: list[Instance] = []
    current_chunk: list[np.ndarray] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                if len(current_chunk) >= 2 or lone_segment == "random":
                    is_random_next = len(current_chunk) == 1 or rng.random() < 0.5
                else:
                    is_random_next = rng.random() < 0.5
                    if not is_random_next:
                        if i + 1 < len(document):                              # B = the next sentence
                            i += 1
                            current_chunk.append(document[i])
                        elif len(current_chunk[0]) >= 2:                       # B = the sentence's tail
                            cut = rng.randint(1, len(current_chunk[0]) - 1)
                            current_chunk = [current_chunk[0][:cut], current_chunk[0][cut:]]
                        else:
                            is_random_next = True
                        counts.lone_segments_next += int(not is_random_next)
                tokens_a = np.concatenate(current_chunk[:a_end])
                if is_random_next:
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(docs) - 1)
                        if random_document_index != doc_index:
                            break
                    random_document = docs[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    parts, length = [], 0
                    for j in range(random_start, len(random_document)):
                        parts.append(random_document[j])
                        length += len(random_document[j])
                        if length >= target_b_length:
                            break
                    tokens_b = np.concatenate(parts)
                    i -= len(current_chunk) - a_end                              # put back the unused
                else:
                    tokens_b = np.concatenate(current_chunk[a_end:])
                (fa, ba), (fb, bb) = truncate_pair(len(tokens_a), len(tokens_b), max_num_tokens, rng)
                tokens_a = tokens_a[fa:len(tokens_a) - ba]
                tokens_b = tokens_b[fb:len(tokens_b) - bb]
                counts.tokens_truncated += fa + ba + fb + bb
                assert len(tokens_a) >= 1 and len(tokens_b) >= 1
                tokens = np.concatenate([[cls_id], tokens_a, [sep_id], tokens_b, [sep_id]])
                instances.append(Instance(tokens, len(tokens_a) + 2, int(is_random_next), short))
                counts.random_next += int(is_random_next)
                counts.short += int(short)
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def packed_instances(docs: list[list[np.ndarray]], max_seq_length: int, cls_id: int, sep_id: int,
                     counts: BuildCounts) -> list[Instance]:
    """FULL-SENTENCES packing of the documents in order (no NSP)."""
    budget = max_seq_length - 2
    out: list[Instance] = []
    buf: list[np.ndarray] = []
    length = 0
    sep = np.array([sep_id])

    def emit():
        nonlocal buf, length
        if buf and buf[-1] is sep:                     # no separator at the very end
            buf.pop()
        if buf:
            tokens = np.concatenate([[cls_id], *buf, sep])
            out.append(Instance(tokens, len(tokens), -1, False))
        buf, length = [], 0

    for d, doc in enumerate(docs):
        if d > 0 and buf:
            if length + 1 >= budget:
                emit()
            else:
                buf.append(sep)                        # document boundary
                length += 1
        for sent in doc:
            if len(sent) > budget:
                counts.sentences_split += 1
                pieces = [sent[k:k + budget] for k in range(0, len(sent), budget)]
            else:
                pieces = [sent]
            for p in pieces:
                if length + len(p) > budget:
                    emit()
                buf.append(p)
                length += len(p)
    emit()
    return out


def mask_instances(instances: list[Instance], cfg: MaskingConfig, rng: np.random.Generator, vocab_size: int,
                   mask_id: int, never_mask: tuple[int, ...], subword: np.ndarray | None) -> None:
    """Static (Google) masking in place: tokens become the masked ids, positions/ids are stored."""
    for inst in instances:
        ids = np.asarray(inst.tokens, dtype=np.int64)
        sub = subword[ids] if subword is not None and cfg.mode != "token" else None
        masked, labels = mask_sequence(ids, cfg, rng, vocab_size, mask_id, never_mask, sub)
        pos = np.flatnonzero(labels != -100)
        inst.tokens = masked
        inst.masked_positions, inst.masked_ids = pos, labels[pos]
