"""The official metrics of GLUE, CoNLL-2003, SQuAD v1.1/v2.0 and SWAG, as plain functions.

Each one computes exactly what the reference does (pure Python/numpy, no scikit-learn, scipy
or seqeval at run time; the tests check them against those libraries and against faithful
copies of the official SQuAD scripts):

  accuracy           share of exact matches                        (SST-2, MNLI, QNLI, RTE, WNLI, SWAG)
  f1_binary          F1 of the positive class, sklearn's f1_score  (MRPC, QQP)
  matthews_corrcoef  sklearn's matthews_corrcoef (multi-class form) (CoLA)
  pearson_spearman   scipy's pearsonr and spearmanr (average ranks) (STS-B)
  conll_f1           entity-level micro F1 = seqeval's default (conlleval) mode, per-type scores too
  example_counts     each example's share of accuracy, binary F1 or entity F1 (ratios of sums)
  squad_v1           evaluate-v1.1.py: EM and token F1 (0-100), max over the gold answers
  squad_v2           evaluate-v2.0.py: exact/f1, HasAns_*/NoAns_*, best_exact/best_f1 and thresholds

Arguments go references first, predictions second (as scikit-learn's ``y_true, y_pred``).
`score_files` (behind `bertkit score`) reads a predictions file and a task's reference file and
returns these metrics.
"""
from __future__ import annotations

import collections
import gzip
import json
import logging
import math
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Mapping, Sequence

import numpy as np

from ..errors import BertkitError
from ..runconfig import Checked, Rule
from ..sources import jsonl_objects, read_json_object
from . import BadRows, SkipBadRows, get_task

log = logging.getLogger("bertkit")


class MetricError(BertkitError, ValueError):
    """References and predictions that cannot be scored together (lengths, missing ids)."""


def _check_lengths(y_true: Sequence, y_pred: Sequence) -> None:
    if len(y_true) != len(y_pred):
        raise MetricError(f"{len(y_true)} references but {len(y_pred)} predictions")
    if len(y_true) == 0:
        raise MetricError("nothing to score: no references")


# ---- classification and regression --------------------------------------------------------------
def accuracy(y_true: Sequence, y_pred: Sequence) -> float:
    """Share of predictions equal to their reference."""
    _check_lengths(y_true, y_pred)
    return sum(t == p for t, p in zip(y_true, y_pred)) / len(y_true)


def f1_binary(y_true: Sequence, y_pred: Sequence, pos_label: Any = 1) -> float:
    """F1 of the positive class: 2·TP / (2·TP + FP + FN), 0.0 when there is no positive at all
    (scikit-learn's ``f1_score(average='binary')`` with its default ``zero_division``)."""
    _check_lengths(y_true, y_pred)
    tp = sum(t == pos_label and p == pos_label for t, p in zip(y_true, y_pred))
    true_sum = sum(t == pos_label for t in y_true)
    pred_sum = sum(p == pos_label for p in y_pred)
    denom = float(true_sum) + float(pred_sum)
    return 2.0 * tp / denom if denom else 0.0


def matthews_corrcoef(y_true: Sequence, y_pred: Sequence) -> float:
    """Matthews correlation in its multi-class form (Gorodkin 2004), as scikit-learn computes it;
    0.0 when either side is constant."""
    _check_lengths(y_true, y_pred)
    classes = sorted(set(y_true) | set(y_pred), key=lambda v: (str(type(v)), v))
    index = {c: i for i, c in enumerate(classes)}
    C = np.zeros((len(classes), len(classes)), dtype=np.int64)    # rows: true, columns: predicted
    for t, p in zip(y_true, y_pred):
        C[index[t], index[p]] += 1
    t_sum = C.sum(axis=1, dtype=np.float64)
    p_sum = C.sum(axis=0, dtype=np.float64)
    n_correct = np.trace(C, dtype=np.float64)
    n = p_sum.sum()
    cov_ytyp = n_correct * n - np.dot(t_sum, p_sum)
    cov_ypyp = n ** 2 - np.dot(p_sum, p_sum)
    cov_ytyt = n ** 2 - np.dot(t_sum, t_sum)
    if cov_ypyp * cov_ytyt == 0:
        return 0.0
    return float(cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp))


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    # scipy.stats.pearsonr: centre, scale each side to unit norm, dot product, clip to [-1, 1]
    xm, ym = x - x.mean(), y - y.mean()
    nx, ny = np.linalg.norm(xm), np.linalg.norm(ym)
    if nx == 0 or ny == 0:
        return float("nan")                       # a constant input: the correlation is undefined
    return float(np.clip(np.dot(xm / nx, ym / ny), -1.0, 1.0))


def _rank(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties get the average of their ranks (scipy.stats.rankdata 'average')."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    starts = np.r_[True, xs[1:] != xs[:-1]]                      # first element of each run of ties
    run = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    counts = np.diff(np.r_[first, len(x)])
    avg = first + (counts + 1) / 2.0                             # mean of ranks first+1 .. first+count
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = avg[run]
    return ranks


def pearson_spearman(y_true: Sequence[float], y_pred: Sequence[float]) -> dict[str, float]:
    """Pearson and Spearman correlation (STS-B), and their mean as GLUE's leaderboard reports it."""
    _check_lengths(y_true, y_pred)
    x = np.asarray(y_true, dtype=np.float64)
    y = np.asarray(y_pred, dtype=np.float64)
    p = _pearson(x, y)
    s = _pearson(_rank(x), _rank(y))
    return {"pearson": p, "spearman": s, "corr": (p + s) / 2}


# ---- CoNLL entity F1 (seqeval default mode = conlleval) ------------------------------------------
def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """(type, first, last) of each chunk in one tag sequence, with conlleval's lenient rules.

    A chunk starts at B-/S- (and at I-/E- after O or after a chunk of another type, which is how
    IOB1 and broken BIO are read); it ends before O, B-, S-, a change of type, and after E-/S-.
    So IOB1, BIO (IOB2) and IOBES all decode as seqeval's default mode decodes them."""
    chunks = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, chunk in enumerate(list(tags) + ["O"]):
        tag = chunk[0]
        type_ = chunk[1:].split("-", maxsplit=1)[-1] or "_"
        if _end_of_chunk(prev_tag, tag, prev_type, type_):
            chunks.append((prev_type, begin, i - 1))
        if _start_of_chunk(prev_tag, tag, prev_type, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return chunks


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    return (prev_tag in ("E", "S")
            or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
            or (prev_tag not in ("O", ".") and prev_type != type_))


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    return (tag in ("B", "S")
            or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
            or (tag not in ("O", ".") and prev_type != type_))


def _prf(tp: int, n_pred: int, n_true: int) -> tuple[float, float, float]:
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_true if n_true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def conll_f1(y_true: Sequence[Sequence[str]], y_pred: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Entity-level micro precision/recall/F1 over sentences of tags, and the same per entity type.

    As seqeval's default mode (and conlleval): sentences are joined with an O between them, an
    entity counts when type, first and last word all match. Returns ``{"precision", "recall",
    "f1", "accuracy" (token level), "per_type": {type: {"precision", "recall", "f1", "support"}}}``.
    """
    _check_sentences(y_true, y_pred)
    true_ents: dict[str, set] = collections.defaultdict(set)
    pred_ents: dict[str, set] = collections.defaultdict(set)
    for ents, sentences in ((true_ents, y_true), (pred_ents, y_pred)):
        for type_, b, e in get_entities([tag for sent in sentences for tag in [*sent, "O"]]):
            ents[type_].add((b, e))
    per_type, tp_all, pred_all, true_all = {}, 0, 0, 0
    for type_ in sorted(set(true_ents) | set(pred_ents)):
        tp = len(true_ents[type_] & pred_ents[type_])
        n_pred, n_true = len(pred_ents[type_]), len(true_ents[type_])
        p, r, f = _prf(tp, n_pred, n_true)
        per_type[type_] = {"precision": p, "recall": r, "f1": f, "support": n_true}
        tp_all, pred_all, true_all = tp_all + tp, pred_all + n_pred, true_all + n_true
    p, r, f = _prf(tp_all, pred_all, true_all)
    n_tokens = sum(len(s) for s in y_true)
    correct = sum(a == b for t, q in zip(y_true, y_pred) for a, b in zip(t, q))
    return {"precision": p, "recall": r, "f1": f, "accuracy": correct / n_tokens if n_tokens else 0.0,
            "per_type": per_type}


def _check_sentences(y_true: Sequence[Sequence[str]], y_pred: Sequence[Sequence[str]]) -> None:
    if len(y_true) != len(y_pred):
        raise MetricError(f"{len(y_true)} reference sentences but {len(y_pred)} predicted")
    for i, (t, p) in enumerate(zip(y_true, y_pred)):
        if len(t) != len(p):
            raise MetricError(f"sentence {i}: {len(t)} reference tags but {len(p)} predicted")


# ---- per-example outcomes of the metrics that are ratios of sums --------------------------------
def example_counts(metric: str, y_true: Sequence, y_pred: Sequence,
                   pos_label: Any = "1") -> tuple[list[int], list[int]] | None:
    """Each example's (num_i, den_i) of a metric that is a ratio of sums: sum(num) / sum(den) is the
    metric itself, so two systems scored on the same examples can be compared pairwise
    (`bertkit.ablate.measure.paired_ratio_difference`).

      accuracy   num = 1 if right else 0, den = 1
      f1         F1 of `pos_label` = 2 TP / (n predicted + n true): num = 2 [both are pos_label],
                 den = [predicted pos_label] + [reference pos_label]
      conll_f1   entity F1 (sentences of tags, `conll_f1`'s entities): num = 2 x the sentence's entities
                 predicted exactly (type, first and last word), den = its predicted + its true entities

    None for any other metric (Matthews correlation, Pearson / Spearman, ...: not ratios of sums)."""
    if metric == "conll_f1":
        _check_sentences(y_true, y_pred)
        true, pred = _entities_by_sentence(y_true), _entities_by_sentence(y_pred)
        return ([2 * len(t & p) for t, p in zip(true, pred)], [len(t) + len(p) for t, p in zip(true, pred)])
    if metric not in ("accuracy", "f1"):
        return None
    _check_lengths(y_true, y_pred)
    if metric == "accuracy":
        return [int(t == p) for t, p in zip(y_true, y_pred)], [1] * len(y_true)
    return ([2 * int(t == pos_label and p == pos_label) for t, p in zip(y_true, y_pred)],
            [int(p == pos_label) + int(t == pos_label) for t, p in zip(y_true, y_pred)])


def _entities_by_sentence(sentences: Sequence[Sequence[str]]) -> list[set]:
    """Each sentence's entities, read as `conll_f1` reads them (the sentences joined with an O between
    them; an entity belongs to the sentence it starts in), so the counts add up to its totals exactly."""
    starts = np.cumsum([0] + [len(s) + 1 for s in sentences])
    out: list[set] = [set() for _ in sentences]
    for entity in get_entities([tag for sent in sentences for tag in [*sent, "O"]]):
        out[int(np.searchsorted(starts, entity[1], side="right")) - 1].add(entity)
    return out


# ---- SQuAD (the official evaluate-v1.1.py / evaluate-v2.0.py) -------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def squad_exact(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def squad_token_f1(gold: str, pred: str) -> float:
    """Token-level F1 of two answers (v2.0 form: two empty answers agree with F1 1)."""
    gold_toks = normalize_answer(gold).split() if gold else []
    pred_toks = normalize_answer(pred).split() if pred else []
    if not gold_toks or not pred_toks:
        return float(gold_toks == pred_toks)
    return _token_f1(gold_toks, pred_toks)


def _token_f1(gold_toks: list[str], pred_toks: list[str]) -> float:
    """F1 of the shared tokens (0 when none are shared: v1.1's F1 of an empty answer)."""
    same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
    return _prf(same, len(pred_toks), len(gold_toks))[2]


def squad_golds(references: Any) -> dict[str, list[str]]:
    """{question id: [gold answer texts]} from a SQuAD JSON (the dict with "data", or its list of
    articles) or from such a mapping already; question order is kept. No question is a MetricError."""
    if isinstance(references, Mapping) and "data" in references:
        references = references["data"]
    if isinstance(references, Mapping):
        golds = {str(k): list(v) for k, v in references.items()}
    else:
        golds = {qa["id"]: [a["text"] for a in qa.get("answers", [])]
                 for article in references for paragraph in article["paragraphs"] for qa in paragraph["qas"]}
    if not golds:
        raise MetricError("nothing to score: no questions in the references")
    return golds


def squad_v1(references: Any, predictions: Mapping[str, str]) -> dict[str, float]:
    """evaluate-v1.1.py: {"exact_match", "f1"} in 0-100; a question with no prediction scores 0."""
    golds = squad_golds(references)
    em = f1 = 0.0
    for qid, answers in golds.items():
        if qid in predictions and answers:
            pred = normalize_answer(predictions[qid])
            # v1.1's F1 is 0 when no token is shared, so an empty gold or prediction scores 0 there
            em += max(pred == normalize_answer(g) for g in answers)
            f1 += max(_token_f1(normalize_answer(g).split(), pred.split()) for g in answers)
    missing = sum(qid not in predictions for qid in golds)
    total = len(golds)
    out = {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total, "total": total}
    if missing:
        out["unanswered"] = missing
    return out


def squad_v2(references: Any, predictions: Mapping[str, str], na_probs: Mapping[str, float] | None = None,
             na_prob_thresh: float = 1.0, reproducible: bool = False) -> dict[str, float]:
    """evaluate-v2.0.py: exact, f1, total, HasAns_*/NoAns_* and, given the per-question null odds
    (``na_probs``), best_exact/best_f1 with the thresholds that reach them.

    As in the official script, a question whose null odds exceed ``na_prob_thresh`` counts as
    answered "no answer"; the references' empty-after-normalisation answers count as no answer.
    Every question needs a prediction (the official script fails otherwise). `reproducible`:
    best thresholds that score best_exact / best_f1 when applied (`best_threshold`)."""
    golds = squad_golds(references)
    missing = [q for q in golds if q not in predictions]
    if missing:
        raise MetricError(f"{len(missing)} of {len(golds)} questions have no prediction (first: "
                          f"{missing[0]!r}); SQuAD 2.0 scores every question")
    has_ans = {q: bool(a) for q, a in golds.items()}
    explicit_odds = na_probs is not None
    if na_probs is None:
        na_probs = {k: 0.0 for k in predictions}
    else:
        lacking = [q for q in golds if q not in na_probs]
        if lacking:
            raise MetricError(f"{len(lacking)} questions have no null odds (first: {lacking[0]!r})")
    exact_raw, f1_raw = {}, {}
    for qid, answers in golds.items():
        gold = [a for a in answers if normalize_answer(a)] or [""]
        pred = predictions[qid]
        exact_raw[qid] = max(squad_exact(a, pred) for a in gold)
        f1_raw[qid] = max(squad_token_f1(a, pred) for a in gold)

    def thresholded(scores: dict) -> dict:
        return {q: float(not has_ans[q]) if na_probs[q] > na_prob_thresh else s for q, s in scores.items()}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)

    def summary(qids: list[str]) -> dict:
        return {"exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
                "f1": 100.0 * sum(f1[q] for q in qids) / len(qids), "total": len(qids)}

    out = summary(list(exact))
    for prefix, qids in (("HasAns", [q for q in golds if has_ans[q]]), ("NoAns", [q for q in golds if not has_ans[q]])):
        if qids:
            out.update({f"{prefix}_{k}": v for k, v in summary(qids).items()})
    if explicit_odds:
        out["best_exact"], out["best_exact_thresh"] = best_threshold(predictions, exact_raw, na_probs, has_ans,
                                                                     reproducible)
        out["best_f1"], out["best_f1_thresh"] = best_threshold(predictions, f1_raw, na_probs, has_ans, reproducible)
    return out


def best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float], na_probs: Mapping[str, float],
                   has_ans: Mapping[str, bool], reproducible: bool = False) -> tuple[float, float]:
    """The official find_best_thresh: sweep questions by increasing null odds, answering "no
    answer" above the threshold; return (best score in 0-100, its threshold).

    `reproducible`: the threshold, applied again (answer "" where the odds exceed it), scores
    exactly the best score returned. The official sweep is kept but for two cases: questions
    with equal odds are scored together (one threshold cannot split them), and when "no answer"
    everywhere is best the threshold lies below the smallest odds (the official 0.0 suits
    probabilities, not logit differences, where it answers every question with negative odds)."""
    cur = best = sum(1 for q in has_ans if not has_ans[q])
    order = [q for q in sorted(na_probs, key=lambda k: na_probs[k]) if q in scores]
    low = na_probs[order[0]] if order else 0.0
    thresh = low - max(1.0, abs(low)) if reproducible and order else 0.0
    for i, qid in enumerate(order):
        cur += scores[qid] if has_ans[qid] else -1 if predictions[qid] else 0
        tied = reproducible and i + 1 < len(order) and na_probs[order[i + 1]] == na_probs[qid]
        if cur > best and not tied:
            best, thresh = cur, na_probs[qid]
    return 100.0 * best / len(scores), thresh


# ---- scoring prediction files against reference files (`bertkit score`) -------------------------
def read_predictions(path: str | Path) -> tuple[dict[str, Any], dict[str, float]]:
    """({id: prediction}, {id: null odds}) from JSONL lines ``{"id", "prediction"}`` (optionally
    ``"null_odds"``, SQuAD 2.0), a JSON array of such objects (``"prediction_text"`` and
    ``"no_answer_probability"`` accepted, as Hugging Face's squad metrics name them), or the
    official SQuAD ``{id: answer}`` JSON object."""
    path = Path(path)
    if not path.is_file():
        raise MetricError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise MetricError(f"{path}: not valid UTF-8 (byte {e.start})") from None
    if not text.strip():
        raise MetricError(f"{path}: empty file, no predictions")
    try:
        whole = json.loads(text)
    except (json.JSONDecodeError, RecursionError):       # (too deep as a whole: each line says so)
        whole = None
    if isinstance(whole, dict) and "id" not in whole:
        bad = next((k for k, v in whole.items() if not isinstance(v, str)), None)
        if bad is not None:
            raise MetricError(f"{path}: a JSON object must map question ids to answer strings "
                              f"(the official SQuAD format); {bad!r} maps to {type(whole[bad]).__name__}")
        return dict(whole), {}
    if isinstance(whole, list):           # a JSON array of the same objects (Hugging Face `evaluate` style)
        records = [(f"{path}: item {n}", obj) for n, obj in enumerate(whole)]
    else:
        def bad(lineno: int, message: str):
            raise MetricError(f"{path}:{lineno}: {message}; expected one {{\"id\": .., \"prediction\": ..}} "
                              "object per line")
        records = [(f"{path}:{n}", obj) for n, obj in jsonl_objects(text.splitlines(), path, bad)]
    preds: dict[str, Any] = {}
    odds: dict[str, float] = {}
    for where, obj in records:
        if isinstance(obj, dict) and "prediction" not in obj and "prediction_text" in obj:
            obj = {**obj, "prediction": obj["prediction_text"]}
        if not isinstance(obj, dict) or "id" not in obj or "prediction" not in obj:
            raise MetricError(f"{where}: expected an object with \"id\" and \"prediction\"")
        if isinstance(obj["id"], (dict, list)) or obj["id"] is None:
            raise MetricError(f"{where}: \"id\" must be a string or a number")
        qid = str(obj["id"])
        if qid in preds:
            raise MetricError(f"{where}: id {qid!r} predicted twice")
        preds[qid] = obj["prediction"]
        for key in ("null_odds", "no_answer_probability"):
            if obj.get(key) is not None:
                odds[qid] = _number(obj[key], f"{where}: {key}")
    if not preds:
        raise MetricError(f"{path}: no predictions")
    return preds, odds


def read_null_odds(path: str | Path) -> dict[str, float]:
    """{question id: null odds} from evaluate-v2.0.py's --na-prob-file (a JSON object)."""
    path = Path(path)
    if not path.is_file():
        raise MetricError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    odds = read_json_object(path, MetricError)
    return {str(k): _number(v, f"{path}: id {k}") for k, v in odds.items()}


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise MetricError(f"{where}: {value!r} is not a number")
    try:
        x = float(value)
    except ValueError:
        raise MetricError(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(x):
        raise MetricError(f"{where}: {value!r} is not a finite number")
    return x


def _as_label(value: Any, known: set, where: str) -> str:
    """A class prediction as the references spell it: 1, 1.0 and "1" are all "1"."""
    if isinstance(value, bool) or isinstance(value, (dict, list)) or value is None:
        raise MetricError(f"{where}: {value!r} is not a label")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    label = str(value).strip()
    if label not in known:
        raise MetricError(f"{where}: {value!r} is not one of the references' labels ({', '.join(sorted(known))})")
    return label


def _normalise(task, preds: dict[str, Any], examples: list, path) -> dict[str, Any]:
    """Check each prediction's type against the task and convert it to what `task.metrics` takes."""
    out: dict[str, Any] = {}
    by_id = {ex.id: ex for ex in examples}
    known = {str(ex.label) for ex in examples if getattr(ex, "label", None) is not None}
    for qid, value in preds.items():
        where = f"{path}: id {qid}"
        if task.head == "question_answering":
            if not isinstance(value, str):
                raise MetricError(f"{where}: the prediction must be an answer string, not {value!r}")
            out[qid] = value
        elif task.head == "multiple_choice":
            k = _number(value, where)
            n = len(by_id[qid].endings) if qid in by_id else 4
            if not k.is_integer() or not 0 <= k < n:
                raise MetricError(f"{where}: {value!r} is not a choice index 0..{n - 1}")
            out[qid] = int(k)
        elif task.head == "token_classification":
            tags = value.split() if isinstance(value, str) else value
            if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                raise MetricError(f"{where}: the prediction must be a list of tags (or one string of them)")
            if qid in by_id and len(tags) != len(by_id[qid].words):
                raise MetricError(f"{where}: {len(tags)} predicted tags for a sentence of {len(by_id[qid].words)} words")
            out[qid] = tags
        elif task.problem == "regression":
            out[qid] = _number(value, where)
        else:
            out[qid] = _as_label(value, known, where)
    return out


def _reference_of(task, example) -> Any:
    if task.head == "token_classification":
        return getattr(example, "tags", None)
    if task.head == "question_answering":
        return True                              # v2.0 questions may have no answer on purpose
    return getattr(example, "label", None)


@dataclass
class ScoreOptions(SkipBadRows, Checked):
    """How `score_files` scores (the flags of `bertkit score`: `cliconfig.add_options`)."""
    na_prob_thresh: Annotated[float, Rule("a finite number", math.isfinite)] = 1.0
    """SQuAD 2.0: answer 'no answer' where the null odds exceed this (as evaluate-v2.0.py)."""


def score_files(task_name: str, predictions: str | Path, references: str | Path, null_odds: str | Path | None = None,
                options: ScoreOptions | None = None) -> dict[str, Any]:
    """The official metrics of `task_name` for a predictions file against a reference file read
    as distributed (GLUE TSV, CoNLL columns, SQuAD JSON, SWAG CSV). Ids: the references' id
    column, else the 0-based data row (CoNLL: sentence) index."""
    o = options or ScoreOptions()
    task = get_task(task_name)
    bad = BadRows(skip=o.skip_bad_rows)
    examples = task.read(references, bad)
    unlabelled = next((ex for ex in examples if _reference_of(task, ex) is None), None)
    if unlabelled is not None:
        raise MetricError(f"{getattr(unlabelled, 'where', None) or references}: no reference label to score "
                          f"against (a test file?)")
    preds, odds = read_predictions(predictions)
    ids = [ex.id for ex in examples]
    known = set(ids)
    if set(preds) != known and set(preds) == {str(i) for i in range(len(ids))} and not bad.count:
        # ids given as row numbers where the file has an id column (e.g. STS-B's "index"): the
        # predictions cover exactly the row numbers and not the ids, so there is no ambiguity
        log.warning("%s: prediction ids are row numbers, not the %s id column; matching by row", predictions,
                    references)
        preds = {ids[int(k)]: v for k, v in preds.items()}
        odds = {ids[int(k)]: v for k, v in odds.items()}
    extra = [k for k in preds if k not in known]
    if extra:
        log.warning("%s: %d predictions have ids not in %s (first: %r); they are ignored",
                    predictions, len(extra), references, extra[0])
        preds = {k: v for k, v in preds.items() if k in known}
    if not preds:
        raise MetricError(f"{predictions}: no prediction id matches an id of {references}")
    missing = [k for k in ids if k not in preds]
    if missing and task.name != "squad":
        raise MetricError(f"{predictions}: no prediction for {len(missing)} of {len(ids)} examples "
                          f"(first id {missing[0]!r})")
    preds = _normalise(task, preds, examples, predictions)
    if null_odds is not None:
        odds.update(read_null_odds(null_odds))
    if missing:                           # (squad: any other task has raised above)
        log.warning("%d of %d questions have no prediction and score 0 (as in evaluate-v1.1.py)",
                    len(missing), len(ids))
    if task.name == "squad2":
        result = squad_v2({ex.id: [t for t, _ in ex.answers] for ex in examples}, preds, odds or None, o.na_prob_thresh)
    else:
        result = task.metrics(preds, examples)
    if bad.count:
        result["skipped_rows"] = bad.count
    return result


__all__ = ["MetricError", "accuracy", "f1_binary", "matthews_corrcoef", "pearson_spearman", "get_entities",
           "conll_f1", "normalize_answer", "squad_exact", "squad_token_f1", "squad_golds", "squad_v1",
           "squad_v2", "best_threshold", "read_predictions", "read_null_odds", "score_files"]
