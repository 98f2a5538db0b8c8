"""SQuAD v1.1/v2.0: reading (and its errors), doc-stride windows, targets and run_squad.py's
post-processing, on real questions of the shared SQuAD slice."""
from __future__ import annotations

import copy
import gzip
import json
import random
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.tasks import BadRows, DataError, collate, get_task
from bertkit.tasks import squad as S
from bertkit.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).parent))
from test_metrics import v20_evaluate  # noqa: E402  (evaluate-v2.0.py's logic)


@pytest.fixture(scope="module")
def dev_json(shared_data) -> dict:
    return json.loads(gzip.open(shared_data / "squad" / "dev.json.gz", "rt", encoding="utf-8").read())


@pytest.fixture(scope="module")
def tokenizer(minilm) -> Tokenizer:
    return Tokenizer.from_dir(minilm)


@pytest.fixture(scope="module")
def examples(shared_data):
    return get_task("squad").read(shared_data / "squad" / "dev.json.gz")


def write(tmp_path, doc, name="d.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc), encoding="utf-8")
    return p


def oracle_outputs(features, boost=10.0):
    """Logits that point at each window's training target (CLS when the answer is elsewhere)."""
    outs = []
    for f in features:
        T = len(f["input_ids"])
        start, end = np.zeros(T), np.zeros(T)
        start[f["start_positions"]] += boost
        end[f["end_positions"]] += boost
        outs.append((start, end))
    return outs


# ---- reading -------------------------------------------------------------------------------------
def test_read_real_slice(examples, dev_json):
    qas = [q for a in dev_json["data"] for p in a["paragraphs"] for q in p["qas"]]
    assert len(examples) == len(qas) == 1047
    ex = examples[0]
    assert ex.id == qas[0]["id"] and ex.question == qas[0]["question"]
    assert ex.answers[0] == (qas[0]["answers"][0]["text"], qas[0]["answers"][0]["answer_start"])
    assert all(e.context[s:s + len(t)] == t for e in examples for t, s in e.answers)


def test_answer_not_at_its_offset_names_the_question(tmp_path, dev_json):
    doc = copy.deepcopy(dev_json)
    qa = doc["data"][0]["paragraphs"][0]["qas"][1]
    qa["answers"][0]["answer_start"] += 3
    path = write(tmp_path, doc)
    with pytest.raises(DataError, match=rf"question id {qa['id']}: answer .* does not match the context at "
                                        rf"answer_start .*the text occurs at"):
        S.read_squad(path)
    bad = BadRows(skip=True)
    kept = S.read_squad(path, bad)
    assert bad.count == 1 and len(kept) == 1046 and qa["id"] not in {e.id for e in kept}


@pytest.mark.parametrize("mutate,message", [
    (lambda qa: qa.pop("id"), "question without an \"id\""),
    (lambda qa: qa.pop("question"), "missing or empty \"question\""),
    (lambda qa: qa.pop("answers"), "missing \"answers\" list"),
    (lambda qa: qa["answers"][0].pop("answer_start"), "needs \"text\" .* and \"answer_start\""),
    (lambda qa: qa.update(answers=[]), "no answers .*squad2"),
])
def test_missing_fields_are_clear_errors(tmp_path, mutate, message):
    doc = {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "q1", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}]}]}]}]}
    mutate(doc["data"][0]["paragraphs"][0]["qas"][0])
    with pytest.raises(DataError, match=message):
        S.read_squad(write(tmp_path, doc))


def test_empty_and_non_squad_files(tmp_path):
    (tmp_path / "e.json").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="empty file"):
        S.read_squad(tmp_path / "e.json")
    with pytest.raises(DataError, match="no \"data\" list"):
        S.read_squad(write(tmp_path, [1, 2]))
    with pytest.raises(DataError, match="no examples"):
        S.read_squad(write(tmp_path, {"data": []}))


def test_v2_reads_impossible_questions(tmp_path):
    doc = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "a", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}],
         "is_impossible": False},
        {"id": "b", "question": "Where is Rome?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "France", "answer_start": 12}]}]}]}]}
    ex = get_task("squad2").read(write(tmp_path, doc))
    assert [e.is_impossible for e in ex] == [False, True] and ex[1].answers == []


# ---- windows and targets -------------------------------------------------------------------------
def google_doc_spans(n, max_tokens_for_doc, doc_stride):
    """run_squad.py's loop, copied."""
    doc_spans, start_offset = [], 0
    while start_offset < n:
        length = n - start_offset
        if length > max_tokens_for_doc:
            length = max_tokens_for_doc
        doc_spans.append((start_offset, length))
        if start_offset + length == n:
            break
        start_offset += min(length, doc_stride)
    return doc_spans


@pytest.mark.parametrize("n,room,stride", [(10, 317, 128), (317, 317, 128), (318, 317, 128), (1000, 317, 128),
                                           (100, 20, 7), (100, 20, 40), (21, 20, 20)])
def test_doc_spans_equal_run_squad(n, room, stride):
    assert S.doc_spans(n, room, stride) == google_doc_spans(n, room, stride)


@pytest.mark.parametrize("max_length,stride", [(384, 128), (96, 24)])
def test_features_layout_and_targets(examples, tokenizer, max_length, stride):
    exs = examples[:120]
    feats = S.featurize_qa(exs, tokenizer, max_length=max_length, stride=stride, train=True)
    assert len({f["example_index"] for f in feats}) == len(exs)
    if max_length == 96:
        assert len(feats) > 2 * len(exs)                     # real windows
    by_ex: dict[int, list] = {}
    for f in feats:
        by_ex.setdefault(f["example_index"], []).append(f)
        ids, types, c0 = f["input_ids"], f["token_type_ids"], f["context_start"]
        ex = exs[f["example_index"]]
        q = tokenizer.encode_ids([ex.question])[0][:S.MAX_QUERY_LENGTH]
        assert len(ids) <= max_length and len(types) == len(ids)
        assert ids[:c0] == [tokenizer.cls_id, *q, tokenizer.sep_id] and ids[-1] == tokenizer.sep_id
        assert types == [0] * c0 + [1] * (len(ids) - c0)
        assert len(f["offsets"]) == len(ids) - c0 - 1 == len(f["max_context"])
        sp, ep = f["start_positions"], f["end_positions"]
        if sp:
            text, start = ex.answers[0]
            cs, ce = f["offsets"][sp - c0][0], f["offsets"][ep - c0][1]
            assert cs <= start < ce and cs < start + len(text) <= ce      # the pieces cover the answer
            assert ex.context[cs:ce].lower().startswith(ex.context[cs:start].lower())
    for i, fs in by_ex.items():
        starts = [f["doc_start"] for f in fs]
        assert starts == [k * stride for k in range(len(fs))]
        n_pieces = fs[-1]["doc_start"] + len(fs[-1]["offsets"])
        # each context piece has its maximal context in exactly one window
        owner = np.zeros(n_pieces, dtype=int)
        for f in fs:
            for j, m in enumerate(f["max_context"]):
                owner[f["doc_start"] + j] += m
        assert (owner == 1).all()
        # the answer is the target of at least one window when some window holds it whole
        assert any(f["start_positions"] > 0 for f in fs) or len(fs) > 1


def test_question_is_cut_to_max_query_length(tokenizer):
    ex = S.QAExample("q", "why " * 100 + "?", "Because it is so. " * 10, [("Because", 0)])
    f = S.featurize_qa([ex], tokenizer, max_length=128, stride=32, train=True)[0]
    assert f["context_start"] == S.MAX_QUERY_LENGTH + 2
    assert f["start_positions"] == f["end_positions"] == S.MAX_QUERY_LENGTH + 2


# ---- post-processing -----------------------------------------------------------------------------
@pytest.mark.parametrize("max_length,stride", [(384, 128), (96, 24)])
def test_oracle_logits_give_em_100(examples, tokenizer, max_length, stride):
    task = get_task("squad")
    exs = examples[:300]
    feats = task.featurize(exs, tokenizer, None, max_length=max_length, stride=stride, train=True)
    preds = task.postprocess(oracle_outputs(feats), feats, exs, None)
    scores = task.metrics(preds, exs)
    assert scores["exact_match"] == 100.0 and scores["f1"] == 100.0


def test_rules_inverted_long_outside_and_max_context(tokenizer):
    context = "Alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma."
    ex = S.QAExample("q", "Which letter?", context, [("gamma", 11)])
    f = S.featurize_qa([ex], tokenizer, max_length=64, stride=128)[0]
    T, c0 = len(f["input_ids"]), f["context_start"]
    piece = {t: i for i, t in enumerate(tokenizer.convert_ids_to_tokens(f["input_ids"]))}

    def run(start_at, end_at, n_best=20, max_answer_length=30):
        start, end = np.full(T, -5.0), np.full(T, -5.0)
        for pos, v in start_at.items():
            start[pos] = v
        for pos, v in end_at.items():
            end[pos] = v
        return S.postprocess_qa([(start, end)], [f], [ex], n_best=n_best, max_answer_length=max_answer_length)["q"]

    g, e = piece["gamma"], piece["epsilon"]
    assert run({g: 3}, {e: 3}) == "gamma delta epsilon"
    assert run({e: 9, g: 5}, {g: 9, e: 6}) == "epsilon"                  # (epsilon, gamma) is inverted: skipped
    assert run({0: 50, 1: 40, g: 3}, {0: 50, 1: 40, g: 3}) == "gamma"    # CLS / question never answer (v1)
    assert run({g: 3}, {e: 3}, max_answer_length=2) != "gamma delta epsilon"
    assert run({g: 3}, {T - 1: 9, e: 3}) == "gamma delta epsilon"        # final [SEP] is not context
    assert c0 <= g < e < T - 1


def test_v2_oracle_null_odds_and_threshold(tmp_path, dev_json, tokenizer):
    doc = copy.deepcopy(dev_json)
    doc["data"] = doc["data"][:1]
    k = 0
    for p in doc["data"][0]["paragraphs"][:12]:
        for qa in p["qas"]:
            qa["is_impossible"] = k % 3 == 0
            if qa["is_impossible"]:
                qa["plausible_answers"], qa["answers"] = qa["answers"], []
            k += 1
    doc["data"][0]["paragraphs"] = doc["data"][0]["paragraphs"][:12]
    task = get_task("squad2")
    exs = task.read(write(tmp_path, doc))
    feats = task.featurize(exs, tokenizer, None, max_length=96, stride=24, train=True)
    preds = task.postprocess(oracle_outputs(feats), feats, exs, None)
    impossible = {e.id for e in exs if e.is_impossible}
    assert 0 < len(impossible) < len(exs)
    assert all(preds[q] == "" for q in impossible)
    assert all(preds.null_odds[e.id] > 0 for e in exs if e.is_impossible)
    assert all(preds.null_odds[e.id] < 0 for e in exs if not e.is_impossible)
    scores = task.metrics(preds, exs)
    assert scores["exact"] == 100.0 and scores["HasAns_exact"] == 100.0 and scores["NoAns_f1"] == 100.0
    assert scores["best_f1"] == 100.0
    always = S.apply_null_threshold(preds, -1e9)                       # everything "no answer"
    assert set(always.values()) == {""}
    files = S.write_predictions(preds, tmp_path / "out")
    assert [p.name for p in files] == ["predictions.json", "nbest_predictions.json", "null_odds.json"]
    assert json.loads(files[2].read_text()) == pytest.approx(preds.null_odds)


def v2_case(seed: int, answer_share: float, ties: bool) -> tuple[list, S.QAPredictions]:
    """60 questions (1 in 3 impossible) and what postprocess_qa gives them at threshold 0: the
    best span is the gold answer with probability `answer_share` (else wrong words); the null
    odds are logit differences of both signs (`ties`: rounded to whole numbers, many equal)."""
    rng = random.Random(seed)
    exs, preds = [], S.QAPredictions()
    for i in range(60):
        qid, impossible = f"q{i}", i % 3 == 0
        exs.append(S.QAExample(qid, "?", "c", [] if impossible else [("gold words", 0)], impossible))
        span = "gold words" if not impossible and rng.random() < answer_share else "other text"
        odds = rng.uniform(-4, 4)
        odds = float(round(odds)) if ties else odds
        preds.nbest[qid], preds.null_odds[qid] = [(span, 2.0), ("", 2.0 + odds)], odds
        preds[qid] = "" if odds > 0 else span
    return exs, preds


def official(exs, preds, odds, thresh=1.0) -> dict:
    data = [{"paragraphs": [{"qas": [{"id": e.id, "answers": [{"text": t} for t, _ in e.answers]} for e in exs]}]}]
    return v20_evaluate(data, dict(preds), odds, na_prob_thresh=thresh)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("answer_share", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("ties", [False, True])
def test_v2_saved_threshold_scores_the_dev_selected_f1(seed, answer_share, ties):
    """The threshold fine-tuning saves (best_f1_thresh), applied again as evaluate applies it,
    gives best_f1 exactly; and the official evaluate-v2.0.py, given it, agrees."""
    exs, preds = v2_case(seed, answer_share, ties)
    dev = S.metrics_v2(preds, exs)
    every = S.apply_null_threshold(preds, float("inf"))
    ref = official(exs, every, preds.null_odds)
    for metric, key in (("f1", "best_f1"), ("exact", "best_exact")):
        thresh = dev[f"{key}_thresh"]
        again = S.metrics_v2(S.apply_null_threshold(preds, thresh), exs)
        assert again[metric] == pytest.approx(dev[key], abs=1e-9), (metric, thresh)
        assert official(exs, every, preds.null_odds, thresh)[metric] == pytest.approx(dev[key], abs=1e-9)
        if not ties:                  # the official sweep's best score, and its threshold unless all-null
            assert dev[key] == pytest.approx(ref[key], abs=1e-9)
            assert thresh == ref[f"{key}_thresh"] or dev[key] == ref["NoAns_total"] * 100 / len(exs)
        else:                         # the official sweep may split equal odds: it can only claim more
            assert dev[key] <= ref[key] + 1e-9
    if answer_share == 0.0:           # "no answer" everywhere is best: below every odds, not 0.0
        assert dev["best_f1"] == pytest.approx(100 / 3) and dev["best_f1_thresh"] < min(preds.null_odds.values())
        assert ref["best_f1_thresh"] == 0.0
        assert official(exs, every, preds.null_odds, 0.0)["f1"] < dev["best_f1"] - 5     # the old saved threshold


def test_v2_evaluate_with_the_saved_threshold_scores_best_f1(tmp_path, dev_json, tokenizer):
    """Windows of real questions and noisy logits (noise: "no answer" everywhere is the best exact
    match, as for an undertrained model; then nearly right ones): postprocess with the selected
    threshold, as `bertkit evaluate` does, scores what selection reported."""
    doc = copy.deepcopy(dev_json)
    doc["data"] = doc["data"][:1]
    doc["data"][0]["paragraphs"] = doc["data"][0]["paragraphs"][:8]
    for k, qa in enumerate(q for p in doc["data"][0]["paragraphs"] for q in p["qas"]):
        if k % 3 == 0:
            qa["is_impossible"], qa["plausible_answers"], qa["answers"] = True, qa["answers"], []
    task = get_task("squad2")
    exs = task.read(write(tmp_path, doc))
    feats = task.featurize(exs, tokenizer, None, max_length=96, stride=24, train=True)
    rng = np.random.default_rng(0)
    all_null = []
    for boost in (0.0, 6.0):
        outs = [(s + rng.normal(0, 2, len(s)), e + rng.normal(0, 2, len(e))) for s, e in oracle_outputs(feats, boost)]
        dev = task.metrics(task.postprocess(outs, feats, exs), exs)
        for metric, key in (("f1", "best_f1"), ("exact", "best_exact")):
            again = task.metrics(task.postprocess(outs, feats, exs, null_threshold=dev[f"{key}_thresh"]), exs)
            assert again[metric] == pytest.approx(dev[key], abs=1e-9), (boost, metric)
        all_null.append(again["NoAns_exact"] == 100.0 and again["HasAns_exact"] == 0.0 and
                        dev["best_exact_thresh"] < min(dev_odds(outs, feats, exs)))
    assert all_null == [True, False]                   # noise: "no answer" everywhere is best; then a mixed case


def dev_odds(outs, feats, exs) -> list[float]:
    return list(get_task("squad2").postprocess(outs, feats, exs).null_odds.values())


def test_qa_head_runs_on_collated_windows(examples, tokenizer):
    """Features collate into the model's keyword arguments; outputs go back through postprocess."""
    from bertkit.config import preset
    from bertkit.model import BertForQuestionAnswering

    torch.manual_seed(0)
    model = BertForQuestionAnswering(preset("tiny", vocab_size=tokenizer.vocab_size)).eval()
    exs = examples[:4]
    feats = S.featurize_qa(exs, tokenizer, max_length=128, stride=64, train=True)
    batch = collate(feats)
    (start, end), loss = model(**batch)
    assert start.shape == batch["input_ids"].shape and torch.isfinite(loss)
    lengths = batch["attention_mask"].sum(-1).tolist()
    outs = [(start[b, :n].detach().numpy(), end[b, :n].detach().numpy()) for b, n in enumerate(lengths)]
    preds = S.postprocess_qa(outs, feats, exs)
    assert set(preds) == {e.id for e in exs}
    assert all(p in e.context for p, e in zip(preds.values(), exs))


# ---- google-research/bert run_squad.py, copied for reference (TF plumbing aside) -----------------
def _is_whitespace(c):                                   # run_squad.py's, for doc_tokens
    return c in " \t\r\n" or ord(c) == 0x202F


def _bert_punct(ch):                                     # tokenization._is_punctuation
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _basic_tokenize(text):
    """tokenization.BasicTokenizer(do_lower_case=True).tokenize (enough of it for get_final_text)."""
    out = []
    for tok in text.split():
        tok = "".join(c for c in unicodedata.normalize("NFD", tok.lower()) if unicodedata.category(c) != "Mn")
        cur = ""
        for c in tok:
            if _bert_punct(c):
                out += [cur] if cur else []
                out.append(c)
                cur = ""
            else:
                cur += c
        out += [cur] if cur else []
    return out


def get_final_text(pred_text, orig_text):
    """run_squad.py's get_final_text (do_lower_case=True): project the normalised piece text
    back onto the original words by aligning the two strings without spaces."""
    def strip_spaces(text):
        ns_chars, ns_to_s = [], {}
        for i, c in enumerate(text):
            if c == " ":
                continue
            ns_to_s[len(ns_chars)] = i
            ns_chars.append(c)
        return "".join(ns_chars), ns_to_s

    tok_text = " ".join(_basic_tokenize(orig_text))
    start_position = tok_text.find(pred_text)
    if start_position == -1:
        return orig_text
    end_position = start_position + len(pred_text) - 1
    orig_ns_text, orig_ns_to_s_map = strip_spaces(orig_text)
    tok_ns_text, tok_ns_to_s_map = strip_spaces(tok_text)
    if len(orig_ns_text) != len(tok_ns_text):
        return orig_text
    tok_s_to_ns_map = {v: k for k, v in tok_ns_to_s_map.items()}
    orig_start = orig_ns_to_s_map.get(tok_s_to_ns_map.get(start_position))
    orig_end = orig_ns_to_s_map.get(tok_s_to_ns_map.get(end_position))
    if orig_start is None or orig_end is None:
        return orig_text
    return orig_text[orig_start:orig_end + 1]


def run_squad_text(example, feature, start_index, end_index, tokenizer):
    """run_squad.py's answer text: pieces -> whitespace doc words (token_to_orig_map) ->
    get_final_text."""
    doc_tokens, char_to_word, prev_ws = [], [], True
    for c in example.context:
        if _is_whitespace(c):
            prev_ws = True
        else:
            if prev_ws:
                doc_tokens.append(c)
            else:
                doc_tokens[-1] += c
            prev_ws = False
        char_to_word.append(len(doc_tokens) - 1)
    c0 = feature["context_start"]
    orig_start = char_to_word[feature["offsets"][start_index - c0][0]]
    orig_end = char_to_word[feature["offsets"][end_index - c0][1] - 1]
    tok_text = " ".join(tokenizer.convert_ids_to_tokens(feature["input_ids"][start_index:end_index + 1]))
    tok_text = " ".join(tok_text.replace(" ##", "").replace("##", "").strip().split())
    return get_final_text(tok_text, " ".join(doc_tokens[orig_start:orig_end + 1]))


def whole_words(context, start, end):
    """[start, end) widened to whole words: runs of characters that are neither whitespace nor
    punctuation (BERT's basic tokenizer's words; written here without the tokenizer)."""
    word = lambda c: not (c.isspace() or _bert_punct(c))
    while start > 0 and word(context[start]) and word(context[start - 1]):
        start -= 1
    while end < len(context) and word(context[end - 1]) and word(context[end]):
        end += 1
    return context[start:end]


def run_squad_write_predictions(examples, features, outputs, version, tokenizer, n_best_size=20,
                                max_answer_length=30, null_score_diff_threshold=0.0):
    """google-research/bert run_squad.py's write_predictions loop, copied; returns run_squad's
    answers, the null score diffs and, per answer, the piece span it came from (context chars)."""
    def _get_best_indexes(logits, n_best_size):
        index_and_score = sorted(enumerate(logits), key=lambda x: x[1], reverse=True)
        return [index_and_score[i][0] for i in range(min(n_best_size, len(index_and_score)))]

    by_ex = {}
    for j, f in enumerate(features):
        by_ex.setdefault(f["example_index"], []).append(j)
    all_predictions, scores_diff_json, spans = {}, {}, {}
    for example_index, example in enumerate(examples):
        feats = [features[j] for j in by_ex[example_index]]
        results = [outputs[j] for j in by_ex[example_index]]
        prelim_predictions = []
        score_null, min_null_feature_index, null_start_logit, null_end_logit = 1000000, 0, 0, 0
        for feature_index, (feature, (start_logits, end_logits)) in enumerate(zip(feats, results)):
            c0 = feature["context_start"]
            token_to_orig_map = {c0 + j: j for j in range(len(feature["offsets"]))}
            token_is_max_context = {c0 + j: m for j, m in enumerate(feature["max_context"])}
            start_indexes = _get_best_indexes(start_logits, n_best_size)
            end_indexes = _get_best_indexes(end_logits, n_best_size)
            if version == 2:
                feature_null_score = start_logits[0] + end_logits[0]
                if feature_null_score < score_null:
                    score_null, min_null_feature_index = feature_null_score, feature_index
                    null_start_logit, null_end_logit = start_logits[0], end_logits[0]
            for start_index in start_indexes:
                for end_index in end_indexes:
                    if start_index >= len(feature["input_ids"]) or end_index >= len(feature["input_ids"]):
                        continue
                    if start_index not in token_to_orig_map or end_index not in token_to_orig_map:
                        continue
                    if not token_is_max_context.get(start_index, False):
                        continue
                    if end_index < start_index or end_index - start_index + 1 > max_answer_length:
                        continue
                    prelim_predictions.append((feature_index, start_index, end_index,
                                               start_logits[start_index], end_logits[end_index]))
        if version == 2:
            prelim_predictions.append((min_null_feature_index, 0, 0, null_start_logit, null_end_logit))
        prelim_predictions = sorted(prelim_predictions, key=lambda x: (x[3] + x[4]), reverse=True)
        seen_predictions, nbest = {}, []
        for feature_index, start_index, end_index, start_logit, end_logit in prelim_predictions:
            if len(nbest) >= n_best_size:
                break
            feature = feats[feature_index]
            span = None
            if start_index > 0:
                final_text = run_squad_text(example, feature, start_index, end_index, tokenizer)
                if final_text in seen_predictions:
                    continue
                seen_predictions[final_text] = True
                c0 = feature["context_start"]
                span = (feature["offsets"][start_index - c0][0], feature["offsets"][end_index - c0][1])
            else:
                final_text = ""
                seen_predictions[final_text] = True
            nbest.append((final_text, start_logit, end_logit, span))
        if version == 2 and "" not in seen_predictions:
            nbest.append(("", null_start_logit, null_end_logit, None))
        if not nbest:
            nbest.append(("empty", 0.0, 0.0, None))
        best_non_null_entry = next((e for e in nbest if e[0]), None)
        if version == 1:
            all_predictions[example.id], spans[example.id] = nbest[0][0], nbest[0][3]
        elif best_non_null_entry is None:          # run_squad.py fails here; bertkit answers ""
            all_predictions[example.id] = None
        else:
            score_diff = score_null - best_non_null_entry[1] - best_non_null_entry[2]
            scores_diff_json[example.id] = score_diff
            answer = score_diff <= null_score_diff_threshold
            all_predictions[example.id] = best_non_null_entry[0] if answer else ""
            spans[example.id] = best_non_null_entry[3] if answer else None
    return all_predictions, scores_diff_json, spans


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_postprocess_equals_run_squad_on_random_logits(examples, tokenizer, version, seed):
    """The same spans as run_squad.py's write_predictions; the answer is that span widened to whole
    words, which is run_squad's own answer whenever the span does not start or end mid-word."""
    rng = np.random.default_rng(seed)
    exs = examples[200:260]
    by_id = {e.id: e for e in exs}
    feats = S.featurize_qa(exs, tokenizer, max_length=80, stride=20)
    # rounded logits: many ties, which the stable sorts must break the same way
    outs = [(np.round(rng.normal(0, 2, len(f["input_ids"])), 1), np.round(rng.normal(0, 2, len(f["input_ids"])), 1))
            for f in feats]
    mid_word = same = 0
    for n_best, max_len in ((20, 30), (5, 4)):
        ours = S.postprocess_qa(outs, feats, exs, version=version, n_best=n_best, max_answer_length=max_len)
        ref, diffs, spans = run_squad_write_predictions(exs, feats, outs, version, tokenizer, n_best, max_len)
        unanswerable = {q for q, a in ref.items() if a is None}
        assert all(ours[q] == "" and ours.null_odds[q] > 0 for q in unanswerable)
        for q, a in ref.items():
            if a is None:
                continue
            if spans[q] is None:                             # no answer ("") or no span at all ("empty")
                assert ours[q] == a and a in ("", "empty")
                continue
            ctx = by_id[q].context
            assert ours[q] == whole_words(ctx, *spans[q]), q
            if ours[q] == ctx[spans[q][0]:spans[q][1]]:        # the span is whole words already
                assert a == ours[q], q
                same += 1
            else:                                             # run_squad keeps the cut word ("scadero")
                assert a in ours[q] and len(a) < len(ours[q]), q
                mid_word += 1
        if version == 2:
            assert {q: d for q, d in ours.null_odds.items() if q not in unanswerable} == pytest.approx(diffs)
    assert same > mid_word > 0                  # random logits often start or end inside a word


def test_answers_are_whole_words(tokenizer):
    """A span that starts or ends on a piece inside a word answers with the whole word, the
    original characters (case, accents, punctuation inside the span) untouched."""
    context = ("Mrs. Ödegaard-Wills sold tyrannosaurus bones (wholesale, retail, or online) for $1,250,000 in "
               "1999's auction. Unbelievably.")
    ex = S.QAExample("q", "What did she sell?", context, [])
    f = S.featurize_qa([ex], tokenizer, max_length=96, stride=32)[0]
    pieces = tokenizer.convert_ids_to_tokens(f["input_ids"])
    T, c0 = len(pieces), f["context_start"]

    def answer(first, last):                                 # piece texts (first occurrence) or positions
        at = lambda p: p if isinstance(p, int) else pieces.index(p, c0)
        start, end = np.full(T, -5.0), np.full(T, -5.0)
        start[at(first)], end[at(last)] = 5.0, 5.0
        return S.postprocess_qa([(start, end)], [f], [ex])["q"]

    # ty ##ran ##nos ##aurus, ode ##gaard - wills, un ##bel ##ie ##va ##bly (the MiniLM vocabulary)
    assert pieces[c0:c0 + 6] == ["mrs", ".", "ode", "##gaard", "-", "wills"]
    assert answer("##ran", "##nos") == "tyrannosaurus"                   # piece text: "rannos"
    assert answer("##ran", "bones") == "tyrannosaurus bones"
    assert answer("ode", "ode") == answer("##gaard", "##gaard") == "Ödegaard"
    assert answer("##gaard", "wills") == "Ödegaard-Wills"
    assert answer("wholesale", "retail") == "wholesale, retail"        # punctuation inside kept
    assert answer("retail", "retail") == "retail"                       # ... and not added around
    assert answer("1", "000") == "1,250,000" and answer("1999", "s") == "1999's"
    assert answer("##bel", "##va") == "Unbelievably"
    for i in range(c0, T - 1):                               # no piece alone answers with part of a word
        a = answer(i, i)
        s_, e_ = f["word_offsets"][i - c0]
        assert a == context[s_:e_] == whole_words(context, *f["offsets"][i - c0])


def test_windows_always_overlap(tokenizer, caplog):
    context = " ".join(f"word{i}" for i in range(300))
    ex = S.QAExample("q", "Which word?", context, [("word150", context.index("word150"))])
    feats = S.featurize_qa([ex], tokenizer, max_length=64, stride=128, train=True)
    room = 64 - len(tokenizer.encode_ids(["Which word?"])[0]) - 3
    starts = [f["doc_start"] for f in feats]
    assert starts[1] - starts[0] == room // 2 and "windows start half a window apart" in caplog.text
    assert any(f["start_positions"] > 0 for f in feats)


def test_packed_qa_loss_is_each_window_alone(examples, tokenizer):
    """Packed QA batches: logits equal the padded path on real tokens, and each window's loss is
    its softmax over its own tokens, i.e. what the padded model gives for that window alone."""
    from bertkit.config import preset
    from bertkit.model import BertForQuestionAnswering
    from bertkit.packing import pack

    torch.manual_seed(0)
    model = BertForQuestionAnswering(preset("tiny", vocab_size=tokenizer.vocab_size)).eval()
    feats = S.featurize_qa(examples[:6], tokenizer, max_length=96, stride=32, train=True)[:8]
    batch = collate(feats)
    assert len(set(batch["attention_mask"].sum(-1).tolist())) > 1        # ragged
    flat, layout = pack(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    with torch.no_grad():
        (ps, pe), loss = model(flat["input_ids"], flat["token_type_ids"], position_ids=flat["position_ids"],
                               packed=layout, start_positions=batch["start_positions"],
                               end_positions=batch["end_positions"])
        (s, e), _ = model(**batch)
        real = batch["attention_mask"].bool()
        assert ps.shape == (int(real.sum()),)
        assert (ps - s[real]).abs().max() < 1e-5 and (pe - e[real]).abs().max() < 1e-5
        alone = [model(**collate([f]))[1] for f in feats]
    assert abs(float(loss) - float(torch.stack(alone).mean())) < 1e-5
