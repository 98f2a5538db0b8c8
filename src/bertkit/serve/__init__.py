"""`bertkit serve`: an HTTP API over one Predictor, with dynamic micro-batching and hard limits.

    app.py      `create_app` (the route table, the page, warm-up) and `serve` (graceful shutdown)
    api.py      what the routes run: request bodies, the bounded queue, the micro-batcher, `Api`
    http.py     `ServeConfig` and the HTTP edge: API key, bounded bodies, deadlines, strict JSON
    compat.py   the APIs clients already speak: OpenAI's and text-embeddings-inference's routes
    inspect.py  `POST /v1/inspect`, the page's Inspect panel

    request -> http: API key, body read under --max-body-bytes and --body-timeout-s
            -> handler: JSON parsed, validated and tokenised (limits: items, tokens) on a worker
               thread when the body is large, never on the event loop
            -> queue (bounded: full = 503)
            -> batcher: when the model is free, takes the requests queued meanwhile (waiting up
               to --max-wait-ms for more, 0 by default) up to --max-batch-tokens real tokens,
               runs each kind as ONE Predictor call on the model thread, and hands each
               request its own slice of the results (rendered to JSON off the event loop).

Routes: bertkit's own (/v1/embed, /v1/classify, /v1/fill-mask, /v1/ner, /v1/qa), OpenAI's
(/v1/embeddings, /v1/models), text-embeddings-inference's (/embed, /predict, /rerank), a page to
try the model (/), and /healthz, /readyz, /metrics, /v1/model, /docs.

The Predictor's padding-free batches make every input's result independent of what it is
batched with, so a batched request answers what the request alone would (to float rounding).
A failing batch is retried request by request, so one bad request cannot fail its neighbours;
a model error answers 500 and the server keeps serving; every client fault answers 4xx. SIGTERM
stops accepting connections, lets in-flight requests finish (at most --shutdown-timeout-s), exits 0.

FastAPI and uvicorn (`pip install 'bertkit[serve]'`) load with `create_app` and `serve`, at first
use: `ServeConfig` and http.py need neither (the command's options are built from them).
"""
from .http import ServeConfig

__all__ = ["ServeConfig", "create_app", "serve"]


def __getattr__(name: str):
    if name in ("create_app", "serve"):
        from . import app
        return getattr(app, name)
    raise AttributeError(f"module 'bertkit.serve' has no attribute {name!r}")
