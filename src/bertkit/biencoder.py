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

The loop has fine-tuning's shape (setup, step, evaluate, checkpoint). Every batch is one packed
(padding-free) forward of all its texts, sorted by length so attention runs in length groups
(`packing.attention_groups`). Dev evaluation is `embed_eval`'s: Spearman on scored pairs, else
nDCG@10 of each anchor retrieving its positive among all dev positives and negatives (SQuAD:
each question its paragraph); the best checkpoint on dev is kept. The folder written is a Hugging
Face BertModel with sentence-transformers' files (`st_files`): `bertkit embed`, `bertkit serve`
(/v1/embeddings) and `SentenceTransformer(path)` give the same vectors.
"""
from __future__ import annotations

import json
import logging
import math
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from .checkpoint import build, load_model, read_config, save_model
from .errors import BertkitError
from .hardware import attention_kernel, choose_precision, machine_facts
from .model import pool_tokens, set_attention_kernel
from .optim import build_optimizer, lr_at
from .outdir import INCOMPLETE_KEY, staged_dir
from .packing import pack
from .runconfig import save_config
from .runlog import MetricsLog, write_run_card
from .sources import dataset_name
from .st_files import write_sentence_transformers
from .tasks import BadRows, DataError, get_task
from .tasks.custom import data_rows
from .tasks.tables import is_table_source
from .tokenizer import Tokenizer

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
    rows = []
    for where, row in data_rows(source, None, bad):
        rows.append((where, row))
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise DataError(f"{source}: no rows")
    texts, score = pick_columns(rows[0][1], columns, source)
    out: dict[str, list] = {"texts": [], "scores": []}
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
            out["scores"].append(value)
        out["texts"].append(values)
    if bad.skip:
        bad.report(source)
    if not out["texts"]:
        raise DataError(f"{source}: no usable rows")
    cols = list(zip(*out["texts"]))
    return Pairs(str(source), list(cols[0]), list(cols[1]), list(cols[2]) if len(cols) == 3 else None,
                 out["scores"] if score is not None else None)


def pick_columns(first: dict, columns: str | None, source) -> tuple[list[str], str | None]:
    """(text columns: anchor, positive[, negative]; score column or None) of a table (module doc)."""
    keys = list(first)
    if columns:
        names = [c.strip() for c in columns.split(",")]
        if not 2 <= len(names) <= 3 or not all(names):
            raise BertkitError(f"embedding_columns {columns!r}: give anchor,positive[,negative] or "
                               "sentence1,sentence2,score")
        missing = next((n for n in names if n not in first), None)
        if missing is not None:
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
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


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
    from .embed_eval import Retrieval, ScoredPairs, read_retrieval

    if is_squad_file(source):
        return read_retrieval(source, skip_bad_rows=skip_bad_rows, limit=limit)
    pairs = read_pairs(source, columns, skip_bad_rows, limit)
    if pairs.scores is not None:
        return ScoredPairs(pairs.name, pairs.anchors, pairs.positives, pairs.scores)
    ids: dict[str, str] = {}
    for text in pairs.positives + (pairs.negatives or []):
        ids.setdefault(text, str(len(ids)))
    return Retrieval(pairs.name, {str(i): a for i, a in enumerate(pairs.anchors)}, {v: k for k, v in ids.items()},
                     {str(i): {ids[p]} for i, p in enumerate(pairs.positives)})


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


def epoch_batches(pairs: Pairs, batch_size: int, rng: random.Random, distinct: bool) -> list[list[int]]:
    """One pass over the rows in a random order, cut into batches; `distinct`: no text twice in a
    batch (a row that would repeat one waits for a later batch)."""
    order = list(range(len(pairs.anchors)))
    rng.shuffle(order)
    if not distinct:
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    batches = []
    while order:
        batch, seen, rest = [], set(), []
        for i in order:
            texts = pairs.texts(i)
            if len(batch) < batch_size and seen.isdisjoint(texts):
                batch.append(i)
                seen.update(texts)
            else:
                rest.append(i)
        batches.append(batch)
        order = rest
    return batches


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
    if loss == "cosine" and max(pairs.scores) > 1:
        top = max(pairs.scores)
        pairs.scores = [s / top for s in pairs.scores]
        log.info("cosine loss: scores divided by the largest, %g (to 0..1)", top)
    return loss


# ---- the loop -----------------------------------------------------------------------------------
def finetune_embedding(cfg, command: str = "") -> dict:
    """Train `cfg.model` as a bi-encoder (`bertkit finetune --task embedding`); returns the metrics
    written to out/metrics.json. Staged as every fine-tuning run (`bertkit.outdir`)."""
    if cfg.freeze:
        raise BertkitError("task embedding trains the whole encoder; --freeze does not apply")
    with staged_dir(cfg.out, lambda p: (p / "finetune.yaml").is_file(), "fine-tuning run") as out:
        result = _train(cfg, command, out)
    best = (result["dev"] or {}).get(result["main_metric"])
    log.info("embedding: best %s on dev %s at update %s; checkpoint in %s", result["main_metric"],
             f"{best:.4f}" if best is not None else None, result["best_step"], cfg.out)
    return result


def load_encoder(cfg) -> nn.Module:
    """The checkpoint's encoder (its pooler too, where it has one), or random weights of its shape."""
    changes = {} if cfg.dropout is None else {"hidden_dropout": cfg.dropout, "attention_dropout": cfg.dropout}
    if cfg.init == "random":
        return build("encoder", read_config(Path(cfg.model))[0].replace(**changes), add_pooler=False)
    return load_model(cfg.model, head="encoder", config_changes=changes)


def default_max_length(path: str | Path, positions: int) -> int:
    """sentence-transformers' max_seq_length of the checkpoint, else 256 (within its positions)."""
    try:
        return min(int(json.loads((Path(path) / "sentence_bert_config.json").read_text())["max_seq_length"]), positions)
    except (OSError, ValueError, KeyError, TypeError):
        return min(DEFAULT_MAX_LENGTH, positions)


@dataclass
class _EmbeddingRun:
    """What the loop of `finetune --task embedding` works on, made by `_setup`."""
    cfg: object
    out: Path
    train: object                     # Pairs (anchors, positives, negatives or scores)
    train_path: object
    dev: object                       # ScoredPairs / retrieval set, or None
    dev_path: object
    loss_name: str
    pooling: str
    main_metric: str | None
    tokenizer: Tokenizer
    model: nn.Module
    max_length: int
    ids: dict                         # text -> token ids, each distinct text tokenized once
    precision: torch.dtype
    precision_reason: str
    kernel: str
    kernel_reason: str
    optimizer: torch.optim.Optimizer
    steps_per_epoch: int
    total: int
    warmup: float
    metrics_log: MetricsLog
    facts: dict


def _train(cfg, command: str, out: Path) -> dict:
    """The run, written into `out` (the staging folder): setup, then the loop (step, evaluate,
    checkpoint), then the metrics and the run card."""
    t_start = time.time()
    run = _setup(cfg, out)
    t_train = time.time()
    best_metrics, best_step, history, tokens = _loop(run, t_train)
    train_time = time.time() - t_train
    result = {"task": "embedding", "main_metric": run.main_metric, "best_step": best_step, "updates": run.total,
              "epochs": cfg.epochs, "train_examples": len(run.train.anchors), "loss": run.loss_name,
              "scale": cfg.embedding_scale, "pooling": run.pooling, "max_length": run.max_length, "dev": best_metrics,
              "history": history, "train_time_s": round(train_time, 1), "wall_time_s": round(time.time() - t_start, 1),
              "tokens_per_s": round(tokens / max(train_time, 1e-9), 1), "tokens_seen": tokens, "init": cfg.init,
              "precision": str(run.precision).replace("torch.", ""), "precision_reason": run.precision_reason,
              "attention_kernel": run.kernel, "attention_kernel_reason": run.kernel_reason,
              "train_file": str(run.train_path), "dev_file": str(run.dev_path) if run.dev_path else None}
    (out / "metrics.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    _write_card(out, cfg, command, run.model, result)
    return result


def _setup(cfg, out: Path) -> _EmbeddingRun:
    """Seeds, data (each distinct text tokenized once), model, precision and attention kernel,
    optimizer and schedule, finetune.yaml and the metrics log."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    train_path = split_source(cfg, "train")
    train = read_pairs(train_path, cfg.embedding_columns, cfg.skip_bad_rows, cfg.train_limit)
    dev_path = split_source(cfg, "dev")
    dev = dev_set(dev_path, cfg.embedding_columns, cfg.skip_bad_rows, cfg.dev_limit) if dev_path else None
    loss_name = choose_loss(cfg.embedding_loss, train)
    pooling = cfg.pooling or "mean"
    main_metric = None if dev is None else "spearman" if hasattr(dev, "scores") else "ndcg@10"
    tokenizer = Tokenizer.from_dir(cfg.model)
    model = load_encoder(cfg)
    max_length = cfg.max_length or default_max_length(cfg.model, model.config.max_position_embeddings)
    texts = list(dict.fromkeys(train.anchors + train.positives + (train.negatives or [])))
    ids = {t: e.input_ids for t, e in zip(texts, tokenizer.encode_batch(texts, None, max_length))}
    tokenizer.stats.report(label=f"{train_path}: distinct texts at {max_length} tokens")
    log.info("%s: %d %s for %s loss (%s pooling), %d distinct texts of <= %d tokens%s", train_path,
             len(train.anchors), "scored pairs" if train.scores else "triplets" if train.negatives else "pairs",
             loss_name, pooling, len(texts), max_length, f"; dev {dev_path} ({main_metric})" if dev else "")
    device = torch.device(cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(device).train()
    precision, precision_reason = choose_precision(cfg.precision, device, model.config)
    kernel, kernel_reason = attention_kernel(device, precision, model.config, max_length)
    set_attention_kernel(model, kernel)
    optimizer = build_optimizer(model, cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                fused=cfg.optimizer == "adamw", layer_decay=cfg.layer_lr_decay)
    steps_per_epoch = math.ceil(len(train.anchors) / cfg.batch_size)
    total = max(1, round(steps_per_epoch * cfg.epochs))
    save_config(cfg, out / "finetune.yaml")
    facts = {"bertkit_embedding": {"pooling": pooling, "loss": loss_name, "scale": cfg.embedding_scale},
             "bertkit_max_length": max_length, INCOMPLETE_KEY: "fine-tuning in progress"}
    return _EmbeddingRun(cfg, out, train, train_path, dev, dev_path, loss_name, pooling, main_metric, tokenizer,
                         model, max_length, ids, precision, precision_reason, kernel, kernel_reason, optimizer,
                         steps_per_epoch, total, cfg.warmup * total if cfg.warmup < 1 else cfg.warmup,
                         MetricsLog(out / "metrics.jsonl"), facts)


def _loop(run: _EmbeddingRun, t_train: float) -> tuple[dict | None, int | None, list[dict], int]:
    """The updates, logged every cfg.log_every; on dev at each epoch's end (and every cfg.eval_every),
    the best model saved. Returns (best dev scores, their update, every dev record, tokens seen)."""
    cfg, model, tokenizer, train = run.cfg, run.model, run.tokenizer, run.train
    device = next(model.parameters()).device
    autocast = torch.autocast(device.type, dtype=run.precision) if run.precision != torch.float32 else nullcontext()
    rng = random.Random(cfg.seed)
    step, tokens, best, best_metrics, best_step, history = 0, 0, None, None, None, []
    bar = tqdm(total=run.total, desc="finetune embedding", disable=not cfg.progress, dynamic_ncols=True)
    while step < run.total:
        batches = epoch_batches(train, cfg.batch_size, rng, distinct=run.loss_name == "mnrl")
        for n, batch in enumerate(batches, 1):
            lr = lr_at(step, run.total, run.warmup, cfg.lr)
            for group in run.optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
            with autocast:
                loss, real = batch_loss(model, train, batch, run.ids, run.loss_name, cfg.embedding_scale, run.pooling,
                                        cfg.packed, tokenizer.pad_id)
            run.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            run.optimizer.step()
            step, tokens = step + 1, tokens + real
            bar.update(1)
            if not math.isfinite(loss.item()):
                raise BertkitError(f"loss is {loss.item()} at update {step}; lower the learning rate")
            if step % cfg.log_every == 0 or step == run.total:
                rate = tokens / max(time.time() - t_train, 1e-9)
                run.metrics_log.write({"step": step, "epoch": round(step / run.steps_per_epoch, 3),
                                       "loss": loss.item(), "lr": lr, "tokens_per_s": round(rate, 1)})
                bar.set_postfix(loss=f"{loss.item():.4f}", tok_s=f"{rate:.0f}")
            end = n == len(batches) or step == run.total
            if run.dev is not None and (end or (cfg.eval_every and step % cfg.eval_every == 0)):
                scores = evaluate_model(model, tokenizer, run.dev, run.pooling, run.max_length, cfg.eval_batch_size)
                record = {"step": step, "epoch": round(step / run.steps_per_epoch, 3),
                          **{f"dev_{k}": v for k, v in scores.items()}}
                run.metrics_log.write(record)
                history.append(record)
                log.info("update %d: dev %s", step, ", ".join(f"{k} {v:.4f}" for k, v in scores.items()
                                                              if isinstance(v, float)))
                if best is None or scores[run.main_metric] > best:
                    best, best_metrics, best_step = scores[run.main_metric], scores, step
                    save_embedding_model(model, tokenizer, run.out, run.pooling, run.max_length, run.facts)
            if step >= run.total:
                break
    bar.close()
    if run.dev is None:
        save_embedding_model(model, tokenizer, run.out, run.pooling, run.max_length, run.facts)
        best_step = step
    return best_metrics, best_step, history, tokens


def evaluate_model(model: nn.Module, tokenizer, dev, pooling: str, max_length: int, batch_size: int) -> dict:
    """`embed_eval` on the in-memory model through a `Predictor` (no dropout for the call; the
    weights as trained: fp32, not prepacked)."""
    from .embed_eval import ScoredPairs, evaluate_retrieval, evaluate_similarity
    from .infer import Predictor

    model.eval()
    try:
        predictor = Predictor(model, tokenizer, device=next(model.parameters()).device, max_length=max_length)
        run = evaluate_similarity if isinstance(dev, ScoredPairs) else evaluate_retrieval
        return run(predictor, dev, pooling, batch_size)
    finally:
        model.train()


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
