"""CoNLL reading, first-sub-word labelling, windows over long sentences mapped back to words."""
from __future__ import annotations

import numpy as np
import pytest

from bertkit import Tokenizer
from bertkit.tasks import BadRows, DataError, get_task
from bertkit.tasks.ner import TaggedExample, featurize_tokens, postprocess_tokens, read_conll

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "eu", "rejects", "german", "peter", "black", "##burn",
             "a", "b", "c"]
    return Tokenizer({w: i for i, w in enumerate(words)}, lowercase=True)


def test_read_conll_sentences_and_ids(tmp_path):
    f = tmp_path / "train.txt"
    f.write_text(CONLL, encoding="utf-8")
    ex = read_conll(f)
    assert [(e.id, e.words, e.tags) for e in ex] == [
        ("0", ["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"]),
        ("1", ["Peter", "Blackburn"], ["B-PER", "I-PER"])]


@pytest.mark.parametrize("body, message", [
    ("EU NNP B-NP B-ORG\nrejects VBZ O\n", "train.txt:2: expected 4 columns"),
    ("EU NNP B-NP ORG\n", "train.txt:1: tag 'ORG' is not O or B-/I-/E-/S-TYPE"),
    ("\n\n", "no examples"),
])
def test_bad_conll(tmp_path, body, message):
    f = tmp_path / "train.txt"
    f.write_text(body, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        read_conll(f)


def test_skipping_a_bad_sentence_keeps_sentence_ids(tmp_path):
    f = tmp_path / "train.txt"
    f.write_text("a X O\n\nb X\n\nc X B-LOC\n", encoding="utf-8")
    bad = BadRows(skip=True)
    ex = read_conll(f, bad)
    assert [(e.id, e.words) for e in ex] == [("0", ["a"]), ("2", ["c"])] and bad.count == 1


def test_first_subword_carries_the_label(tok):
    ex = TaggedExample("0", ["Peter", "Blackburn", "rejects"], ["B-PER", "I-PER", "O"])
    labels = ["B-PER", "I-PER", "O"]
    (f,) = featurize_tokens([ex], tok, labels, max_length=16)
    assert tok.convert_ids_to_tokens(f["input_ids"]) == ["[CLS]", "peter", "black", "##burn", "rejects", "[SEP]"]
    assert f["labels"] == [-100, 0, 1, -100, 2, -100]
    assert f["word_ids"] == [None, 0, 1, None, 2, None]


def test_long_sentence_windows_map_back_with_most_context(tok):
    words = ["a", "b", "c"] * 10                       # 30 pieces, windows of 8 pieces
    labels = ["B-LOC", "O"]
    ex = TaggedExample("s", words, ["O"] * 30)
    feats = featurize_tokens([ex], tok, labels, max_length=10, stride=3)
    assert len(feats) > 1 and all(len(f["input_ids"]) <= 10 for f in feats)
    # every word is labelled in some window; predict B-LOC exactly for word 12 from the window
    # where it is most central, and an (ignored) wrong answer from a window where it is at an edge
    outs = []
    for f in feats:
        s, e, _ = f["window"]
        o = np.tile([0.0, 1.0], (len(f["input_ids"]), 1))
        for pos, w in enumerate(f["word_ids"]):
            if w == 12:
                centre = min(w - s, e - 1 - w)
                o[pos] = [1.0, 0.0] if centre >= 2 else [0.0, 1.0]
        outs.append(o)
    pred = postprocess_tokens(outs, feats, [ex], labels)["s"]
    assert len(pred) == 30 and pred[12] == "B-LOC" and pred.count("B-LOC") == 1
    covered = {w for f in feats for w in f["word_ids"] if w is not None}
    assert covered == set(range(30))


def test_unseen_tag_is_an_error():
    from bertkit.tasks.ner import check_tags
    with pytest.raises(DataError, match="tag 'B-ORG' was not seen in training"):
        check_tags([TaggedExample("0", ["x"], ["B-ORG"], "dev.txt:4")], ["O", "B-PER"])


def test_metric_is_seqeval_default():
    seqeval = pytest.importorskip("seqeval.metrics")
    ref = [["B-PER", "I-PER", "O", "B-LOC"], ["I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    ex = [TaggedExample(str(i), ["w"] * len(t), t) for i, t in enumerate(ref)]
    m = get_task("conll2003").metrics({str(i): p for i, p in enumerate(pred)}, ex)
    assert m["f1"] == pytest.approx(seqeval.f1_score(ref, pred))


def test_shared_conll_valid(shared_data):
    t = get_task("conll2003")
    ex = t.read(t.split_path(shared_data / "conll2003", "dev"))
    assert len(ex) == 3250 and sum(len(e.words) for e in ex) == 51362
