"""bertkit.finetune.biencoder (`bertkit finetune --task embedding`): losses equal sentence-transformers'
(MultipleNegativesRankingLoss, CoSENTLoss, CosineSimilarityLoss), batches without repeated texts,
columns and sources, and the trained folder: `bertkit embed`, the server's /v1/embeddings and
`SentenceTransformer(path)` give the same vectors (1e-5, fp32), with mean and [CLS] pooling."""
from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest
import torch

from bertkit.embed_eval import Retrieval, ScoredPairs
from bertkit.errors import BertkitError
from bertkit.finetune.biencoder import (Pairs, cosent_loss, cosine_loss, dev_set, epoch_batches, mnrl_loss,
                                        pick_columns, read_pairs)
from bertkit.st_files import sentence_transformers_pooling

PAIRS = [("how tall is the tower?", "the tower is 300 metres tall."),
         ("who wrote the book?", "the book was written by a sailor."),
         ("where is the river?", "the river runs through the north."),
         ("when did the war end?", "the war ended in the spring."),
         ("what colour is the sky?", "the sky is blue on clear days."),
         ("how old is the king?", "the king is sixty years old.")]
TEXTS = ["a question about towers", "the sailor wrote a book.", "rivers and the north"]


def st_loss(name, **kw):
    from sentence_transformers.sentence_transformer import losses
    return getattr(losses, name)(model=None, **kw) if name != "CosineSimilarityLoss" else losses.CosineSimilarityLoss(None)


def test_losses_equal_sentence_transformers():
    pytest.importorskip("sentence_transformers")
    g = torch.Generator().manual_seed(0)
    a, p, n = (torch.randn(6, 16, generator=g) for _ in range(3))
    labels = torch.tensor([0.1, 0.9, 0.5, 0.5, 0.3, 1.0])
    mnrl = st_loss("MultipleNegativesRankingLoss", scale=20.0)
    torch.testing.assert_close(mnrl_loss(a, torch.cat([p, n]), 20.0), mnrl.compute_loss_from_embeddings([a, p, n], None))
    torch.testing.assert_close(mnrl_loss(a, p, 20.0), mnrl.compute_loss_from_embeddings([a, p], None))
    cosent = st_loss("CoSENTLoss", scale=20.0)
    torch.testing.assert_close(cosent_loss(a, p, labels, 20.0), cosent.compute_loss_from_embeddings([a, p], labels))
    cos = st_loss("CosineSimilarityLoss")
    torch.testing.assert_close(cosine_loss(a, p, labels), cos.compute_loss_from_embeddings([a, p], labels))


def test_batches_never_repeat_a_text_and_cover_every_row():
    texts = [f"p{i % 5}" for i in range(40)]                 # 8 questions on each of 5 paragraphs
    pairs = Pairs("x", [f"q{i}" for i in range(40)], texts)
    batches = epoch_batches(40, 4, random.Random(0), pairs.texts)
    assert sorted(i for b in batches for i in b) == list(range(40))
    for b in batches:
        assert len({pairs.positives[i] for i in b}) == len(b) <= 4
    plain = epoch_batches(40, 4, random.Random(0))
    assert len(plain) == 10 and sorted(i for b in plain for i in b) == list(range(40))


def test_columns_by_name_order_and_option(tmp_path):
    assert pick_columns({"id": 1, "anchor": "a", "positive": "b", "negative": "c"}, None, "f") == (
        ["anchor", "positive", "negative"], None)
    assert pick_columns({"sentence1": "a", "sentence2": "b", "score": "4.2"}, None, "f") == (
        ["sentence1", "sentence2"], "score")
    assert pick_columns({"idx": "3", "q": "a", "d": "b", "label": 1}, None, "f") == (["q", "d"], "label")
    assert pick_columns({"x": "a", "y": "b", "z": "0.5"}, "x,y,z", "f") == (["x", "y"], "z")
    assert pick_columns({"x": "a", "y": "b", "z": "c"}, "x,y,z", "f") == (["x", "y", "z"], None)
    with pytest.raises(BertkitError, match="no column 'w'"):
        pick_columns({"x": "a", "y": "b"}, "x,w", "f")
    with pytest.raises(BertkitError, match="two text columns"):
        pick_columns({"x": "a", "n": 3}, None, "f")
    f = tmp_path / "scored.csv"
    f.write_text("sentence1,sentence2,score\na b,a c,4.5\nd e,,1\nf g,f h,x\n", encoding="utf-8")
    with pytest.raises(BertkitError, match=r"scored.csv:3: empty or non-text 'sentence2'"):
        read_pairs(f)
    got = read_pairs(f, skip_bad_rows=True)
    assert (got.anchors, got.positives, got.scores) == (["a b"], ["a c"], [4.5])


def test_squad_and_unscored_dev_sets_are_retrieval(tmp_path):
    doc = {"version": "1.1", "data": [{"title": "T", "paragraphs": [
        {"context": "the tower is tall.", "qas": [{"id": "1", "question": "is it tall?",
                                                    "answers": [{"text": "tall", "answer_start": 13}]},
                                                   {"id": "2", "question": "what is tall?",
                                                    "answers": [{"text": "the tower", "answer_start": 0}]}]},
        {"context": "the sea is wide.", "qas": [{"id": "3", "question": "is it wide?",
                                                  "answers": [{"text": "wide", "answer_start": 11}]}]}]}]}
    f = tmp_path / "dev.json.gz"
    with gzip.open(f, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh)
    pairs = read_pairs(f)
    assert pairs.anchors == ["is it tall?", "what is tall?", "is it wide?"] and pairs.positives[1] == "the tower is tall."
    dev = dev_set(str(f), None, False, None)
    assert isinstance(dev, Retrieval) and len(dev.corpus) == 2 and dev.relevant["2"] == {"0"}
    j = tmp_path / "dev.jsonl"
    j.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in PAIRS[:3]))
    dev = dev_set(str(j), None, False, None)
    assert isinstance(dev, Retrieval) and dev.queries["1"] == PAIRS[1][0] and dev.relevant["1"] == {"1"}
    s = tmp_path / "sts.jsonl"
    s.write_text("".join(json.dumps({"sentence1": a, "sentence2": p, "score": i}) + "\n" for i, (a, p) in enumerate(PAIRS)))
    assert isinstance(dev_set(str(s), None, False, None), ScoredPairs)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("pairs")
    (d / "train.jsonl").write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in PAIRS))
    (d / "dev.jsonl").write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in PAIRS[:4]))
    return d


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_trained_folder_gives_the_same_vectors_in_embed_serve_and_sentence_transformers(
        minilm, data_dir, tmp_path, capsys, pooling, one_thread):
    st = pytest.importorskip("sentence_transformers")
    from bertkit.cli import main
    from bertkit.infer import Predictor

    out = tmp_path / "emb"
    assert main(["finetune", "--task", "embedding", "--model", str(minilm), "--data", str(data_dir), "--out", str(out),
                 "--batch_size", "3", "--epochs", "1", "--lr", "1e-4", "--pooling", pooling, "--max_length", "32",
                 "--precision", "fp32", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["updates"] == 2 and metrics["loss"] == "mnrl" and metrics["main_metric"] == "ndcg@10"
    assert 0 < metrics["dev"]["ndcg@10"] <= 1 and summary["dev"]["ndcg@10"] == metrics["dev"]["ndcg@10"]
    assert sentence_transformers_pooling(out) == (pooling, False)
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 32
    ref = st.SentenceTransformer(str(out), device="cpu").encode(TEXTS)
    ours = Predictor.from_dir(out, precision="fp32", small_batches=False).embed(TEXTS, pooling=pooling)
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    assert main(["embed", "--model", str(out), str(tmp_path / "in.txt")]) == 0   # the pooling of the folder
    cli = np.array([json.loads(line)["embedding"] for line in capsys.readouterr().out.splitlines()])
    np.testing.assert_allclose(cli, ref, atol=1e-5)
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient
    from bertkit.serve import ServeConfig, create_app
    p = Predictor.from_dir(out, precision="fp32", small_batches=False)
    cfg = ServeConfig(max_length=p.max_length, embed_pooling=sentence_transformers_pooling(out)[0], warmup=False)
    with TestClient(create_app(p, cfg)) as client:
        r = client.post("/v1/embeddings", json={"input": TEXTS, "model": "m"})
    served = np.array([d["embedding"] for d in r.json()["data"]])
    np.testing.assert_allclose(served, ref / np.linalg.norm(ref, axis=1, keepdims=True), atol=1e-5)


def test_scored_pairs_train_with_cosent_and_bad_options(minilm, tmp_path, capsys, one_thread):
    from bertkit.cli import main

    f = tmp_path / "sts.csv"
    f.write_text("sentence1,sentence2,score\n" + "".join(f"{a},{p},{i % 5}\n" for i, (a, p) in enumerate(PAIRS)))
    out = tmp_path / "sts"
    base = ["finetune", "--task", "embedding", "--model", str(minilm), "--train_file", str(f), "--batch_size", "6",
            "--epochs", "1", "--max_length", "24", "--precision", "fp32", "--no-progress"]
    assert main(base + ["--dev_file", str(f), "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["loss"] == "cosent" and metrics["main_metric"] == "spearman" and "pearson" in metrics["dev"]
    assert main(base + ["--out", str(tmp_path / "x"), "--embedding_loss", "mnrl", "--embedding_scale", "0"]) == 1
    assert "embedding_scale must be a finite number > 0" in capsys.readouterr().err
    g = tmp_path / "pairs.jsonl"
    g.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in PAIRS))
    assert main(base[:6] + [str(g)] + base[7:] + ["--out", str(tmp_path / "y"), "--embedding_loss", "cosine"]) == 1
    assert "needs scored pairs" in capsys.readouterr().err
