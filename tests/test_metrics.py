"""bertkit.tasks.metrics against scikit-learn, scipy, seqeval and the official SQuAD scripts.

The official evaluate-v1.1.py and evaluate-v2.0.py are copied below (their logic, line for line,
minus argument parsing and printing) and serve as the reference."""
from __future__ import annotations

import collections
import random
import re
import string
import warnings

import numpy as np
import pytest

from bertkit.tasks import metrics as M

sklearn_metrics = pytest.importorskip("sklearn.metrics")
stats = pytest.importorskip("scipy.stats")
seqeval_metrics = pytest.importorskip("seqeval.metrics")


# ---- the official SQuAD v1.1 evaluation (evaluate-v1.1.py) ---------------------------------------
def v11_normalize_answer(s):
    def remove_articles(text):
        return re.sub(r'\b(a|an|the)\b', ' ', text)

    def white_space_fix(text):
        return ' '.join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return ''.join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def v11_f1_score(prediction, ground_truth):
    prediction_tokens = v11_normalize_answer(prediction).split()
    ground_truth_tokens = v11_normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def v11_exact_match_score(prediction, ground_truth):
    return (v11_normalize_answer(prediction) == v11_normalize_answer(ground_truth))


def v11_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


def v11_evaluate(dataset, predictions):
    f1 = exact_match = total = 0
    for article in dataset:
        for paragraph in article['paragraphs']:
            for qa in paragraph['qas']:
                total += 1
                if qa['id'] not in predictions:
                    continue
                ground_truths = list(map(lambda x: x['text'], qa['answers']))
                prediction = predictions[qa['id']]
                exact_match += v11_metric_max_over_ground_truths(v11_exact_match_score, prediction, ground_truths)
                f1 += v11_metric_max_over_ground_truths(v11_f1_score, prediction, ground_truths)
    exact_match = 100.0 * exact_match / total
    f1 = 100.0 * f1 / total
    return {'exact_match': exact_match, 'f1': f1}


# ---- the official SQuAD v2.0 evaluation (evaluate-v2.0.py) ---------------------------------------
def v20_make_qid_to_has_ans(dataset):
    qid_to_has_ans = {}
    for article in dataset:
        for p in article['paragraphs']:
            for qa in p['qas']:
                qid_to_has_ans[qa['id']] = bool(qa['answers'])
    return qid_to_has_ans


def v20_normalize_answer(s):
    def remove_articles(text):
        regex = re.compile(r'\b(a|an|the)\b', re.UNICODE)
        return re.sub(regex, ' ', text)

    def white_space_fix(text):
        return ' '.join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return ''.join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def v20_get_tokens(s):
    if not s:
        return []
    return v20_normalize_answer(s).split()


def v20_compute_exact(a_gold, a_pred):
    return int(v20_normalize_answer(a_gold) == v20_normalize_answer(a_pred))


def v20_compute_f1(a_gold, a_pred):
    gold_toks = v20_get_tokens(a_gold)
    pred_toks = v20_get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def v20_get_raw_scores(dataset, preds):
    exact_scores = {}
    f1_scores = {}
    for article in dataset:
        for p in article['paragraphs']:
            for qa in p['qas']:
                qid = qa['id']
                gold_answers = [a['text'] for a in qa['answers'] if v20_normalize_answer(a['text'])]
                if not gold_answers:
                    gold_answers = ['']
                if qid not in preds:
                    continue
                a_pred = preds[qid]
                exact_scores[qid] = max(v20_compute_exact(a, a_pred) for a in gold_answers)
                f1_scores[qid] = max(v20_compute_f1(a, a_pred) for a in gold_answers)
    return exact_scores, f1_scores


def v20_apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
    new_scores = {}
    for qid, s in scores.items():
        pred_na = na_probs[qid] > na_prob_thresh
        if pred_na:
            new_scores[qid] = float(not qid_to_has_ans[qid])
        else:
            new_scores[qid] = s
    return new_scores


def v20_make_eval_dict(exact_scores, f1_scores, qid_list=None):
    if not qid_list:
        total = len(exact_scores)
        return collections.OrderedDict([
            ('exact', 100.0 * sum(exact_scores.values()) / total),
            ('f1', 100.0 * sum(f1_scores.values()) / total),
            ('total', total),
        ])
    else:
        total = len(qid_list)
        return collections.OrderedDict([
            ('exact', 100.0 * sum(exact_scores[k] for k in qid_list) / total),
            ('f1', 100.0 * sum(f1_scores[k] for k in qid_list) / total),
            ('total', total),
        ])


def v20_merge_eval(main_eval, new_eval, prefix):
    for k in new_eval:
        main_eval['%s_%s' % (prefix, k)] = new_eval[k]


def v20_find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for i, qid in enumerate(qid_list):
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            if preds[qid]:
                diff = -1
            else:
                diff = 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def v20_evaluate(dataset, preds, na_probs=None, na_prob_thresh=1.0):
    na_prob_file = na_probs is not None
    if not na_prob_file:
        na_probs = {k: 0.0 for k in preds}
    qid_to_has_ans = v20_make_qid_to_has_ans(dataset)
    has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
    no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
    exact_raw, f1_raw = v20_get_raw_scores(dataset, preds)
    exact_thresh = v20_apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    f1_thresh = v20_apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    out_eval = v20_make_eval_dict(exact_thresh, f1_thresh)
    if has_ans_qids:
        v20_merge_eval(out_eval, v20_make_eval_dict(exact_thresh, f1_thresh, qid_list=has_ans_qids), 'HasAns')
    if no_ans_qids:
        v20_merge_eval(out_eval, v20_make_eval_dict(exact_thresh, f1_thresh, qid_list=no_ans_qids), 'NoAns')
    if na_prob_file:
        best_exact, exact_thresh = v20_find_best_thresh(preds, exact_raw, na_probs, qid_to_has_ans)
        best_f1, f1_thresh = v20_find_best_thresh(preds, f1_raw, na_probs, qid_to_has_ans)
        out_eval['best_exact'] = best_exact
        out_eval['best_exact_thresh'] = exact_thresh
        out_eval['best_f1'] = best_f1
        out_eval['best_f1_thresh'] = f1_thresh
    return dict(out_eval)


# ---- classification and regression ---------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_classification_metrics_equal_sklearn(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 2, 5, 37, 400])
    k = rng.choice([2, 2, 3, 5])
    skew = rng.random()
    y_true = [rng.randrange(k) if rng.random() > skew else 0 for _ in range(n)]
    y_pred = [t if rng.random() < 0.6 else rng.randrange(k) for t in y_true]
    assert M.accuracy(y_true, y_pred) == pytest.approx(sklearn_metrics.accuracy_score(y_true, y_pred), abs=1e-15)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_mcc = sklearn_metrics.matthews_corrcoef(y_true, y_pred)
        if k == 2:
            ref_f1 = sklearn_metrics.f1_score(y_true, y_pred)
            assert M.f1_binary(y_true, y_pred) == pytest.approx(ref_f1, abs=1e-12)
    assert M.matthews_corrcoef(y_true, y_pred) == pytest.approx(ref_mcc, abs=1e-12)


@pytest.mark.parametrize("y_true,y_pred", [
    ([0, 0, 0], [0, 0, 0]),            # no positive anywhere: F1 0, MCC 0
    ([1, 1, 1], [1, 1, 1]),            # constant on both sides: MCC 0, F1 1
    ([1, 0, 1, 0], [0, 1, 0, 1]),      # all wrong: MCC -1
    ([1, 0, 1, 0], [1, 1, 1, 1]),      # constant prediction: MCC 0
    (["1", "0", "1"], ["1", "1", "0"]),  # string labels with pos_label "1"
])
def test_classification_edge_cases(y_true, y_pred):
    pos = y_true[0].__class__(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert M.f1_binary(y_true, y_pred, pos_label=pos) == pytest.approx(
            sklearn_metrics.f1_score(y_true, y_pred, pos_label=pos), abs=1e-12)
        assert M.matthews_corrcoef(y_true, y_pred) == pytest.approx(
            sklearn_metrics.matthews_corrcoef(y_true, y_pred), abs=1e-12)


def test_length_mismatch_is_an_error():
    with pytest.raises(M.MetricError, match="3 references but 2 predictions"):
        M.accuracy([1, 2, 3], [1, 2])


@pytest.mark.parametrize("seed", range(8))
def test_pearson_spearman_equal_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 300))
    x = np.round(rng.uniform(0, 5, n), int(rng.integers(0, 2)))     # rounding makes ties
    y = x + rng.normal(0, rng.uniform(0.1, 3), n)
    if seed % 2:
        y = np.round(y)                                                # heavy ties on the other side
    r = M.pearson_spearman(x.tolist(), y.tolist())
    assert r["pearson"] == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert r["spearman"] == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
    assert r["corr"] == pytest.approx((r["pearson"] + r["spearman"]) / 2)


def test_correlation_of_a_constant_is_nan_like_scipy():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(stats.pearsonr([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])[0])
    assert np.isnan(M.pearson_spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])["pearson"])


# ---- CoNLL entity F1 ------------------------------------------------------------------------------
TYPES = ["PER", "LOC", "ORG", "MISC"]


def random_tags(rng, n, prefixes):
    return [rng.choice(["O", "O"] + [f"{p}-{t}" for p in prefixes for t in TYPES]) for _ in range(n)]


def assert_same_as_seqeval(y_true, y_pred):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_p = seqeval_metrics.precision_score(y_true, y_pred)
        ref_r = seqeval_metrics.recall_score(y_true, y_pred)
        ref_f = seqeval_metrics.f1_score(y_true, y_pred)
        ref_acc = seqeval_metrics.accuracy_score(y_true, y_pred)
        report = seqeval_metrics.classification_report(y_true, y_pred, output_dict=True)
    ours = M.conll_f1(y_true, y_pred)
    assert ours["precision"] == pytest.approx(ref_p, abs=1e-12)
    assert ours["recall"] == pytest.approx(ref_r, abs=1e-12)
    assert ours["f1"] == pytest.approx(ref_f, abs=1e-12)
    assert ours["accuracy"] == pytest.approx(ref_acc, abs=1e-12)
    types = {k for k in report if k not in ("micro avg", "macro avg", "weighted avg")}
    assert set(ours["per_type"]) == types
    for t in types:
        for key, ref_key in (("precision", "precision"), ("recall", "recall"), ("f1", "f1-score"), ("support", "support")):
            assert ours["per_type"][t][key] == pytest.approx(report[t][ref_key], abs=1e-12), (t, key)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("prefixes", [("B", "I"), ("I",), ("B", "I", "E", "S")], ids=["BIO", "IOB1", "IOBES"])
def test_conll_f1_equals_seqeval_on_random_tags(seed, prefixes):
    rng = random.Random(seed)
    y_true = [random_tags(rng, rng.randrange(0, 15), prefixes) for _ in range(rng.randrange(1, 30))]
    y_pred = [[t if rng.random() < 0.7 else rng.choice(["O", f"{rng.choice(prefixes)}-{rng.choice(TYPES)}"])
               for t in sent] for sent in y_true]
    assert_same_as_seqeval(y_true, y_pred)


@pytest.mark.parametrize("y_true,y_pred", [
    ([["B-PER", "I-PER", "O"]], [["I-PER", "I-PER", "O"]]),                  # I- opens a chunk after O
    ([["B-PER", "I-LOC"]], [["B-PER", "I-PER"]]),                            # type change splits
    ([["B-PER"], ["I-PER"]], [["B-PER"], ["B-PER"]]),                        # sentences never join
    ([["B-PER", "B-PER"]], [["B-PER", "I-PER"]]),                            # B after B splits
    ([["S-LOC", "E-LOC", "B-ORG", "E-ORG"]], [["S-LOC", "I-LOC", "B-ORG", "I-ORG"]]),
    ([["O", "O"]], [["O", "B-MISC"]]),                                        # no true entity at all
    ([["O"]], [["O"]]),                                                       # nothing anywhere
    ([["B-PER", "I-PER"], []], [["B-PER", "I-PER"], []]),                     # an empty sentence
    ([["B-PER-X", "I-PER-X", "PER"]], [["B-PER-X", "I-PER", "B"]]),          # odd tags (hyphen, no prefix)
])
def test_conll_f1_tricky_cases(y_true, y_pred):
    assert_same_as_seqeval(y_true, y_pred)


def test_conll_f1_counts_entities_as_expected():
    r = M.conll_f1([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-ORG"]])
    assert (r["precision"], r["recall"], r["f1"]) == (0.5, 0.5, 0.5)
    assert r["per_type"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1}
    assert r["per_type"]["ORG"]["support"] == 0 and r["per_type"]["LOC"]["recall"] == 0.0
    with pytest.raises(M.MetricError, match="sentence 0: 2 reference tags but 1 predicted"):
        M.conll_f1([["O", "O"]], [["O"]])


# ---- per-example outcomes: metrics that are ratios of sums -----------------------------------------
def test_example_counts_of_accuracy_and_binary_f1_add_up_to_the_metric():
    rng = random.Random(0)
    ref = [rng.choice("0011") for _ in range(408)]                    # MRPC-sized, two thirds positive
    pred = [r if rng.random() < 0.7 else rng.choice("01") for r in ref]
    num, den = M.example_counts("accuracy", ref, pred)
    assert den == [1] * 408 and set(num) <= {0, 1} and sum(num) / sum(den) == M.accuracy(ref, pred)
    num, den = M.example_counts("f1", ref, pred)                      # 2 TP / (predicted + true positives)
    assert set(num) <= {0, 2} and set(den) <= {0, 1, 2}
    assert sum(num) / sum(den) == pytest.approx(M.f1_binary(ref, pred, pos_label="1"), rel=1e-12)
    assert (num[0], den[0]) == ((2, 2) if ref[0] == pred[0] == "1" else (0, (ref[0] == "1") + (pred[0] == "1")))
    for metric in ("mcc", "spearman", "corr", "exact"):                # not ratios of sums
        assert M.example_counts(metric, ref, pred) is None
    with pytest.raises(M.MetricError, match="3 references but 2 predictions"):
        M.example_counts("accuracy", ["1", "0", "1"], ["1", "0"])


def test_example_counts_of_entity_f1_per_sentence():
    true = [["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-LOC"],      # a person, a three-word place
            ["B-ORG", "I-ORG", "O", "B-MISC"],
            ["O", "O"],
            ["I-PER", "I-PER", "B-PER"]]                               # IOB1: two people
    pred = [["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"],            # the person right, the place cut short
            ["B-LOC", "I-LOC", "O", "B-MISC"],                         # the ORG typed LOC, MISC right
            ["B-PER", "O"],                                            # a spurious entity
            ["I-PER", "I-PER", "I-PER"]]                               # two people read as one
    num, den = M.example_counts("conll_f1", true, pred)
    assert num == [2, 2, 0, 0] and den == [4, 4, 1, 3]
    assert sum(num) / sum(den) == pytest.approx(M.conll_f1(true, pred)["f1"], rel=1e-12) == 1 / 3
    for seed in range(10):                                              # and on random tags of every scheme
        rng = random.Random(seed)
        prefixes = rng.choice([("B", "I"), ("I",), ("B", "I", "E", "S")])
        y_true = [random_tags(rng, rng.randrange(0, 15), prefixes) for _ in range(rng.randrange(1, 30))]
        y_pred = [[t if rng.random() < 0.7 else rng.choice(["O", f"{rng.choice(prefixes)}-{rng.choice(TYPES)}"])
                   for t in sent] for sent in y_true]
        num, den = M.example_counts("conll_f1", y_true, y_pred)
        assert len(num) == len(den) == len(y_true)
        assert (sum(num) / sum(den) if sum(den) else 0.0) == pytest.approx(M.conll_f1(y_true, y_pred)["f1"], abs=1e-12)
    with pytest.raises(M.MetricError, match="sentence 0: 2 reference tags but 1 predicted"):
        M.example_counts("conll_f1", [["O", "O"]], [["O"]])


# ---- SQuAD ----------------------------------------------------------------------------------------
ANSWER_BITS = ["the", "a", "An", "Denver Broncos", "broncos", "1,000", "1000", "Santa Clara, California",
               "Levi's Stadium", "  ", "", "!", "THE end.", "end", "über café", "Über Café", "an apple", "x-ray",
               "x ray", "(1996)", "1996", "the the the", "théâtre", "Theatre"]


def random_answer(rng):
    return " ".join(rng.choice(ANSWER_BITS) for _ in range(rng.randrange(0, 4)))


def random_dataset(rng, n_questions, impossible_share=0.0):
    qas = []
    for i in range(n_questions):
        impossible = rng.random() < impossible_share
        answers = [] if impossible else [{"text": random_answer(rng), "answer_start": 0}
                                         for _ in range(rng.randrange(1, 4))]
        qas.append({"id": f"q{i}", "question": "?", "answers": answers})
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas[:n_questions // 2]},
                                          {"context": "d", "qas": qas[n_questions // 2:]}]}]


def gold_of(dataset, qid):
    return [a["text"] for p in dataset[0]["paragraphs"] for q in p["qas"] if q["id"] == qid for a in q["answers"]]


@pytest.mark.parametrize("seed", range(10))
def test_squad_v1_equals_official(seed):
    rng = random.Random(seed)
    data = random_dataset(rng, rng.randrange(1, 60))
    qids = [q["id"] for p in data[0]["paragraphs"] for q in p["qas"]]
    preds = {}
    for q in qids:
        r = rng.random()
        if r < 0.1:
            continue                                                   # unanswered: scores 0
        preds[q] = rng.choice(gold_of(data, q)) if r < 0.4 else random_answer(rng)
    ours = M.squad_v1({"data": data, "version": "1.1"}, preds)
    ref = v11_evaluate(data, preds)
    assert ours["exact_match"] == pytest.approx(ref["exact_match"], abs=1e-9)
    assert ours["f1"] == pytest.approx(ref["f1"], abs=1e-9)


def test_squad_normalisation_examples():
    assert M.normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert M.normalize_answer("an apple, a pear") == "apple pear"
    assert M.normalize_answer("theatre") == "theatre"                    # articles only as words
    assert M.squad_token_f1("Denver Broncos", "the broncos") == pytest.approx(2 / 3)
    assert M.squad_v1({"q": ["Denver Broncos", "Broncos"]}, {"q": "broncos."})["exact_match"] == 100.0


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("with_odds", [False, True])
def test_squad_v2_equals_official(seed, with_odds):
    rng = random.Random(seed)
    data = random_dataset(rng, rng.randrange(1, 60), impossible_share=rng.choice([0.0, 0.3, 0.6, 1.0]))
    qids = [q["id"] for p in data[0]["paragraphs"] for q in p["qas"]]
    preds = {}
    for q in qids:
        golds = gold_of(data, q)
        r = rng.random()
        preds[q] = "" if r < 0.3 else (rng.choice(golds) if golds and r < 0.6 else random_answer(rng))
    na_probs = None
    if with_odds:     # logit differences like run_squad's null_odds.json, with ties
        na_probs = {q: round(rng.uniform(-5, 5), rng.choice([0, 2])) for q in rng.sample(qids, len(qids))}
    for thresh in (1.0, 0.0, -2.5):
        ours = M.squad_v2({"data": data}, preds, na_probs, na_prob_thresh=thresh)
        ref = v20_evaluate(data, preds, na_probs, na_prob_thresh=thresh)
        assert set(ours) == set(ref)
        for k, v in ref.items():
            assert ours[k] == pytest.approx(v, abs=1e-9), k


def test_squad_v2_missing_prediction_is_an_error():
    with pytest.raises(M.MetricError, match="1 of 2 questions have no prediction"):
        M.squad_v2({"a": ["x"], "b": []}, {"a": "x"})
