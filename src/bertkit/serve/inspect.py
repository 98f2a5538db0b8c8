"""`POST /v1/inspect`: `bertkit inspect`'s numbers for the server's page (its Inspect panel draws them).

The served model may be prepacked, quantised or exported, and inspection changes its attention
layers while it runs; so this route reads its own plain fp32 copy of the checkpoint folder, loaded at
the first request, and answers one request at a time on a worker thread (never on the event loop,
never on the batcher's model). Inputs up to --max-length tokens; the answer leaves out the per-head
rows and full maps (the CLI's report draws those).
"""
from __future__ import annotations

import threading

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ..inspect import InspectError, encode, inspect, load
from .api import Api, LimitError, body_schema, validate


class InspectRequest(BaseModel):
    text: str = Field(description="the text ([MASK] where an MLM checkpoint should predict)")
    pair: str | None = Field(None, description="the right-hand segment (default: the text's second half of words)")
    steps: int = Field(8, ge=0, le=32, description="tokens to generate left to right with an LM head")


KEEP = ("model", "tokens", "check", "segment", "fill_mask", "generate", "answers")


def add_inspect_route(app: FastAPI, api: Api) -> None:
    predictor, cfg = api.predictor, api.cfg
    lock = threading.Lock()
    loaded: list = []

    def work(body: bytes) -> dict:
        req = validate(InspectRequest, body)
        with lock:
            if not loaded:
                if getattr(predictor, "source", None) is None:
                    raise LimitError(404, "/v1/inspect needs the checkpoint folder the server loaded")
                loaded.append(load(predictor.source))
            try:
                n = len(encode(loaded[0], req.text, req.pair))
                if n > cfg.max_length:
                    raise LimitError(413, f"the input is {n} tokens; the limit is {cfg.max_length} (--max-length)")
                r = inspect(loaded[0], req.text, req.pair, steps=req.steps)
            except InspectError as e:
                raise LimitError(422, str(e)) from None
        a = r["attention"]
        return {**{k: r[k] for k in KEEP if k in r},
                "attention": {"position": a["position"], "mean": a["mean"], "mass": a["mass"]}}

    @app.post("/v1/inspect", summary="attention per layer and the segment-change test on one text (pair)",
              openapi_extra=body_schema(InspectRequest))
    async def inspect_route(request: Request):
        return JSONResponse(await api.offload(work, await request.body()))
