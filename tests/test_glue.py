"""GLUE readers on the files as distributed (headers, BOM, CoLA without header, MNLI's last-column
label, test files without labels), bad rows with file:line, windows over long inputs, metrics."""
from __future__ import annotations

import gzip

import numpy as np
import pytest

from bertkit.tasks import BadRows, DataError, collate, get_task
from bertkit.tasks.glue import TextExample, featurize_classification, postprocess_classification, windows
from bertkit.tokenizer import TruncationStats


def write(path, text: str, gz: bool = False):
    data = text.encode("utf-8")
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def test_mrpc_with_bom_and_quotes(tmp_path):
    f = write(tmp_path / "train.tsv", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
              '1\t11\t12\tHe said "yes".\tHe said "yes" loudly.\n0\t13\t14\tA b.\tC d.\n')
    ex = get_task("mrpc").read(f)
    assert [(e.id, e.text, e.pair, e.label) for e in ex] == [
        ("0", 'He said "yes".', 'He said "yes" loudly.', "1"), ("1", "A b.", "C d.", "0")]


def test_cola_without_header_and_test_file_with_header(tmp_path):
    f = write(tmp_path / "dev.tsv.gz", "gj04\t1\t\tOur friends won't buy this.\ngj04\t0\t*\tThey drank the pub.\n", gz=True)
    ex = get_task("cola").read(f)
    assert [(e.text, e.label) for e in ex] == [("Our friends won't buy this.", "1"), ("They drank the pub.", "0")]
    t = write(tmp_path / "test.tsv", "index\tsentence\n0\tBill whistled.\n")
    assert [(e.id, e.text, e.label) for e in get_task("cola").read(t)] == [("0", "Bill whistled.", None)]


def test_mnli_label_is_last_column_and_stsb_scores(tmp_path):
    head = "index\tpromptID\tpairID\tgenre\ts1b\ts2b\ts1p\ts2p\tsentence1\tsentence2\tlabel1\tgold_label\n"
    f = write(tmp_path / "train.tsv", head + "7\t1\t1n\tfiction\tx\tx\tx\tx\tA man.\tA person.\tentailment\tentailment\n")
    ex = get_task("mnli").read(f)
    assert (ex[0].id, ex[0].label, ex[0].pair) == ("7", "entailment", "A person.")
    assert get_task("mnli-mm").files["dev"] == "dev_mismatched.tsv"
    s = write(tmp_path / "stsb.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
              "5\tg\tf\t2012\t1\tn\tn\tA plane.\tAn air plane.\t4.250\n")
    assert get_task("stsb").read(s)[0].label == pytest.approx(4.25)


@pytest.mark.parametrize("body, message", [
    ("sentence\tlabel\ngood film\t1\nbad film\n", "train.tsv:3: expected 2 tab-separated columns"),
    ("sentence\tlabel\ngood film\t\n", "train.tsv:2: missing label"),
    ("sentence\tlabel\ngood film\tpositive\n", "train.tsv:2: unknown label 'positive'"),
    ("", "no examples"),
    ("sentence\tlabel\n", "no examples"),
])
def test_bad_rows_name_file_and_line(tmp_path, body, message):
    f = write(tmp_path / "train.tsv", body)
    with pytest.raises(DataError, match=message.replace("(", r"\(")):
        get_task("sst2").read(f)


def test_skip_bad_rows_counts(tmp_path):
    f = write(tmp_path / "train.tsv", "sentence\tlabel\ngood\t1\nbad\nworse\tx\nfine\t1\n")
    bad = BadRows(skip=True)
    ex = get_task("sst2").read(f, bad)
    assert [e.text for e in ex] == ["good", "fine"] and bad.count == 2
    assert [e.id for e in ex] == ["0", "3"]          # ids stay the data-row index
    s = write(tmp_path / "s.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
              "0\tg\tf\ty\t1\tn\tn\ta\tb\tfive\n")
    with pytest.raises(DataError, match="s.tsv:2: score 'five' is not a number"):
        get_task("stsb").read(s)


def test_wrong_task_file_is_explained(tmp_path):
    f = write(tmp_path / "dev.tsv", "sentence\tlabel\ngood\t1\n")
    with pytest.raises(DataError, match="no '#1 String' column"):
        get_task("mrpc").read(f)


def test_windows_cover_everything():
    assert windows(5, 10, 2) == [(0, 5)]
    spans = windows(25, 10, 3)
    assert spans[0] == (0, 10) and spans[-1][1] == 25
    assert all(b[0] == a[1] - 3 for a, b in zip(spans, spans[1:]))


class FakeTok:
    """Each word is one piece, id = its length (enough to test layout)."""
    cls_id, sep_id, pad_id = 101, 102, 0

    stats = TruncationStats()

    def encode_ids(self, texts):
        return [[len(w) for w in t.split()] for t in texts]


def test_long_inputs_slide_and_average():
    tok = FakeTok()
    long = TextExample("a", " ".join(["w"] * 30), None, "1")
    short = TextExample("b", "x y", "z", "0")
    feats = featurize_classification([long, short], tok, ["0", "1"], max_length=12, stride=4)
    windows_a = [f for f in feats if f["example_index"] == 0]
    assert len(windows_a) > 1 and all(len(f["input_ids"]) <= 12 for f in feats)
    assert feats[-1]["input_ids"] == [101, 1, 1, 102, 1, 102] and feats[-1]["token_type_ids"] == [0, 0, 0, 0, 1, 1]
    outs = [np.array([0.0, 1.0]) if f["example_index"] == 0 else np.array([2.0, 0.0]) for f in feats]
    outs[0] = np.array([5.0, 0.0])                    # one window disagrees; the mean decides
    preds = postprocess_classification(outs, feats, [long, short], ["0", "1"])
    n = len(windows_a)
    assert preds == {"a": "0" if 5 > n - 1 else "1", "b": "0"}
    # without a stride: longest-first truncation, counted
    feats = featurize_classification([long], tok, ["0", "1"], max_length=12, stride=None)
    assert len(feats) == 1 and len(feats[0]["input_ids"]) == 12
    batch = collate(feats + [{"input_ids": [101, 102], "token_type_ids": [0, 0], "labels": 0}])
    assert batch["input_ids"].shape == (2, 12) and batch["attention_mask"][1].sum() == 2


def test_metrics_match_sklearn(tmp_path):
    sklearn = pytest.importorskip("sklearn.metrics")
    ex = [TextExample(str(i), "t", None, lab) for i, lab in enumerate("1101001110")]
    pred = dict(zip([e.id for e in ex], "1001011100"))
    m = get_task("mrpc").metrics(pred, ex)
    ref, p = [e.label for e in ex], [pred[e.id] for e in ex]
    assert m["f1"] == pytest.approx(sklearn.f1_score(ref, p, pos_label="1"))
    assert m["accuracy"] == pytest.approx(sklearn.accuracy_score(ref, p))
    assert get_task("cola").metrics(pred, ex)["mcc"] == pytest.approx(sklearn.matthews_corrcoef(ref, p))


@pytest.mark.parametrize("task, folder, rows", [("sst2", "SST-2", 872), ("mrpc", "MRPC", 408), ("cola", "CoLA", 527),
                                                ("stsb", "STS-B", 1500), ("rte", "RTE", 277)])
def test_shared_glue_dev_files(shared_data, task, folder, rows):
    t = get_task(task)
    ex = t.read(t.split_path(shared_data / "glue" / folder, "dev"))
    assert len(ex) == rows
    assert all(e.label is not None for e in ex)


def test_window_overlap_is_capped_at_half_a_window():
    """An overlap close to the window once stepped 1 token at a time (226 windows per RTE example
    at max_length 64); the step is now at least half a window."""
    for n, size, overlap in ((100, 10, 9), (1000, 31, 64), (57, 8, 7), (10, 1, 5)):
        spans = windows(n, size, overlap)
        assert spans[0][0] == 0 and spans[-1][1] == n and all(e - s <= size for s, e in spans)
        assert all(b[0] - a[0] >= max(size - size // 2, 1) for a, b in zip(spans, spans[1:]))
        assert len(spans) <= 2 * n / size + 1
    assert windows(25, 10, 3) == [(0, 10), (7, 17), (14, 24), (21, 25)]     # a small overlap is kept


def test_pair_cap_counts_as_truncation(caplog):
    tok = FakeTok()
    tok.stats.truncated_inputs = tok.stats.tokens_cut = 0
    ex = TextExample("a", " ".join(["w"] * 40), " ".join(["v"] * 20), "1")
    feats = featurize_classification([ex], tok, ["0", "1"], max_length=23, stride=50)
    # budget 20: B capped at 10 (10 of its 20 pieces cut, counted), A in windows of 10 stepping 5
    assert all(f["input_ids"][-11:-1] == [1] * 10 for f in feats) and len(feats) == 7
    assert tok.stats.truncated_inputs == 1 and tok.stats.tokens_cut == 10
    assert "overlap by half a window" in caplog.text


@pytest.fixture(scope="module")
def rte_train(shared_data):
    t = get_task("rte")
    return t, t.read(t.split_path(shared_data / "glue" / "RTE", "train"))


@pytest.fixture(scope="module")
def bert_vocab(shared_data):
    from bertkit.tokenizer import Tokenizer
    return Tokenizer.from_vocab(shared_data / "vocab" / "bert-base-uncased-vocab.txt")


def test_rte_at_max_length_64_does_not_explode(rte_train, bert_vocab, caplog):
    """Real RTE train (2,213 pairs) at --max-length 64: plain truncation by default, one input per
    example; with windows (the task's old default overlap of 64) a few windows per long example."""
    import logging

    from bertkit.tasks.plumbing import featurize, input_stride

    task, examples = rte_train
    labels = task.labels(examples)
    caplog.set_level(logging.INFO, logger="bertkit")
    stride = input_stride(task, None, None, 64)
    assert stride is None
    feats, summary = featurize(task, examples, bert_vocab, labels, 64, stride, "train")
    assert len(feats) == len(examples) == 2213 and summary["max_windows"] == 1
    assert summary["truncated_examples"] > 0 and "truncated" in caplog.text
    caplog.clear()
    feats, summary = featurize(task, examples, bert_vocab, labels, 64, input_stride(task, None, 64, 64), "train")
    assert summary["windowed_examples"] > 0 and summary["max_windows"] <= 12
    assert len(feats) < 2.5 * len(examples)                   # was 43,015 features (19.4 per example)
    assert "examples in 2.." in caplog.text and "overlap by half a window" in caplog.text
    assert all(len(f["input_ids"]) <= 64 for f in feats)


def test_input_stride_choices():
    from bertkit.errors import BertkitError
    from bertkit.tasks.plumbing import input_stride

    rte, ner, squad = get_task("rte"), get_task("conll2003"), get_task("squad")
    assert input_stride(rte, None, None, 128) is None                 # truncation, as in the paper
    assert input_stride(rte, True, None, 128) == 32                   # a quarter of the window
    assert input_stride(rte, None, 20, 128) == 20
    assert input_stride(ner, None, None, 128) == 32 and input_stride(squad, None, None, 384) == 128
    for args in ((rte, False, 20, 128), (ner, False, None, 128), (squad, None, 0, 384), (rte, None, -1, 128)):
        with pytest.raises(BertkitError):
            input_stride(*args)
