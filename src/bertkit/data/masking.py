"""Masked-LM masking: which positions to predict and what the model sees there.

API (the pre-training loop codes against this):

  MaskingConfig(mode='token'|'whole_word'|'span', mask_prob=0.15, max_predictions=20,
                mask_token_fraction=0.8, random_token_fraction=0.1, span_p=0.2, max_span=10)
  with_overrides(prepared_cfg, {field: value}) -> (cfg, changed)   the prepared masking, overridden
  mask_sequence(input_ids, cfg, rng, vocab_size, mask_id, special_ids, is_subword=None)
      -> (masked_ids, labels)        labels = -100 where not selected, else the original id
  TokenInfo(vocab_size, pad_id, cls_id, sep_id, mask_id, subword=None)   ids the masker needs
  Collator(tokenizer_or_ids_info, masking_cfg, seed, pad_to_multiple_of=None)
      collator(batch, epoch=None) -> dict of torch tensors: input_ids (B, T), token_type_ids,
      attention_mask, mlm_labels (-100 where not predicted), nsp_labels (B,) when the data has NSP
  Collator(..., objective='clm'): no masks; mlm_labels = the next token (left-to-right LM)

Selection follows google-research/bert `create_masked_lm_predictions`: the candidates are every
position whose id is not special ([CLS], [SEP], [PAD], [MASK]); they are shuffled (whole-word mode
shuffles words: a '##' piece joins the word before it) and taken greedily, skipping a word that
would overflow, until n = min(max_predictions, max(1, round(n_candidates * mask_prob))) positions
are selected. Google counts len(tokens) *including* [CLS]/[SEP] in that formula; we count the
candidates, so the rate is mask_prob of the tokens that can be predicted (at length 128 both give
19). Each selected position (each word, in whole-word and span modes: replacement is per word)
becomes [MASK] with probability mask_token_fraction, a random id drawn uniformly from the whole
vocabulary (as Google) with probability random_token_fraction, and stays itself otherwise.
Span mode (SpanBERT): span lengths in words ~ Geometric(span_p) clipped at max_span, start at a
random word, spans drawn until the same budget n is spent (the last span is cut to fit).

Dynamic masking is a pure function of (seed, epoch, instance index): the rng is
`np.random.default_rng([seed, epoch, index])`, so resumed runs, any number of data-loader workers
and DDP ranks see exactly the same masks. Static data (prepared with --masking static) carries its
masked positions; the collator uses them as stored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, asdict
from typing import Annotated, Any, Iterable, Literal, Sequence

import numpy as np

from ..runconfig import AT_LEAST_1, HALF_OPEN_UNIT, OPEN_UNIT, UNIT, RunConfigError, check_fields

Mode = Literal["token", "whole_word", "span"]


class MaskingError(RunConfigError):
    """A masking setting is out of range; the message names it."""


@dataclass
class MaskingConfig:
    mode: Mode = "token"
    """'token' (BERT), 'whole_word' (all pieces of a word together) or 'span' (SpanBERT)."""
    mask_prob: Annotated[float, OPEN_UNIT] = 0.15
    """Share of the candidate tokens to predict."""
    max_predictions: Annotated[int, AT_LEAST_1] = 20
    """Cap on predictions per sequence (Google's max_predictions_per_seq)."""
    mask_token_fraction: Annotated[float, UNIT] = 0.8
    """Of the selected positions: share replaced by [MASK]."""
    random_token_fraction: Annotated[float, UNIT] = 0.1
    """Of the selected positions: share replaced by a random vocabulary id (the rest keep their id)."""
    span_p: Annotated[float, HALF_OPEN_UNIT] = 0.2
    """Span mode: parameter of the geometric distribution of span lengths (in words)."""
    max_span: Annotated[int, AT_LEAST_1] = 10
    """Span mode: longest span, in words."""

    def __post_init__(self):
        check_fields(self, error=MaskingError)      # the choices and ranges on the fields
        if self.mask_token_fraction + self.random_token_fraction > 1.0 + 1e-9:
            raise MaskingError(f"mask_token_fraction + random_token_fraction = "
                               f"{self.mask_token_fraction + self.random_token_fraction:g}: must be at most 1")

    def to_dict(self) -> dict:
        return asdict(self)


def with_overrides(prepared: MaskingConfig, overrides: dict) -> tuple[MaskingConfig, dict]:
    """The masking to train with: what was prepared, with the given fields replaced. Returns it and
    {field: {"prepared": old, "trained": new}} for each field whose value changes."""
    changed = {k: {"prepared": getattr(prepared, k), "trained": v} for k, v in overrides.items()
               if getattr(prepared, k) != v}
    return MaskingConfig(**{**prepared.to_dict(), **overrides}), changed


def default_max_predictions(max_length: int, mask_prob: float) -> int:
    """Google's cap on predictions per sequence: length x rate rounded up to a multiple of 10
    (20 at 128 and 15%, 80 at 512)."""
    return max(1, math.ceil(max_length * mask_prob / 10 - 1e-9) * 10)


def num_to_predict(n_candidates: int, cfg: MaskingConfig) -> int:
    """min(max_predictions, max(1, round(n * p))) as Google (Python 3 round); 0 without candidates."""
    if n_candidates <= 0:
        return 0
    return min(cfg.max_predictions, max(1, int(round(n_candidates * cfg.mask_prob))), n_candidates)


def candidates(ids: np.ndarray, special_ids: Iterable[int]) -> np.ndarray:
    """True where a token may be selected (not one of special_ids)."""
    ok = np.ones(len(ids), dtype=bool)
    for s in special_ids:
        ok &= ids != s
    return ok


def _words(cand: np.ndarray, is_subword: np.ndarray | None) -> list[np.ndarray]:
    """Group candidate positions into words: a '##' piece right after a candidate joins its word."""
    if is_subword is None or len(cand) == 0:
        return [cand[i:i + 1] for i in range(len(cand))]
    starts = ~(is_subword[cand].astype(bool)) | np.r_[True, np.diff(cand) != 1]
    return np.split(cand, np.flatnonzero(starts)[1:])


def select_positions(input_ids: np.ndarray, cfg: MaskingConfig, rng: np.random.Generator,
                     special_ids: Iterable[int], is_subword: np.ndarray | None = None
                     ) -> list[np.ndarray]:
    """The selected positions, as a list of groups (one per word/span) that share a replacement."""
    ids = np.asarray(input_ids)
    cand = np.flatnonzero(candidates(ids, special_ids))
    k = num_to_predict(len(cand), cfg)
    if k == 0:
        return []
    if cfg.mode == "token":
        return [np.sort(rng.choice(cand, size=k, replace=False))]
    words = _words(cand, is_subword if cfg.mode in ("whole_word", "span") else None)
    groups: list[np.ndarray] = []
    if cfg.mode == "whole_word":
        count = 0
        for w in rng.permutation(len(words)):
            if count >= k:
                break
            if count + len(words[w]) > k:
                continue
            groups.append(words[w])
            count += len(words[w])
        return groups
    # span: geometric lengths in words, random start word, until the budget k is spent
    covered = np.zeros(len(ids), dtype=bool)
    count, tries = 0, 0
    while count < k and tries < 100 * k:
        tries += 1
        length = min(int(rng.geometric(cfg.span_p)), cfg.max_span)
        start = int(rng.integers(len(words)))
        pos = np.concatenate(words[start:start + length])
        pos = pos[~covered[pos]][: k - count]
        if len(pos):
            covered[pos] = True
            groups.append(pos)
            count += len(pos)
    return groups


def mask_sequence(input_ids: np.ndarray, cfg: MaskingConfig, rng: np.random.Generator, vocab_size: int,
                  mask_id: int, special_ids: Iterable[int], is_subword: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Mask one sequence. Returns (masked_ids, labels): int64 arrays, labels -100 where not selected.

    `is_subword`: per-position booleans (True for a '##' piece) for whole-word and span modes;
    without it every token is its own word.
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    groups = select_positions(ids, cfg, rng, special_ids, is_subword)
    masked, labels = ids.copy(), np.full(len(ids), -100, dtype=np.int64)
    if not groups:
        return masked, labels
    if cfg.mode == "token":                   # one decision per token
        pos = groups[0]
        u = rng.random(len(pos))
    else:                                     # one decision per word / span
        u = np.repeat(rng.random(len(groups)), [len(g) for g in groups])
        pos = np.concatenate(groups)
    labels[pos] = ids[pos]
    to_mask = u < cfg.mask_token_fraction
    to_random = (u >= cfg.mask_token_fraction) & (u < cfg.mask_token_fraction + cfg.random_token_fraction)
    masked[pos[to_mask]] = mask_id
    n_rand = int(to_random.sum())
    if n_rand:
        masked[pos[to_random]] = rng.integers(0, vocab_size, n_rand)
    return masked, labels


def mask_many(flat: np.ndarray, offsets: np.ndarray, cfg: MaskingConfig, rng: np.random.Generator,
              vocab_size: int, mask_id: int, special_ids: Iterable[int], subword: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mask many sequences at once (static data): instance i is flat[offsets[i]:offsets[i + 1]].

    Returns (masked flat ids, positions within their instance, original ids there, offsets of each
    instance's predictions). Token mode is vectorised (each instance gets a uniform random subset of
    its candidates of Google's size, then 80/10/10 per position - the same distribution as
    `mask_sequence`); whole-word and span modes run `mask_sequence` per instance.
    `subword`: per-vocabulary-id booleans ('##' pieces)."""
    flat = np.asarray(flat, dtype=np.int64)
    n = len(offsets) - 1
    lens = np.diff(offsets)
    inst = np.repeat(np.arange(n), lens)
    if cfg.mode != "token":
        masked, labels = flat.copy(), np.full(len(flat), -100, dtype=np.int64)
        for i in range(n):
            lo, hi = offsets[i], offsets[i + 1]
            sub = subword[flat[lo:hi]] if subword is not None else None
            masked[lo:hi], labels[lo:hi] = mask_sequence(flat[lo:hi], cfg, rng, vocab_size, mask_id, special_ids, sub)
        sel = np.flatnonzero(labels != -100)
    else:
        cand = candidates(flat, special_ids)
        n_cand = np.bincount(inst[cand], minlength=n)
        k = np.minimum(np.minimum(cfg.max_predictions, np.maximum(1, np.round(n_cand * cfg.mask_prob))), n_cand)
        # random keys in an (instances, longest) table; non-candidates and padding sort last;
        # each row's k smallest keys are a uniform random k-subset of its candidates
        col = np.arange(len(flat)) - offsets[inst]
        table = np.full((n, int(lens.max()) if n else 0), 2.0)
        table[inst, col] = np.where(cand, rng.random(len(flat)), 2.0)
        order = np.argsort(table, axis=1)
        rows, ranks = np.nonzero(np.arange(table.shape[1])[None, :] < k[:, None])
        sel = offsets[rows] + order[rows, ranks]
        sel.sort()
        masked = flat.copy()
        u = rng.random(len(sel))
        to_mask = u < cfg.mask_token_fraction
        to_random = (u >= cfg.mask_token_fraction) & (u < cfg.mask_token_fraction + cfg.random_token_fraction)
        masked[sel[to_mask]] = mask_id
        masked[sel[to_random]] = rng.integers(0, vocab_size, int(to_random.sum()))
    counts = np.bincount(inst[sel], minlength=n)
    mlm_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return masked, sel - offsets[inst[sel]], flat[sel], mlm_offsets


# ---- the ids the masker needs, from a tokenizer, a dataset or its meta.json ----------------------
@dataclass
class TokenInfo:
    vocab_size: int
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    subword: np.ndarray | None = None
    """bool per vocabulary id: True for '##' pieces (whole-word and span masking)."""

    @property
    def never_mask(self) -> tuple[int, ...]:
        return (self.pad_id, self.cls_id, self.sep_id, self.mask_id)

    @classmethod
    def from_vocab(cls, vocab: dict[str, int]) -> "TokenInfo":
        size = max(vocab.values()) + 1
        sub = np.zeros(size, dtype=bool)
        sub[[i for t, i in vocab.items() if t.startswith("##")]] = True
        return cls(size, vocab["[PAD]"], vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"], sub)

    @classmethod
    def of(cls, obj: Any) -> "TokenInfo":
        """From a TokenInfo, a bertkit Tokenizer, a PretrainingData, or a meta.json dict."""
        if isinstance(obj, TokenInfo):
            return obj
        if hasattr(obj, "vocab") and hasattr(obj, "mask_id"):          # Tokenizer
            return cls.from_vocab(obj.vocab)
        if hasattr(obj, "token_info"):                                 # PretrainingData
            return obj.token_info()
        if isinstance(obj, dict) and "special_ids" in obj:             # meta.json
            s = obj["special_ids"]
            return cls(int(obj["vocab_size"]), s["pad"], s["cls"], s["sep"], s["mask"])
        raise TypeError(f"cannot get token ids from {type(obj).__name__}")


# ---- batches ------------------------------------------------------------------------------------
class Collator:
    """Pad instances into a batch and mask them (dynamic) or apply their stored masks (static).

    Call with a list of instances (dicts from `PretrainingData[i]`, which carry their global
    `index`) or of (index, instance) pairs. `epoch` comes from the argument or the `epoch`
    attribute (set it each epoch: `collator.epoch = e`).

    objective='clm' (left-to-right LM): nothing is masked (static masks are undone) and
    `mlm_labels` holds each position's next token, labels[i] = ids[i + 1] within the sequence
    (-100 at its last token and on padding), for the same head.
    """

    def __init__(self, tokenizer_or_ids_info: Any, masking_cfg: MaskingConfig | None = None, seed: int = 0,
                 pad_to_multiple_of: int | None = None, objective: str = "mlm"):
        self.info = TokenInfo.of(tokenizer_or_ids_info)
        self.cfg = masking_cfg or MaskingConfig()
        self.seed, self.pad_to_multiple_of, self.epoch = int(seed), pad_to_multiple_of, 0
        if objective not in ("mlm", "clm"):
            raise MaskingError(f"objective {objective!r}: expected mlm or clm")
        if self.seed < 0:
            raise MaskingError(f"seed {seed}: expected >= 0")
        self.objective = objective
        if self.cfg.mode != "token" and self.info.subword is None:
            raise MaskingError(f"{self.cfg.mode} masking needs the vocabulary (pass the tokenizer or dataset)")

    def mask(self, input_ids: np.ndarray, index: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, int(epoch), int(index)])
        sub = self.info.subword[input_ids] if self.info.subword is not None else None
        return mask_sequence(input_ids, self.cfg, rng, self.info.vocab_size, self.info.mask_id,
                             self.info.never_mask, sub)

    def __call__(self, batch: Sequence[Any], epoch: int | None = None) -> dict:
        import torch

        epoch = self.epoch if epoch is None else epoch
        items = [b if isinstance(b, tuple) else (b.get("index", j), b) for j, b in enumerate(batch)]
        T = max(len(inst["input_ids"]) for _, inst in items)
        if self.pad_to_multiple_of:
            T = -(-T // self.pad_to_multiple_of) * self.pad_to_multiple_of
        B = len(items)
        ids = np.full((B, T), self.info.pad_id, dtype=np.int64)
        types = np.zeros((B, T), dtype=np.int64)
        attn = np.zeros((B, T), dtype=np.int64)
        labels = np.full((B, T), -100, dtype=np.int64)
        nsp = np.zeros(B, dtype=np.int64)
        for r, (idx, inst) in enumerate(items):
            x = np.asarray(inst["input_ids"], dtype=np.int64)
            n = len(x)
            if self.objective == "clm":                           # next token; static masks undone
                if "masked_lm_positions" in inst:
                    x = x.copy()
                    x[np.asarray(inst["masked_lm_positions"])] = inst["masked_lm_ids"]
                masked, lab = x, np.full(n, -100, dtype=np.int64)
                lab[:-1] = x[1:]
            elif "masked_lm_positions" in inst:                   # static: stored masks
                masked, lab = x, np.full(n, -100, dtype=np.int64)
                lab[np.asarray(inst["masked_lm_positions"])] = inst["masked_lm_ids"]
            else:
                masked, lab = self.mask(x, idx, epoch)
            ids[r, :n], labels[r, :n], attn[r, :n] = masked, lab, 1
            types[r, :n] = inst["token_type_ids"]
            nsp[r] = inst.get("nsp_label", -1)
        out = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types),
               "attention_mask": torch.from_numpy(attn), "mlm_labels": torch.from_numpy(labels)}
        if (nsp >= 0).all():
            out["nsp_labels"] = torch.from_numpy(nsp)
        return out
