"""The held-out set pre-training evaluates on, and how much of its text the training data holds.

`choose_held_out(data, eval_path, eval_instances)` picks, in this order: a folder given as
`data.eval_path`; the held-out documents `prepare` split off (DATA/eval/); else, for data prepared
without a split, the last instances of the training data themselves (which share documents with
the training instances, and with static masks or random-next segments, text: a warning).

`ngram_overlap(held, train)` measures the paper note's failure mode "mask leakage": the share of
the held-out set's 12-grams of token ids (windows of 12 consecutive tokens inside a segment, with
the original ids where static masks replaced them) that also occur anywhere in the training
data. A document split keeps it near the rate at which natural text repeats itself (quotes,
boilerplate); evaluating on training documents does not. It is exact for the held-out instances
used and scans up to `max_train_tokens` of training text (beyond that, the same random share of
every shard, so a lower bound; the shards holding the held-out instances themselves are read
whole; the result says how much was scanned). Windows are hashed to 64 bits (a false match among a few
million distinct 12-grams has odds of ~1e-7).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .pretraining import DataError, PretrainingData, eval_split, open_dataset

NGRAM = 12
WARN_OVERLAP = 0.05
_P = np.uint64(0x100000001B3)           # odd multiplier of the polynomial hash (FNV prime)
_MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class HeldOut:
    """What pretrain evaluates on: `indices` of `data`, and the first `train_stop` instances of the
    training data are the ones trained on (all of them unless the held-out set is carved out)."""
    data: PretrainingData | None
    indices: np.ndarray
    source: str                          # 'split' | 'eval_path' | 'last_instances' | 'none'
    train_stop: int
    report: dict = field(default_factory=dict)


def choose_held_out(train: PretrainingData, eval_path: str | None = None, eval_instances: int = 256) -> HeldOut:
    none = np.zeros(0, dtype=np.int64)
    if eval_instances <= 0:
        return HeldOut(None, none, "none", len(train), {"source": "none"})
    if eval_path:
        data, source = open_dataset(eval_path), "eval_path"
        if data.meta.get("tokenizer_hash") != train.meta.get("tokenizer_hash"):
            raise DataError(f"{eval_path}: prepared with another tokenizer than {train.path} (its ids would mean "
                            "other tokens); prepare the held-out text with the same --model")
    else:
        data, source = eval_split(train), "split"
    if data is None:                     # prepared without a split: carve the last instances out
        n = min(eval_instances, len(train) // 10)
        return HeldOut(train, np.arange(len(train) - n, len(train), dtype=np.int64), "last_instances",
                       len(train) - n, {"source": "last_instances", "path": str(train.path), "instances": n})
    n = min(eval_instances, len(data))
    idx = np.unique(np.linspace(0, len(data) - 1, n).astype(np.int64)) if n else none
    return HeldOut(data, idx, source, len(train), {"source": source, "path": str(data.path), "instances": len(idx)})


# ---- n-gram overlap --------------------------------------------------------------------------------
def ngram_hashes(ids: np.ndarray, special: np.ndarray, n: int = NGRAM) -> np.ndarray:
    """64-bit hashes of every window of n ids that holds no special position (uint64, in order)."""
    m = len(ids) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    x = ids.astype(np.uint64) + np.uint64(1)
    h = np.zeros(m, dtype=np.uint64)
    for k in range(n):                   # h = sum x[i + k] P^(n - 1 - k)  (mod 2^64)
        h = h * _P + x[k:k + m]
    h ^= h >> np.uint64(31)
    h *= _MIX
    h ^= h >> np.uint64(29)
    bad = np.concatenate([[0], np.cumsum(special, dtype=np.int64)])
    return h[bad[n:] - bad[:m] == 0]


def _instance_ids(ds, i: int) -> np.ndarray:
    """Instance i with its original ids (static masks undone)."""
    x = ds[int(i)]
    ids = x["input_ids"].copy()
    if "masked_lm_positions" in x:
        ids[x["masked_lm_positions"]] = x["masked_lm_ids"]
    return ids


def _shard_ids(ds: PretrainingData, s: int, stop: int) -> np.ndarray:
    """The ids of the first `stop` instances of shard s, static masks undone."""
    a = ds._shard(s)
    off = np.asarray(a["offsets"])
    end = int(off[stop])
    flat = np.asarray(a["input_ids"][:end], dtype=np.int64)
    if ds.static:
        mo = np.asarray(a["masked_lm_offsets"])
        where = off[np.repeat(np.arange(len(off) - 1), np.diff(mo))] + np.asarray(a["masked_lm_positions"])
        keep = where < end
        flat[where[keep]] = np.asarray(a["masked_lm_ids"], dtype=np.int64)[keep]
    return flat


def _training_shards(ds: PretrainingData, stop: int, budget: int, full: set[int]) -> tuple[list[tuple[int, int]], int]:
    """(shard, instances to read) covering up to `budget` tokens of the first `stop` instances, and
    their total token count. Over the budget each shard gives the same share of its instances, read
    from its start (a shard's instances are shuffled, so that is a random sample of all its
    documents); the shards in `full` (those holding the held-out instances themselves) are read whole."""
    parts, total = [], 0
    for s in range(len(ds.shard_paths)):
        lo = int(ds._starts[s])
        if lo >= stop:
            break
        off = np.asarray(ds._shard(s)["offsets"])
        k = min(len(off) - 1, stop - lo)
        parts.append((s, k, off))
        total += int(off[k])
    rest = sum(int(off[k]) for s, k, off in parts if s not in full)
    share = min(1.0, max(budget - (total - rest), 0) / max(rest, 1))
    chosen = [(s, k if s in full or share >= 1.0 else int(np.searchsorted(off, share * off[k])))
              for s, k, off in parts]
    return [(s, k) for s, k in chosen if k > 0], total


def ngram_overlap(held: HeldOut, train: list[tuple[PretrainingData, int]], n: int = NGRAM,
                  max_train_tokens: int = 10_000_000) -> dict[str, Any]:
    """Share of the held-out instances' n-grams (with multiplicity) found in the training data:
    `train` is a list of (dataset, number of leading instances trained on)."""
    if held.data is None or not len(held.indices):
        return {"ngram": n, "overlap": None, "eval_ngrams": 0}
    never = np.asarray(held.data.token_info().never_mask)
    ev = [ngram_hashes(x, np.isin(x, never), n) for x in (_instance_ids(held.data, i) for i in held.indices)]
    ev = np.concatenate(ev) if ev else np.zeros(0, dtype=np.uint64)
    if not len(ev):
        return {"ngram": n, "overlap": None, "eval_ngrams": 0}
    uniq, inverse = np.unique(ev, return_inverse=True)
    found = np.zeros(len(uniq), dtype=bool)
    scanned = total = 0
    for ds, stop in train:
        never = np.asarray(ds.token_info().never_mask)
        mine = held.data is ds or held.data.path == ds.path
        full = {int(np.searchsorted(ds._starts, i, side="right") - 1) for i in held.indices} if mine else set()
        shards, size = _training_shards(ds, stop, max_train_tokens // max(len(train), 1), full)
        total += size
        for s, k in shards:
            flat = _shard_ids(ds, s, k)
            scanned += len(flat)
            h = ngram_hashes(flat, np.isin(flat, never), n)
            pos = np.minimum(np.searchsorted(uniq, h), len(uniq) - 1)
            hit = uniq[pos] == h
            found[pos[hit]] = True
    return {"ngram": n, "overlap": float(found[inverse].mean()), "eval_ngrams": int(len(ev)),
            "eval_instances": int(len(held.indices)), "train_tokens_scanned": int(scanned),
            "train_tokens": int(total), "sampled": scanned < total, "against": [str(ds.path) for ds, _ in train]}
