"""The APIs clients already speak, over `bertkit serve`'s pipeline: OpenAI's embeddings
(`POST /v1/embeddings`, `GET /v1/models`; the official `openai` client works with
base_url=http://HOST:PORT/v1) and text-embeddings-inference's `/embed`, `/predict`, `/rerank`.

/v1/embeddings pools as the checkpoint does (sentence-transformers' pooling config; mean
otherwise) and always returns unit vectors, as OpenAI's do. `dimensions` other than the model's
own is refused (the model was not trained to be cut). Token-id arrays as input are refused.
"""
from __future__ import annotations

from typing import Any, Literal

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel, Field

from .api import Api, LimitError, Plan, add_post, parse_body, texts_and_pairs, validate, vectors


class EmbeddingsRequest(BaseModel):
    """OpenAI's POST /v1/embeddings."""
    input: str | list[str] = Field(description="a text or a list of texts (token-id arrays are not accepted)")
    model: str = Field(description="any name; the answer reports the served model's")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32 bytes")
    dimensions: int | None = Field(None, description="must be the model's own size, if given")
    user: str | None = None
    truncate: bool = Field(False, description="bertkit extension: cut texts over --max-length instead of 413")


class TeiEmbedRequest(BaseModel):
    inputs: str | list[str]
    normalize: bool = True
    truncate: bool = False


class TeiPredictRequest(BaseModel):
    inputs: str | list[str] | list[list[str]] = Field(description="a text, a pair [a, b], or a list of [a] / [a, b]")
    raw_scores: bool = False
    truncate: bool = False


class TeiRerankRequest(BaseModel):
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False


def add_compat_routes(app: FastAPI, api: Api) -> None:
    add_post(app, api, "/v1/embeddings", embeddings_plan, EmbeddingsRequest,
             "OpenAI-compatible embeddings (mean pooling, unit length)", render_off_loop=True)

    @app.get("/v1/models", summary="OpenAI-compatible model list (the one served model)")
    async def models():
        return {"object": "list", "data": [{"id": api.cfg.served_model_name, "object": "model", "created": 0,
                                            "owned_by": "bertkit"}]}

    add_post(app, api, "/embed", tei_embed_plan, TeiEmbedRequest, "text-embeddings-inference: embeddings",
             render_off_loop=True)
    add_post(app, api, "/predict", tei_predict_plan, TeiPredictRequest, "text-embeddings-inference: classify")
    add_post(app, api, "/rerank", tei_rerank_plan, TeiRerankRequest,
             "text-embeddings-inference: rerank (a cross-encoder with one output)")


def embeddings_plan(api: Api, body: bytes) -> Plan:
    value = parse_body(body, 400)
    if isinstance(value, dict) and _token_ids(value.get("input")):
        raise LimitError(400, "input: token-id arrays are not accepted; send text (a string or a list of strings)")
    req = validate(EmbeddingsRequest, value, status=400)
    texts = _some([req.input] if isinstance(req.input, str) else req.input, "input")
    if req.dimensions is not None and req.dimensions != api.hidden:
        raise LimitError(400, f"dimensions: this model's embeddings have {api.hidden} dimensions and it was not "
                              f"trained to shorten them; omit dimensions or send {api.hidden}")
    tokens = api.count(texts, None, "inputs", req.truncate)

    def answer(rows: list) -> dict:
        data = [{"object": "embedding", "index": i, "embedding": v}
                for i, v in enumerate(vectors(rows, req.encoding_format))]
        return {"object": "list", "data": data, "model": api.cfg.served_model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return Plan("embed", {"pooling": api.cfg.embed_pooling, "normalize": True}, {"texts": texts}, tokens, answer)


# ---- text-embeddings-inference ----
def tei_embed_plan(api: Api, body: bytes) -> Plan:
    req = validate(TeiEmbedRequest, body)
    texts = _some([req.inputs] if isinstance(req.inputs, str) else req.inputs, "inputs")
    tokens = api.count(texts, None, "inputs", req.truncate)
    return Plan("embed", {"pooling": api.cfg.embed_pooling, "normalize": req.normalize}, {"texts": texts}, tokens,
                lambda r: vectors(r, "float"))


def tei_predict_plan(api: Api, body: bytes) -> Plan:
    req = validate(TeiPredictRequest, body)
    x = req.inputs
    single = isinstance(x, str) or (bool(x) and all(isinstance(s, str) for s in x))
    items = _some([[x]] if isinstance(x, str) else [x] if single else x, "inputs")   # TEI: ["a", "b"] is one pair
    if any(len(s) not in (1, 2) for s in items):
        raise LimitError(422, "inputs: each item is [text] or [text, pair]")
    texts, pairs = [s[0] for s in items], [s[1] if len(s) == 2 else None for s in items]
    pairs = pairs if any(p is not None for p in pairs) else None
    tokens = api.count(texts, pairs, "inputs", req.truncate)

    def answer(rows: list) -> Any:
        out = [_tei_scores(r, req.raw_scores) for r in rows]
        return out[0] if single else out
    return Plan("classify", {"raw": True}, texts_and_pairs(texts, pairs), tokens, answer)


def tei_rerank_plan(api: Api, body: bytes) -> Plan:
    req = validate(TeiRerankRequest, body)
    _some(req.texts, "texts")
    queries = [req.query] * len(req.texts)
    tokens = api.count(queries, req.texts, "texts", req.truncate)

    def answer(rows: list) -> list:
        scores = [r["score"] if "logits" not in r else r["logits"][0] for r in rows]
        if not req.raw_scores:
            scores = [float(1 / (1 + np.exp(-s))) for s in scores]
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
        return [{"index": i, "score": scores[i], **({"text": req.texts[i]} if req.return_text else {})}
                for i in ranked]
    return Plan("classify", {"raw": True}, {"texts": queries, "pairs": req.texts}, tokens, answer)


def _some(items: list, field: str) -> list:
    """`items`, or 400 when there are none (as text-embeddings-inference answers an empty batch, and
    /v1/embeddings an empty input)."""
    if not items:
        raise LimitError(400, f"{field}: the list is empty; send at least one text")
    return items


def _token_ids(x: Any) -> bool:
    """OpenAI also takes token ids: [1, 2] or [[1, 2], [3]]."""
    return isinstance(x, list) and bool(x) and all(isinstance(v, int) or (isinstance(v, list) and v and
                                                   all(isinstance(t, int) for t in v)) for v in x)


def _tei_scores(r: dict, raw: bool) -> list[dict]:
    if "scores" not in r:                                # regression: one value
        return [{"label": "score", "score": r["score"]}]
    scores = dict(zip(r["scores"], r["logits"])) if raw and "logits" in r else r["scores"]
    return sorted(({"label": k, "score": v} for k, v in scores.items()), key=lambda d: -d["score"])
