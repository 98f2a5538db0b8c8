"""Frozen-feature probes fitted to convergence: logistic regression on cached encoder features.

`finetune --freeze` (`bertkit.probe`) trains a linear head by SGD at a fixed learning rate, which on
small models can stay at the majority class. Here the same question - how much of a task can a
linear map read off the frozen states? - is answered as a convex problem, solved:

1. the encoder runs once per split (eval mode, fp32, no gradients, padding-free batches) and its
   states are kept: sentence tasks at [CLS] and averaged over the tokens ("cls", "mean"; "last"
   for a causal model), token tagging at the first word piece of each word (the paper's section
   5.3). Table 7's features are read from them: embeddings, second_to_last, last, sum_last_four (a
   plain sum here: nothing is learned but the linear map), concat_last_four (`probe.probe_layers`);
2. features are standardised with the training rows' mean and standard deviation, then
   multinomial logistic regression with an L2 penalty (two classes: one logit, as scikit-learn's
   LogisticRegression) is fitted by full-batch L-BFGS (strong-Wolfe line search, float64) until
   the largest gradient entry of mean loss + ||W||^2 / (2 C n) is below `tol` (or `max_iter`;
   both recorded). Nothing is random: the same input gives the same weights, bit for bit;
3. C is chosen from a log-spaced grid by k-fold cross-validation on the training examples only
   (fixed folds by example, so the windows or words of one example stay together; the task's own
   metric on each held-out fold; only a C whose fits converged in every fold is eligible, so a
   score read off a half-solved problem never wins; a tie goes to the smaller C, the stronger
   penalty), refitted on all training rows, and the dev set is scored by the task's own postprocess
   and metrics (SST-2 accuracy, MRPC F1 of class 1 and accuracy, CoNLL-2003 entity-level F1), beside
   the dev score of always answering the training majority class. Each dev example's share of the main metric is kept
   (`dev_outcomes`), so two probes on the same dev set are compared pairwise (ablate's report).

`probe(FinetuneConfig, ProbeSpec)` runs it (the data options - data, limits, max_length, windows -
are fine-tuning's); `bertkit probe` and the probe arms of `bertkit ablate` (`ablate.probes`) call it.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from .checkpoint import load_model
from .errors import BertkitError
from .finetune import check_checkpoint, columns_of, read_task_data, task_max_length
from .hardware import pick_device
from .model import pool_tokens
from .outdir import write_whole
from .packing import pack
from .probe import POOLINGS, check_pooling, probe_layers
from .runconfig import unknown_key
from .sources import jsonl_objects
from .tasks import collate
from .tasks.metrics import example_counts
from .tasks.plumbing import resolve_task
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from .finetune.config import FinetuneConfig
    from .tasks import Task

log = logging.getLogger("bertkit")

TABLE7 = ["embeddings", "second_to_last", "last", "sum_last_four", "concat_last_four"]
GRID_C = [1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0]


@dataclass
class ProbeSpec:
    """What to probe and how hard to solve it (an ablate arm's `probe:` keys, `bertkit probe`'s options)."""
    features: list | str = field(default_factory=lambda: list(TABLE7))
    """Feature choices, comma-separated (`bertkit.probe`'s names; default Table 7's five: embeddings,
    second_to_last, last, sum_last_four, concat_last_four; also sum_all, concat_last_N, sum_last_N;
    sums are plain sums)."""
    pooling: list | str = field(default_factory=lambda: ["cls", "mean"])
    """Sentence tasks: where to read each feature, cls, mean, last, comma-separated (default: cls,mean;
    `bertkit probe`: last,mean on a causal model); tagging reads each word's first piece."""
    C: list | str = field(default_factory=lambda: list(GRID_C))
    """Inverse L2 strengths to choose from by cross-validation, comma-separated (scikit-learn's C: the
    penalty is ||W||^2 / 2C; default 0.001,0.01,0.1,1,10,100)."""
    folds: int = 5
    """Cross-validation folds over the training examples, 2 or more."""
    tol: float = 1e-6
    """Converged when the largest gradient entry of the mean objective is at most this."""
    max_iter: int = 1000
    """L-BFGS iterations at most, per fit (the count is reported)."""

    def __post_init__(self) -> None:
        for name in ("features", "pooling", "C"):
            value = getattr(self, name)
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                value = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else [value]
            if not isinstance(value, list) or not value:
                raise BertkitError(f"probe {name} must be a non-empty list, got {value!r}")
            setattr(self, name, value)
        for f in self.features:
            if probe_layers(str(f), 10 ** 6)[0] == "pooler":       # the name only; depth is checked on the model
                raise BertkitError("probe features 'pooler': the pooler is a trained layer, not a state; "
                                   f"choose from {', '.join(TABLE7)}")
        if bad := [p for p in self.pooling if p not in POOLINGS]:
            raise BertkitError(f"probe pooling {bad[0]!r}: choose from {', '.join(POOLINGS)}")
        try:
            self.C = [float(c) for c in self.C]
        except (TypeError, ValueError):
            raise BertkitError(f"probe C must be numbers, got {self.C!r}") from None
        if not all(0 < c < math.inf for c in self.C):
            raise BertkitError(f"probe C must be positive and finite, got {self.C}")
        self.C = sorted(set(self.C))
        for name, low in (("folds", 2), ("max_iter", 1)):
            v = getattr(self, name)
            if type(v) is not int or v < low:
                raise BertkitError(f"probe {name} must be an integer >= {low}, got {v!r}")
        if not (isinstance(self.tol, (int, float)) and 0 < self.tol < math.inf):
            raise BertkitError(f"probe tol must be a positive number, got {self.tol!r}")


def probe_spec(raw: dict | None, where: str = "probe") -> ProbeSpec:
    """A ProbeSpec from a mapping (YAML), unknown keys named with the closest known one."""
    if not isinstance(raw, dict):
        raise BertkitError(f"{where} must be a mapping (features: [...], pooling: [...]), not {raw!r}")
    known = [f.name for f in fields(ProbeSpec)]
    for key in raw:
        if key not in known:
            raise BertkitError(unknown_key(key, known, where))
    try:
        return ProbeSpec(**raw)
    except BertkitError as e:
        raise BertkitError(f"{where}: {e}") from None


# ---- logistic regression ------------------------------------------------------------------------
@dataclass
class LogReg:
    """A fitted model: logits = X W^T + b; two classes keep one row (class 0's logit is 0)."""
    weight: Tensor
    bias: Tensor
    num_classes: int
    iterations: int
    converged: bool
    grad_max: float

    def log_proba(self, X: Tensor) -> Tensor:
        """(n, num_classes) log-probabilities."""
        return _logits(X, self.weight, self.bias, self.num_classes).log_softmax(-1)


def _logits(X: Tensor, W: Tensor, b: Tensor, num_classes: int) -> Tensor:
    z = torch.addmm(b, X, W.T)                                           # (n, K) or (n, 1)
    return torch.cat([torch.zeros_like(z), z], 1) if num_classes == 2 else z


def fit_logreg(X: Tensor, y: Tensor, num_classes: int, C: float, tol: float = 1e-6, max_iter: int = 1000,
               init: LogReg | None = None) -> LogReg:
    """Minimise mean cross-entropy + ||W||^2 / (2 C n) (the bias unpenalised): scikit-learn's
    LogisticRegression(C) objective divided by C n, so the gradient tolerance means the same at any
    C and n. X (n, d) float64, y (n,) class indices; `init`: a warm start (a neighbouring C)."""
    n, d = X.shape
    rows = 1 if num_classes == 2 else num_classes
    W = (init.weight.clone() if init is not None else X.new_zeros(rows, d)).requires_grad_(True)
    b = (init.bias.clone() if init is not None else X.new_zeros(rows)).requires_grad_(True)
    opt = torch.optim.LBFGS([W, b], lr=1.0, max_iter=max_iter, max_eval=10 * max_iter, tolerance_grad=tol,
                            tolerance_change=1e-15, history_size=20, line_search_fn="strong_wolfe")
    penalty = 1.0 / (2.0 * C * n)

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(_logits(X, W, b, num_classes), y) + penalty * W.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    iterations = int(opt.state[W].get("n_iter", 0))
    closure()                                     # the gradient at the final point (the last call may be a trial)
    grad_max = float(max(W.grad.abs().max(), b.grad.abs().max()))
    return LogReg(W.detach(), b.detach(), num_classes, iterations, grad_max <= tol, grad_max)


def standardise(train: Tensor, *others: Tensor) -> list[Tensor]:
    """float64 copies scaled by the training rows' mean and standard deviation (constant columns: 1)."""
    X = train.double()
    mean, std = X.mean(0), X.std(0, unbiased=False)
    std = torch.where(std > 1e-12, std, torch.ones_like(std))
    return [(t.double() - mean) / std for t in (X, *others)]


def folds_of(groups: np.ndarray, k: int) -> np.ndarray:
    """Fold of each row: its example's place in a fixed permutation (seed 0) of the examples, modulo k."""
    examples = np.unique(groups)
    if len(examples) < k:
        raise BertkitError(f"{k}-fold cross-validation needs at least {k} training examples, got {len(examples)}")
    fold = np.empty(int(examples.max()) + 1, dtype=np.int64)
    fold[examples[np.random.RandomState(0).permutation(len(examples))]] = np.arange(len(examples)) % k
    return fold[groups]


def choose_c(scores: dict[float, float], unconverged: set[float] = frozenset()) -> float:
    """The C of the best mean score among those whose fits converged in every fold (all of them when
    none did); a tie goes to the smaller C (the stronger penalty)."""
    eligible = {c: s for c, s in scores.items() if c not in unconverged} or scores
    best = max(eligible.values())
    return min(c for c, s in eligible.items() if s == best)


# ---- features -----------------------------------------------------------------------------------
@dataclass
class Encoded:
    """A split's encoder states: one row per input window (sentence tasks) or per word's first
    piece in a window (tagging). `states[(layer, pooling)]` (pooling None for tagging) is (rows, C)."""
    states: dict
    labels: np.ndarray            # (rows,) class index, -1 where none
    feature: np.ndarray           # (rows,) index of the window (task feature) the row came from
    position: np.ndarray          # (rows,) token position in that window (-1: sentence rows)
    groups: np.ndarray            # (rows,) example index


def encode(encoder, head: str, feats: Sequence[dict], layers: Sequence[int], poolings: Sequence[str | None],
           batch_tokens: int = 8192, desc: str | None = None) -> Encoded:
    """Run the frozen encoder over `feats` (longest batches first, padding-free) and keep the asked states."""

    order = sorted(range(len(feats)), key=lambda i: -len(feats[i]["input_ids"]))
    batches, start = [], 0
    while start < len(order):
        size = max(1, batch_tokens // len(feats[order[start]]["input_ids"]))
        batches.append(order[start:start + size])
        start += size
    device = next(encoder.parameters()).device
    per_feature: dict = {}
    with torch.inference_mode():
        for idx in tqdm(batches, desc=desc, unit="batch", disable=desc is None, leave=False):
            b = collate([{k: feats[i][k] for k in ("input_ids", "token_type_ids")} for i in idx])
            flat, layout = pack(b["input_ids"].to(device), b["attention_mask"].to(device),
                                b["token_type_ids"].to(device))
            states = encoder(flat["input_ids"], flat["token_type_ids"], None, flat["position_ids"], layout,
                             all_layers=True)
            starts = layout.cu_seqlens[:-1].tolist()
            if head == "token_classification":
                for k, i in enumerate(idx):
                    pos = [j for j, w in enumerate(feats[i]["word_ids"]) if w is not None]
                    at = torch.tensor([starts[k] + j for j in pos], dtype=torch.long, device=device)
                    per_feature[i] = (pos, {(l, None): states[l].index_select(0, at).float().cpu() for l in layers})
            else:
                pooled = {(l, p): pool_tokens(states[l], p, layout).float().cpu() for l in layers for p in poolings}
                for k, i in enumerate(idx):
                    per_feature[i] = ([-1], {key: v[k:k + 1] for key, v in pooled.items()})
    keys = list(per_feature[0][1]) if feats else []
    rows = [(i, j) for i in range(len(feats)) for j in per_feature[i][0]]
    labels = []
    for i, j in rows:
        lab = feats[i].get("labels")
        lab = lab[j] if isinstance(lab, list) else lab
        labels.append(-1 if lab is None or lab == -100 else int(lab))
    return Encoded(states={key: torch.cat([per_feature[i][1][key] for i in range(len(feats))]) for key in keys},
                   labels=np.array(labels, dtype=np.int64),
                   feature=np.array([i for i, _ in rows], dtype=np.int64),
                   position=np.array([j for _, j in rows], dtype=np.int64),
                   groups=np.array([feats[i]["example_index"] for i, _ in rows], dtype=np.int64))


def feature_matrix(enc: Encoded, features: str, pooling: str | None, num_layers: int) -> Tensor:
    """(rows, C) or (rows, K C): the chosen states concatenated, or summed (sum_*: a plain sum)."""
    combine, layers = probe_layers(features, num_layers)
    chosen = [enc.states[(l, pooling)] for l in layers]
    return torch.cat(chosen, 1) if combine == "concat" else torch.stack(chosen).sum(0)


# ---- scoring with the task's own postprocess and metrics ----------------------------------------
def task_scores(task: "Task", labels: Sequence[str], split: Split, logp: np.ndarray, rows: np.ndarray | None = None,
                keep_examples: Sequence[int] | None = None) -> dict:
    """The task's metrics on the examples `keep_examples` (indices) of `split`, from the log-probabilities
    of `rows` of its encoder states (their windows' rows); by default every row and example."""
    predictions, chosen = task_predictions(task, labels, split, logp, rows, keep_examples)
    return task.metrics(predictions, chosen)


def task_predictions(task: "Task", labels: Sequence[str], split: Split, logp: np.ndarray,
                     rows: np.ndarray | None = None, keep_examples: Sequence[int] | None = None) -> tuple[dict, list]:
    """({example id: prediction}, the examples `keep_examples`) by the task's own postprocess: the
    outputs it expects are rebuilt from the rows' log-probabilities ((K,) per window, or (T, K) per
    window with the rows at first pieces); by default every row and example of `split`."""
    examples, feats, enc = split.examples, split.feats, split.enc
    rows = np.arange(len(enc.labels)) if rows is None else rows
    keep_examples = range(len(examples)) if keep_examples is None else keep_examples
    place = {e: k for k, e in enumerate(keep_examples)}
    windows = sorted({int(enc.feature[r]) for r in rows})
    outputs = {}
    for r, lp in zip(rows, logp):
        i = int(enc.feature[r])
        if task.head == "token_classification":
            out = outputs.setdefault(i, np.zeros((len(feats[i]["input_ids"]), len(labels)), dtype=np.float64))
            out[enc.position[r]] = lp
        else:
            outputs[i] = lp
    sub = [{**feats[i], "example_index": place[feats[i]["example_index"]]} for i in windows]
    chosen = [examples[e] for e in keep_examples]
    return task.postprocess([outputs[i] for i in windows], sub, chosen, labels), chosen


def dev_outcomes(task: "Task", predictions: dict, examples: Sequence) -> dict | None:
    """Each dev example's share of the main metric, {num: [...], den: [...]} in the order of `examples`
    (sum(num) / sum(den) is the metric: `tasks.metrics.example_counts`), so two probes scored on the
    same examples are compared pairwise; None where the metric is not a ratio of sums (mcc, ...)."""
    if task.head == "token_classification":
        metric = "conll_f1" if task.main_metric == "f1" else task.main_metric
        refs, preds = [list(ex.tags) for ex in examples], [list(predictions[ex.id]) for ex in examples]
    else:
        metric = task.main_metric
        refs, preds = [str(ex.label) for ex in examples], [str(predictions[ex.id]) for ex in examples]
    counts = example_counts(metric, refs, preds)
    return None if counts is None else {"num": counts[0], "den": counts[1]}


# ---- one task ----------------------------------------------------------------------------------
def combinations(head: str, spec: ProbeSpec, config) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(features, pooling) pairs to fit and why the others are left out (tagging reads every word;
    an embeddings [CLS] is one vector for every input; a causal [CLS] sees only itself)."""
    for f in spec.features:
        probe_layers(f, config.num_layers)                    # depth against this model: one line if too deep
    if head == "token_classification":
        return [(f, None) for f in spec.features], []
    pairs, skipped = [], []
    for f in spec.features:
        for p in spec.pooling:
            try:
                pairs.append((f, check_pooling(head, f, p, config.causal)))
            except BertkitError as e:
                skipped.append(f"{f}/{p}: {e}")
    if not pairs:
        raise BertkitError("no probe left to fit: " + "; ".join(skipped))
    return pairs, skipped


def fit_probe(X: Tensor, y: np.ndarray, groups: np.ndarray, X_dev: Tensor, spec: ProbeSpec, num_classes: int,
              score: Callable[[LogReg, np.ndarray, Tensor], float], report: Callable[[dict], None]) -> dict:
    """C by k-fold cross-validation (`cross_validate`), then the refit on every training row and the dev
    rows' log-probabilities: {C, cv, cv_unconverged, model, dev_logp, fit_wall_s}. `score(model,
    held-out rows, their X)` is the task metric."""
    t0 = time.perf_counter()
    means, unconverged = cross_validate(X, y, groups, spec, num_classes, score, report)
    C = choose_c(means, unconverged)
    Xt, Xd = standardise(X, X_dev)
    model = fit_logreg(Xt, torch.from_numpy(y).to(Xt.device), num_classes, C, spec.tol, spec.max_iter)
    report({"fold": "all", "C": C, "iterations": model.iterations, "converged": model.converged,
            "grad_max": model.grad_max})
    return {"C": C, "cv": {f"{c:g}": round(m, 6) for c, m in means.items()},
            "cv_unconverged": [f"{c:g}" for c in sorted(unconverged)], "model": model,
            "dev_logp": model.log_proba(Xd).cpu().numpy(), "fit_wall_s": round(time.perf_counter() - t0, 2)}


def cross_validate(X: Tensor, y: np.ndarray, groups: np.ndarray, spec: ProbeSpec, num_classes: int,
                   score: Callable[[LogReg, np.ndarray, Tensor], float], report: Callable[[dict], None]
                   ) -> tuple[dict[float, float], set[float]]:
    """{C: mean held-out score} over k folds by example (each fold standardised by its own training rows;
    warm starts along the C grid within a fold), and the Cs whose fit did not converge in some fold."""
    fold = folds_of(groups, spec.folds)
    cv: dict[float, list[float]] = {c: [] for c in spec.C}
    unconverged: set[float] = set()
    for k in range(spec.folds):
        train, held = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        Xt, Xh = standardise(X[train], X[held])
        yt = torch.from_numpy(y[train]).to(Xt.device)
        model = None
        for c in spec.C:
            model = fit_logreg(Xt, yt, num_classes, c, spec.tol, spec.max_iter, init=model)
            cv[c].append(float(score(model, held, Xh)))
            if not model.converged:
                unconverged.add(c)
            report({"fold": k, "C": c, "score": cv[c][-1], "iterations": model.iterations,
                    "converged": model.converged, "grad_max": model.grad_max})
    return {c: float(np.mean(v)) for c, v in cv.items()}, unconverged


@dataclass
class Split:
    """One split as the probe sees it: examples, their task features (windows) and encoder states."""
    examples: list
    feats: list
    enc: Encoded | None = None


def read_task(cfg: "FinetuneConfig") -> tuple["Task", list[str], Split, Split]:
    """The task, its labels and the train / dev splits featurized as fine-tuning does (limits,
    max_length, windows), every problem one line before the encoder runs."""
    task = resolve_task(cfg.task, columns_of(cfg))
    if task.head not in ("sequence_classification", "token_classification") or task.problem == "regression":
        raise BertkitError(f"a logistic-regression probe needs a classification or tagging task; {task.name} is "
                           f"{'a regression' if task.problem == 'regression' else task.head.replace('_', ' ')}")
    cfg.max_length = task_max_length(task, cfg)
    check_checkpoint(cfg)
    data = read_task_data(task, cfg, Tokenizer.from_dir(cfg.model))
    if data.dev_examples is None:
        raise BertkitError(f"{cfg.data}: no dev split for {task.name}; the probe is scored on dev (give --dev-file)")
    return task, data.labels, Split(data.train_examples, data.train_feats), Split(data.dev_examples, data.dev_feats)


def probe(cfg: "FinetuneConfig", spec: ProbeSpec | None = None, progress: bool = False,
          fits_log: Path | None = None, finished: Path | None = None, key: str = "") -> dict:
    """Probe `cfg.model` on `cfg.task` (`cfg`'s data options; its training options are not used).

    Returns {task, model, metric, labels, train_examples, dev_examples, dev_ids, train_rows, dev_rows,
    majority: {label, <dev metrics>}, skipped, spec, encode_wall_s, wall_s, probes: [{features,
    pooling, metric, value, dev: {<metrics>}, C, cv: {C: mean score}, iterations, converged,
    grad_max, width, fit_wall_s, outcomes: {num, den} per dev example in dev_ids' order (`dev_outcomes`;
    None for a metric that is not a ratio of sums)}]}. `fits_log`: one JSONL line per fit (fold, C,
    score, iterations). `finished`: a JSONL file of the probes done so far, one line each ({"key",
    "probe"}); those of the same `key` are taken from it instead of fitted again, and each new one is
    added as soon as it is fitted: an interrupted run resumes at the probe it was on, with the same
    numbers (nothing in a probe is random)."""
    spec = spec or ProbeSpec()
    t0 = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task, labels, train, dev = read_task(cfg)
    device = pick_device(cfg.device)
    encoder = load_model(cfg.model, head="encoder").float().eval().requires_grad_(False).to(device)
    L = encoder.config.num_layers
    pairs, skipped = combinations(task.head, spec, encoder.config)
    layers = sorted({i for f, _ in pairs for i in probe_layers(f, L)[1]})
    poolings = sorted({p for _, p in pairs if p is not None})
    for split, name in ((train, "train"), (dev, "dev")):
        split.enc = encode(encoder, task.head, split.feats, layers, poolings, desc=f"encode {name}" if progress else None)
    encode_wall = time.perf_counter() - t0
    y = train.enc.labels
    if (y < 0).any():
        raise BertkitError("training rows without a label: the probe needs labelled training data")
    majority = int(np.bincount(y, minlength=len(labels)).argmax())
    one_hot = np.where(np.arange(len(labels)) == majority, 0.0, -1e9)[None].repeat(len(dev.enc.labels), 0)
    result = {"task": task.name, "model": str(cfg.model), "metric": task.main_metric, "labels": list(labels),
              "train_examples": len(train.examples), "dev_examples": len(dev.examples),
              "dev_ids": [ex.id for ex in dev.examples], "train_rows": len(y), "dev_rows": len(dev.enc.labels),
              "majority": {"label": labels[majority], **task_scores(task, labels, dev, one_hot)},
              "skipped": skipped, "spec": {f.name: getattr(spec, f.name) for f in fields(ProbeSpec)},
              "max_length": cfg.max_length, "device": str(device), "threads": torch.get_num_threads(),
              "encode_wall_s": round(encode_wall, 2), "probes": []}
    done = _finished_probes(finished, key) if finished else {}
    if finished:          # kept from it: these probes alone (a torn last line would swallow the next one)
        write_whole(finished, "".join(json.dumps({"key": key, "probe": r}) + "\n" for r in done.values()))
    if done:
        log.info("probe %s: %d of %d probes reused from %s", task.name, len(done), len(pairs), finished)
    log_file = _fits_log(fits_log, done) if fits_log else None
    bar = tqdm(total=(len(pairs) - len(done)) * (spec.folds * len(spec.C) + 1),
               desc="probe fits", unit="fit", disable=not progress or None, leave=False)
    try:
        for features, pooling in pairs:
            rec = done.get((features, pooling))
            if rec is None:
                rec = _one_probe(task, labels, train, dev, features, pooling, L, spec, device,
                                 lambda fit: _fit_done(bar, log_file, features, pooling, fit))
                if finished:
                    with open(finished, "a", encoding="utf-8") as f:
                        f.write(json.dumps({"key": key, "probe": rec}) + "\n")
            result["probes"].append(rec)
    finally:
        bar.close()
        if log_file:
            log_file.close()
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    return result


def _lines_kept(path: Path | None) -> list[dict]:
    """The JSON objects of a resume file; a line cut short by an interrupted write is left out."""
    if path is None or not path.is_file():
        return []
    with path.open(encoding="utf-8") as f:
        return [obj for _, obj in jsonl_objects(f, path, bad=lambda lineno, message: None)]


def _finished_probes(path: Path, key: str) -> dict[tuple[str, str | None], dict]:
    """The probes of `key` in a `probe(finished=...)` file, by (features, pooling)."""
    return {(o["probe"]["features"], o["probe"]["pooling"]): o["probe"] for o in _lines_kept(path)
            if o.get("key") == key and isinstance(o.get("probe"), dict) and {"features", "pooling"} <= set(o["probe"])}


def _fits_log(path: Path, done: dict):
    """fits.jsonl opened for the fits to come: on a resumed run it keeps the lines of the probes
    reused (`done`) and drops those of the probe that was cut short."""
    kept = [o for o in _lines_kept(path if done else None) if (o.get("features"), o.get("pooling")) in done]
    f = open(path, "w", encoding="utf-8")
    f.writelines(json.dumps(o) + "\n" for o in kept)
    return f


def _fit_done(bar, log_file, features: str, pooling: str | None, rec: dict) -> None:
    bar.update(1)
    if log_file:
        log_file.write(json.dumps({"features": features, "pooling": pooling, **rec}) + "\n")
        log_file.flush()


def _one_probe(task: "Task", labels: list[str], train: Split, dev: Split, features: str, pooling: str | None,
               num_layers: int, spec: ProbeSpec, device, report: Callable[[dict], None]) -> dict:
    X, X_dev = (feature_matrix(split.enc, features, pooling, num_layers).to(device) for split in (train, dev))

    def score(model: LogReg, rows: np.ndarray, Xh: Tensor) -> float:
        keep = sorted(set(train.enc.groups[rows].tolist()))
        return task_scores(task, labels, train, model.log_proba(Xh).cpu().numpy(), rows, keep)[task.main_metric]

    fit = fit_probe(X, train.enc.labels, train.enc.groups, X_dev, spec, len(labels), score, report)
    predictions, _ = task_predictions(task, labels, dev, fit["dev_logp"])
    scores = task.metrics(predictions, dev.examples)
    model = fit["model"]
    log.info("probe %s %s%s: dev %s %.4f (C %g%s, %d L-BFGS iterations%s)", task.name, features,
             f"/{pooling}" if pooling else "", task.main_metric, scores[task.main_metric], fit["C"],
             ", at the edge of the grid" if fit["C"] in (spec.C[0], spec.C[-1]) and len(spec.C) > 1 else "",
             model.iterations, "" if model.converged else ", NOT converged")
    return {"features": features, "pooling": pooling, "metric": task.main_metric,
            "value": scores[task.main_metric], "dev": scores, "C": fit["C"], "cv": fit["cv"],
            "cv_unconverged": fit["cv_unconverged"],
            "iterations": model.iterations, "converged": model.converged, "grad_max": model.grad_max,
            "width": X.shape[1], "fit_wall_s": fit["fit_wall_s"],
            "outcomes": dev_outcomes(task, predictions, dev.examples)}


def write_results(path: Path, result: dict) -> None:
    """results.json, written whole (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, results_json(result) + "\n")


def results_json(result: dict) -> str:
    """`probe`'s result as indented JSON, the per-example lists (dev_ids, each probe's outcomes) one line each."""
    inline: dict[str, str] = {}

    def one_line(d: dict, key: str) -> dict:
        if d.get(key) is None:
            return d
        inline[mark := f"@inline-{len(inline)}@"] = json.dumps(d[key])
        return {**d, key: mark}

    shown = {**one_line(result, "dev_ids")}
    if isinstance(result.get("probes"), list):
        shown["probes"] = [one_line(p, "outcomes") for p in result["probes"]]
    text = json.dumps(shown, indent=1)
    for key, value in inline.items():
        text = text.replace(json.dumps(key), value, 1)
    return text
