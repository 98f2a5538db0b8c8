"""bertkit.embed_eval: similarity and retrieval metrics equal sentence-transformers' own evaluators
(to 1e-4, fp32, all-MiniLM-L6-v2 with mean and [CLS] pooling on slices of the shared STS-B and
SQuAD dev data), the readers (STS-B folder, CSV columns, SQuAD, BEIR), and `bertkit embed-eval`."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from bertkit.embed_eval import (Retrieval, evaluate_retrieval, evaluate_similarity, rank, read_beir, read_retrieval,
                                read_scored_pairs, retrieval_metrics)
from bertkit.errors import BertkitError

st = pytest.importorskip("sentence_transformers")

METRICS = ("recall@1", "recall@10", "mrr@10", "ndcg@10")


@pytest.fixture(scope="module")
def predictor(minilm):
    from bertkit.infer import Predictor
    return Predictor.from_dir(minilm, precision="fp32", small_batches=False)


@pytest.fixture(scope="module")
def st_models(minilm):
    """all-MiniLM-L6-v2 in sentence-transformers with its own mean pooling, and with [CLS] pooling."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    mean = SentenceTransformer(str(minilm), device="cpu")
    cls = SentenceTransformer(modules=[Transformer(str(minilm), max_seq_length=256), Pooling(384, "cls")], device="cpu")
    return {"mean": mean, "cls": cls}


def ir_evaluator(data: Retrieval, **kw):
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
    from sentence_transformers.util import cos_sim
    return InformationRetrievalEvaluator(data.queries, data.corpus, data.relevant, accuracy_at_k=[1, 10],
                                         precision_recall_at_k=[1, 10], mrr_at_k=[10], ndcg_at_k=[10], map_at_k=[10],
                                         score_functions={"cosine": cos_sim}, write_csv=False, **kw)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_similarity_equals_sentence_transformers(predictor, st_models, shared_data, pooling):
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    data = read_scored_pairs(shared_data / "glue" / "STS-B", "dev", limit=48)
    ours = evaluate_similarity(predictor, data, pooling)
    theirs = EmbeddingSimilarityEvaluator(data.sentences1, data.sentences2, data.scores, main_similarity="cosine",
                                          write_csv=False)(st_models[pooling])
    assert ours["pairs"] == 48
    assert ours["spearman"] == pytest.approx(theirs["spearman_cosine"], abs=1e-4)
    assert ours["pearson"] == pytest.approx(theirs["pearson_cosine"], abs=1e-4)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_retrieval_equals_sentence_transformers(predictor, st_models, shared_data, pooling):
    data = read_retrieval(shared_data / "squad" / "dev.json.gz", limit=40)
    ours = evaluate_retrieval(predictor, data, pooling)
    theirs = ir_evaluator(data)(st_models[pooling])
    assert (ours["queries"], ours["corpus"]) == (40, len(data.corpus)) and len(data.corpus) >= 5
    for m in METRICS:
        key = "cosine_" + ("accuracy@1" if m == "recall@1" else m)
        assert ours[m] == pytest.approx(theirs[key], abs=1e-4), m
    assert ours["recall@10"] == pytest.approx(theirs["cosine_recall@10"], abs=1e-4)


def test_ranking_and_metrics_follow_sentence_transformers_on_ties_and_many_relevant():
    """Duplicate passages (equal scores) rank by id; several relevant passages per query: the
    metrics equal InformationRetrievalEvaluator.compute_metrics on the same ranking."""
    rng = np.random.default_rng(0)
    corpus = rng.standard_normal((30, 8)).astype(np.float32)
    corpus[[3, 17, 25]] = corpus[5]                        # four equal passages
    ids = [f"d{i}" for i in range(30)]
    queries = np.concatenate([corpus[[5]], rng.standard_normal((9, 8)).astype(np.float32)])
    ranked = rank(queries, corpus, ids, k=10, chunk=7)
    assert ranked[0][:4] == sorted(["d5", "d3", "d17", "d25"])
    relevant = [set(random.Random(i).sample(ids, 1 + i % 4)) for i in range(10)]
    data = Retrieval("x", {str(i): "q" for i in range(10)}, {c: "p" for c in ids},
                     {str(i): r for i, r in enumerate(relevant)})
    theirs = ir_evaluator(data).compute_metrics([[{"corpus_id": c, "score": -j} for j, c in enumerate(r)]
                                                 for r in ranked])
    ours = retrieval_metrics(ranked, relevant)
    assert ours["recall@1"] == pytest.approx(theirs["recall@k"][1])
    assert ours["recall@10"] == pytest.approx(theirs["recall@k"][10])
    assert ours["mrr@10"] == pytest.approx(theirs["mrr@k"][10])
    assert ours["ndcg@10"] == pytest.approx(theirs["ndcg@k"][10])


def test_pooler_pooling_is_the_pretrained_pooler(predictor, minilm):
    transformers = pytest.importorskip("transformers")
    texts = ["a man plays the flute.", "the cat sat on the mat, quietly."]
    hf = transformers.BertModel.from_pretrained(str(minilm)).eval()
    enc = transformers.AutoTokenizer.from_pretrained(str(minilm))(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = hf(**enc).pooler_output.numpy()
    np.testing.assert_allclose(predictor.embed(texts, pooling="pooler"), ref, atol=1e-5)


def test_readers_csv_columns_beir_and_bad_rows(tmp_path):
    f = tmp_path / "pairs.csv"
    f.write_text("a,b,gold\nfirst one,second one,4.5\nx,y,0\n", encoding="utf-8")
    data = read_scored_pairs(f, columns=("a", "b", "gold"))
    assert (data.sentences1, data.sentences2, data.scores) == (["first one", "x"], ["second one", "y"], [4.5, 0.0])
    with pytest.raises(BertkitError, match="pairs.csv:2: no score in 'score'"):
        read_scored_pairs(f, columns=("a", "b", "score"))
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "title": "T", "text": "one"}\n{"_id": "d2", "text": "two"}\n')
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "which?"}\n{"_id": "q2", "text": "what?"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\nq2\td2\t2\n")
    r = read_retrieval(beir, "test")
    assert r.corpus == {"d1": "T one", "d2": "two"} and r.relevant == {"q1": {"d1"}, "q2": {"d2"}}
    assert r.queries == {"q1": "which?", "q2": "what?"}
    with pytest.raises(BertkitError, match="no qrels/dev.tsv.*test.tsv"):
        read_beir(beir, "dev")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\n")
    with pytest.raises(BertkitError, match=r"test.tsv:2: expected"):
        read_beir(beir, "test")


def test_embed_eval_command(minilm, tmp_path, capsys):
    from bertkit.cli import main

    f = tmp_path / "pairs.jsonl"
    rows = [("a man plays a flute", "a man plays the flute", 4.8), ("a dog runs", "a cat sleeps", 0.6),
            ("the sky is blue", "the sky is clear and blue", 3.9), ("he cooks", "she reads a book", 0.2)]
    f.write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in rows))
    assert main(["embed-eval", "--model", str(minilm), "--sts", str(f), "--pooling", "cls,mean", "--json"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["pooling"], r["own"], r["pairs"], r["precision"]) for r in out] == [
        ("cls", False, 4, "float32"), ("mean", True, 4, "float32")]
    assert main(["embed-eval", "--model", str(minilm)]) == 1
    assert "--sts SOURCE" in capsys.readouterr().err
    assert main(["embed-eval", "--model", str(minilm), "--sts", str(f), "--pooling", "max"]) == 1
    assert "choose among mean, cls, pooler" in capsys.readouterr().err
    assert main(["embed-eval", "--model", str(minilm), "--sts", str(f), "--batch-size", "0"]) == 1
    assert capsys.readouterr().err == "bertkit embed-eval: error: batch_size must be at least 1, got 0\n"   # EmbedEvalOptions
