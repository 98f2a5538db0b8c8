"""The APIs clients already speak, and who may call them: the official `openai` client against
/v1/embeddings and /v1/models of a real server on all-MiniLM-L6-v2 (vectors equal to
sentence-transformers'), text-embeddings-inference's /embed, /predict and /rerank, the API key
(401 without it, constant-time compare, /healthz and the page open) and the refusal to bind
beyond loopback without a key."""
from __future__ import annotations

import base64
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
from fastapi.testclient import TestClient  # noqa: E402
from serve_helpers import server_thread, tiny_checkpoint  # noqa: E402

from bertkit.errors import BertkitError  # noqa: E402
from bertkit.infer import Predictor  # noqa: E402
from bertkit.serve import ServeConfig, create_app  # noqa: E402
from bertkit.serve.http import check_bind, is_loopback, key_matches  # noqa: E402
from bertkit.st_files import sentence_transformers_pooling  # noqa: E402

TEXTS = ["The quick brown fox jumps over the lazy dog.", "hi", "A man is playing a guitar on stage."]


@pytest.fixture(scope="module")
def minilm_app(minilm):
    pytest.importorskip("onnxruntime")
    p = Predictor.from_dir(minilm, device="cpu", small_batches=True, small_batch_tokens=64)   # short inputs on the onnxruntime engine
    assert p.small is not None, p.small_reason
    pooling, normalize = sentence_transformers_pooling(minilm)
    assert (pooling, normalize) == ("mean", True)          # modules.json: Pooling (mean) + Normalize
    cfg = ServeConfig(max_length=p.max_length, embed_pooling=pooling, embed_normalize=normalize,
                      served_model_name="all-MiniLM-L6-v2", max_request_items=8, warmup=False)
    return p, cfg


def test_openai_client_embeddings(minilm_app, minilm):
    openai = pytest.importorskip("openai")
    st = pytest.importorskip("sentence_transformers")
    p, cfg = minilm_app
    with server_thread(create_app(p, cfg)) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        default = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)   # the client asks for base64
        floats = client.embeddings.create(model="anything", input=TEXTS, encoding_format="float")
        one = client.embeddings.create(model="m", input=TEXTS[0], dimensions=384)
        assert [d.index for d in default.data] == [0, 1, 2] and all(d.object == "embedding" for d in default.data)
        assert default.model == "all-MiniLM-L6-v2" and default.object == "list"
        a, b = np.array([d.embedding for d in default.data]), np.array([d.embedding for d in floats.data])
        assert a.shape == (3, 384) and len(one.data) == 1
        np.testing.assert_allclose(a, b, atol=1e-6)                      # base64 = little-endian float32
        np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1, atol=1e-5)
        ref = st.SentenceTransformer(str(minilm), device="cpu").encode(TEXTS)
        cos = (a * ref).sum(1) / np.linalg.norm(ref, axis=1)
        assert cos.min() > 0.9999, cos                                   # what sentence-transformers gives
        tokens = sum(len(e.input_ids) for e in p.encode(TEXTS))
        assert default.usage.prompt_tokens == default.usage.total_tokens == tokens
        assert [m.id for m in client.models.list().data] == ["all-MiniLM-L6-v2"]
        for bad in ({"input": [[101, 102]]}, {"input": [1, 2, 3]}, {"input": []}, {"input": "a", "dimensions": 64},
                    {"input": ["a"] * 9}, {"input": "word " * 400}):
            with pytest.raises(openai.APIStatusError) as err:
                client.embeddings.create(model="m", **bad)
            assert 400 <= err.value.status_code < 500 and err.value.body["message"], bad
        # "truncate" is bertkit's extension, reachable with extra_body
        long = client.embeddings.create(model="m", input="word " * 400, extra_body={"truncate": True})
        assert long.usage.prompt_tokens == p.max_length


def test_openai_client_api_key(minilm_app):
    openai = pytest.importorskip("openai")
    p, cfg = minilm_app
    from dataclasses import replace
    with server_thread(create_app(p, replace(cfg, api_key="k-123"))) as port:
        url = f"http://127.0.0.1:{port}/v1"
        with pytest.raises(openai.AuthenticationError) as err:
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).embeddings.create(model="m", input="a")
        assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
        r = openai.OpenAI(base_url=url, api_key="k-123", max_retries=0).embeddings.create(model="m", input="a")
        assert len(r.data[0].embedding) == 384


def test_api_key_on_every_route_but_healthz_and_page(minilm_app):
    from dataclasses import replace
    p, cfg = minilm_app
    with TestClient(create_app(p, replace(cfg, api_key="s3cret"))) as c:
        good = {"authorization": "Bearer s3cret"}
        assert c.get("/healthz").status_code == 200 and c.get("/").status_code == 200
        for method, path in (("get", "/readyz"), ("get", "/metrics"), ("get", "/v1/model"), ("get", "/docs"),
                             ("get", "/openapi.json"), ("post", "/v1/embed"), ("post", "/v1/embeddings"),
                             ("post", "/embed"), ("get", "/v1/models"), ("post", "/v1/classify"), ("get", "/nope")):
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic s3cret"},
                            {"authorization": "s3cret"}, {"authorization": "Bearer s3cre"}, {"authorization": "Bearer"}):
                r = getattr(c, method)(path, headers=headers)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (path, headers)
        r = c.post("/v1/embed", json={"texts": ["a"]}, headers=good)
        assert r.status_code == 200
        info = c.get("/v1/model", headers=good).json()
        assert info["limits"]["api_key_required"] is True and "s3cret" not in str(info)
        assert "s3cret" not in repr(replace(cfg, api_key="s3cret"))
    assert key_matches(b"Bearer k", b"k") and key_matches(b"bearer  k ", b"k") and not key_matches(None, b"k")
    assert not key_matches(b"Bearer k2", b"k") and not key_matches(b"Token k", b"k")


def test_bind_beyond_loopback_needs_a_key(minilm, tmp_path):
    for host in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
        check_bind(host, None)
    for host in ("0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "example.com", "127.0.0.1.example.com", ""):
        assert not is_loopback(host), host
        with pytest.raises(BertkitError, match="--insecure-no-api-key"):
            check_bind(host, None)
        check_bind(host, "a key")
        check_bind(host, None, insecure=True)
    with pytest.raises(BertkitError, match="empty"):
        check_bind("127.0.0.1", "  ")
    env = {k: v for k, v in os.environ.items() if k != "BERTKIT_API_KEY"}
    cmd = [sys.executable, "-m", "bertkit", "serve", "--model", str(tmp_path / "absent"), "--host", "0.0.0.0"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "--insecure-no-api-key" in lines[0] and "Traceback" not in r.stderr


def test_api_key_from_environment(monkeypatch):
    import argparse

    from bertkit.commands.serve import setup_serve

    for env, argv, want in (("k-env", [], "k-env"), ("k-env", ["--api-key", "k-arg"], "k-arg"), (None, [], None),
                            ("", [], None)):
        if env is None:
            monkeypatch.delenv("BERTKIT_API_KEY", raising=False)
        else:
            monkeypatch.setenv("BERTKIT_API_KEY", env)
        parser = argparse.ArgumentParser()
        setup_serve(parser)
        args = parser.parse_args(["--model", "m", "--host", "0.0.0.0", *argv])
        assert args.api_key == want
        if want is None:
            with pytest.raises(BertkitError, match="--insecure-no-api-key"):
                check_bind(args.host, args.api_key, args.insecure_no_api_key)
        else:
            check_bind(args.host, args.api_key, args.insecure_no_api_key)


def test_tei_routes(tmp_path, minilm, minilm_app):
    p, cfg = minilm_app
    with TestClient(create_app(p, cfg)) as c:
        r = c.post("/embed", json={"inputs": TEXTS[:2]})
        got = np.array(r.json())
        np.testing.assert_allclose(got, p.embed(TEXTS[:2], normalize=True), atol=1e-5)
        assert np.array(c.post("/embed", json={"inputs": "hi", "normalize": False}).json()).shape == (1, 384)
        empty = c.post("/embed", json={"inputs": []})                    # 400 as /v1/embeddings (was 200 [])
        assert empty.status_code == 400 and empty.json()["detail"] == "inputs: the list is empty; send at least one text"
        assert c.post("/predict", json={"inputs": "x"}).status_code == 404
    cls = Predictor.from_dir(tiny_checkpoint(tmp_path, "sequence_classification", minilm, names=["neg", "pos"],
                                             num_labels=2), device="cpu")
    with TestClient(create_app(cls, ServeConfig(max_length=cls.max_length, warmup=False))) as c:
        single = c.post("/predict", json={"inputs": "good film"}).json()
        pair = c.post("/predict", json={"inputs": ["good film", "bad film"]}).json()          # TEI: one pair
        batch = c.post("/predict", json={"inputs": [["good film"], ["good film", "bad film"]]}).json()
        assert [d["label"] for d in single] in (["neg", "pos"], ["pos", "neg"]) and single[0]["score"] >= single[1]["score"]
        for got, want in zip(batch, [single, pair]):                                         # batched = alone
            assert [d["label"] for d in got] == [d["label"] for d in want]
            assert [d["score"] for d in got] == pytest.approx([d["score"] for d in want], abs=1e-5)
        want = cls.classify(["good film"])[0]["scores"]
        assert {d["label"]: d["score"] for d in single} == pytest.approx(want, abs=1e-6)
        assert c.post("/rerank", json={"query": "q", "texts": ["a"]}).status_code == 404    # two labels: no reranker
        assert c.post("/predict", json={"inputs": []}).status_code == 400
    rank = Predictor.from_dir(tiny_checkpoint(tmp_path / "r", "sequence_classification", minilm, num_labels=1),
                              device="cpu")
    with TestClient(create_app(rank, ServeConfig(max_length=rank.max_length, warmup=False))) as c:
        texts = ["paris is in france", "a cat", "the eiffel tower", "bananas"]
        out = c.post("/rerank", json={"query": "where is paris", "texts": texts, "return_text": True}).json()
        raw = c.post("/rerank", json={"query": "where is paris", "texts": texts, "raw_scores": True}).json()
        logits = [r["logits"][0] if "logits" in r else r["score"]
                  for r in rank.classify(["where is paris"] * 4, texts, raw=True)]
        assert [d["index"] for d in out] == list(np.argsort(logits)[::-1])
        assert [d["score"] for d in raw] == pytest.approx(sorted(logits, reverse=True), abs=1e-5)
        assert all(0 < d["score"] < 1 and d["text"] == texts[d["index"]] for d in out)
        empty = c.post("/rerank", json={"query": "q", "texts": []})
        assert empty.status_code == 400 and empty.json()["detail"] == "texts: the list is empty; send at least one text"


def test_base64_is_little_endian_float32(minilm_app):
    p, cfg = minilm_app
    with TestClient(create_app(p, cfg)) as c:
        r = c.post("/v1/embeddings", json={"model": "m", "input": ["hi"], "encoding_format": "base64"}).json()
        vec = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), dtype="<f4")
        np.testing.assert_allclose(vec, p.embed(["hi"], normalize=True)[0], atol=1e-6)
