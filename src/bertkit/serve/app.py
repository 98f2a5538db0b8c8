"""`bertkit serve`'s app: the route table over one Predictor, the page, warm-up, graceful shutdown."""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from .. import __version__
from ..infer import Predictor, PredictorError
from ..infer.prepack import warm_gemm_shapes
from .api import (Api, Batcher, ClassifyRequest, ClassifyResponse, EmbedRequest, EmbedResponse, FillMaskRequest,
                  FillMaskResponse, LimitError, NerRequest, NerResponse, Plan, QaRequest, QaResponse, add_post,
                  texts_and_pairs, validate, vectors)
from .compat import add_compat_routes
from ..heap import Heap
from .http import Guard, Metrics, ServeConfig, error_payload, guarded_protocol
from .inspect import add_inspect_route

log = logging.getLogger("bertkit")


def create_app(predictor: Predictor, cfg: ServeConfig | None = None) -> Any:
    """The ASGI app: FastAPI routes inside `http.Guard` (run it with `serve`, or test it
    with fastapi.testclient.TestClient). `app.fastapi` is the FastAPI object.

    Handlers return JSON bytes, rendered off the event loop when large: skipping FastAPI's
    per-float re-validation of the embeddings keeps the loop free under load."""
    cfg = cfg or ServeConfig(max_length=predictor.max_length)
    metrics = Metrics()
    api = Api(predictor, cfg, Batcher(predictor, cfg, metrics))
    app = FastAPI(title="bertkit", version=__version__, lifespan=lifespan,
                  description=f"BERT inference ({predictor.head} head, {predictor.backend} backend).")
    app.state.api, app.state.ready = api, False
    add_error_handlers(app, cfg)
    add_task_routes(app, api)
    add_compat_routes(app, api)
    add_inspect_route(app, api)
    guarded = Guard(app, cfg, metrics.request,
                    headers={"X-Bertkit-Precision": str(predictor.precision)})   # which precision made a vector
    guarded.fastapi = app
    add_service_routes(app, api, metrics, guarded)
    return guarded


@asynccontextmanager
async def lifespan(app: FastAPI):
    """Before the first request: the batcher started, the model warmed up on its thread, what the load
    made frozen out of the garbage collector's scans. After the last: the batcher stopped (in-flight
    work finished), the preparing threads let go, the collector sees everything again."""
    api = app.state.api
    api.batcher.start()
    await asyncio.get_running_loop().run_in_executor(api.batcher.executor, warm_up, api.predictor, api.cfg)
    # what the load made (model, tokenizer, runtimes) lives as long as the server: out of the collector's
    # sight, a full collection scans only what requests made instead of stalling every request for tens
    # of ms (docs/serve-measurements.md)
    gc.collect()
    gc.freeze()
    app.state.ready = True
    log.info("bertkit serve: %s head, endpoints %s", api.predictor.head, ", ".join(sorted(api.available)))
    yield
    app.state.ready = False
    await api.batcher.stop()
    gc.unfreeze()
    api.prep.shutdown(wait=False)


def add_error_handlers(app: FastAPI, cfg: ServeConfig) -> None:
    """Every error a JSON body: a client's fault 4xx (503 with Retry-After when full), a model's 500."""
    @app.exception_handler(LimitError)
    async def limit_error(request: Request, e: LimitError):
        headers = {"Retry-After": str(cfg.retry_after_s)} if e.status == 503 else None
        return JSONResponse(error_payload(request.url.path, e.status, str(e)), status_code=e.status, headers=headers)

    @app.exception_handler(PredictorError)
    async def predictor_error(request: Request, e: PredictorError):
        return JSONResponse(error_payload(request.url.path, 422, str(e)), status_code=422)

    @app.exception_handler(Exception)
    async def model_error(request: Request, e: Exception):
        return JSONResponse(error_payload(request.url.path, 500, f"model error: {type(e).__name__}: {str(e)[:300]}"),
                            status_code=500)


# ---- bertkit's own routes: a request body to a Plan -----------------------------------------------
def add_task_routes(app: FastAPI, api: Api) -> None:
    add_post(app, api, "/v1/embed", embed_plan, EmbedRequest, "sentence or token embeddings", EmbedResponse,
             render_off_loop=True)
    add_post(app, api, "/v1/classify", classify_plan, ClassifyRequest, "sequence (pair) classification",
             ClassifyResponse)
    add_post(app, api, "/v1/fill-mask", fill_mask_plan, FillMaskRequest, "top-k words for each [MASK]",
             FillMaskResponse)
    add_post(app, api, "/v1/ner", ner_plan, NerRequest, "word-level named entities", NerResponse)
    add_post(app, api, "/v1/qa", qa_plan, QaRequest, "extractive question answering", QaResponse)


def embed_plan(api: Api, body: bytes) -> Plan:
    req = validate(EmbedRequest, body)
    tokens = api.count(req.texts, req.pairs, "texts", req.truncate)
    pooling = req.pooling or api.cfg.embed_pooling
    normalize = api.cfg.embed_normalize if req.normalize is None else req.normalize
    return Plan("embed", {"pooling": pooling, "normalize": normalize}, texts_and_pairs(req.texts, req.pairs), tokens,
                lambda r: {"embeddings": vectors(r, "float")})


def classify_plan(api: Api, body: bytes) -> Plan:
    req = validate(ClassifyRequest, body)
    tokens = api.count(req.texts, req.pairs, "texts", req.truncate)
    return Plan("classify", {}, texts_and_pairs(req.texts, req.pairs), tokens, lambda r: {"results": r})


def fill_mask_plan(api: Api, body: bytes) -> Plan:
    req = validate(FillMaskRequest, body)
    tokens = api.count(req.texts, None, "texts", req.truncate)
    mask_id = api.tok.mask_id
    for i, ids in enumerate(api.tok.encode_ids(req.texts)):
        if mask_id not in ids[:api.cfg.max_length - 2]:
            raise LimitError(422, f"text {i} has no [MASK] token" + (" within --max-length" if mask_id in ids else ""))
    return Plan("fill_mask", {"top_k": req.top_k}, {"texts": req.texts}, tokens, lambda r: {"results": r})


def ner_plan(api: Api, body: bytes) -> Plan:
    req = validate(NerRequest, body)
    flat = [t if isinstance(t, str) else " ".join(t) for t in req.texts]
    for i, t in enumerate(req.texts):
        if (isinstance(t, list) and not t) or not flat[i].strip():
            raise LimitError(422, f"text {i} has no words")
    tokens = api.count(flat, None, "texts", False, windowed=True)
    return Plan("ner", {}, {"texts": req.texts}, tokens, lambda r: {"results": r})


def qa_plan(api: Api, body: bytes) -> Plan:
    req = validate(QaRequest, body)
    if len(req.questions) != len(req.contexts):
        raise LimitError(422, f"{len(req.questions)} questions but {len(req.contexts)} contexts")
    for i, (q, c) in enumerate(zip(req.questions, req.contexts)):
        if not q.strip() or not c.strip():
            raise LimitError(422, f"question {i}: question and context must be non-empty")
    tokens = api.count(req.questions, req.contexts, "questions", False, windowed=True)
    return Plan("qa", {}, {"questions": req.questions, "contexts": req.contexts}, tokens, lambda r: {"answers": r})


# ---- the page and the service routes -------------------------------------------------------------
def add_service_routes(app: FastAPI, api: Api, metrics: Metrics, guarded: Guard) -> None:
    predictor, cfg, batcher = api.predictor, api.cfg, api.batcher

    @app.get("/", response_class=HTMLResponse, summary="a page to try the model")
    async def page():
        return HTMLResponse(_page())

    @app.get("/healthz", summary="the process is up")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz", summary="the model is loaded and the server accepts work")
    async def readyz():
        if not app.state.ready:
            return JSONResponse({"status": "not ready"}, status_code=503)
        return {"status": "ready"}

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
    async def prometheus():
        metrics.queue_depth = batcher.queue.qsize() + len(batcher.held) if batcher.queue else 0
        metrics.in_flight = guarded.in_flight
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/model", summary="the loaded model, its endpoints and the server's limits")
    async def model_info():
        c = predictor.config
        describe = getattr(predictor, "describe", None)
        return {"head": predictor.head, "backend": predictor.backend, "int8": predictor.int8,
                "int8_agreement": predictor.int8_agreement,
                "prepacked": predictor.prepacked, "compiled": predictor.compiled,
                "runtime": describe() if callable(describe) else None,
                "hidden_size": c.hidden_size, "num_layers": c.num_layers, "labels": predictor.label_names()
                if predictor.head in ("sequence_classification", "token_classification") else None,
                "model": cfg.served_model_name,
                "embedding": {"pooling": cfg.embed_pooling, "normalize": cfg.embed_normalize,
                              "dimensions": c.hidden_size},
                "endpoints": sorted(api.available), "limits": cfg.public()}


def warm_up(predictor: Predictor, cfg: ServeConfig) -> None:
    """One request's worth of work, then (cfg.warmup, prepacked weights) every GEMM shape."""
    predictor.embed(["warm up"])
    if cfg.warmup and predictor.prepacked:
        t0, before = time.perf_counter(), Heap.rss_mb()
        n = warm_gemm_shapes(predictor.model, cfg.max_batch_tokens)
        Heap().trim()                                 # the warm-up's inputs and outputs are gone
        log.info("warm-up: %d GEMM shapes up to %d rows in %.1f s (RSS %+.0f MB)", n, cfg.max_batch_tokens,
                 time.perf_counter() - t0, Heap.rss_mb() - before)


def _page() -> str:
    return (resources.files("bertkit") / "static" / "index.html").read_text(encoding="utf-8")


def serve(predictor: Predictor, cfg: ServeConfig, log_level: str = "info") -> int:
    """Run the server until SIGTERM / SIGINT; in-flight requests finish first (at most
    cfg.shutdown_timeout_s). Returns 0."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):                  # SIGTERM is the normal way to stop: exit 0
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM and sig in self._captured_signals:
                self._captured_signals.remove(sig)

    Heap().limit_arenas(2)          # threads otherwise each grow their own malloc arena, kept forever
    Heap().keep_while_busy()        # one batch's activations reuse the last one's pages (trimmed when idle)
    app = create_app(predictor, cfg)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=log_level, access_log=False,
                            http=guarded_protocol(cfg.header_timeout_s, cfg.send_timeout_s),
                            timeout_graceful_shutdown=cfg.shutdown_timeout_s, backlog=2048,
                            timeout_keep_alive=cfg.keep_alive_s, limit_concurrency=cfg.max_connections)
    server = Server(config)
    server.run()
    return 0 if server.started else 1
