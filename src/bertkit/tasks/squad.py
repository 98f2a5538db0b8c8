"""SQuAD v1.1 and v2.0 extractive question answering, as google-research/bert's run_squad.py does it.

  read         the official JSON ({"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]});
               every answer's text must sit in the context at its answer_start
  featurize    [CLS] question [SEP] context-window [SEP]: the question cut to max_query_length (64)
               word pieces, the context cut into windows that fill max_length (384) and start
               doc_stride (128) pieces apart; training targets are the first and last piece of the
               first answer, or [CLS] (position 0) when the window does not hold the whole answer
               or the question has none (v2.0)
  postprocess  per window the n_best (20) start and end logits; spans inside the context, not
               inverted, at most max_answer_length (30) pieces, whose start piece has its maximal
               context in that window; score = start + end logit; the answer is the context's
               original characters from the start of the first piece's word to the end of the last
               piece's word (words as BERT's basic tokenizer splits them: whitespace and every
               punctuation mark), so an answer never starts or ends inside a word. run_squad.py
               maps pieces to whitespace words and back with get_final_text, which keeps a span
               that starts on a "##" piece mid-word ("lesale, retail"); the tokenizer's character
               offsets make that alignment exact here. v2.0: null score = the minimum over
               windows of start[CLS] + end[CLS]; null odds = null score - best non-null score;
               the answer is "" when the odds exceed `null_threshold` (0 by default). Fine-tuning
               saves the threshold that maximises F1 on dev (and scores it when applied) with the
               model (config.json `bertkit_null_threshold`), and evaluate / predict / serve apply it
  metrics      the official evaluate-v1.1.py / evaluate-v2.0.py (`bertkit.tasks.metrics`)

`stride` here is run_squad.py's doc_stride, the step between window starts (Hugging Face's
run_qa.py passes the same number as an *overlap*; the two agree only when the window is 256).
A doc stride as long as the window (e.g. the default 128 with --max-length 128) would leave no
overlap, so such windows start half a window apart instead (with a warning).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import BertkitError
from ..sources import parse_json
from . import BadRows, DataError, Task, open_text, require_examples
from .metrics import squad_v1, squad_v2

log = logging.getLogger("bertkit")

MAX_QUERY_LENGTH = 64
N_BEST = 20
MAX_ANSWER_LENGTH = 30


@dataclass
class QAExample:
    """One question on one context; `answers` are (text, answer_start) pairs, empty when impossible."""
    id: str
    question: str
    context: str
    answers: list[tuple[str, int]] = field(default_factory=list)
    is_impossible: bool = False
    title: str = ""
    where: str | None = None

    @property
    def label(self):            # no class label (`check_labels` looks for one)
        return None


class QAPredictions(dict):
    """{question id: answer text}, plus what v2.0 needs: `null_odds` {id: null score - best
    non-null score} and `nbest` {id: [(text, score), ...]} (best first)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.null_odds: dict[str, float] = {}
        self.nbest: dict[str, list[tuple[str, float]]] = {}


# ---- reading -------------------------------------------------------------------------------------
def read_squad(path: str | Path, bad: BadRows | None = None, version: int = 1) -> list[QAExample]:
    """Questions of a SQuAD JSON file. v1 questions need at least one answer; v2 questions may
    have none (``is_impossible``). Problems name the question id and go to `bad`."""
    bad = bad or BadRows()
    with open_text(path) as f:
        text = f.read()
    if not text.strip():
        raise DataError(f"{path}: empty file")
    doc = parse_json(text, path)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise DataError(f"{path}: not a SQuAD file (no \"data\" list of articles)")
    examples: list[QAExample] = []
    seen: set[str] = set()
    for a, article in enumerate(data):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            bad(path, f"article {a}", "missing \"paragraphs\" list")
            continue
        title = str(article.get("title", ""))
        for p, para in enumerate(paragraphs):
            context = para.get("context") if isinstance(para, dict) else None
            qas = para.get("qas") if isinstance(para, dict) else None
            if not isinstance(context, str) or not isinstance(qas, list):
                bad(path, f"article {a} ({title}) paragraph {p}", "needs a \"context\" string and a \"qas\" list")
                continue
            for q, qa in enumerate(qas):
                ex = _read_question(qa, context, title, version, bad, path,
                                    f"article {a} paragraph {p} question {q}", seen)
                if ex is not None:
                    examples.append(ex)
    return require_examples(examples, path, bad)


def _read_question(qa, context: str, title: str, version: int, bad: BadRows, path, where: str,
                   seen: set[str]) -> QAExample | None:
    """One question as an example; None when it goes to `bad`, as does an id already in `seen` (then added)."""
    if not isinstance(qa, dict) or not isinstance(qa.get("id"), (str, int)):
        bad(path, where, "question without an \"id\"")
        return None
    qid = str(qa["id"])
    loc = f"question id {qid}"
    question = qa.get("question")
    if not isinstance(question, str) or not question.strip():
        bad(path, loc, "missing or empty \"question\"")
        return None
    raw = qa.get("answers")
    if not isinstance(raw, list):
        bad(path, loc, "missing \"answers\" list")
        return None
    impossible = bool(qa.get("is_impossible", False)) or not raw
    if impossible and version == 1:
        bad(path, loc, "no answers (SQuAD v1.1 questions all have one; use --task squad2 for v2.0 data)")
        return None
    answers = []
    for ans in ([] if qa.get("is_impossible") else raw):
        if not isinstance(ans, dict) or not isinstance(ans.get("text"), str) or not isinstance(ans.get("answer_start"), int):
            bad(path, loc, "an answer needs \"text\" (string) and \"answer_start\" (integer)")
            return None
        t, s = ans["text"], ans["answer_start"]
        if s < 0 or context[s:s + len(t)] != t:
            found = context.find(t)
            hint = f"; the text occurs at {found}" if found >= 0 else "; the text is not in the context"
            bad(path, loc, f"answer {t!r} does not match the context at answer_start {s} "
                           f"(context there: {context[max(s, 0):max(s, 0) + len(t)]!r}{hint})")
            return None
        answers.append((t, s))
    if qid in seen:
        bad(path, loc, "id repeated")
        return None
    seen.add(qid)
    return QAExample(qid, question, context, answers, impossible, title, f"{path}: {loc}")


def parse_question(obj: dict, where: str) -> QAExample:
    """A `bertkit predict` line: {"question": .., "context": ..}, optional "id"."""
    q, c = obj.get("question"), obj.get("context")
    if not isinstance(q, str) or not q.strip() or not isinstance(c, str) or not c.strip():
        raise DataError(f"{where}: needs non-empty \"question\" and \"context\" strings")
    return QAExample(str(obj.get("id", "")), q, c, [], False, "", where)


# ---- features ------------------------------------------------------------------------------------
def doc_spans(n: int, room: int, doc_stride: int) -> list[tuple[int, int]]:
    """run_squad.py's windows: (start, length) of at most `room` pieces, starts `doc_stride` apart."""
    spans, start = [], 0
    while start < n:
        length = min(n - start, room)
        spans.append((start, length))
        if start + length == n:
            break
        start += min(length, doc_stride)
    return spans or [(0, 0)]


def max_context(spans: Sequence[tuple[int, int]], span_index: int, position: int) -> bool:
    """Whether window `span_index` gives piece `position` its most context (run_squad's
    _check_is_max_context: min(left, right) + 0.01 * window length; the first window wins ties)."""
    best_score, best = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best = score, i
    return best == span_index


def char_span_to_pieces(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """First and last piece overlapping characters [start, end) of the context."""
    first = next((i for i, (s, e) in enumerate(offsets) if e > start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < end), None)
    if first is None or last is None or last < first:
        return None
    return first, last


def featurize_qa(examples: Sequence[QAExample], tokenizer, labels=None, max_length: int = 384,
                 stride: int | None = 128, train: bool = False, max_query_length: int = MAX_QUERY_LENGTH) -> list[dict]:
    """Windows of [CLS] question [SEP] context [SEP] with start/end targets (see the module doc)."""
    doc_stride = stride if stride is not None else 128
    questions = tokenizer.backend.encode_batch([ex.question for ex in examples], add_special_tokens=False)
    unique = list(dict.fromkeys(ex.context for ex in examples))    # contexts repeat across questions
    contexts = {c: (enc, piece_words(enc))
                for c, enc in zip(unique, tokenizer.backend.encode_batch(unique, add_special_tokens=False))}
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    feats, no_target, narrowed, q_cut, q_tokens = [], 0, 0, 0, 0
    for i, ex in enumerate(examples):
        q_ids = questions[i].ids[:max_query_length]
        if len(questions[i].ids) > max_query_length:
            q_cut += 1
            q_tokens += len(questions[i].ids) - max_query_length
        enc, words = contexts[ex.context]
        doc_ids, offsets = enc.ids, [tuple(o) for o in enc.offsets]
        room = max_length - len(q_ids) - 3
        if room < 1:
            raise DataError(f"max_length {max_length} leaves no room for the context after a "
                            f"{len(q_ids)}-piece question")
        piece_span = None
        if ex.answers:
            text, start = ex.answers[0]
            piece_span = char_span_to_pieces(offsets, start, start + len(text))
            if piece_span is None:
                no_target += 1
        step = doc_stride
        if step >= room:        # windows would not overlap: an answer across a boundary is lost
            step = max(room // 2, 1)
            narrowed += 1
        spans = doc_spans(len(doc_ids), room, step)
        for k, (s, length) in enumerate(spans):
            ids = [cls, *q_ids, sep, *doc_ids[s:s + length], sep]
            types = [0] * (len(q_ids) + 2) + [1] * (length + 1)
            first = len(q_ids) + 2                                   # input position of piece s
            feat = {"input_ids": ids, "token_type_ids": types, "example_index": i,
                    "context_start": first, "doc_start": s,
                    "offsets": offsets[s:s + length], "word_offsets": words[s:s + length],
                    "max_context": [max_context(spans, k, s + j) for j in range(length)]}
            if ex.answers or ex.is_impossible:
                sp, ep = 0, 0                                        # [CLS]: no answer in this window
                if piece_span is not None and s <= piece_span[0] and piece_span[1] <= s + length - 1:
                    sp, ep = piece_span[0] - s + first, piece_span[1] - s + first
                feat["start_positions"], feat["end_positions"] = sp, ep
            feats.append(feat)
    if narrowed:
        log.warning("doc stride %d is not shorter than the context room of %d questions at max_length %d; "
                    "their windows start half a window apart instead (so they overlap)", doc_stride, narrowed,
                    max_length)
    if no_target:
        log.warning("%d answers cover no word piece of their context; they train towards [CLS]", no_target)
    if q_cut:
        log.warning("cut %d of %d questions to their first %d word pieces (%d pieces cut)", q_cut, len(examples),
                    max_query_length, q_tokens)
    tokenizer.stats.add(len(examples), q_cut, q_tokens)
    return feats


def piece_words(enc) -> list[tuple[int, int]]:
    """Per word piece of an encoded text, the character span of the whole word it belongs to."""
    spans: dict[int, list[int]] = {}
    for w, (s, e) in zip(enc.word_ids, enc.offsets):
        span = spans.setdefault(w, [s, e])
        span[0], span[1] = min(span[0], s), max(span[1], e)
    return [tuple(spans[w]) for w in enc.word_ids]


# ---- post-processing -----------------------------------------------------------------------------
def _best_indexes(logits: np.ndarray, n: int) -> list[int]:
    return np.argsort(-np.asarray(logits), kind="stable")[:n].tolist()


def postprocess_qa(outputs: Sequence, features: Sequence[dict], examples: Sequence[QAExample], labels=None,
                   n_best: int = N_BEST, max_answer_length: int = MAX_ANSWER_LENGTH, version: int = 1,
                   null_threshold: float = 0.0) -> QAPredictions:
    """{id: answer} from (start, end) logits per window, with run_squad.py's rules (module doc)."""
    by_example: dict[int, list[int]] = {}
    for j, f in enumerate(features):
        by_example.setdefault(f["example_index"], []).append(j)
    preds = QAPredictions()
    for i, ex in enumerate(examples):
        prelim = []                                # (score, start logit, end logit, char start, char end)
        null = None                                # (score, start logit, end logit), v2.0
        for j in by_example.get(i, []):
            f, (start, end) = features[j], outputs[j]
            start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
            if version == 2 and (null is None or start[0] + end[0] < null[0]):
                null = (start[0] + end[0], start[0], end[0])
            first, n_ctx = f["context_start"], len(f["offsets"])
            for s in _best_indexes(start, n_best):
                cs = s - first                     # piece index inside the window's context
                if cs < 0 or cs >= n_ctx or not f["max_context"][cs]:
                    continue
                for e in _best_indexes(end, n_best):
                    ce = e - first
                    if ce < 0 or ce >= n_ctx or e < s or e - s + 1 > max_answer_length:
                        continue
                    prelim.append((start[s] + end[e], start[s], end[e], f["word_offsets"][cs][0],
                                   f["word_offsets"][ce][1]))
        if null is not None:
            prelim.append((null[0], null[1], null[2], -1, -1))
        prelim.sort(key=lambda p: p[0], reverse=True)             # stable, as run_squad's sorted()
        nbest, seen = [], set()
        for score, _, _, cs, ce in prelim:
            if len(nbest) >= n_best:
                break
            text = ex.context[cs:ce] if cs >= 0 else ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append((text, float(score)))
        if null is not None and "" not in seen:
            nbest.append(("", float(null[0])))
        if not nbest:
            nbest.append(("empty", 0.0))
        preds.nbest[ex.id] = nbest
        if version == 1:
            preds[ex.id] = nbest[0][0]
            continue
        best = next((e for e in nbest if e[0]), None)
        if best is None:        # no non-null span anywhere (e.g. a window with no context): certainly no answer
            odds = (float(null[0]) if null is not None else 0.0) + 1e4
        else:
            odds = float(null[0]) - best[1]
        preds.null_odds[ex.id] = odds
        preds[ex.id] = "" if best is None or odds > null_threshold else best[0]
    return preds


def apply_null_threshold(preds: QAPredictions, threshold: float) -> QAPredictions:
    """v2.0 answers again with another null threshold (e.g. best_f1_thresh tuned on dev)."""
    out = QAPredictions()
    out.null_odds, out.nbest = dict(preds.null_odds), dict(preds.nbest)
    for qid in preds:
        best = next((t for t, _ in preds.nbest.get(qid, []) if t), "")
        out[qid] = "" if preds.null_odds.get(qid, 0.0) > threshold else best
    return out


def write_predictions(preds: QAPredictions, out_dir: str | Path) -> list[Path]:
    """predictions.json ({id: answer}, the official format), nbest_predictions.json and, for
    v2.0, null_odds.json (the evaluation script's --na-prob-file)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "predictions.json", out_dir / "nbest_predictions.json"]
    written[0].write_text(json.dumps(dict(preds), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    written[1].write_text(json.dumps({q: [{"text": t, "score": s} for t, s in v] for q, v in preds.nbest.items()},
                                     indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if preds.null_odds:
        written.append(out_dir / "null_odds.json")
        written[2].write_text(json.dumps(preds.null_odds, indent=1) + "\n", encoding="utf-8")
    return written


# ---- metrics and the task entries ----------------------------------------------------------------
def references(examples: Sequence[QAExample]) -> dict[str, list[str]]:
    return {ex.id: [t for t, _ in ex.answers] for ex in examples}


def metrics_v1(predictions: dict, examples: Sequence[QAExample]) -> dict:
    return squad_v1(references(examples), predictions)


def metrics_v2(predictions: dict, examples: Sequence[QAExample]) -> dict:
    """evaluate-v2.0.py on the answers as given; best_exact / best_f1 and their thresholds over
    every question answered by its best non-null span (the official sweep on answers already cut
    at threshold 0 cannot find a threshold above 0), chosen so that `apply_null_threshold` (and
    evaluate, predict, serve) with a threshold scores exactly its best_* (`metrics.best_threshold`:
    when "no answer" everywhere is best, a threshold below every null odds, not 0). The answers
    are scored as given: not cut again at the official script's default of 1.0 (a probability,
    not a logit difference), which would hide every threshold above 1.0."""
    odds = getattr(predictions, "null_odds", None) or None
    out = squad_v2(references(examples), predictions, odds, na_prob_thresh=float("inf"))
    if odds and getattr(predictions, "nbest", None):
        every = squad_v2(references(examples), apply_null_threshold(predictions, float("inf")), odds,
                         reproducible=True)
        out.update({k: every[k] for k in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")})
    return out


def qa_settings(raw: dict) -> dict:
    """How a fine-tuned QA checkpoint reads inputs and answers, from its config.json: SQuAD
    version, max_length, doc stride and the v2.0 null threshold tuned on dev (defaults otherwise)."""
    task = raw.get("bertkit_task")
    out = {"version": 2 if isinstance(task, dict) and task.get("name") == "squad2" else 1,
           "max_length": raw.get("bertkit_max_length", 384), "doc_stride": raw.get("bertkit_stride", 128),
           "null_threshold": raw.get("bertkit_null_threshold", 0.0)}
    for key, name in (("max_length", "bertkit_max_length"), ("doc_stride", "bertkit_stride")):
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BertkitError(f"config.json: {name} must be a positive integer, got {v!r}")
    t = out["null_threshold"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t != t or abs(t) == float("inf"):
        raise BertkitError(f"config.json: bertkit_null_threshold must be a finite number, got {t!r}")
    out["null_threshold"] = float(t)
    return out


def _task(version: int) -> Task:
    return Task(
        name="squad" if version == 1 else "squad2", head="question_answering",
        description=("SQuAD v1.1 extractive QA (EM, F1)" if version == 1 else
                     "SQuAD v2.0 extractive QA with unanswerable questions (EM, F1, HasAns/NoAns, best threshold)"),
        read=lambda path, bad=None: read_squad(path, bad, version),
        featurize=featurize_qa,
        postprocess=lambda outputs, features, examples, labels=None, **kw: postprocess_qa(
            outputs, features, examples, labels, version=version, **kw),
        metrics=metrics_v1 if version == 1 else metrics_v2,
        main_metric="f1" if version == 1 else "best_f1", parse=parse_question,
        files={"train": "train.json", "dev": "dev.json"} if version == 1 else
              {"train": "train-v2.0.json", "dev": "dev-v2.0.json"},
        max_length=384, stride=128)


SQUAD_V1 = _task(1)
SQUAD_V2 = _task(2)
