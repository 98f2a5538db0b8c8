"""Bi-encoder training (`bertkit finetune --task embedding`): sentence embeddings trained by contrast.

    bertkit finetune --task embedding --model DIR --train-file pairs.jsonl --dev-file dev.jsonl --out runs/emb
    bertkit finetune --task embedding --model DIR --data squad/ --out runs/squad-emb    # question -> paragraph

Data: pairs `anchor, positive[, negative]` or scored pairs `sentence1, sentence2, score` from CSV /
TSV / JSONL / Parquet files or dataset names (`tasks.custom.data_rows`), or a SQuAD file (each
question and its paragraph). A folder holds train.* and dev.* (or validation.*). Columns: the
`embedding_columns` given (a numeric third column is the score), else by name (anchor / positive
/ negative, query / positive / negative, sentence1 / sentence2, question / context, text /
text_pair, premise / hypothesis), else the first text columns in order; a numeric `score` or
`label` column beside two texts is the score.

Losses, as sentence-transformers computes them:
  mnrl    MultipleNegativesRankingLoss: cross-entropy over scale x cosine(anchor_i, each positive
          and negative of the batch), the right answer positive_i: in-batch negatives. Its batches
          hold no text twice (sentence-transformers' NO_DUPLICATES sampler), so a positive is never
          also a negative. The default for pairs and triplets.
  cosent  CoSENTLoss on scored pairs: log(1 + sum over pairs i, j with score_i < score_j of
          exp(scale (cos_i - cos_j))). The default for scored pairs.
  cosine  CosineSimilarityLoss: mean squared error of the cosine against the score (scores above 1
          divided by the largest training score: STS-B's 0-5 becomes 0-1).

The loop is fine-tuning's (`finetune.start_loop`, `finetune.train`). Every batch is one packed
(padding-free) forward of all its texts, sorted by length so attention runs in length groups
(`packing.attention_groups`). Dev evaluation is `embed_eval`'s: Spearman on scored pairs, else
nDCG@10 of each anchor retrieving its positive among all dev positives and negatives (SQuAD:
each question its paragraph); the best checkpoint on dev is kept. The folder written is a Hugging
Face BertModel with sentence-transformers' files (`st_files`): `bertkit embed`, `bertkit serve`
(/v1/embeddings) and `SentenceTransformer(path)` give the same vectors.
"""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import save_model
from ..embed_eval import ScoredPairs, evaluate_retrieval, evaluate_similarity, pair_retrieval, read_retrieval
from ..errors import BertkitError
from ..hardware import machine_facts
from ..model import pool_tokens
from ..outdir import INCOMPLETE_KEY
from ..packing import pack, pad_rows
from ..runlog import write_run_card
from ..sources import dataset_name
from ..st_files import max_seq_length, write_sentence_transformers
from ..tasks import BadRows, DataError, finite_number, get_task
from ..tasks.custom import data_rows
from ..tasks.tables import is_table_source
from ..tokenizer import Tokenizer
from . import (epoch_batches, evaluating, load_encoder, log_dev, seed_run, staged_run, start_loop, train,
               write_result)

log = logging.getLogger("bertkit")

LOSSES = ("mnrl", "cosent", "cosine")
NAMED = (("anchor", "positive", "negative"), ("query", "positive", "negative"), ("sentence1", "sentence2"),
         ("question", "context"), ("text", "text_pair"), ("premise", "hypothesis"))
SCORE_COLUMNS = ("score", "label")
SPLIT_STEMS = {"train": ("train",), "dev": ("dev", "validation")}
EXTENSIONS = (".jsonl", ".jsonl.gz", ".csv", ".csv.gz", ".tsv", ".tsv.gz", ".parquet", ".json", ".json.gz")
DEFAULT_MAX_LENGTH = 256


@dataclass
class Pairs:
    """Training (or dev) rows: anchors and positives, optional negatives or scores."""
    name: str
    anchors: list[str]
    positives: list[str]
    negatives: list[str] | None = None
    scores: list[float] | None = None

    def texts(self, i: int) -> tuple[str, ...]:
        return (self.anchors[i], self.positives[i]) + ((self.negatives[i],) if self.negatives else ())


# ---- data ---------------------------------------------------------------------------------------
def is_squad_file(path: str | Path) -> bool:
    """A SQuAD JSON document (not JSON Lines)."""
    p = Path(path)
    return p.is_file() and p.name.endswith((".json", ".json.gz")) and not is_table_source(get_task("squad"), p)


def read_pairs(source: str | Path, columns: str | None = None, skip_bad_rows: bool = False,
               limit: int | None = None) -> Pairs:
    """Pairs (or triplets, or scored pairs) from a table, file or dataset name; a SQuAD file gives
    (question, paragraph) pairs."""
    bad = BadRows(skip=skip_bad_rows)
    if is_squad_file(source):
        ex = get_task("squad").read(Path(source), bad)[:limit]
        return Pairs(str(source), [e.question for e in ex], [e.context for e in ex])
    rows = list(itertools.islice(data_rows(source, None, bad), limit))
    if not rows:
        raise DataError(f"{source}: no rows")
    texts, score = pick_columns(rows[0][1], columns, source)
    kept, scores = [], []
    for where, row in rows:
        values = [row.get(c) for c in texts]
        empty = next((c for c, v in zip(texts, values) if not isinstance(v, str) or not v.strip()), None)
        if empty is not None:
            bad(source, where, f"empty or non-text {empty!r}")
            continue
        if score is not None:
            value = _number(row.get(score))
            if value is None:
                bad(source, where, f"{score} {row.get(score)!r} is not a number")
                continue
            scores.append(value)
        kept.append(values)
    bad.report(source)
    if not kept:
        raise DataError(f"{source}: no usable rows")
    cols = list(zip(*kept))
    return Pairs(str(source), list(cols[0]), list(cols[1]), list(cols[2]) if len(cols) == 3 else None,
                 scores if score is not None else None)


def pick_columns(first: dict, columns: str | None, source) -> tuple[list[str], str | None]:
    """(text columns: anchor, positive[, negative]; score column or None) of a table (module doc)."""
    keys = list(first)
    if columns:
        names = [c.strip() for c in columns.split(",")]
        if not 2 <= len(names) <= 3 or not all(names):
            raise BertkitError(f"embedding_columns {columns!r}: give anchor,positive[,negative] or "
                               "sentence1,sentence2,score")
        if (missing := next((n for n in names if n not in first), None)) is not None:
            raise DataError(f"{source}: no column {missing!r} (has: {', '.join(map(str, keys))})")
        if len(names) == 3 and _number(first[names[2]]) is not None:
            return names[:2], names[2]
        return names, None
    for named in NAMED:
        if named[0] in first and named[1] in first:
            texts = [n for n in named if n in first]
            break
    else:
        texts = [k for k in keys if isinstance(first[k], str) and _number(first[k]) is None][:3]
        if len(texts) < 2:
            raise DataError(f"{source}: needs two text columns (anchor, positive); has {', '.join(map(str, keys))} "
                            "(name them with --embedding_columns)")
    score = None if len(texts) == 3 else next(
        (k for k in SCORE_COLUMNS if k in first and _number(first[k]) is not None), None)
    return texts, score


def _number(value) -> float | None:
    return None if isinstance(value, bool) else finite_number(value)


def split_source(cfg, split: str) -> str | None:
    """The file (or dataset name) of `split`: train_file / dev_file, else found in `data`."""
    explicit = cfg.train_file if split == "train" else cfg.dev_file
    if explicit is not None:
        return explicit
    if cfg.data is None:
        if split == "train":
            raise BertkitError("give --data DIR or --train-file FILE")
        return None
    named = dataset_name(cfg.data)
    if named is not None:
        return str(named if named.split else named.with_split("train" if split == "train" else "validation"))
    folder = Path(cfg.data)
    if folder.is_file():
        return str(folder) if split == "train" else None
    for stem in SPLIT_STEMS[split]:
        for ext in EXTENSIONS:
            if (folder / (stem + ext)).is_file():
                return str(folder / (stem + ext))
    if split == "train":
        raise DataError(f"{folder}: no train file ({', '.join('train' + e for e in EXTENSIONS[:4])}, ...)")
    log.warning("no dev file in %s: keeping the last checkpoint", folder)
    return None


def dev_set(source: str, columns: str | None, skip_bad_rows: bool, limit: int | None):
    """What dev evaluation measures: `embed_eval.ScoredPairs` (Spearman) for scored pairs, else an
    `embed_eval.Retrieval` (nDCG@10): anchors retrieving their positives among every dev text."""
    if is_squad_file(source):
        return read_retrieval(source, skip_bad_rows=skip_bad_rows, limit=limit)
    pairs = read_pairs(source, columns, skip_bad_rows, limit)
    if pairs.scores is not None:
        return ScoredPairs(pairs.name, pairs.anchors, pairs.positives, pairs.scores)
    return pair_retrieval(pairs.name, {str(i): a for i, a in enumerate(pairs.anchors)}, pairs.positives,
                          pairs.negatives or ())


# ---- losses and batches -------------------------------------------------------------------------
def mnrl_loss(anchors: Tensor, candidates: Tensor, scale: float) -> Tensor:
    """In-batch negatives: (B, C) anchors against (B * k, C) candidates, positives first."""
    scores = scale * F.normalize(anchors, dim=-1) @ F.normalize(candidates, dim=-1).T     # (B, B * k)
    return F.cross_entropy(scores, torch.arange(len(anchors), device=anchors.device))


def cosent_loss(a: Tensor, b: Tensor, scores: Tensor, scale: float) -> Tensor:
    """CoSENT: every pair scored lower should have the lower cosine."""
    s = scale * F.cosine_similarity(a, b, dim=-1)                                          # (B,)
    lower = scores[:, None] < scores[None, :]                                              # (B, B): i below j
    return torch.logsumexp(torch.cat([s.new_zeros(1), (s[:, None] - s[None, :])[lower]]), dim=0)


def cosine_loss(a: Tensor, b: Tensor, scores: Tensor) -> Tensor:
    return F.mse_loss(F.cosine_similarity(a, b, dim=-1), scores)


def embed_rows(model: nn.Module, rows: Sequence[list[int]], pooling: str, packed: bool, pad_id: int = 0) -> Tensor:
    """(n, C) pooled vectors of token-id rows in one forward: packed (padding-free, longest first
    so attention runs in length groups) or padded to the longest."""
    device = next(model.parameters()).device
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    T = len(rows[order[0]])
    ids = torch.tensor([rows[i] + [pad_id] * (T - len(rows[i])) for i in order], device=device)     # (n, T)
    mask = torch.tensor([[1] * len(rows[i]) + [0] * (T - len(rows[i])) for i in order], device=device)
    if packed:
        flat, layout = pack(ids, mask)                                                          # (N,)
        flat = pad_rows(flat)                                            # a new N every batch: few GEMM row counts (CPU)
        h = model(flat["input_ids"], flat["token_type_ids"], None, flat["position_ids"], packed=layout)
        v = pool_tokens(h, pooling, layout)
    else:
        v = pool_tokens(model(ids, torch.zeros_like(ids), mask), pooling, attention_mask=mask)
    back = torch.empty(len(order), dtype=torch.long, device=v.device)
    back[torch.tensor(order, device=v.device)] = torch.arange(len(order), device=v.device)
    return v.float()[back]


def batch_loss(model: nn.Module, pairs: Pairs, batch: list[int], ids: dict[str, list[int]], loss: str,
               scale: float, pooling: str, packed: bool, pad_id: int) -> tuple[Tensor, int]:
    """(loss, real tokens) of one batch: every text of the batch in one forward."""
    columns = [pairs.anchors, pairs.positives] + ([pairs.negatives] if pairs.negatives else [])
    rows = [ids[col[i]] for col in columns for i in batch]
    v = embed_rows(model, rows, pooling, packed, pad_id).view(len(columns), len(batch), -1)   # (k, B, C)
    if loss == "mnrl":
        return mnrl_loss(v[0], v[1:].flatten(0, 1), scale), sum(map(len, rows))
    scores = torch.tensor([pairs.scores[i] for i in batch], dtype=torch.float32, device=v.device)
    value = cosent_loss(v[0], v[1], scores, scale) if loss == "cosent" else cosine_loss(v[0], v[1], scores)
    return value, sum(map(len, rows))


def choose_loss(asked: str | None, pairs: Pairs) -> str:
    """The loss asked for (checked against the data), else mnrl for pairs, cosent for scored pairs."""
    loss = asked or ("cosent" if pairs.scores is not None else "mnrl")
    if loss not in LOSSES:
        raise BertkitError(f"embedding_loss {loss!r}: choose {', '.join(LOSSES)}")
    if loss != "mnrl" and pairs.scores is None:
        raise DataError(f"{pairs.name}: embedding_loss {loss} needs scored pairs (a score or label column)")
    if loss == "cosine" and (top := max(pairs.scores)) > 1:
        pairs.scores = [s / top for s in pairs.scores]
        log.info("cosine loss: scores divided by the largest, %g (to 0..1)", top)
    return loss


# ---- the loop: fine-tuning's (finetune/__init__.py) ---------------------------------------------
def finetune_embedding(cfg, command: str = "") -> dict:
    """Train `cfg.model` as a bi-encoder (`bertkit finetune --task embedding`); returns the metrics
    written to out/metrics.json. Staged as every fine-tuning run (`bertkit.outdir`)."""
    if cfg.freeze:
        raise BertkitError("task embedding trains the whole encoder; --freeze does not apply")
    return staged_run(cfg, lambda out: _train(cfg, command, out))


def _train(cfg, command: str, out: Path) -> dict:
    """The run, written into `out` (the staging folder): seeds, data (each distinct text tokenized
    once), the encoder, `finetune.train`'s loop (dev evaluated by `embed_eval`, the best model
    kept), then the metrics and the run card."""
    t_start = time.time()
    seed_run(cfg)
    train_path = split_source(cfg, "train")
    pairs = read_pairs(train_path, cfg.embedding_columns, cfg.skip_bad_rows, cfg.train_limit)
    dev_path = split_source(cfg, "dev")
    dev = dev_set(dev_path, cfg.embedding_columns, cfg.skip_bad_rows, cfg.dev_limit) if dev_path else None
    loss_name = choose_loss(cfg.embedding_loss, pairs)
    pooling = cfg.pooling or "mean"
    main_metric = None if dev is None else "spearman" if hasattr(dev, "scores") else "ndcg@10"
    tokenizer = Tokenizer.from_dir(cfg.model)
    model = load_encoder(cfg, {} if cfg.dropout is None else {"hidden_dropout": cfg.dropout,
                                                               "attention_dropout": cfg.dropout})
    max_length = cfg.max_length or max_seq_length(cfg.model, model.config.max_position_embeddings, DEFAULT_MAX_LENGTH)
    texts = list(dict.fromkeys(pairs.anchors + pairs.positives + (pairs.negatives or [])))
    ids = {t: e.input_ids for t, e in zip(texts, tokenizer.encode_batch(texts, None, max_length))}
    tokenizer.stats.report(label=f"{train_path}: distinct texts at {max_length} tokens")
    log.info("%s: %d %s for %s loss (%s pooling), %d distinct texts of <= %d tokens%s", train_path,
             len(pairs.anchors), "scored pairs" if pairs.scores else "triplets" if pairs.negatives else "pairs",
             loss_name, pooling, len(texts), max_length, f"; dev {dev_path} ({main_metric})" if dev else "")
    loop = start_loop(cfg, model, len(pairs.anchors), max_length, main_metric, out)
    facts = {"bertkit_embedding": {"pooling": pooling, "loss": loss_name, "scale": cfg.embedding_scale},
             "bertkit_max_length": max_length, INCOMPLETE_KEY: "fine-tuning in progress"}
    save = lambda: save_embedding_model(model, tokenizer, out, pooling, max_length, facts)   # noqa: E731

    def evaluate() -> None:
        with evaluating(model, tokenizer, max_length) as predictor:
            scores = (evaluate_similarity if isinstance(dev, ScoredPairs) else evaluate_retrieval)(
                predictor, dev, pooling, cfg.eval_batch_size)
        if log_dev(loop, scores):
            save()

    distinct = pairs.texts if loss_name == "mnrl" else None
    train_time = train(loop, "finetune embedding", lambda rng: epoch_batches(len(pairs.anchors), cfg.batch_size, rng,
                                                                             distinct),
                       lambda batch: (*batch_loss(model, pairs, batch, ids, loss_name, cfg.embedding_scale, pooling,
                                                  cfg.packed, tokenizer.pad_id), 0.0),
                       evaluate if dev is not None else None, save)
    result = write_result(loop, "embedding", len(pairs.anchors), {"loss": loss_name, "scale": cfg.embedding_scale,
                          "pooling": pooling, "max_length": max_length}, train_time, t_start, train_path, dev_path)
    _write_card(out, cfg, command, model, result)
    return result


def save_embedding_model(model: nn.Module, tokenizer, out: Path, pooling: str, max_length: int, facts: dict) -> None:
    """The encoder as a Hugging Face BertModel folder, its tokenizer and sentence-transformers' files."""
    save_model(model, out, extra_config=facts)
    tokenizer.save(out)
    write_sentence_transformers(out, pooling, model.config.hidden_size, max_length)


def _write_card(out: Path, cfg, command: str, model: nn.Module, result: dict) -> None:
    write_run_card(out, {
        "name": "finetune embedding", "command": command, "model": f"{cfg.model} (init {cfg.init})",
        "parameters": sum(p.numel() for p in model.parameters()),
        "objective": f"{result['loss']} (scale {result['scale']})", "sentence_pooling": result["pooling"],
        "sequence_lengths": f"<= {result['max_length']} tokens", "global_batch": cfg.batch_size,
        "updates": result["updates"], "tokens_seen": result["tokens_seen"], "optimizer": cfg.optimizer,
        "peak_lr": cfg.lr, "schedule": f"linear, warmup {cfg.warmup}", "precision": result["precision"],
        "precision_reason": result["precision_reason"], "packed": cfg.packed,
        "attention_kernel": result["attention_kernel"], "wall_time_s": result["wall_time_s"],
        "tokens_per_s": result["tokens_per_s"], "data": f"{result['train_file']} ({result['train_examples']} rows), "
        f"dev {result['dev_file']}", "seed": cfg.seed,
        "final_eval": {k: v for k, v in (result["dev"] or {}).items() if isinstance(v, float)},
        "hardware": machine_facts(), "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}})
