"""Fine-tuning: one pre-trained encoder, one small task head, the paper's recipe (section 4).

The settings are `finetune.config.FinetuneConfig`; evaluation runs through `infer.Predictor`.
What training shares with inference about a task (which task, strides, features, reference checks,
scores, the predictions file) is `bertkit.tasks.plumbing`; running a fine-tuned checkpoint on new
inputs (`evaluate`, `predict` commands) is `bertkit.predict`, which never imports this module.

The loop has the pre-training loop's shape - explicit phases you can read top to bottom (the
bi-encoder, `finetune.biencoder`, runs the same `start_loop` / `train` with its own batches and loss):

    setup      read train/dev files through the task, label names from the training data,
               load the checkpoint with a new head (or random weights of the same shape)
    step       packed (padding-free) batches on heads that take them, AdamW over
               `optim.param_groups`, lr from the pure `optim.lr_at`, global-norm clipping
    evaluate   on the dev file at every epoch end (and every `eval_every` updates)
    checkpoint the best model on dev (task's main metric) is written as a Hugging Face folder:
               config.json with id2label + model.safetensors + tokenizer + finetune.yaml +
               run_card.{md,json} + metrics.json (+ metrics.jsonl, dev_predictions.jsonl),
               into OUT.incomplete, which replaces OUT when the run is done (`bertkit.outdir`)

Inputs longer than max_length: sentence classification truncates (longest first, as the paper)
unless `windows`/`stride` ask for overlapping windows; tagging and SQuAD read windows. How many
were cut or windowed goes to the log, metrics.json and the run card (`finetune.card`).

`grid()` runs the paper's hyper-parameter grid (batch {16, 32} x lr {5e-5, 3e-5, 2e-5} x
epochs {2, 3, 4}) and keeps the best run on dev. `freeze=True` trains a linear probe on a frozen
encoder over one of the paper's Table 7 feature choices (`bertkit.probe`; default the last four
layers concatenated), never on a frozen random pooler.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import random
import shutil
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..checkpoint import build, check_inputs_fit, load_model, read_config, save_model
from ..errors import BertkitError, DivergedError
from ..hardware import (PRECISION_NAMES, attention_kernel, choose_precision, deterministic, dtype_name,
                        machine_facts, pick_device)
from ..infer import Predictor
from ..model import set_attention_kernel
from ..optim import build_optimizer, lr_at
from ..outdir import INCOMPLETE_KEY, staged_dir
from ..packing import pack
from ..probe import ProbeModel
from ..runconfig import save_config
from ..runlog import MetricsLog
from ..tasks import BadRows, DataError, Task
from ..tasks.plumbing import (COLUMN_KEYS, CUSTOM, check_references, evaluate, featurize, input_stride,
                              resolve_task, write_predictions)
from ..tasks.squad import apply_null_threshold
from ..tokenizer import Tokenizer
from .card import batch_flops, build_card, eval_flops, write_card
from .config import FinetuneConfig

log = logging.getLogger("bertkit")


# ---- setup --------------------------------------------------------------------------------------
def columns_of(cfg: FinetuneConfig) -> dict:
    return {k: getattr(cfg, k) for k in COLUMN_KEYS}


def task_record(task: Task, cfg: FinetuneConfig) -> dict:
    """What a checkpoint stores to rebuild its task (config.json key `bertkit_task`)."""
    if cfg.task in CUSTOM:
        return {"name": cfg.task, "columns": columns_of(cfg)}
    return {"name": task.name}


def read_split(task: Task, cfg: FinetuneConfig, split: str) -> tuple[list, Path] | tuple[None, None]:
    explicit = cfg.train_file if split == "train" else cfg.dev_file
    if explicit is None and cfg.data is None:
        if split == "train":
            raise BertkitError("give --data DIR or --train-file FILE")
        return None, None
    try:
        path = Path(explicit) if explicit is not None else task.split_path(cfg.data, split)
    except DataError:
        if split == "dev":
            log.warning("no dev file for %s in %s: keeping the last checkpoint", task.name, cfg.data)
            return None, None
        raise
    bad = BadRows(skip=cfg.skip_bad_rows)
    examples = task.read(path, bad)[:cfg.train_limit if split == "train" else cfg.dev_limit]     # None: all
    log.info("%s: %d %s examples%s", path, len(examples), split, f" ({bad.count} bad rows skipped)" if bad.count else "")
    return examples, path


def load_encoder(cfg: FinetuneConfig, changes: dict) -> nn.Module:
    """The checkpoint's encoder (its pooler too, where it has one), or random weights of its shape."""
    if cfg.init == "random":
        return build("encoder", read_config(Path(cfg.model))[0].replace(**changes), add_pooler=False)
    return load_model(cfg.model, head="encoder", config_changes=changes)


def build_model(task: Task, cfg: FinetuneConfig, labels: Sequence[str] | None) -> nn.Module:
    """The checkpoint with a new task head (or random weights of the same shape); with `freeze`,
    a `ProbeModel` on the frozen encoder."""
    args = task.head_args(labels)
    changes: dict = {} if cfg.pooling is None else {"classifier_pooling": cfg.pooling}
    if cfg.dropout is not None:
        changes.update(hidden_dropout=cfg.dropout, attention_dropout=cfg.dropout, classifier_dropout=None)
    if cfg.freeze:
        if cfg.init == "random" and cfg.features == "pooler":
            raise BertkitError("probe features 'pooler' with init random: a frozen random pooler is not a feature")
        return ProbeModel(load_encoder(cfg, changes), task.head, args.get("num_labels", 0), cfg.features,
                          args.get("problem"), cfg.probe_pooling)
    if cfg.init == "random":
        return build(task.head, read_config(Path(cfg.model))[0].replace(**changes), **args)
    return load_model(cfg.model, head=task.head, new_head_ok=True, config_changes=changes, **args)


# ---- batches ------------------------------------------------------------------------------------
def run_batch(model: nn.Module, task: Task, features: Sequence[dict], packed: bool):
    """A training step's forward: collate, run the model with its targets (packed where the head
    allows), return (out, loss, batch, layout). Inference runs through `infer.Predictor`."""
    batch = task.collate(features)
    device = next(model.parameters()).device
    if device.type != "cpu":
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    head = getattr(model, "head", "")
    if packed and task.packed and head in ("sequence_classification", "token_classification", "question_answering"):
        per_token = head == "token_classification"
        flat, layout = pack(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                            labels=batch.get("labels") if per_token else None)
        kwargs = dict(input_ids=flat["input_ids"], token_type_ids=flat["token_type_ids"],
                      position_ids=flat["position_ids"], packed=layout)
        if "labels" in batch:
            kwargs["labels"] = flat["labels"] if per_token else batch["labels"]
        kwargs.update({k: batch[k] for k in ("start_positions", "end_positions") if k in batch})  # (B,): per window
        out, loss = model(**kwargs)
        return out, loss, batch, layout
    out, loss = model(**batch)
    return out, loss, batch, None


def epoch_batches(n: int, batch_size: int, rng: random.Random, texts=None) -> list[list[int]]:
    """One pass over n rows in a random order, cut into batches; with `texts` (row -> its texts),
    no text twice in a batch (a row that would repeat one waits for a later batch)."""
    order = list(range(n))
    rng.shuffle(order)
    if texts is None:
        return [order[i:i + batch_size] for i in range(0, n, batch_size)]
    batches = []
    while order:
        batch, seen, rest = [], set(), []
        for i in order:
            row = texts(i)
            if len(batch) < batch_size and seen.isdisjoint(row):
                batch.append(i)
                seen.update(row)
            else:
                rest.append(i)
        batches.append(batch)
        order = rest
    return batches


@contextmanager
def evaluating(model: nn.Module, tokenizer, max_length: int | None = None):
    """A `Predictor` around the in-memory model, in eval mode (no dropout) for the block: the
    module's weights, dtype and layers are left as they are (no prepacking, no cast), and its
    train/eval mode comes back afterwards, so training goes on with the same module."""
    was_training = model.training
    model.eval()
    try:
        yield Predictor(model, tokenizer, device=next(model.parameters()).device, max_length=max_length)
    finally:
        model.train(was_training)


# ---- the loop (the bi-encoder's too: biencoder.py) -----------------------------------------------
def is_finetune_output(path: Path) -> bool:
    """Whether a folder holds a previous fine-tuning run (which a new run into it may replace)."""
    return (path / "finetune.yaml").is_file() or (path / "grid.json").is_file()


def finetune(cfg: FinetuneConfig, command: str = "") -> dict:
    """Fine-tune `cfg.model` on `cfg.task`; returns the metrics written to `out/metrics.json`."""
    if cfg.task == "embedding":                   # `bertkit finetune --task embedding` runs biencoder.py's loop
        raise BertkitError("task embedding trains a bi-encoder: bertkit.finetune.biencoder.finetune_embedding (no --grid)")
    check_checkpoint(cfg)
    return staged_run(cfg, lambda out: _finetune(cfg, command, out))


def staged_run(cfg: FinetuneConfig, run: Callable[[Path], dict]) -> dict:
    """`run(folder)` writes into `OUT.incomplete`, which replaces `OUT` only when the run is complete
    (`bertkit.outdir`): a killed or failed run never leaves a finished-looking folder."""
    with staged_dir(cfg.out, is_finetune_output, "fine-tuning run") as out:
        result = run(out)
    log.info("%s: best %s on dev %s at update %s; checkpoint in %s", result["task"], result["main_metric"],
             _fmt_metric((result["dev"] or {}).get(result["main_metric"])), result["best_step"], cfg.out)
    return result


def check_checkpoint(cfg: FinetuneConfig) -> None:
    """Before anything is read or written: the checkpoint's tokenizer fits its embeddings and
    max_length fits its positions."""
    config, _ = read_config(Path(cfg.model))
    check_inputs_fit(config, Tokenizer.from_dir(cfg.model).vocab_size, cfg.max_length, "max_length", cfg.model)


def task_max_length(task: Task, cfg: FinetuneConfig) -> int:
    """cfg.max_length, else the task's own window (SQuAD: 384) within the model's positions."""
    return cfg.max_length or min(task.max_length, read_config(Path(cfg.model))[0].max_position_embeddings)


def seed_run(cfg: FinetuneConfig) -> None:
    """torch's threads, and the seeds of the head's initialisation, the data order and dropout."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)


def _finetune(cfg: FinetuneConfig, command: str, out: Path) -> dict:
    """The run, written into `out` (the staging folder): the task and its data, the model on this
    machine (`start_loop`), the updates (`train_task`), then metrics.json and the run card."""
    t_start = time.time()
    seed_run(cfg)
    task = resolve_task(cfg.task, columns_of(cfg))
    if cfg.pooling is not None and task.head not in ("sequence_classification", "multiple_choice"):
        raise BertkitError(f"pooling {cfg.pooling!r}: only sentence(-pair) and multiple-choice heads pool; "
                           f"task {task.name} reads every token")     # before any data is read
    cfg.max_length = task_max_length(task, cfg)
    tokenizer = Tokenizer.from_dir(cfg.model)
    data = read_task_data(task, cfg, tokenizer)
    loop = start_loop(cfg, build_model(task, cfg, data.labels), len(data.train_feats), cfg.max_length,
                      task.main_metric, out)
    log.info("%s: %d train features, %d updates (%d per epoch), %s init, lr %g, batch %d, %s (%s)", task.name,
             len(data.train_feats), loop.total, loop.steps_per_epoch, cfg.init, cfg.lr, cfg.batch_size,
             loop.chosen["precision"], loop.chosen["precision_reason"])
    facts = {"bertkit_stride": data.inputs["stride"],      # saved in config.json: how inputs were read
             # ... and what this machine chose (dev evaluation, and `bertkit evaluate` after it, run fp32)
             "bertkit_run": {"device": next(loop.model.parameters()).device.type,
                             "precision": PRECISION_NAMES[loop.precision],
                             "attention_kernel": loop.chosen["attention_kernel"], "packed": cfg.packed,
                             "evaluation": "fp32"},
             INCOMPLETE_KEY: "fine-tuning in progress"}   # removed when the run completes
    train_time = train_task(loop, task, tokenizer, data, facts)
    result = write_result(loop, task.name, len(data.train_examples), {
        "train_features": len(data.train_feats), "dev_examples": len(data.dev_examples or []), "inputs": data.inputs},
        train_time, t_start, data.train_path, data.dev_path, train_flops=loop.train_flops, eval_flops=loop.eval_flops)
    write_card(out, build_card(cfg, task, loop.model, data.labels, result, command, facts, machine_facts()))
    return result


@dataclass
class TaskData:
    """A run's training and dev data: examples, label names from the training data, features."""
    train_examples: list
    train_path: Path
    dev_examples: list | None        # None: no dev set (the last model is kept)
    dev_path: Path | None
    labels: Sequence[str] | None     # None: regression, or a task without labels
    train_feats: list
    dev_feats: list | None
    inputs: dict                     # how inputs over max_length were read: windows, stride, counts per split


def read_task_data(task: Task, cfg: FinetuneConfig, tokenizer) -> TaskData:
    """The train and dev sets read, checked (two labels at least, dev's references) and featurised."""
    train_examples, train_path = read_split(task, cfg, "train")
    dev_examples, dev_path = read_split(task, cfg, "dev")
    labels = task.labels(train_examples)
    if labels is not None and len(labels) < 2 and task.problem != "regression":
        raise DataError(f"{train_path}: training data has only {len(labels)} label ({', '.join(labels)}); "
                        f"a classifier needs two or more")
    if dev_examples is not None:
        check_references(task, dev_examples, labels, str(dev_path))
    stride = input_stride(task, cfg.windows, cfg.stride, cfg.max_length)
    inputs = {"windows": stride is not None, "stride": stride}
    train_feats, inputs["train"] = featurize(task, train_examples, tokenizer, labels, cfg.max_length, stride,
                                             "train", train=True)
    dev_feats = None
    if dev_examples is not None:
        dev_feats, inputs["dev"] = featurize(task, dev_examples, tokenizer, labels, cfg.max_length, stride, "dev")
    return TaskData(train_examples, train_path, dev_examples, dev_path, labels, train_feats, dev_feats, inputs)


@dataclass
class Loop:
    """A fine-tuning loop's state: what it trains (set up once by `start_loop`) and what it keeps."""
    cfg: FinetuneConfig
    model: nn.Module
    out: Path                        # the staging folder the run writes into
    main_metric: str | None          # the dev score that picks the checkpoint kept (None: no dev set)
    optimizer: Any
    precision: torch.dtype           # of autocast (float32: none)
    chosen: dict                     # precision and attention kernel, and why
    steps_per_epoch: int
    total: int                       # updates in all
    metrics_log: MetricsLog          # out/metrics.jsonl
    step: int = 0                    # updates done
    tokens: int = 0                  # real (non-padding) tokens trained on
    train_flops: float = 0.0
    eval_flops: float = 0.0
    best: float | None = None        # the best dev main metric so far
    best_metrics: dict | None = None # all dev scores at that point
    best_step: int | None = None
    history: list[dict] = field(default_factory=list)   # every dev evaluation record


def start_loop(cfg: FinetuneConfig, model: nn.Module, n_train: int, max_length: int, main_metric: str | None,
               out: Path) -> Loop:
    """The model on the device with the precision and attention kernel chosen for this machine, the
    optimizer, the number of updates; finetune.yaml written, metrics.jsonl started."""
    device = pick_device(cfg.device)
    determinism = deterministic(device, cfg.deterministic)         # before the first GPU matrix product
    model.to(device).train()
    precision, precision_reason = choose_precision(cfg.precision, device, model.config)
    kernel, kernel_reason = attention_kernel(device, precision, model.config, max_length, cfg.attention)
    set_attention_kernel(model, kernel)
    optimizer = build_optimizer(model, cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                fused=cfg.optimizer == "adamw", layer_decay=cfg.layer_lr_decay)
    steps_per_epoch = math.ceil(n_train / cfg.batch_size)
    save_config(cfg, out / "finetune.yaml")
    chosen = {"precision": dtype_name(precision), "precision_reason": precision_reason,
              "attention_kernel": kernel, "attention_kernel_reason": kernel_reason, "deterministic": determinism}
    return Loop(cfg, model, out, main_metric, optimizer, precision, chosen, steps_per_epoch,
                max(1, round(steps_per_epoch * cfg.epochs)), MetricsLog(out / "metrics.jsonl"))


def train(loop: Loop, desc: str, batches: Callable[[random.Random], list[list[int]]],
          forward: Callable[[list[int]], tuple[torch.Tensor, int, float]], evaluate: Callable[[], None] | None,
          save: Callable[[], None]) -> float:
    """The updates, epoch by epoch over `batches(rng)` (one shuffled pass of row indices);
    `forward(batch)` gives (loss, real tokens, FLOPs). The loss is logged every `log_every`
    updates; `evaluate` (which keeps the best model: `log_dev`) runs at every epoch end and every
    `eval_every` updates; without it, `save` keeps the last model. Returns the seconds it took."""
    cfg, model = loop.cfg, loop.model
    device = next(model.parameters()).device
    autocast = torch.autocast(device.type, dtype=loop.precision) if loop.precision != torch.float32 else nullcontext()
    warmup = cfg.warmup * loop.total if cfg.warmup < 1 else cfg.warmup
    rng = random.Random(cfg.seed)
    t_train = time.time()
    bar = tqdm(total=loop.total, desc=desc, disable=not cfg.progress, dynamic_ncols=True)
    while loop.step < loop.total:
        epoch = batches(rng)
        for n, batch in enumerate(epoch, 1):
            lr = lr_at(loop.step, loop.total, warmup, cfg.lr)
            for group in loop.optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
            model.train()
            with autocast:
                loss, tokens, flops = forward(batch)
            loop.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip_norm:
                torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.clip_norm)
            loop.optimizer.step()
            loop.step, loop.tokens, loop.train_flops = loop.step + 1, loop.tokens + tokens, loop.train_flops + flops
            step = loop.step
            bar.update(1)
            if not math.isfinite(loss.item()):
                raise DivergedError(f"loss is {loss.item()} at update {step}; lower the learning rate")
            if step % cfg.log_every == 0 or step == loop.total:
                rate = loop.tokens / max(time.time() - t_train, 1e-9)
                loop.metrics_log.write({"step": step, "epoch": round(step / loop.steps_per_epoch, 3),
                                        "loss": loss.item(), "lr": lr, "tokens_per_s": round(rate, 1)})
                bar.set_postfix(loss=f"{loss.item():.4f}", tok_s=f"{rate:.0f}")
            if evaluate is not None and (n == len(epoch) or step == loop.total
                                         or (cfg.eval_every and step % cfg.eval_every == 0)):
                evaluate()
            if step >= loop.total:
                break
    bar.close()
    if evaluate is None:
        save()
        loop.best_step = loop.step
    return time.time() - t_train


def log_dev(loop: Loop, scores: dict, extra: dict | None = None) -> bool:
    """Dev `scores` at this update into metrics.jsonl (with `extra` keys), the history and the log;
    whether they are the best so far (the caller then keeps the model)."""
    record = {"step": loop.step, "epoch": round(loop.step / loop.steps_per_epoch, 3),
              **{f"dev_{k}": v for k, v in _plain(scores).items() if not isinstance(v, dict)}, **(extra or {})}
    loop.metrics_log.write(record)
    loop.history.append(record)
    log.info("update %d: dev %s", loop.step, ", ".join(f"{k} {_fmt_metric(v)}" for k, v in scores.items()
                                                        if not isinstance(v, dict)))
    if loop.best is not None and not scores[loop.main_metric] > loop.best:
        return False
    loop.best, loop.best_metrics, loop.best_step = scores[loop.main_metric], scores, loop.step
    return True


def write_result(loop: Loop, task: str, n_train: int, own: dict, train_time: float, t_start: float,
                 train_path, dev_path, **counts) -> dict:
    """metrics.json: the run's summary, `own` what only this kind of run reports."""
    result = {"task": task, "main_metric": loop.main_metric, "best_step": loop.best_step, "updates": loop.total,
              "epochs": loop.cfg.epochs, "train_examples": n_train, **own, "dev": _plain(loop.best_metrics),
              "history": loop.history, "train_time_s": round(train_time, 1),
              "wall_time_s": round(time.time() - t_start, 1),
              "tokens_per_s": round(loop.tokens / max(train_time, 1e-9), 1), "init": loop.cfg.init,
              "tokens_seen": loop.tokens, **counts, **loop.chosen,
              "train_file": str(train_path), "dev_file": str(dev_path) if dev_path else None}
    (loop.out / "metrics.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def train_task(loop: Loop, task: Task, tokenizer, data: TaskData, facts: dict) -> float:
    """`train` on a task's features: dev evaluated through `infer.Predictor` (the best model and
    its dev predictions kept); without a dev set the last model is kept. Returns the seconds it took."""
    cfg, model = loop.cfg, loop.model
    dev_pass = eval_flops(model.config, data.dev_feats) if data.dev_feats is not None else 0.0
    save = lambda: save_finetuned(model, tokenizer, loop.out, task, cfg, data.labels, facts)   # noqa: E731

    def forward(batch: list[int]) -> tuple[torch.Tensor, int, float]:
        _, loss, collated, layout = run_batch(model, task, [data.train_feats[i] for i in batch], cfg.packed)
        mask = collated["attention_mask"]            # (one sync per update; cheap next to the step)
        return loss, int(mask.sum()), batch_flops(model.config, mask, layout is not None, cfg.freeze)

    def evaluate_dev() -> None:
        with evaluating(model, tokenizer) as predictor:
            scores, predictions = evaluate(predictor, task, data.dev_examples, data.dev_feats, data.labels,
                                           cfg.eval_batch_size)
        counts = predicted_counts(task, predictions) if data.labels is not None else None
        if log_dev(loop, scores, None if counts is None else {"dev_predicted": counts}):   # all one class: collapsed
            if "best_f1_thresh" in scores:       # SQuAD v2.0: answer "" above the null threshold best on dev
                facts["bertkit_null_threshold"] = float(scores["best_f1_thresh"])
                predictions = apply_null_threshold(predictions, facts["bertkit_null_threshold"])
            save()
            write_predictions(predictions, loop.out / "dev_predictions.jsonl")
        loop.eval_flops += dev_pass

    return train(loop, f"finetune {task.name}", lambda rng: epoch_batches(len(data.train_feats), cfg.batch_size, rng),
                 forward, evaluate_dev if data.dev_feats is not None else None, save)


def predicted_counts(task: Task, predictions: dict) -> dict[str, int] | None:
    """How often each label (sentence classification) or tag (tagging: every word) was predicted on dev,
    most frequent first; None for other heads."""
    if task.head == "sequence_classification":
        counts = Counter(str(p) for p in predictions.values())
    elif task.head == "token_classification":
        counts = Counter(str(t) for tags in predictions.values() for t in tags)
    else:
        return None
    return dict(counts.most_common())


def save_finetuned(model: nn.Module, tokenizer, out: Path, task: Task, cfg: FinetuneConfig, labels,
                   facts: dict) -> None:
    """HF checkpoint (+ id2label, task, probe features, `facts`: config.json keys such as the
    stride inputs were read with) and the tokenizer into `out`."""
    extra: dict[str, Any] = {"bertkit_task": task_record(task, cfg), "bertkit_max_length": cfg.max_length, **facts}
    if labels is not None:
        extra["id2label"] = {str(i): name for i, name in enumerate(labels)}
    if isinstance(model, ProbeModel):
        extra["bertkit_probe"] = model.record()
    save_model(model, out, extra_config=extra)
    tokenizer.save(out)


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


def _fmt_metric(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


# ---- the paper's grid ---------------------------------------------------------------------------
PAPER_GRID = {"batch_size": (16, 32), "lr": (5e-5, 3e-5, 2e-5), "epochs": (2, 3, 4)}


def grid(cfg: FinetuneConfig, command: str = "", space: dict | None = None) -> dict:
    """Every combination of `space` (default: the paper's 18) into out/grid/<name>; the best run on
    dev (task's main metric) is copied to `out`. Returns a summary (also out/grid.json)."""
    space = space or PAPER_GRID
    with staged_dir(cfg.out, is_finetune_output, "fine-tuning run") as out:
        runs = []
        for values in itertools.product(*space.values()):
            setting = dict(zip(space, values))
            name = "_".join(f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in setting.items())
            run_cfg = dataclasses.replace(cfg, out=str(out / "grid" / name), **setting)
            result = finetune(run_cfg, command=command + f"  # grid run {name}")
            main = (result["dev"] or {}).get(result["main_metric"])
            runs.append({"name": name, **setting, result["main_metric"]: main})
            log.info("grid %s: dev %s %s", name, result["main_metric"], _fmt_metric(main))
        scored = [r for r in runs if r[result["main_metric"]] is not None]
        if not scored:
            raise BertkitError("grid search needs a dev file to choose the best run")
        best = max(scored, key=lambda r: r[result["main_metric"]])
        for item in (out / "grid" / best["name"]).iterdir():
            if item.is_file():
                shutil.copy2(item, out / item.name)
        summary = {"main_metric": result["main_metric"], "best": best, "runs": runs}
        (out / "grid.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
