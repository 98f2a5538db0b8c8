"""NSP's topic shortcut: the bag-of-words baseline of `data stats` and the NSP head probe (`nsp_probe`)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from bertkit.cli import main
from bertkit.data.stats import best_threshold, roc_auc, tfidf_cosine, threshold_baseline, topic_baseline

DOCS, SENTENCES, WORDS, POOL = 60, 10, 8, 6


def words_of(vocab_txt) -> list[str]:
    """Whole lower-case words of the vocabulary (one word piece each), in a fixed shuffled order."""
    words = [w for w in vocab_txt.read_text(encoding="utf-8").split("\n")[2000:]
             if w.isalpha() and w.isascii() and len(w) >= 4]
    random.Random(0).shuffle(words)
    return words


def write_corpus(path, words: list[str], own_words: bool, docs: int = DOCS) -> None:
    """`docs` documents of SENTENCES sentences of WORDS words: each document with its own POOL words
    (`own_words`, no word shared between documents), or all drawn from one pool of POOL x docs words."""
    rng = random.Random(1)
    out = []
    for d in range(docs):
        pool = words[POOL * d:POOL * (d + 1)] if own_words else words[:POOL * docs]
        out.append("\n".join(" ".join(rng.choice(pool) for _ in range(WORDS)).capitalize() + "."
                             for _ in range(SENTENCES)))
    path.write_text("\n\n".join(out) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def corpora(minilm, tmp_path_factory):
    d = tmp_path_factory.mktemp("topic")
    words = words_of(minilm / "vocab.txt")
    write_corpus(d / "own.txt", words, own_words=True)
    write_corpus(d / "shared.txt", words, own_words=False)
    return d


def prepared(minilm, text, out, **cfg):
    from bertkit import Tokenizer
    from bertkit.data.prepare import PrepareConfig, prepare
    from bertkit.data.pretraining import open_dataset
    # no short targets, no lone sentence split in two: a segment of a word or two (or only its full stop)
    # shares no word even with its true next segment
    cfg = {"max_length": 48, "dupe_factor": 4, "eval_documents": 0, "short_seq_prob": 0.0, "lone_segment": "random", **cfg}
    prepare([str(text)], Tokenizer.from_dir(minilm), out, PrepareConfig(**cfg), progress=False)
    return open_dataset(out)


# ---- the measures ---------------------------------------------------------------------------------
def test_measures_equal_scikit_learn():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics import roc_auc_score
    rng = np.random.default_rng(0)
    segs = [rng.integers(0, 25, rng.integers(1, 12)) for _ in range(2 * 40)]
    cos = tfidf_cosine(np.concatenate(segs), np.repeat(np.arange(len(segs)), [len(s) for s in segs]), 40)
    X = TfidfVectorizer(token_pattern=r"\S+").fit_transform([" ".join(f"w{t}" for t in s) for s in segs])
    np.testing.assert_allclose(cos, np.asarray(X[0::2].multiply(X[1::2]).sum(1)).ravel(), atol=1e-12)
    scores, y = rng.integers(0, 6, 300).astype(float), rng.random(300) < 0.4          # many ties
    assert roc_auc(scores, y) == pytest.approx(roc_auc_score(y, scores), abs=1e-12)
    assert roc_auc(scores, np.ones(300, bool)) is None
    assert best_threshold(np.array([1.0, 2, 3, 4]), np.array([0, 0, 1, 1], bool)) == 2.5
    assert best_threshold(np.array([1.0, 1, 1]), np.array([1, 1, 0], bool)) == float("-inf")
    r = threshold_baseline(np.r_[np.zeros(50), np.ones(50)], np.r_[np.zeros(50), np.ones(50)].astype(bool))
    assert r["accuracy"] == 1.0 and r["auc"] == 1.0 and r["fit_pairs"] + r["scored_pairs"] == 100
    assert threshold_baseline(scores, y, seed=3) == threshold_baseline(scores, y, seed=3)


# ---- data stats ------------------------------------------------------------------------------------
def test_topic_baseline_solves_other_vocabularies_and_not_one_vocabulary(minilm, corpora, tmp_path, capsys):
    own = topic_baseline(prepared(minilm, corpora / "own.txt", tmp_path / "own"))
    assert own["pairs"] > 300 and own["auc"] > 0.99 and own["accuracy"] > 0.97, own
    shared = topic_baseline(prepared(minilm, corpora / "shared.txt", tmp_path / "shared"))
    assert abs(shared["auc"] - 0.5) < 0.1 and abs(shared["accuracy"] - 0.5) < 0.12, shared
    # sentence order: A and B always of one document, swapped or not - no topic to go by
    sop = topic_baseline(prepared(minilm, corpora / "own.txt", tmp_path / "sop", pair_mode="sop"))
    assert sop["pair_mode"] == "sop" and abs(sop["auc"] - 0.5) < 0.1, sop
    # static masks are undone first: the same pairs, the same cosines
    ds = prepared(minilm, corpora / "own.txt", tmp_path / "static", masking="static")
    assert topic_baseline(ds)["auc"] > 0.99
    from bertkit.data.heldout import _instance_ids
    from bertkit.data.stats import _pair_ids
    mine = np.array([0, 3, 4, 17, len(ds) - 1])
    L = np.array([len(ds[int(i)]["input_ids"]) for i in mine])
    assert ds.meta["shards"] == ["shard-00000"] and (ds[3]["input_ids"] == ds.token_info().mask_id).any()
    np.testing.assert_array_equal(_pair_ids(ds, 0, mine, L), np.concatenate([_instance_ids(ds, i) for i in mine]))
    assert main(["data", "stats", str(tmp_path / "own"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["topic"]["auc"] == own["auc"] and s["topic"]["measure"] == "tfidf_cosine"
    assert main(["data", "stats", str(tmp_path / "own")]) == 0
    assert "topic shortcut: the words of A and B alone" in capsys.readouterr().out
    prepared(minilm, corpora / "own.txt", tmp_path / "packed", nsp=False)
    assert main(["data", "stats", str(tmp_path / "packed"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["topic"] is None


# ---- the NSP head probe ----------------------------------------------------------------------------
def test_probe_pairs_are_next_other_document_and_far_in_the_same_document():
    from bertkit.nsp_probe import probe_pairs
    # sentence k of document d is 3 tokens, each 1000 d + k: every token says where it came from
    docs = [[np.full(3, 1000 * d + k) for k in range(n)] for d, n in enumerate([2, 6, 9, 4, 3])]
    pairs = probe_pairs(docs, anchors=50, seed=1, max_length=15, min_distance=2)   # 6 tokens a side: 2 sentences
    def plain(p):
        return [(k, a.tolist(), b.tolist()) for k, a, b in p]
    assert plain(pairs) == plain(probe_pairs(docs, anchors=50, seed=1, max_length=15, min_distance=2)) != \
        plain(probe_pairs(docs, anchors=50, seed=2, max_length=15, min_distance=2))
    assert [k for k, _, _ in pairs[:3]] == ["is_next", "random_document", "same_document"]
    eligible = sum(max(n - 2, 0) for n in [2, 6, 9, 4, 3])
    assert len(pairs) == 3 * eligible                                        # fewer anchors than asked: all
    for n, (kind, a, b) in enumerate(pairs):
        d, i = divmod(int(a[-1]), 1000)
        assert len(a) <= 6 and len(b) <= 6 and (a // 1000 == d).all() and np.all(np.diff(a) >= 0)
        assert a is pairs[n - n % 3][1]                                       # one A for the three kinds
        bd, j = divmod(int(b[0]), 1000)
        if kind == "is_next":
            assert (bd, j) == (d, i + 1)
        elif kind == "same_document":
            assert bd == d and j >= i + 2
        else:
            assert bd != d
    from bertkit.errors import DataError
    with pytest.raises(DataError, match="needs 2 documents"):
        probe_pairs([[np.ones(2)] * 2, [np.ones(2)]], min_distance=2)


def save_tiny(minilm, path, nsp_bias=None, head="pretraining"):
    """A 2-layer post-LN BERT with an NSP head (random weights) and the bert-base-uncased vocabulary."""
    from bertkit.checkpoint import build, save_model
    from bertkit.config import BertConfig
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=48,
                     max_position_embeddings=64, initializer_range=0.2)
    model = build(head, cfg).eval()
    if nsp_bias is not None:
        with torch.no_grad():
            model.nsp.weight.zero_()
            model.nsp.bias.copy_(torch.tensor(nsp_bias))
    save_model(model, path)
    (path / "vocab.txt").write_bytes((minilm / "vocab.txt").read_bytes())
    return path


def test_nsp_head_probe_equals_transformers_and_topic_fails_on_the_same_document(minilm, corpora, tmp_path,
                                                                                  one_thread):
    from bertkit.nsp_probe import nsp_shortcut, probe_pairs, read_documents_ids
    from bertkit.tokenizer import Tokenizer
    m = save_tiny(minilm, tmp_path / "m")
    r = nsp_shortcut(m, corpora / "own.txt", anchors=120, max_length=48, seed=0)
    assert r["anchors"] == 120 and r["documents"] == DOCS and r["nsp_head"]
    assert {k["pairs"] for k in r["kinds"].values()} == {120}
    # each word belongs to one document: topic tells other documents apart, not the same document's far text
    assert r["against_is_next"]["random_document"]["topic_auc"] > 0.99
    assert abs(r["against_is_next"]["same_document"]["topic_auc"] - 0.5) < 0.12
    assert r == nsp_shortcut(m, corpora / "own.txt", anchors=120, max_length=48, seed=0)
    # P(IsNext) is transformers' BertForPreTraining on the same inputs
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForPreTraining.from_pretrained(str(m)).eval()
    tok = Tokenizer.from_dir(m)
    pairs = probe_pairs(read_documents_ids([corpora / "own.txt"], tok), anchors=4, max_length=48)
    from bertkit.nsp_probe import load_nsp_model, nsp_is_next
    ours = nsp_is_next(load_nsp_model(m), pairs, tok.cls_id, tok.sep_id, tok.pad_id, batch_size=5)
    for (_, a, b), p in zip(pairs, ours):
        ids = torch.tensor([[tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]])
        types = torch.tensor([[0] * (len(a) + 2) + [1] * (len(b) + 1)])
        with torch.no_grad():
            logits = hf(input_ids=ids, token_type_ids=types).seq_relationship_logits
        assert p == pytest.approx(torch.softmax(logits, -1)[0, 0].item(), abs=1e-5)
    # a head that always says IsNext: right on is_next, wrong on both negatives, AUC 0.5
    always = nsp_shortcut(save_tiny(minilm, tmp_path / "always", nsp_bias=[4.0, -4.0]), corpora / "own.txt",
                          anchors=30, max_length=48)
    assert [always["kinds"][k]["nsp_accuracy"] for k in ("is_next", "random_document", "same_document")] == [1, 0, 0]
    assert always["against_is_next"]["same_document"]["nsp_auc"] == 0.5


def test_nsp_shortcut_command(minilm, corpora, tmp_path, capsys, one_thread):
    m = save_tiny(minilm, tmp_path / "m")
    args = ["data", "nsp-shortcut", str(corpora / "own.txt"), "--model", str(m), "--anchors", "40", "--max-length", "48"]
    assert main(args + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["anchors"] == 40 and set(r["against_is_next"]) == {"random_document", "same_document"}
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "same_document" in out and "NSP head accuracy" in out
    assert main(["data", "nsp-shortcut", str(corpora / "own.txt"), "--model", str(minilm), "--topic-only",
                 "--anchors", "40", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert not r["nsp_head"] and "nsp_accuracy" not in r["kinds"]["is_next"]
    (tmp_path / "one.txt").write_text("One document.\nOf three.\nSentences.\n", encoding="utf-8")
    assert main(["data", "nsp-shortcut", str(tmp_path / "one.txt"), "--model", str(m), "--max-length", "48"]) == 1
    assert "one.txt: 1 documents" in capsys.readouterr().err
    for extra, says in ((["--model", str(save_tiny(minilm, tmp_path / "mlm", head="masked_lm"))], "no NSP head"),
                        (["--model", str(m), "--max-length", "100"], "has 64 positions"),
                        (["--model", str(m), "--max-length", "48", "--min-distance", "1"], "min_distance must be at least 2"),
                        (["--model", str(m), "--anchors", "0"], "anchors must be at least 1, got 0")):
        assert main(["data", "nsp-shortcut", str(corpora / "own.txt"), *extra]) == 1
        err = capsys.readouterr().err.strip().split("\n")
        assert len(err) == 1 and says in err[0], err
