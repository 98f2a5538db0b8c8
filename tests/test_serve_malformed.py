"""The server's malformed-input corpus (tests/data/serve_malformed.jsonl): bodies no route accepts
(not JSON, NaN / Infinity, numbers out of range, lone surrogates in strings or keys, invalid
UTF-8, nesting beyond the parser, wrong top-level types) sent to every POST route, plus bad
bodies for each route and odd-but-valid ones. Every bad one answers 4xx with a one-line message
(never 500, never an echo of the input), every odd one answers below 500, and the server serves
on. Each route is tried on a checkpoint whose head has it, so the body is parsed, not refused
with 404."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from serve_helpers import tiny_checkpoint  # noqa: E402

from bertkit.infer import Predictor  # noqa: E402
from bertkit.serve import ServeConfig, create_app  # noqa: E402

CORPUS = Path(__file__).parent / "data" / "serve_malformed.jsonl"
HEADS = {  # app: (head, build arguments, routes it answers)
    "mlm": ("masked_lm", {}, ["/v1/embed", "/v1/embeddings", "/embed", "/v1/fill-mask"]),
    "cls": ("sequence_classification", {"num_labels": 2, "names": ["neg", "pos"]}, ["/v1/classify", "/predict"]),
    "rank": ("sequence_classification", {"num_labels": 1}, ["/rerank"]),
    "ner": ("token_classification", {"num_labels": 3, "names": ["B-PER", "I-PER", "O"]}, ["/v1/ner"]),
    "qa": ("question_answering", {}, ["/v1/qa"]),
}


def cases() -> list[dict]:
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    routes = [r for _, _, rs in HEADS.values() for r in rs]
    out = []
    for row in rows:
        body = bytes.fromhex(row["body_hex"]) if "body_hex" in row else row["body"].encode("utf-8", "surrogatepass")
        for route in (routes if row["route"] == "*" else [row["route"]]):
            out.append({"route": route, "name": row["name"], "body": body, "expect": row["expect"]})
    return out


@pytest.fixture(scope="module")
def clients(tmp_path_factory, minilm):
    root = tmp_path_factory.mktemp("malformed")
    out = {}
    for name, (head, args, routes) in HEADS.items():
        args = dict(args)
        names = args.pop("names", None)
        p = Predictor.from_dir(tiny_checkpoint(root / name, head, minilm, names=names, **args), device="cpu")
        client = TestClient(create_app(p, ServeConfig(max_length=p.max_length, warmup=False)))
        client.__enter__()
        for r in routes:
            out[r] = client
    yield out
    for c in set(out.values()):
        c.__exit__(None, None, None)


def test_corpus_size():
    all_cases = cases()
    assert len(all_cases) >= 300, len(all_cases)
    assert sum(c["expect"] == "4xx" for c in all_cases) >= 300


def test_malformed_bodies_answer_4xx(clients):
    failures, statuses = [], {}
    all_cases = cases()
    for case in all_cases:
        r = clients[case["route"]].post(case["route"], content=case["body"], headers={"content-type": "application/json"})
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        ok = 400 <= r.status_code < 500 and r.status_code != 404 if case["expect"] == "4xx" else r.status_code < 500
        message = ""
        if r.status_code >= 400:
            try:
                data = r.json()
                message = data.get("detail") or data.get("error", {}).get("message")
            except ValueError:
                ok = False
            ok = ok and isinstance(message, str) and "\n" not in message and len(message) < 400
        if not ok:
            failures.append((case["route"], case["name"], r.status_code, r.text[:200]))
    print(f"{len(all_cases)} cases: status counts {dict(sorted(statuses.items()))}")
    assert not failures, f"{len(failures)} of {len(all_cases)} failed: {failures[:10]}"
    for c in set(clients.values()):
        assert c.get("/healthz").status_code == 200
        assert 'code="500"' not in c.get("/metrics").text
