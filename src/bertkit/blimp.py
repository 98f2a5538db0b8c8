"""BLiMP (Warstadt et al., 2020): what a language model knows of English grammar, with no fine-tuning.

Each minimal pair is an acceptable and an unacceptable sentence; the model gets the pair when it
scores the acceptable one strictly higher (a tie is a failure: a model that scores every sentence
the same gets 0, not 50 or 100%). Scores are log-likelihoods:

  * a masked model (BERT) by pseudo-log-likelihood (Salazar et al., 2020): each word piece masked in
    turn, PLL(S) = sum_i log p(x_i | S without x_i), over the pieces between [CLS] and [SEP];
  * `pll-word-l2r` (Kauf and Ivanova, 2023, "PLL-word-l2r"): as PLL, but scoring a piece also masks the
    later pieces of the same word, so a split word is not read off its own remaining pieces;
  * a causal model (`train.objective=clm`, config.json `bertkit_causal`) by its log-likelihood,
    sum_i log p(x_i | [CLS] x_1 .. x_{i-1}) over the same pieces (the head at position i predicts
    token i + 1, as pre-training taught it; [SEP] is not scored, so both methods score the same pieces).

Speed: the masked copies of many sentences of one length form one padding-free batch of about
`max_tokens` tokens (every row the same length: `packing.py`'s view path, no mask); only the scored
position of each row goes through the last block and the MLM head's vocabulary projection; on the
CPU, batches run on several threads of one core each.

    pred = load(DIR)                                   # Predictor of the MLM head, fp32
    pairs = read_pairs(["blimp_dev.jsonl.gz"], limit=50)
    scored = score_pairs(pred, pairs, "pll")           # {"good", "bad", ...}: log-likelihoods
    summary = summarize(pairs, scored["good"], scored["bad"], published())
"""
from __future__ import annotations

import contextlib
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Callable, Literal, Sequence, get_args

import numpy as np
import torch
import torch.nn.functional as F

from .errors import DataError
from .checkpoint import model_folder
from .infer import Batch, Predictor
from .model import Block, SelfAttention
from .packing import alibi_bias, packing
from .runconfig import AT_LEAST_1, THREADS, Checked, Rule
from .sources import jsonl_objects, open_text

log = logging.getLogger("bertkit")

Method = Literal["auto", "pll", "pll-word-l2r", "causal"]
METHODS: tuple[str, ...] = get_args(Method)[1:]
PUBLISHED = {"ngram": "5-gram", "lstm": "LSTM", "txl": "Transformer-XL", "gpt2": "GPT-2"}
"""The models of the BLiMP paper (their per-paradigm accuracies ship in sample/blimp_published.jsonl)."""
SAMPLE = Path(__file__).parent / "sample" / "blimp_sample.jsonl.gz"
"""The first 2 pairs of each of the 67 paradigms (BLiMP, CC BY 4.0): a file to try the command on."""
HEAD_ROWS = 512          # scored positions per vocabulary projection: (512, V) logits at a time


@dataclass
class BlimpOptions(Checked):
    """How `bertkit blimp` scores (its flags: `cliconfig.add_options`)."""
    method: Method = "auto"
    """auto: causal for a train.objective=clm checkpoint, else pll; pll: mask each piece in turn (Salazar
    et al. 2020); pll-word-l2r: also mask the later pieces of its word (Kauf and Ivanova 2023); causal:
    the left-to-right log-likelihood."""
    limit: Annotated[int | None, AT_LEAST_1] = None
    """Only the first N pairs of each paradigm."""
    max_tokens: Annotated[int, Rule("at least 16", lambda v: v >= 16)] = 4096
    """Tokens per batch of masked copies."""
    precision: Literal["fp32", "bf16", "auto"] = "fp32"
    """fp32 (exact scores), bf16, or auto (bf16 where this CPU measures it faster and it keeps cosine
    0.999 to fp32)."""
    device: str | None = None
    """cpu, cuda, cuda:1 ... (default: cuda if available)."""
    threads: Annotated[int | None, THREADS] = None
    """CPU threads: that many batches at a time, one thread each (default: torch's count)."""


@dataclass(frozen=True)
class Pair:
    """One minimal pair of a BLiMP file."""
    paradigm: str        # UID, e.g. adjunct_island
    phenomenon: str      # linguistics_term, e.g. island_effects
    pair_id: str
    good: str
    bad: str
    where: str           # FILE:LINE, for messages


# ---- reading ------------------------------------------------------------------------------------
def data_files(paths: Sequence[str | Path]) -> list[Path]:
    """The BLiMP files named: a file as given; a folder, its *.jsonl and *.jsonl.gz files (sorted)."""
    files: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise DataError(f"{p}: no such file or folder")
        found = sorted(f for f in p.iterdir() if f.name.endswith((".jsonl", ".jsonl.gz")) and f.is_file()) \
            if p.is_dir() else [p]
        if not found:
            raise DataError(f"{p}: no .jsonl or .jsonl.gz files in this folder")
        files += found
    return files


def _rows(path: Path):
    """(line number, object) of a BLiMP file's JSON Lines (`sources.jsonl_objects`)."""
    with open_text(path) as f:
        yield from jsonl_objects(f, path)


def read_pairs(paths: Sequence[str | Path], limit: int | None = None) -> list[Pair]:
    """Minimal pairs from BLiMP JSONL files (the original `data/*.jsonl`, one paradigm each, or one file
    of many), the first `limit` of each paradigm. In a folder, a file whose first row has no
    `sentence_good` (e.g. published_lm_results.jsonl) is skipped; a named file must be pairs."""
    pairs: list[Pair] = []
    seen: dict[tuple[str, str], str] = {}
    counts: dict[str, int] = {}
    named = {Path(p) for p in paths}
    for path in data_files(paths):
        for n, row in _rows(path):
            where = f"{path}:{n}"
            if n == 1 and path not in named and "sentence_good" not in row:
                log.info("%s: no sentence_good in its first row, not a file of pairs: skipped", path)
                break
            pair = _pair(row, where)
            if limit is not None and counts.get(pair.paradigm, 0) >= limit:
                continue
            key = (pair.paradigm, pair.pair_id)
            if key in seen:
                raise DataError(f"{where}: pair {pair.pair_id} of {pair.paradigm} was already read at {seen[key]}")
            seen[key] = where
            counts[pair.paradigm] = counts.get(pair.paradigm, 0) + 1
            pairs.append(pair)
    if not pairs:
        raise DataError(f"{', '.join(map(str, paths))}: no minimal pairs")
    return pairs


def _pair(row: dict, where: str) -> Pair:
    for key in ("UID", "sentence_good", "sentence_bad"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise DataError(f"{where}: field {key!r} must be a non-empty string")
    term = row.get("linguistics_term")
    if term is not None and not isinstance(term, str):
        raise DataError(f"{where}: field 'linguistics_term' must be a string")
    return Pair(row["UID"], term or row["UID"], str(row.get("pairID", where)), row["sentence_good"],
                row["sentence_bad"], where)


def published(path: str | Path | None = None) -> dict[str, dict]:
    """The BLiMP paper's per-paradigm accuracies {UID: {"phenomenon", "ngram", "lstm", "txl", "gpt2"}}
    (the authors' raw_results/summary/models_summary.jsonl, CC BY 4.0; default: the copy bundled in
    sample/). Its phenomenon and overall rows (UID "overall") are left out: they are recomputed here
    over the paradigms scored."""
    if path is None:
        text = (resources.files("bertkit") / "sample" / "blimp_published.jsonl").read_text(encoding="utf-8")
        where = "sample/blimp_published.jsonl"
    else:
        text, where = Path(path).read_text(encoding="utf-8"), str(path)
    out = {}
    for n, row in jsonl_objects(text.splitlines(), where):
        try:
            if row["UID"] != "overall":
                out[row["UID"]] = {"phenomenon": row["linguistics_term"],
                                   **{k: float(row[k]) for k in PUBLISHED}}
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{where}:{n}: not a row of per-paradigm accuracies "
                            f"(UID, linguistics_term, {', '.join(PUBLISHED)}): {e}") from None
    return out


# ---- scoring ------------------------------------------------------------------------------------
def load(path: str | Path, precision: str = "fp32", device: str | None = None,
         threads: int | None = None) -> Predictor:
    """A checkpoint's encoder and MLM head as scoring runs it: fp32 by default (precision auto: bf16 where the
    CPU measures it faster and it follows fp32, see infer/choose.py), plain Linear layers (prepacking pads each
    GEMM's rows and measured slower on these large uniform batches; and the last block can then run at
    the scored positions only), no engine of short batches. A pre-training checkpoint folder
    (checkpoints/step-N) is read from its model/ folder."""
    return Predictor.from_dir(model_folder(path), head="masked_lm", device=device, threads=threads,
                              precision=precision, prepack=False, small_batches=False)


def method_for(pred: Predictor, method: str = "auto") -> str:
    """'auto' -> 'causal' for a causal checkpoint, else 'pll'; a method the model cannot run is an error."""
    causal = bool(pred.config.causal)
    if method == "auto":
        return "causal" if causal else "pll"
    if method not in METHODS:
        raise DataError(f"method {method!r}: expected auto, {', '.join(METHODS)}")
    if causal and method != "causal":
        raise DataError(f"{method} needs a bidirectional model; this checkpoint is causal (config.json "
                        "bertkit_causal): score it with method causal")
    if not causal and method == "causal":
        raise DataError("method causal needs a left-to-right model (config.json bertkit_causal, "
                        "pre-trained with train.objective=clm); this one attends both ways: use pll")
    return method


def copies(ids: torch.Tensor, words: torch.Tensor, method: str, mask_id: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """S sentences of one length L ([CLS] x_1 .. x_n [SEP], n = L - 2) -> what the model reads and where
    it is scored: (rows (R, L), positions (M,) into the flattened rows, targets (M,), sentence of each
    target (M,)). PLL: n rows per sentence, row k hides x_k (and, pll-word-l2r, the later pieces of its
    word); causal: the sentence itself, position i - 1 predicting x_i. `words` (S, L): word index per
    piece, -1 at [CLS] / [SEP]."""
    S, L = ids.shape
    n = L - 2
    targets = ids[:, 1:L - 1].reshape(-1)                                    # (S*n,)
    owner = torch.arange(S).repeat_interleave(n)                             # (S*n,)
    if method == "causal":
        at = (torch.arange(S)[:, None] * L + torch.arange(n)[None, :]).reshape(-1)
        return ids, at, targets, owner
    scored = torch.arange(1, L - 1)                                          # (n,) the piece row k scores
    hide = torch.zeros(n, L, dtype=torch.bool)
    hide[torch.arange(n), scored] = True                                     # (n, L)
    if method == "pll-word-l2r":
        same_word = words[:, None, :] == words[:, scored][:, :, None]       # (S, n, L)
        later = torch.arange(L)[None, :] >= scored[:, None]                 # (n, L)
        hide = same_word & later & (words[:, None, :] >= 0)                 # (S, n, L)
    rows = ids[:, None, :].repeat(1, n, 1)                                   # (S, n, L)
    rows[hide.expand(S, n, L)] = mask_id
    at = torch.arange(S * n) * L + scored.repeat(S)                          # (S*n,)
    return rows.view(S * n, L), at, targets, owner


def log_probs(pred: Predictor, rows: torch.Tensor, at: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets) at the flattened positions `at` of `rows` (R, L) (every row the same length: one
    packed batch that is a (R, L) view), the vocabulary projection on those M positions only: (M,) float64.
    With one position per row (PLL) and plain blocks, the last block runs at that position only."""
    R, L = rows.shape
    dev = pred.device
    tensors = {"input_ids": rows.reshape(-1).to(dev), "position_ids": torch.arange(L, device=dev).repeat(R),
               "token_type_ids": torch.zeros(R * L, dtype=torch.long, device=dev)}
    layout = packing(torch.ones(R, L, dtype=torch.bool, device=dev))
    enc, at = pred.encoder, at.to(dev)
    with torch.inference_mode():
        if len(at) == R and pred.backend == "torch" and pred.small is None and _plain(enc):
            x = enc.embeddings(tensors["input_ids"], tensors["token_type_ids"], tensors["position_ids"])
            for block in enc.blocks[:-1]:
                x = block(x, layout)
            h = _last_block_at(enc.blocks[-1], x, R, L, at - torch.arange(R, device=dev) * L)   # (R, C)
            h = enc.final_norm(h) if enc.final_norm is not None else h
        else:
            h = pred.hidden(Batch(list(range(R)), layout, tensors))[at]           # (M, C)
        out = []
        for s in range(0, len(at), HEAD_ROWS):                                      # (HEAD_ROWS, V) at a time
            logits = pred.model.mlm(h[s:s + HEAD_ROWS]).float()
            t = targets[s:s + HEAD_ROWS].to(dev)[:, None]
            out.append((logits.gather(1, t)[:, 0] - logits.logsumexp(-1)).double().cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def _plain(enc) -> bool:
    """The encoder's blocks are model.py's own (not prepacked, not quantised), bidirectional."""
    return all(type(b) is Block and type(b.attn) is SelfAttention and type(b.attn.query) is torch.nn.Linear
               and not b.attn.causal for b in enc.blocks)


def _last_block_at(block: Block, x: torch.Tensor, R: int, L: int, pos: torch.Tensor) -> torch.Tensor:
    """`block(x)` at one position per row, pos (R,), of x (R*L, C) -> (R, C): keys and values at every
    token, the query, residual and feed-forward at that position only (the last block's other L - 1
    outputs are never read: with 4 layers ~20% of PLL's arithmetic). Eval mode: no dropout."""
    attn, C = block.attn, x.shape[-1]
    H = attn.num_heads
    a = block.norm1(x) if block.pre_norm else x                                   # (R*L, C)
    rows = torch.arange(R, device=x.device) * L + pos                             # (R,)
    heads = lambda t, T: t.view(R, T, H, C // H).transpose(1, 2)                  # (R, H, T, D)
    q = heads(attn.query(a[rows]), 1)                                             # (R, H, 1, D)
    k, v = heads(attn.key(a), L), heads(attn.value(a), L)                         # (R, H, L, D)
    bias = None
    if attn.slopes is not None:                                                   # ALiBi: row pos of (H, L, L)
        bias = alibi_bias(attn.slopes, L, q)[:, pos].transpose(0, 1)[:, :, None]  # (R, H, 1, L)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(R, C)
    x = x[rows]                                                                   # (R, C)
    if block.pre_norm:
        x = x + attn.out(y)
        return x + block.mlp(block.norm2(x))
    x = block.norm1(x + attn.out(y))
    return block.norm2(x + block.mlp(x))


def score_sentences(pred: Predictor, sentences: Sequence[str], method: str, max_tokens: int = 4096,
                    progress: Callable[[int], None] | None = None, where: Sequence[str] | None = None,
                    workers: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """(log-likelihoods (S,) float64, scored pieces per sentence (S,), tokens the model read) of
    sentences under `method`; `progress(k)` is called as k more sentences are done. On the CPU the
    batches run on `workers` threads of one core each (default: torch's thread count): two threads of
    one core each kept their speed on a shared machine where one batch on two OpenMP threads ran 3-5x
    slower (the threads wait for each other whenever another job holds a core)."""
    tok = pred.tokenizer
    encs = tok.encode_batch(list(sentences), None, pred.max_length)
    for i, e in enumerate(encs):
        if e.truncated:
            label = where[i] if where is not None else f"sentence {i}"
            raise DataError(f"{label}: {len(e.input_ids) + e.truncated} tokens, longer than the model's "
                            f"{pred.max_length}")
    lengths = np.array([len(e.input_ids) for e in encs])
    chunks = []                                  # sentences of one length whose rows make ~max_tokens tokens
    for L in sorted(set(lengths.tolist()), reverse=True):
        group = np.flatnonzero(lengths == L)
        step = max(1, max_tokens // (L * (1 if method == "causal" else max(L - 2, 1))))
        chunks += [group[s:s + step] for s in range(0, len(group), step)]

    def run(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        ids = torch.tensor([encs[i].input_ids for i in idx], dtype=torch.long)                # (S, L)
        words = torch.tensor([[-1 if w is None else w for w in encs[i].word_ids] for i in idx])
        rows, at, targets, owner = copies(ids, words, method, tok.mask_id)
        lp = log_probs(pred, rows, at, targets) if len(at) else torch.zeros(0, dtype=torch.float64)
        return idx, np.bincount(owner.numpy(), weights=lp.numpy(), minlength=len(idx)), rows.numel()

    scores = np.zeros(len(encs), dtype=np.float64)
    read = 0
    workers = workers or torch.get_num_threads()
    with _one_thread_each(workers if pred.device.type == "cpu" else 1) as pool:
        for idx, total, n in (pool.map(run, chunks) if pool else map(run, chunks)):
            scores[idx] += total
            read += n
            if progress:
                progress(len(idx))
    return scores, lengths - 2, read


@contextlib.contextmanager
def _one_thread_each(workers: int):
    """A pool of `workers` threads, each running torch on one intra-op thread (None for one worker: the
    caller's thread and its torch threads). torch releases the GIL in its kernels."""
    if workers <= 1:
        yield None
        return
    before = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,)) as pool:
            yield pool
    finally:
        torch.set_num_threads(before)


def score_pairs(pred: Predictor, pairs: Sequence[Pair], method: str, max_tokens: int = 4096,
                progress: Callable[[int], None] | None = None, workers: int | None = None) -> dict:
    """Both sentences of every pair scored (`score_sentences`): {"good", "bad" (float64 arrays),
    "good_tokens", "bad_tokens", "tokens_read"}."""
    texts = [p.good for p in pairs] + [p.bad for p in pairs]
    where = [f"{p.where} sentence_good" for p in pairs] + [f"{p.where} sentence_bad" for p in pairs]
    scores, pieces, read = score_sentences(pred, texts, method, max_tokens, progress, where, workers)
    n = len(pairs)
    return {"good": scores[:n], "bad": scores[n:], "good_tokens": pieces[:n], "bad_tokens": pieces[n:],
            "tokens_read": read}


# ---- accuracy -----------------------------------------------------------------------------------
def wilson(correct: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% at the default z); (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (0.0 if correct == 0 else centre - half), (1.0 if correct == n else centre + half)


def _group(correct: np.ndarray, idx: np.ndarray) -> dict:
    k, n = int(correct[idx].sum()), len(idx)
    lo, hi = wilson(k, n)
    return {"pairs": n, "correct": k, "accuracy": k / n if n else 0.0, "ci95": [lo, hi]}


def summarize(pairs: Sequence[Pair], good: np.ndarray, bad: np.ndarray, reference: dict | None = None) -> dict:
    """Accuracy overall (with its Wilson 95% interval and the mean over paradigms, as the paper
    reports), per phenomenon and per paradigm; a pair counts only when good > bad (a tie or a NaN
    fails). `reference` (from `published()`): the paper's models beside each row, their means taken
    over the paradigms scored here, and its grouping of paradigms into phenomena."""
    correct = np.asarray(good) > np.asarray(bad)
    ties = int((np.asarray(good) == np.asarray(bad)).sum())
    para = np.array([p.paradigm for p in pairs])
    reference = reference or {}
    # the paper's 12 phenomena (the files call two argument-structure paradigms "s-selection")
    phen = {p.paradigm: reference.get(p.paradigm, {}).get("phenomenon", p.phenomenon) for p in pairs}

    def beside(uids: list[str]) -> dict | None:
        rows = [reference[u] for u in uids if u in reference]
        if len(rows) != len(uids):
            return None
        return {k: float(np.mean([r[k] for r in rows])) for k in PUBLISHED}

    paradigms = {uid: {"phenomenon": phen[uid], **_group(correct, np.flatnonzero(para == uid)),
                       "published": beside([uid])} for uid in sorted(set(para.tolist()))}
    phenomena = {}
    for term in sorted(set(phen.values())):
        uids = [u for u in paradigms if phen[u] == term]
        idx = np.flatnonzero(np.isin(para, uids))
        phenomena[term] = {**_group(correct, idx), "paradigms": len(uids),
                           "paradigm_mean": float(np.mean([paradigms[u]["accuracy"] for u in uids])),
                           "published": beside(uids)}
    overall = {**_group(correct, np.arange(len(pairs))), "ties": ties, "paradigms": len(paradigms),
               "paradigm_mean": float(np.mean([v["accuracy"] for v in paradigms.values()]))}
    return {"overall": overall, "published": beside(list(paradigms)), "phenomena": phenomena,
            "paradigms": paradigms, "correct": correct}


def pair_rows(pairs: Sequence[Pair], scored: dict, correct: np.ndarray):
    """One JSON-ready dict per pair (the per-pair JSONL)."""
    for i, p in enumerate(pairs):
        yield {"UID": p.paradigm, "pairID": p.pair_id, "good": float(scored["good"][i]),
               "bad": float(scored["bad"][i]), "good_tokens": int(scored["good_tokens"][i]),
               "bad_tokens": int(scored["bad_tokens"][i]), "correct": bool(correct[i])}


__all__ = ["METHODS", "PUBLISHED", "Pair", "copies", "data_files", "load", "log_probs", "method_for", "pair_rows",
           "published", "read_pairs", "score_pairs", "score_sentences", "summarize", "wilson"]
