"""Measurements: a tokenizer on your text, and prepared data as the trainer will see it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated

import numpy as np

from ..errors import DataError
from ..runconfig import AT_LEAST_1, NON_NEGATIVE, SEED, Checked
from .heldout import choose_held_out, ngram_overlap
from .masking import Collator, MaskingConfig, Mode, TokenInfo
from .pretraining import PretrainingData
from .text import TextCounts, expand_inputs, read_documents


@dataclass
class TokenizerStatsOptions(Checked):
    """What `bertkit tokenizer stats` measures (its flags: `cliconfig.add_options`)."""
    max_length: Annotated[int, AT_LEAST_1] = 512
    """The sequence length whose truncation to measure (tokens, with [CLS] and [SEP])."""
    max_sentences: Annotated[int, AT_LEAST_1] = 200_000
    """Measure on the first N sentences."""
    sentence_split: bool = False
    """Lines are paragraphs: split them into sentences."""


def tokenizer_stats(tokenizer, inputs: list[str], options: TokenizerStatsOptions | None = None) -> dict:
    """Sub-words per word, [UNK] rate, share of words in 3+ pieces, and the share of documents and
    of consecutive sentence pairs longer than max_length (with [CLS]/[SEP]) - what truncation cuts."""
    o = options or TokenizerStatsOptions()
    max_length, max_sentences = o.max_length, o.max_sentences
    counts = TextCounts()
    docs, n = [], 0
    for doc in read_documents(expand_inputs(inputs), counts, sentence_split=o.sentence_split):
        docs.append(doc)
        n += len(doc)
        if n >= max_sentences:
            break
    sents = [s for d in docs for s in d]
    if not sents:
        raise DataError(f"{', '.join(map(str, inputs))}: no text to measure (empty, or only blank lines)")
    words = pieces = unk = split3 = 0
    lengths = []
    for k in range(0, len(sents), 4096):
        for e in tokenizer.backend.encode_batch(sents[k:k + 4096], add_special_tokens=False):
            ids = np.asarray(e.ids, dtype=np.int64)
            lengths.append(len(ids))
            if not len(ids):
                continue
            wid = np.asarray([w if w is not None else -1 for w in e.word_ids], dtype=np.int64)
            per_word = np.unique(wid, return_counts=True)[1]
            words += len(per_word)
            pieces += len(ids)
            split3 += int((per_word >= 3).sum())
            unk += int((ids == tokenizer.unk_id).sum())
    lengths = np.asarray(lengths, dtype=np.int64)
    doc_lens, pair_over, pairs, k = [], 0, 0, 0
    for d in docs:
        L = lengths[k:k + len(d)]
        k += len(d)
        doc_lens.append(int(L.sum()))
        if len(L) >= 2:
            pairs += len(L) - 1
            pair_over += int(((L[:-1] + L[1:] + 3) > max_length).sum())
    doc_lens = np.asarray(doc_lens)
    return {
        "files": counts.files, "documents": len(docs), "sentences": len(sents), "words": words, "pieces": pieces,
        "pieces_per_word": pieces / max(words, 1), "unk_rate": unk / max(pieces, 1),
        "words_3plus_pieces": split3 / max(words, 1), "max_length": max_length,
        "sentences_truncated": float(((lengths + 2) > max_length).mean()) if len(lengths) else 0.0,
        "documents_truncated": float(((doc_lens + 2) > max_length).mean()) if len(doc_lens) else 0.0,
        "pairs_truncated": pair_over / max(pairs, 1),
        "mean_sentence_pieces": float(lengths.mean()) if len(lengths) else 0.0,
        "sampled": n >= max_sentences,
    }


# ---- the topic shortcut of NSP (the paper note's failure mode 3) ------------------------------------
def tfidf_cosine(terms: np.ndarray, segment: np.ndarray, n_pairs: int) -> np.ndarray:
    """Cosine of the bag-of-words TF-IDF vectors of segments 2p (A) and 2p + 1 (B), for each pair p.

    `terms[k]` (a token id) occurs in segment `segment[k]`. Term frequency is the count in the segment,
    idf = ln((1 + S) / (1 + df)) + 1 over the S = 2 n_pairs segments themselves (scikit-learn's smooth
    idf), so a word every segment holds weighs little and a rare shared word a lot. 0 for an empty side."""
    S = 2 * n_pairs
    V = int(terms.max()) + 1 if len(terms) else 1
    key, tf = np.unique(segment.astype(np.int64) * V + terms.astype(np.int64), return_counts=True)
    seg, term = key // V, key % V
    df = np.bincount(term, minlength=V)
    w = tf * (np.log((1.0 + S) / (1.0 + df)) + 1.0)[term]
    norm = np.sqrt(np.bincount(seg, w * w, minlength=S))
    pk = (seg // 2) * V + term              # (pair, term): a term both sides hold appears twice, A first
    order = np.argsort(pk, kind="stable")
    pk, w = pk[order], w[order]
    both = pk[1:] == pk[:-1]
    dot = np.bincount(pk[1:][both] // V, w[1:][both] * w[:-1][both], minlength=n_pairs)
    denom = norm[0::2] * norm[1::2]
    return np.where(denom > 0, dot / np.where(denom > 0, denom, 1.0), 0.0)


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve: the chance that a random positive scores above a random negative
    (ties count half; Mann-Whitney). None when one class is absent."""
    scores, positive = np.asarray(scores, dtype=np.float64), np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return None
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    first = np.r_[True, s[1:] != s[:-1]]
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(s)]
    ranks = np.empty(len(s))
    ranks[order] = ((starts + 1 + ends) / 2.0)[np.cumsum(first) - 1]      # 1-based, ties averaged
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def best_threshold(scores: np.ndarray, positive: np.ndarray) -> float:
    """The cut t that makes `score > t` agree best with `positive` (the lowest such cut, midway between
    two scores; -inf = all positive, +inf = none)."""
    order = np.argsort(scores, kind="mergesort")
    s, y = np.asarray(scores, dtype=np.float64)[order], np.asarray(positive, dtype=bool)[order]
    n = len(s)
    if not n:
        return float("-inf")
    right = np.r_[0, np.cumsum(~y)] + np.r_[np.cumsum(y[::-1])[::-1], 0]    # cut k: negatives below + positives above
    valid = np.r_[True, s[1:] != s[:-1], True]                               # only between distinct scores
    k = int(np.argmax(np.where(valid, right, -1)))
    if k == 0:
        return float("-inf")
    return float("inf") if k == n else float((s[k - 1] + s[k]) / 2.0)


def threshold_baseline(scores: np.ndarray, positive: np.ndarray, seed: int = 0) -> dict:
    """How well one threshold on `scores` separates the classes: chosen on a random half of the pairs
    (seeded, so deterministic), accuracy measured on the other half, beside the majority class's share
    of that half (chance); and the ROC AUC over all pairs (no threshold). Threshold None: no cut beats
    calling every pair one class."""
    scores, positive = np.asarray(scores, dtype=np.float64), np.asarray(positive, dtype=bool)
    n = len(scores)
    perm = np.random.default_rng(seed).permutation(n)
    fit, test = perm[: n // 2], perm[n // 2:]
    t = best_threshold(scores[fit], positive[fit])
    hits = (scores[test] > t) == positive[test]
    share = float(positive[test].mean()) if len(test) else 0.0
    return {"pairs": n, "fit_pairs": len(fit), "scored_pairs": len(test), "threshold": t if np.isfinite(t) else None,
            "accuracy": float(hits.mean()) if len(test) else None, "chance": max(share, 1.0 - share),
            "auc": roc_auc(scores, positive),
            "mean_score_positive": float(scores[positive].mean()) if positive.any() else None,
            "mean_score_negative": float(scores[~positive].mean()) if (~positive).any() else None}


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions starts[i] .. starts[i] + lengths[i] - 1 of every i, concatenated."""
    lengths = np.maximum(lengths, 0)
    shift = starts - np.r_[0, np.cumsum(lengths)[:-1]]
    return np.repeat(shift, lengths) + np.arange(int(lengths.sum()))


def _pair_ids(ds: PretrainingData, s: int, mine: np.ndarray, L: np.ndarray) -> np.ndarray:
    """The ids of instances `mine` of shard s, one after the other (only those read), static masks undone."""
    a = ds._shard(s)
    off = np.asarray(a["offsets"])
    ids = np.asarray(a["input_ids"][_ranges(off[mine], L)], dtype=np.int64)
    if ds.static:
        mo = np.asarray(a["masked_lm_offsets"])
        counts = mo[mine + 1] - mo[mine]
        at = _ranges(mo[mine], counts)
        first = np.r_[0, np.cumsum(L)[:-1]]
        ids[np.repeat(first, counts) + np.asarray(a["masked_lm_positions"][at], dtype=np.int64)] = \
            np.asarray(a["masked_lm_ids"][at], dtype=np.int64)
    return ids


def topic_baseline(ds: PretrainingData, sample: int = 20000, seed: int = 0) -> dict | None:
    """The paper note's sentence-pair shortcut, measured on prepared pairs: a model that sees only the
    words of A and B (TF-IDF cosine, IDF from these pairs, no order, no model) and one threshold on it,
    telling is-next (label 0) from the rest (NSP: random next from another document; SOP: swapped).
    Over an even sample of `sample` instances (only those are read), with the original ids where static
    masks replaced them. None when the data has no pairs."""
    never = np.asarray(ds.token_info().never_mask)
    n_all = len(ds)
    pick = np.unique(np.linspace(0, n_all - 1, min(sample, n_all)).astype(np.int64)) if n_all else np.zeros(0, np.int64)
    terms, segs, labels, base = [], [], [], 0
    for s in range(len(ds.shard_paths)):
        lo = int(ds._starts[s])
        mine = pick[(pick >= lo) & (pick < int(ds._starts[s + 1]))] - lo
        if not len(mine):
            continue
        a = ds._shard(s)
        b = np.asarray(a["b_start"][mine], dtype=np.int64)
        lab = np.asarray(a["nsp_labels"][mine], dtype=np.int64)
        off = np.asarray(a["offsets"])
        L = off[mine + 1] - off[mine]
        keep = (lab >= 0) & (b < L)
        mine, b, lab, L = mine[keep], b[keep], lab[keep], L[keep]
        if not len(mine):
            continue
        ids = _pair_ids(ds, s, mine, L)
        first = np.r_[0, np.cumsum(L)[:-1]]
        pair = base + np.arange(len(mine))
        for start, n, side in ((first + 1, b - 2, 0), (first + b, L - b - 1, 1)):     # A, then B
            terms.append(ids[_ranges(start, n)])
            segs.append(np.repeat(2 * pair + side, np.maximum(n, 0)))
        labels.append(lab)
        base += len(mine)
    if not base:
        return None
    terms, segs = np.concatenate(terms), np.concatenate(segs)
    ok = ~np.isin(terms, never)
    out = threshold_baseline(tfidf_cosine(terms[ok], segs[ok], base), np.concatenate(labels) == 0, seed)
    return {"measure": "tfidf_cosine", "pair_mode": ds.meta.get("config", {}).get("pair_mode", "nsp"), **out}


def _mask_breakdown(ids: np.ndarray, labels: np.ndarray, info: TokenInfo) -> tuple[int, int, int]:
    sel = labels != -100
    shown, target = ids[sel], labels[sel]
    mask = int((shown == info.mask_id).sum())
    keep = int(((shown == target) & (shown != info.mask_id)).sum())
    return mask, keep, int(sel.sum()) - mask - keep


def held_out_stats(ds: PretrainingData, eval_instances: int = 256) -> dict:
    """What `pretrain` would evaluate on with this data (its held-out split, else its last instances)
    and the share of that set's 12-grams found in the training instances (mask leakage)."""
    if ds.meta.get("split") == "eval":
        return {"source": "this folder is a held-out split"}
    held = choose_held_out(ds, None, eval_instances)
    return {**held.report, **ngram_overlap(held, [(ds, held.train_stop)]), "split": ds.meta.get("eval")}


@dataclass
class DataStatsOptions(Checked):
    """What `bertkit data stats` measures (its flags: `cliconfig.add_options`)."""
    sample: Annotated[int, NON_NEGATIVE] = 20000
    """Instances to measure masking (and the topic shortcut) on."""
    mask_mode: Mode | None = None
    """Dynamic data: measure this masking (pretrain's data.mask_mode; default: as prepared)."""
    seed: Annotated[int, SEED] = 0
    """Dynamic data: the collator seed (pretrain's train.seed)."""


def data_stats(ds: PretrainingData, options: DataStatsOptions | None = None, bins: int = 16,
               eval_instances: int = 256, **changes) -> dict:
    """Counts over all instances; masking measured over an even sample of `sample` instances with
    the collator training uses (the prepared masking, or `mask_mode`; `seed`: pretrain's train.seed);
    the topic shortcut of the pairs over the same sample (`topic_baseline`, its halves drawn with
    `seed`). `options`: `DataStatsOptions` (keyword arguments of its fields change single ones)."""
    o = dataclasses.replace(options or DataStatsOptions(), **changes)
    sample, seed = o.sample, o.seed
    meta, info = ds.meta, ds.token_info()
    max_len = int(meta["max_length"])
    lengths, nsp, short, b_start = [], [], [], []
    bad = 0
    for s in range(len(ds.shard_paths)):
        a = ds._shard(s)
        off = np.asarray(a["offsets"])
        ids = np.asarray(a["input_ids"])
        L = np.diff(off)
        lengths.append(L)
        nsp.append(np.asarray(a["nsp_labels"]))
        short.append(np.asarray(a["short"]))
        b = np.asarray(a["b_start"]).astype(np.int64)
        b_start.append(b)
        if len(L):  # well-formed: [CLS] first, [SEP] last, [SEP] closing A when there is a B
            first, last = ids[off[:-1]], ids[off[1:] - 1]
            sep_a = ids[(off[:-1] + b - 1)[b < L]]
            bad += int((first != info.cls_id).sum() + (last != info.sep_id).sum() + (sep_a != info.sep_id).sum()
                       + (L > max_len).sum() + ((b < 2) | (b > L)).sum())
    L, nsp, short, b = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (lengths, nsp, short, b_start))
    n = len(L)
    pairs = b < L
    edges = np.linspace(0, max_len, bins + 1).astype(int)
    hist = np.histogram(L, bins=edges)[0] if n else np.zeros(bins, int)
    out = {
        "instances": n, "tokens": int(L.sum()), "max_length": max_len, "longest": int(L.max()) if n else 0,
        "mean_length": float(L.mean()) if n else 0.0, "full_length_fraction": float((L == max_len).mean()) if n else 0.0,
        "length_histogram": {f"{edges[i] + 1}-{edges[i + 1]}": int(hist[i]) for i in range(bins)},
        "nsp": bool(meta["nsp"]),
        "random_next_fraction": float((nsp == 1).sum() / max(int((nsp >= 0).sum()), 1)) if meta["nsp"] else None,
        "short_fraction": float(short.mean()) if n else 0.0,
        "mean_a_length": float((b[pairs] - 2).mean()) if pairs.any() else None,
        "mean_b_length": float((L[pairs] - b[pairs] - 1).mean()) if pairs.any() else None,
        "malformed": bad, "shards": len(ds.shard_paths), "counts": meta.get("counts", {}),
    }
    # masking, over an even sample, as training sees it: the same Collator, seed and epoch 0
    idx = np.unique(np.linspace(0, n - 1, min(sample, n)).astype(np.int64)) if n else np.zeros(0, np.int64)
    cfg = MaskingConfig(**meta.get("masking_config", {}))
    cfg = dataclasses.replace(cfg, mode=o.mask_mode) if o.mask_mode else cfg
    collator = Collator(ds, cfg, seed=seed)
    cand = sel = m = k = r = at_cap = 0
    for lo in range(0, len(idx), 256):
        batch = collator([ds[int(i)] for i in idx[lo:lo + 256]], epoch=0)
        shown, labels = batch["input_ids"].numpy(), batch["mlm_labels"].numpy()
        real = batch["attention_mask"].numpy().astype(bool)
        chosen = labels != -100
        original = np.where(chosen, labels, shown)
        cand += int((real & ~np.isin(original, info.never_mask)).sum())
        cm, ck, cr = _mask_breakdown(shown, labels, info)
        per = chosen.sum(1)
        sel, m, k, r = sel + int(per.sum()), m + cm, k + ck, r + cr
        at_cap += int((per >= cfg.max_predictions).sum())
    out["masking"] = {
        "mode": "static" if ds.static else "dynamic", "config": cfg.to_dict(), "instances_measured": int(len(idx)),
        "seed": seed, "selected_fraction": sel / max(cand, 1), "mask_fraction": m / max(sel, 1),
        "keep_fraction": k / max(sel, 1), "random_fraction": r / max(sel, 1),
        "at_cap_fraction": at_cap / max(len(idx), 1), "predictions_per_instance": sel / max(len(idx), 1),
    }
    out["held_out"] = held_out_stats(ds, eval_instances)
    out["topic"] = topic_baseline(ds, sample, seed) if meta["nsp"] else None
    return out


@dataclass
class ShowOptions(Checked):
    """Which instances `bertkit data show` prints (its flags: `cliconfig.add_options`)."""
    n: Annotated[int, NON_NEGATIVE] = 5
    """Instances to print."""
    start: Annotated[int, NON_NEGATIVE] = 0
    """The first instance."""
    epoch: Annotated[int, NON_NEGATIVE] = 0
    """Dynamic data: the epoch whose masks to show."""
    seed: Annotated[int, SEED] = 0
    """Dynamic data: the collator seed (pretrain's train.seed)."""


def show_instances(ds: PretrainingData, options: ShowOptions | None = None) -> str:
    """Decoded instances: segments on their own lines, masked positions as {shown|target}."""
    o = options or ShowOptions()
    tok = ds.tokenizer()
    collator = Collator(ds, MaskingConfig(**ds.meta.get("masking_config", {})), seed=o.seed)
    lines = []
    for i in range(o.start, min(o.start + o.n, len(ds))):
        x = ds[i]
        ids = x["input_ids"]
        if "masked_lm_positions" in x:
            shown, labels = ids, np.full(len(ids), -100, dtype=np.int64)
            labels[x["masked_lm_positions"]] = x["masked_lm_ids"]
        else:
            shown, labels = collator.mask(ids, i, o.epoch)
        toks = tok.convert_ids_to_tokens(shown)
        tgt = tok.convert_ids_to_tokens(np.where(labels >= 0, labels, 0))
        words = [f"{{{t}|{g}}}" if lab >= 0 else t for t, g, lab in zip(toks, tgt, labels)]
        nsp = {0: "is-next", 1: "random-next", -1: "no NSP"}[x["nsp_label"]]
        b = int(np.argmax(x["token_type_ids"])) if x["token_type_ids"].any() else len(ids)
        lines.append(f"#{i}  {nsp}  length {len(ids)}  predictions {int((labels >= 0).sum())}")
        lines.append("  A: " + " ".join(words[:b]))
        if b < len(ids):
            lines.append("  B: " + " ".join(words[b:]))
    return "\n".join(lines)
