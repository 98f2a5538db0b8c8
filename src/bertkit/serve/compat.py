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
from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from .api import Api, LimitError, Plan, body_schema, parse_body, validate, vectors


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
    cfg, count, need, handle, hidden = api.cfg, api.count, api.need, api.handle, api.hidden

    def embeddings_plan(body: bytes) -> Plan:
        value = parse_body(body, 400)
        if isinstance(value, dict) and _token_ids(value.get("input")):
            raise LimitError(400, "input: token-id arrays are not accepted; send text (a string or a list of strings)")
        req = validate(EmbeddingsRequest, value, status=400)
        texts = _some([req.input] if isinstance(req.input, str) else req.input, "input")
        if req.dimensions is not None and req.dimensions != hidden:
            raise LimitError(400, f"dimensions: this model's embeddings have {hidden} dimensions and it was not "
                                  f"trained to shorten them; omit dimensions or send {hidden}")
        tokens = count(texts, None, "inputs", req.truncate)

        def answer(rows: list) -> dict:
            data = [{"object": "embedding", "index": i, "embedding": v}
                    for i, v in enumerate(vectors(rows, req.encoding_format))]
            return {"object": "list", "data": data, "model": cfg.served_model_name,
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return Plan("embed", {"pooling": cfg.embed_pooling, "normalize": True}, {"texts": texts}, tokens, answer)

    @app.post("/v1/embeddings", summary="OpenAI-compatible embeddings (mean pooling, unit length)",
              openapi_extra=body_schema(EmbeddingsRequest))
    async def embeddings(request: Request):
        return await handle(request, embeddings_plan, render_off_loop=True)

    @app.get("/v1/models", summary="OpenAI-compatible model list (the one served model)")
    async def models():
        return {"object": "list", "data": [{"id": cfg.served_model_name, "object": "model", "created": 0,
                                            "owned_by": "bertkit"}]}

    # ---- text-embeddings-inference ----
    def tei_embed_plan(body: bytes) -> Plan:
        req = validate(TeiEmbedRequest, body)
        texts = _some([req.inputs] if isinstance(req.inputs, str) else req.inputs, "inputs")
        tokens = count(texts, None, "inputs", req.truncate)
        return Plan("embed", {"pooling": cfg.embed_pooling, "normalize": req.normalize}, {"texts": texts}, tokens,
                    lambda r: vectors(r, "float"))

    @app.post("/embed", summary="text-embeddings-inference: embeddings", openapi_extra=body_schema(TeiEmbedRequest))
    async def tei_embed(request: Request):
        return await handle(request, tei_embed_plan, render_off_loop=True)

    def tei_predict_plan(body: bytes) -> Plan:
        req = validate(TeiPredictRequest, body)
        x = req.inputs
        single = isinstance(x, str) or (bool(x) and all(isinstance(s, str) for s in x))
        items = _some([[x]] if isinstance(x, str) else [x] if single else x, "inputs")   # TEI: ["a", "b"] is one pair
        if any(len(s) not in (1, 2) for s in items):
            raise LimitError(422, "inputs: each item is [text] or [text, pair]")
        texts, pairs = [s[0] for s in items], [s[1] if len(s) == 2 else None for s in items]
        has_pairs = any(p is not None for p in pairs)
        tokens = count(texts, pairs if has_pairs else None, "inputs", req.truncate)

        def answer(rows: list) -> Any:
            out = [_tei_scores(r, req.raw_scores) for r in rows]
            return out[0] if single else out
        return Plan("classify", {"raw": True}, {"texts": texts, "pairs": pairs} if has_pairs else {"texts": texts},
                    tokens, answer)

    @app.post("/predict", include_in_schema="/predict" in api.available, summary="text-embeddings-inference: classify",
              openapi_extra=body_schema(TeiPredictRequest))
    async def tei_predict(request: Request):
        need("/predict")
        return await handle(request, tei_predict_plan)

    def tei_rerank_plan(body: bytes) -> Plan:
        req = validate(TeiRerankRequest, body)
        _some(req.texts, "texts")
        queries = [req.query] * len(req.texts)
        tokens = count(queries, req.texts, "texts", req.truncate)

        def answer(rows: list) -> list:
            scores = [r["score"] if "logits" not in r else r["logits"][0] for r in rows]
            if not req.raw_scores:
                scores = [float(1 / (1 + np.exp(-s))) for s in scores]
            ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
            return [{"index": i, "score": scores[i], **({"text": req.texts[i]} if req.return_text else {})}
                    for i in ranked]
        return Plan("classify", {"raw": True}, {"texts": queries, "pairs": req.texts}, tokens, answer)

    @app.post("/rerank", include_in_schema="/rerank" in api.available, summary="text-embeddings-inference: rerank "
              "(a cross-encoder with one output)", openapi_extra=body_schema(TeiRerankRequest))
    async def tei_rerank(request: Request):
        need("/rerank")
        return await handle(request, tei_rerank_plan)


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
    if raw and "logits" in r:
        scores = dict(zip(r["scores"], r["logits"]))
    else:
        scores = r["scores"]
    return sorted(({"label": k, "score": v} for k, v in scores.items()), key=lambda d: -d["score"])
