"""`bertkit serve`: an HTTP API over one Predictor, with dynamic micro-batching and hard limits.

    request -> validate (JSON schema, item and length limits) -> queue (bounded: full = 503)
            -> batcher: when the model is free, takes the requests queued meanwhile (waiting up
               to --max-wait-ms for more, 0 by default) up to --max-batch-tokens real tokens,
               runs each kind as ONE Predictor call on the model thread, and hands each
               request its own slice of the results.

The Predictor's padding-free batches make every input's result independent of what it is
batched with, so a batched request answers what the request alone would (to float rounding).
A failing batch is retried request by request, so one bad request cannot fail its neighbours;
a model error answers 500 and the server keeps serving. SIGTERM stops accepting connections,
lets in-flight requests finish, and exits 0.

FastAPI and uvicorn are imported only here (`pip install 'bertkit[serve]'`).
"""
from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field

from .infer import Predictor, PredictorError

log = logging.getLogger("bertkit")


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    """Address to bind; the default answers only this machine."""
    port: int = 8000
    max_batch_tokens: int = 2048
    """Most real tokens one batching round may hold (`bertkit serve` uses 8192 on a GPU)."""
    max_wait_ms: float = 0.0
    """How long the batcher waits for more requests once one has arrived (0: a round takes what
    queued while the model was busy; on 2 CPU cores 5 ms only added latency)."""
    max_queue: int = 256
    """Most requests waiting for the model; beyond it requests get 503 with Retry-After."""
    max_length: int = 512
    """Most tokens of one text (with [CLS]/[SEP]); longer texts get 413 unless "truncate": true."""
    max_request_items: int = 64
    """Most texts (or questions) in one request; more is 413."""
    max_body_bytes: int = 1_000_000
    """Largest request body; more is 413."""
    window_factor: int = 16
    """/v1/ner and /v1/qa read long texts in windows: up to window_factor x max_length tokens."""
    retry_after_s: int = 1


# ---- request and response bodies ----------------------------------------------------------------
class EmbedRequest(BaseModel):
    texts: list[str] = Field(description="texts to embed")
    pairs: list[str | None] | None = Field(None, description="optional second segment per text")
    pooling: Literal["mean", "cls", "none"] = "mean"
    normalize: bool = False
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


# ---- metrics (Prometheus text format, no extra dependency) ----------------------------------------
class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets, self.counts, self.sum, self.n = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
        self.sum += v
        self.n += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out += [f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.n}',
                f"{name}_sum{{{labels}}} {self.sum:.6f}", f"{name}_count{{{labels}}} {self.n}"]
        return out


class Metrics:
    LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.latency: dict[str, Histogram] = {}
        self.batch_items = Histogram((1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        self.batch_tokens = Histogram((64, 256, 1024, 2048, 4096, 8192, 16384, 65536))
        self.model_errors = 0
        self.rejected = 0
        self.queue_depth = 0
        self.in_flight = 0

    def request(self, path: str, code: int, seconds: float) -> None:
        with self.lock:
            self.requests[(path, code)] = self.requests.get((path, code), 0) + 1
            self.latency.setdefault(path, Histogram(self.LATENCY)).observe(seconds)

    def batch(self, items: int, tokens: int) -> None:
        with self.lock:
            self.batch_items.observe(items)
            self.batch_tokens.observe(tokens)

    def render(self) -> str:
        with self.lock:
            out = ["# HELP bertkit_requests_total HTTP requests by path and status code.",
                   "# TYPE bertkit_requests_total counter"]
            out += [f'bertkit_requests_total{{path="{p}",code="{c}"}} {n}' for (p, c), n in sorted(self.requests.items())]
            out += ["# HELP bertkit_request_errors_total Requests answered with a 4xx or 5xx code.",
                    "# TYPE bertkit_request_errors_total counter"]
            errors: dict[str, int] = {}
            for (p, c), n in self.requests.items():
                if c >= 400:
                    errors[p] = errors.get(p, 0) + n
            out += [f'bertkit_request_errors_total{{path="{p}"}} {n}' for p, n in sorted(errors.items())]
            out += ["# HELP bertkit_request_duration_seconds Request latency.",
                    "# TYPE bertkit_request_duration_seconds histogram"]
            for p, h in sorted(self.latency.items()):
                out += h.lines("bertkit_request_duration_seconds", f'path="{p}"')
            out += ["# HELP bertkit_batch_items Inputs per model call.", "# TYPE bertkit_batch_items histogram"]
            out += self.batch_items.lines("bertkit_batch_items")
            out += ["# HELP bertkit_batch_tokens Real tokens per model call.", "# TYPE bertkit_batch_tokens histogram"]
            out += self.batch_tokens.lines("bertkit_batch_tokens")
            out += ["# HELP bertkit_model_errors_total Model calls that raised.", "# TYPE bertkit_model_errors_total counter",
                    f"bertkit_model_errors_total {self.model_errors}",
                    "# HELP bertkit_rejected_total Requests refused because the queue was full (503).",
                    "# TYPE bertkit_rejected_total counter", f"bertkit_rejected_total {self.rejected}",
                    "# HELP bertkit_queue_depth Requests waiting for the model.", "# TYPE bertkit_queue_depth gauge",
                    f"bertkit_queue_depth {self.queue_depth}",
                    "# HELP bertkit_in_flight_requests Requests being handled.", "# TYPE bertkit_in_flight_requests gauge",
                    f"bertkit_in_flight_requests {self.in_flight}"]
        return "\n".join(out) + "\n"


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

    def __init__(self, predictor: Predictor, cfg: ServeConfig, metrics: Metrics):
        self.predictor, self.cfg, self.metrics = predictor, cfg, metrics
        self.queue: asyncio.Queue[Job] | None = None
        self.held: list[Job] = []     # taken from the queue but over this round's budget
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertkit-model")
        self.task: asyncio.Task | None = None

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
        loop = asyncio.get_running_loop()
        while True:
            jobs = await self.next_round()
            self.metrics.queue_depth = self.queue.qsize() + len(self.held)
            groups: dict[tuple, list[Job]] = {}
            for j in jobs:
                groups.setdefault((j.task, j.options), []).append(j)
            for group in groups.values():
                live = [j for j in group if not j.future.done()]      # client may have gone away
                if not live:
                    continue
                outcomes = await loop.run_in_executor(self.executor, self.run_group, live)
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
            out = p.embed(inputs["texts"], inputs.get("pairs"), **opts)
            return [x.tolist() for x in out]
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
ENDPOINT_HEADS = {"/v1/classify": ("sequence_classification",), "/v1/ner": ("token_classification",),
                  "/v1/qa": ("question_answering",), "/v1/fill-mask": ("masked_lm", "pretraining")}


def create_app(predictor: Predictor, cfg: ServeConfig | None = None) -> FastAPI:
    """The FastAPI app (run it with `serve`, or test it with fastapi.testclient.TestClient).

    Handlers return JSONResponse directly: the response models document the API, and skipping
    FastAPI's per-float re-validation of the embeddings keeps the event loop free under load."""
    from contextlib import asynccontextmanager

    cfg = cfg or ServeConfig(max_length=predictor.max_length)
    metrics = Metrics()
    batcher = Batcher(predictor, cfg, metrics)
    state = {"ready": False}
    tok = predictor.tokenizer
    available = {path for path, heads in ENDPOINT_HEADS.items() if predictor.head in heads} | {"/v1/embed"}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        await asyncio.get_running_loop().run_in_executor(batcher.executor, predictor.embed, ["warm up"])
        state["ready"] = True
        log.info("bertkit serve: %s head, endpoints %s", predictor.head, ", ".join(sorted(available)))
        yield
        state["ready"] = False
        await batcher.stop()

    app = FastAPI(title="bertkit", version=_version(), lifespan=lifespan,
                  description=f"BERT inference ({predictor.head} head, {predictor.backend} backend).")
    app.state.batcher, app.state.metrics, app.state.config = batcher, metrics, cfg

    @app.middleware("http")
    async def limits_and_metrics(request: Request, call_next):
        start = time.perf_counter()
        metrics.in_flight += 1
        try:
            if request.method == "POST" and "json" not in request.headers.get("content-type", ""):
                # bodies are always JSON (`curl -d` says form-urlencoded): parse them as JSON
                request.scope["headers"] = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"] + [
                    (b"content-type", b"application/json")]
            size = request.headers.get("content-length")
            if size is not None and size.isdigit() and int(size) > cfg.max_body_bytes:
                response = JSONResponse({"detail": f"request body is {size} bytes; the limit is "
                                         f"{cfg.max_body_bytes} (--max-body-bytes)"}, status_code=413)
            else:
                response = await call_next(request)
        except Exception as e:                  # last resort: answer 500, keep serving
            log.exception("unhandled error on %s", request.url.path)
            response = JSONResponse({"detail": f"server error: {type(e).__name__}"}, status_code=500)
        finally:
            metrics.in_flight -= 1
        path = request.url.path if request.url.path in _KNOWN_PATHS else "other"
        metrics.request(path, response.status_code, time.perf_counter() - start)
        return response

    @app.exception_handler(LimitError)
    async def limit_error(request: Request, e: LimitError):
        headers = {"Retry-After": str(cfg.retry_after_s)} if e.status == 503 else None
        return JSONResponse({"detail": str(e)}, status_code=e.status, headers=headers)

    @app.exception_handler(PredictorError)
    async def predictor_error(request: Request, e: PredictorError):
        return JSONResponse({"detail": str(e)}, status_code=422)

    @app.exception_handler(Exception)
    async def model_error(request: Request, e: Exception):
        return JSONResponse({"detail": f"model error: {type(e).__name__}: {str(e)[:300]}"}, status_code=500)

    def need(path: str) -> None:
        if path not in available:
            heads = " or ".join(ENDPOINT_HEADS[path])
            raise LimitError(404, f"{path} needs a {heads} checkpoint; this one is {predictor.head}")

    def count(texts: list[str], pairs: list | None, what: str, truncate: bool, windowed: bool = False) -> int:
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

    async def run(task: str, options: dict, inputs: dict, tokens: int) -> list:
        if not next(iter(inputs.values())):
            return []
        job = Job(task, tuple(sorted(options.items())), inputs, tokens, asyncio.get_running_loop().create_future())
        try:
            return await batcher.submit(job)
        except (LimitError, PredictorError):
            raise
        except Exception as e:              # the model failed on this request: 500, keep serving
            raise LimitError(500, f"model error: {type(e).__name__}: {str(e)[:300]}") from None

    @app.post("/v1/embed", response_model=EmbedResponse, summary="sentence or token embeddings")
    async def embed(req: EmbedRequest):
        tokens = count(req.texts, req.pairs, "texts", req.truncate)
        inputs = {"texts": req.texts} if req.pairs is None else {"texts": req.texts, "pairs": req.pairs}
        return JSONResponse({"embeddings": await run("embed", {"pooling": req.pooling, "normalize": req.normalize},
                                                      inputs, tokens)})

    @app.post("/v1/classify", response_model=ClassifyResponse, include_in_schema="/v1/classify" in available,
              summary="sequence (pair) classification")
    async def classify(req: ClassifyRequest):
        need("/v1/classify")
        tokens = count(req.texts, req.pairs, "texts", req.truncate)
        inputs = {"texts": req.texts} if req.pairs is None else {"texts": req.texts, "pairs": req.pairs}
        return JSONResponse({"results": await run("classify", {}, inputs, tokens)})

    @app.post("/v1/fill-mask", response_model=FillMaskResponse, include_in_schema="/v1/fill-mask" in available,
              summary="top-k words for each [MASK]")
    async def fill_mask(req: FillMaskRequest):
        need("/v1/fill-mask")
        tokens = count(req.texts, None, "texts", req.truncate)
        limit = cfg.max_length
        for i, ids in enumerate(tok.encode_ids(req.texts)):
            if tok.mask_id not in ids[:limit - 2]:
                raise LimitError(422, f"text {i} has no [MASK] token" + (" within --max-length" if tok.mask_id in ids else ""))
        return JSONResponse({"results": await run("fill_mask", {"top_k": req.top_k}, {"texts": req.texts}, tokens)})

    @app.post("/v1/ner", response_model=NerResponse, include_in_schema="/v1/ner" in available,
              summary="word-level named entities")
    async def ner(req: NerRequest):
        need("/v1/ner")
        flat = [t if isinstance(t, str) else " ".join(t) for t in req.texts]
        for i, t in enumerate(req.texts):
            if (isinstance(t, list) and not t) or not flat[i].strip():
                raise LimitError(422, f"text {i} has no words")
        tokens = count(flat, None, "texts", False, windowed=True)
        return JSONResponse({"results": await run("ner", {}, {"texts": req.texts}, tokens)})

    @app.post("/v1/qa", response_model=QaResponse, include_in_schema="/v1/qa" in available,
              summary="extractive question answering")
    async def qa(req: QaRequest):
        need("/v1/qa")
        if len(req.questions) != len(req.contexts):
            raise LimitError(422, f"{len(req.questions)} questions but {len(req.contexts)} contexts")
        for i, (q, c) in enumerate(zip(req.questions, req.contexts)):
            if not q.strip() or not c.strip():
                raise LimitError(422, f"question {i}: question and context must be non-empty")
        tokens = count(req.questions, req.contexts, "questions", False, windowed=True)
        return JSONResponse({"answers": await run("qa", {}, {"questions": req.questions, "contexts": req.contexts},
                                                  tokens)})

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
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/model", summary="the loaded model, its endpoints and the server's limits")
    async def model_info():
        c = predictor.config
        return {"head": predictor.head, "backend": predictor.backend, "int8": predictor.int8,
                "int8_agreement": getattr(predictor, "int8_agreement", None),
                "prepacked": predictor.prepacked, "compiled": predictor.compiled,
                "hidden_size": c.hidden_size, "num_layers": c.num_layers, "labels": predictor.label_names()
                if predictor.head in ("sequence_classification", "token_classification") else None,
                "endpoints": sorted(available), "limits": asdict(cfg)}

    return app


_KNOWN_PATHS = {"/v1/embed", "/v1/classify", "/v1/fill-mask", "/v1/ner", "/v1/qa", "/healthz", "/readyz",
                "/metrics", "/v1/model", "/docs", "/openapi.json"}


def _version() -> str:
    from . import __version__
    return __version__


def serve(predictor: Predictor, cfg: ServeConfig, log_level: str = "info") -> int:
    """Run the server until SIGTERM / SIGINT; in-flight requests finish first. Returns 0."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):                  # SIGTERM is the normal way to stop: exit 0
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM and sig in self._captured_signals:
                self._captured_signals.remove(sig)

    app = create_app(predictor, cfg)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=60, backlog=2048, timeout_keep_alive=30)
    server = Server(config)
    server.run()
    return 0 if server.started else 1
