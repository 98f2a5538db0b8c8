"""`bertkit serve`: an HTTP API over one Predictor, with dynamic micro-batching and hard limits.

Why ~600 lines: one route table and its request models; the HTTP edge is serve_http.py and the
OpenAI / TEI routes serve_compat.py.

    request -> serve_http: API key, body read under --max-body-bytes and --body-timeout-s
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

FastAPI and uvicorn are imported only here (`pip install 'bertkit[serve]'`).
"""
from __future__ import annotations

import asyncio
import base64
import logging
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field, ValidationError

from .infer import Predictor, PredictorError
from .model import HEADS
from .serve_http import (BodyError, Guard, GuardConfig, Heap, Metrics, ServeConfig, dump_json, error_payload,
                         guarded_protocol, parse_json)

log = logging.getLogger("bertkit")


# ---- request and response bodies ----------------------------------------------------------------
class EmbedRequest(BaseModel):
    texts: list[str] = Field(description="texts to embed")
    pairs: list[str | None] | None = Field(None, description="optional second segment per text")
    pooling: Literal["mean", "cls", "none"] | None = Field(None, description="default: the checkpoint's")
    normalize: bool | None = Field(None, description="default: the checkpoint's (sentence-transformers: Normalize)")
    truncate: bool = Field(False, description="cut texts over --max-length instead of answering 413")


class EmbedResponse(BaseModel):
    embeddings: list = Field(description="one vector per text; for pooling 'none' one vector per token")


class ClassifyRequest(BaseModel):
    texts: list[str]
    pairs: list[str | None] | None = None
    truncate: bool = False


class ClassifyResponse(BaseModel):
    results: list[dict] = Field(description='per text {"label", "score", "scores"} ({"score"} for regression)')


class FillMaskRequest(BaseModel):
    texts: list[str] = Field(description="texts with one or more [MASK] tokens")
    top_k: int = Field(5, ge=1, le=100)
    truncate: bool = False


class FillMaskResponse(BaseModel):
    results: list[list[list[dict]]] = Field(description='per text, per [MASK]: [{"token", "id", "score"}]')


class NerRequest(BaseModel):
    texts: list[str | list[str]] = Field(description="strings, or lists of words")


class NerResponse(BaseModel):
    results: list[dict] = Field(description='per text {"words", "tags", "entities"}')


class QaRequest(BaseModel):
    questions: list[str]
    contexts: list[str]


class QaResponse(BaseModel):
    answers: list[dict] = Field(description='per question {"answer", "score"}')


# ---- the batcher ---------------------------------------------------------------------------------
@dataclass
class Job:
    task: str                        # embed / classify / fill_mask / ner / qa
    options: tuple                   # requests batch together only with equal options
    inputs: dict[str, list]          # lists of equal length (texts, pairs, questions, ...)
    tokens: int
    future: asyncio.Future = field(repr=False)

    @property
    def items(self) -> int:
        return len(next(iter(self.inputs.values())))


class LimitError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Batcher:
    """Queue of Jobs; one loop groups them under the token budget and runs them on the model thread."""

    IDLE_TRIM_S = 1.0                # this long without work after a round: malloc_trim

    def __init__(self, predictor: Predictor, cfg: ServeConfig, metrics: Metrics):
        self.predictor, self.cfg, self.metrics = predictor, cfg, metrics
        self.queue: asyncio.Queue[Job] | None = None
        self.held: list[Job] = []     # taken from the queue but over this round's budget
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertkit-model")
        self.task: asyncio.Task | None = None
        self.heap = Heap()

    def start(self) -> None:
        self.queue = asyncio.Queue(maxsize=self.cfg.max_queue)
        self.task = asyncio.get_running_loop().create_task(self.loop())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        self.executor.shutdown(wait=True)

    async def submit(self, job: Job) -> Any:
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            self.metrics.rejected += 1
            raise LimitError(503, f"server busy: {self.cfg.max_queue} requests are queued (--max-queue)") from None
        self.metrics.queue_depth = self.queue.qsize() + len(self.held)
        return await job.future

    async def next_round(self) -> list[Job]:
        """Jobs for one model round: the first waiting job, then more of any kind until the
        token budget is reached or max_wait_ms has passed since the first one."""
        jobs = self.held or [await self.queue.get()]
        self.held = []
        tokens = sum(j.tokens for j in jobs)
        deadline = time.monotonic() + self.cfg.max_wait_ms / 1000
        while tokens < self.cfg.max_batch_tokens:
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), wait)
                except asyncio.TimeoutError:
                    break
            if tokens + job.tokens > self.cfg.max_batch_tokens:
                self.held.append(job)
                break
            jobs.append(job)
            tokens += job.tokens
        return jobs

    async def loop(self) -> None:
        loop, worked = asyncio.get_running_loop(), False
        while True:
            if worked and not self.held:            # idle for IDLE_TRIM_S after work: free pages go back
                try:
                    self.held = [await asyncio.wait_for(self.queue.get(), self.IDLE_TRIM_S)]
                except asyncio.TimeoutError:
                    await loop.run_in_executor(self.executor, self.heap.trim)
                    worked = False
                    continue
            await self.run_round(await self.next_round())
            worked = True

    async def run_round(self, jobs: list[Job]) -> None:
        self.metrics.queue_depth = self.queue.qsize() + len(self.held)
        groups: dict[tuple, list[Job]] = {}
        for j in jobs:
            groups.setdefault((j.task, j.options), []).append(j)
        for group in groups.values():
            live = [j for j in group if not j.future.done()]      # client may have gone away
            if not live:
                continue
            outcomes = await asyncio.get_running_loop().run_in_executor(self.executor, self.run_group, live)
            for j, (ok, value) in zip(live, outcomes):
                if not j.future.done():
                    j.future.set_result(value) if ok else j.future.set_exception(value)

    def run_group(self, jobs: list[Job]) -> list[tuple[bool, Any]]:
        """One Predictor call for all jobs; if it fails, each job alone (isolates a bad one)."""
        try:
            return [(True, r) for r in self.split(jobs, self.call(jobs))]
        except Exception as e:
            if len(jobs) == 1:
                return [self.failure(jobs[0], e)]
        out = []
        for j in jobs:
            try:
                out.append((True, self.call([j])))
            except Exception as e:
                out.append(self.failure(j, e))
        return out

    def failure(self, job: Job, e: Exception) -> tuple[bool, Exception]:
        if not isinstance(e, PredictorError):
            self.metrics.model_errors += 1
            log.exception("model error on a %s request", job.task)
        return False, e

    def call(self, jobs: list[Job]) -> list:
        """Run the jobs' inputs, concatenated, through the Predictor; one result per input."""
        inputs = {k: [x for j in jobs for x in j.inputs[k]] for k in jobs[0].inputs}
        opts = dict(jobs[0].options)
        self.metrics.batch(len(next(iter(inputs.values()))), sum(j.tokens for j in jobs))
        p = self.predictor
        if jobs[0].task == "embed":
            return list(p.embed(inputs["texts"], inputs.get("pairs"), **opts))     # float32 arrays
        if jobs[0].task == "classify":
            return p.classify(inputs["texts"], inputs.get("pairs"), **opts)
        if jobs[0].task == "fill_mask":
            return p.fill_mask(inputs["texts"], **opts)
        if jobs[0].task == "ner":
            return p.ner(inputs["texts"], **opts)
        return p.qa(inputs["questions"], inputs["contexts"], **opts)

    @staticmethod
    def split(jobs: list[Job], results: list) -> list[list]:
        out, i = [], 0
        for j in jobs:
            out.append(results[i:i + j.items])
            i += j.items
        return out


# ---- the app -------------------------------------------------------------------------------------
# route -> the heads that serve it, read off the head classes (`endpoints`)
ENDPOINT_HEADS = {path: tuple(name for name, cls in HEADS.items() if path in cls.endpoints)
                  for path in dict.fromkeys(p for cls in HEADS.values() for p in cls.endpoints)}
INLINE_BYTES = 4096     # bodies up to this are parsed and tokenised on the event loop (a thread hop costs more)


@dataclass
class Plan:
    """A validated request: what to run, on what, and how to shape the answer."""
    task: str
    options: dict
    inputs: dict[str, list]
    tokens: int
    answer: Callable[[list], Any]


def _body_schema(model: type[BaseModel]) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


def _parse(body: bytes, status: int = 422) -> Any:
    try:
        return parse_json(body)
    except BodyError as e:
        raise LimitError(status, str(e)) from None


def _validate(model: type[BaseModel], body: bytes | Any, status: int = 422) -> Any:
    """The request model of a body (bytes) or of an already parsed value; errors name the field
    and never echo the input."""
    value = _parse(body, status) if isinstance(body, bytes) else body
    try:
        return model.model_validate(value)
    except ValidationError as e:
        errs = e.errors(include_url=False, include_input=False, include_context=False)
        where = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'body'}: {err['msg']}" for err in errs[:3])
        raise LimitError(status, f"invalid request ({len(errs)} error{'s' * (len(errs) > 1)}): {where}") from None


def _vectors(rows: list, encoding: str) -> list:
    if encoding == "base64":                       # OpenAI's: little-endian float32 bytes
        return [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii") for v in rows]
    return [np.asarray(v).tolist() for v in rows]


class Api:
    """What every route shares: the config, which routes this head has, token counting under the
    limits, and the request pipeline (`handle`)."""

    def __init__(self, predictor: Predictor, cfg: ServeConfig, batcher: Batcher):
        self.predictor, self.cfg, self.batcher = predictor, cfg, batcher
        self.tok = predictor.tokenizer
        self.hidden = predictor.config.hidden_size
        self.prep = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bertkit-prep")  # parse, tokenise, render
        available = {path for path, heads in ENDPOINT_HEADS.items() if predictor.head in heads}
        if "/rerank" in available and len(predictor.labels or {}) > 1:
            available.discard("/rerank")            # a cross-encoder has one output
        self.available = available | {"/v1/embed", "/v1/embeddings", "/embed"}

    def need(self, path: str) -> None:
        if path not in self.available:
            heads = " or ".join(ENDPOINT_HEADS[path])
            extra = " with one label" if path == "/rerank" else ""
            raise LimitError(404, f"{path} needs a {heads} checkpoint{extra}; this one is {self.predictor.head}")

    def count(self, texts: list[str], pairs: list | None, what: str, truncate: bool, windowed: bool = False) -> int:
        """Real tokens of the inputs (413 over the limits). Tokenises: keep it off the event loop."""
        cfg, tok = self.cfg, self.tok
        if len(texts) > cfg.max_request_items:
            raise LimitError(413, f"request has {len(texts)} {what}; the limit is {cfg.max_request_items} "
                                  "(--max-request-items)")
        if pairs is not None and len(pairs) != len(texts):
            raise LimitError(422, f"{len(texts)} texts but {len(pairs)} pairs")
        lengths = [len(x) + 2 for x in tok.encode_ids(texts)]
        if pairs is not None:
            lengths = [n + (len(x) + 1 if p is not None else 0)
                       for n, x, p in zip(lengths, tok.encode_ids([p or "" for p in pairs]), pairs)]
        limit = cfg.max_length * (cfg.window_factor if windowed else 1)
        if not truncate:
            for i, n in enumerate(lengths):
                if n > limit:
                    flag = f"{cfg.window_factor} x --max-length" if windowed else "--max-length"
                    raise LimitError(413, f"text {i} is {n} tokens; the limit is {limit} ({flag})"
                                     + ("" if windowed else '; send "truncate": true to cut it'))
        return sum(min(n, limit) for n in lengths)

    async def offload(self, fn: Callable, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.prep, fn, *args)

    async def handle(self, request: Request, prepare: Callable[[bytes], Plan], render_off_loop: bool = False) -> Response:
        """body -> prepare (parse, validate, tokenise) -> the model -> plan.answer -> JSON bytes;
        the steps around the model run on a worker thread for a large body (and the answer always
        for embeddings), never holding the event loop for long."""
        body = await request.body()                 # already read and bounded by the guard
        small = len(body) <= INLINE_BYTES           # answers grow with the request (words, masks, texts)
        plan = prepare(body) if small else await self.offload(prepare, body)
        results = await self.run(plan) if next(iter(plan.inputs.values())) else []

        def render() -> bytes:
            return dump_json(plan.answer(results))
        data = await self.offload(render) if render_off_loop or not small else render()
        return Response(data, media_type="application/json")

    async def run(self, plan: Plan) -> list:
        job = Job(plan.task, tuple(sorted(plan.options.items())), plan.inputs, plan.tokens,
                  asyncio.get_running_loop().create_future())
        try:
            return await self.batcher.submit(job)
        except (LimitError, PredictorError):
            raise
        except Exception as e:              # the model failed on this request: 500, keep serving
            raise LimitError(500, f"model error: {type(e).__name__}: {str(e)[:300]}") from None


def create_app(predictor: Predictor, cfg: ServeConfig | None = None) -> Any:
    """The ASGI app: FastAPI routes inside `serve_http.Guard` (run it with `serve`, or test it
    with fastapi.testclient.TestClient). `app.fastapi` is the FastAPI object.

    Handlers return JSON bytes, rendered off the event loop when large: skipping FastAPI's
    per-float re-validation of the embeddings keeps the loop free under load."""
    from contextlib import asynccontextmanager

    from .serve_compat import add_compat_routes

    cfg = cfg or ServeConfig(max_length=predictor.max_length)
    metrics = Metrics()
    batcher = Batcher(predictor, cfg, metrics)
    api = Api(predictor, cfg, batcher)
    state = {"ready": False}
    tok, available = predictor.tokenizer, api.available
    count, need, handle = api.count, api.need, api.handle

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        await asyncio.get_running_loop().run_in_executor(batcher.executor, warm_up, predictor, cfg)
        state["ready"] = True
        log.info("bertkit serve: %s head, endpoints %s", predictor.head, ", ".join(sorted(available)))
        yield
        state["ready"] = False
        await batcher.stop()
        api.prep.shutdown(wait=False)

    app = FastAPI(title="bertkit", version=_version(), lifespan=lifespan,
                  description=f"BERT inference ({predictor.head} head, {predictor.backend} backend).")
    app.state.batcher, app.state.metrics, app.state.config = batcher, metrics, cfg

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

    # ---- bertkit's own routes ----
    def embed_plan(body: bytes) -> Plan:
        req = _validate(EmbedRequest, body)
        tokens = count(req.texts, req.pairs, "texts", req.truncate)
        inputs = {"texts": req.texts} if req.pairs is None else {"texts": req.texts, "pairs": req.pairs}
        pooling = req.pooling or cfg.embed_pooling
        normalize = cfg.embed_normalize if req.normalize is None else req.normalize
        return Plan("embed", {"pooling": pooling, "normalize": normalize}, inputs, tokens,
                    lambda r: {"embeddings": _vectors(r, "float")})

    @app.post("/v1/embed", response_model=EmbedResponse, summary="sentence or token embeddings",
              openapi_extra=_body_schema(EmbedRequest))
    async def embed(request: Request):
        return await handle(request, embed_plan, render_off_loop=True)

    def classify_plan(body: bytes) -> Plan:
        req = _validate(ClassifyRequest, body)
        tokens = count(req.texts, req.pairs, "texts", req.truncate)
        inputs = {"texts": req.texts} if req.pairs is None else {"texts": req.texts, "pairs": req.pairs}
        return Plan("classify", {}, inputs, tokens, lambda r: {"results": r})

    @app.post("/v1/classify", response_model=ClassifyResponse, include_in_schema="/v1/classify" in available,
              summary="sequence (pair) classification", openapi_extra=_body_schema(ClassifyRequest))
    async def classify(request: Request):
        need("/v1/classify")
        return await handle(request, classify_plan)

    def fill_mask_plan(body: bytes) -> Plan:
        req = _validate(FillMaskRequest, body)
        tokens = count(req.texts, None, "texts", req.truncate)
        for i, ids in enumerate(tok.encode_ids(req.texts)):
            if tok.mask_id not in ids[:cfg.max_length - 2]:
                raise LimitError(422, f"text {i} has no [MASK] token" + (" within --max-length" if tok.mask_id in ids else ""))
        return Plan("fill_mask", {"top_k": req.top_k}, {"texts": req.texts}, tokens, lambda r: {"results": r})

    @app.post("/v1/fill-mask", response_model=FillMaskResponse, include_in_schema="/v1/fill-mask" in available,
              summary="top-k words for each [MASK]", openapi_extra=_body_schema(FillMaskRequest))
    async def fill_mask(request: Request):
        need("/v1/fill-mask")
        return await handle(request, fill_mask_plan)

    def ner_plan(body: bytes) -> Plan:
        req = _validate(NerRequest, body)
        flat = [t if isinstance(t, str) else " ".join(t) for t in req.texts]
        for i, t in enumerate(req.texts):
            if (isinstance(t, list) and not t) or not flat[i].strip():
                raise LimitError(422, f"text {i} has no words")
        tokens = count(flat, None, "texts", False, windowed=True)
        return Plan("ner", {}, {"texts": req.texts}, tokens, lambda r: {"results": r})

    @app.post("/v1/ner", response_model=NerResponse, include_in_schema="/v1/ner" in available,
              summary="word-level named entities", openapi_extra=_body_schema(NerRequest))
    async def ner(request: Request):
        need("/v1/ner")
        return await handle(request, ner_plan)

    def qa_plan(body: bytes) -> Plan:
        req = _validate(QaRequest, body)
        if len(req.questions) != len(req.contexts):
            raise LimitError(422, f"{len(req.questions)} questions but {len(req.contexts)} contexts")
        for i, (q, c) in enumerate(zip(req.questions, req.contexts)):
            if not q.strip() or not c.strip():
                raise LimitError(422, f"question {i}: question and context must be non-empty")
        tokens = count(req.questions, req.contexts, "questions", False, windowed=True)
        return Plan("qa", {}, {"questions": req.questions, "contexts": req.contexts}, tokens,
                    lambda r: {"answers": r})

    @app.post("/v1/qa", response_model=QaResponse, include_in_schema="/v1/qa" in available,
              summary="extractive question answering", openapi_extra=_body_schema(QaRequest))
    async def qa(request: Request):
        need("/v1/qa")
        return await handle(request, qa_plan)

    add_compat_routes(app, api)

    # ---- the page and the service routes ----
    @app.get("/", response_class=HTMLResponse, summary="a page to try the model")
    async def page():
        return HTMLResponse(_page())

    @app.get("/healthz", summary="the process is up")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz", summary="the model is loaded and the server accepts work")
    async def readyz():
        if not state["ready"]:
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
                "endpoints": sorted(available), "limits": cfg.public()}

    guarded = Guard(app, GuardConfig(cfg.max_body_bytes, cfg.body_timeout_s, cfg.api_key), metrics.request)
    guarded.fastapi = app
    return guarded


def warm_up(predictor: Predictor, cfg: ServeConfig) -> None:
    """One request's worth of work, then (cfg.warmup, prepacked weights) every GEMM shape."""
    predictor.embed(["warm up"])
    if cfg.warmup and predictor.prepacked:
        from .prepack import warm_gemm_shapes

        t0, before = time.perf_counter(), Heap.rss_mb()
        n = warm_gemm_shapes(predictor.model, cfg.max_batch_tokens)
        Heap().trim()                                 # the warm-up's inputs and outputs are gone
        log.info("warm-up: %d GEMM shapes up to %d rows in %.1f s (RSS %+.0f MB)", n, cfg.max_batch_tokens,
                 time.perf_counter() - t0, Heap.rss_mb() - before)


def _page() -> str:
    from importlib import resources
    return (resources.files("bertkit") / "static" / "index.html").read_text(encoding="utf-8")


def _version() -> str:
    from . import __version__
    return __version__


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
    app = create_app(predictor, cfg)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=log_level, access_log=False,
                            http=guarded_protocol(cfg.header_timeout_s, cfg.send_timeout_s),
                            timeout_graceful_shutdown=cfg.shutdown_timeout_s, backlog=2048,
                            timeout_keep_alive=cfg.keep_alive_s, limit_concurrency=cfg.max_connections)
    server = Server(config)
    server.run()
    return 0 if server.started else 1
