"""The serving pipeline behind `bertkit serve`'s routes: request and response bodies, the bounded
queue and the micro-batcher that runs each kind of request as one Predictor call, and `Api`, which
turns a request body into work for it. app.py assembles the routes; compat.py adds the
OpenAI / text-embeddings-inference ones over the same `Api`."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Literal

import numpy as np
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, Field, ValidationError

from ..infer import Predictor, PredictorError
from ..heap import Heap
from .http import BodyError, Metrics, ServeConfig, dump_json, fast_json, parse_json

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
    task: str                        # the Predictor method: embed / classify / fill_mask / ner / qa
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
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
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
        self.metrics.batch(len(next(iter(inputs.values()))), sum(j.tokens for j in jobs))
        # the task is the Predictor method, the inputs its first arguments in order; embed's array -> rows
        return list(getattr(self.predictor, jobs[0].task)(*inputs.values(), **dict(jobs[0].options)))

    @staticmethod
    def split(jobs: list[Job], results: list) -> list[list]:
        ends = itertools.accumulate(j.items for j in jobs)
        return [results[end - j.items:end] for j, end in zip(jobs, ends)]


# ---- the app -------------------------------------------------------------------------------------
# route -> the heads (model.HEADS' names) that answer it; /v1/embed, /v1/embeddings and /embed: every head
ENDPOINT_HEADS = {"/v1/fill-mask": ("pretraining", "masked_lm"),
                  "/v1/classify": ("sequence_classification",), "/predict": ("sequence_classification",),
                  "/rerank": ("sequence_classification",), "/v1/ner": ("token_classification",),
                  "/v1/qa": ("question_answering",)}
INLINE_BYTES = 4096     # bodies up to this are parsed and tokenised on the event loop (a thread hop costs more)


class Tokens(int):
    """A request's real tokens (what the batcher budgets), carrying what "truncate": true cut:
    `truncated` inputs and `cut` tokens (the response's X-Bertkit-Truncated-* headers, a log line)."""
    truncated: int = 0
    cut: int = 0


TRUNCATION_HEADERS = ("X-Bertkit-Truncated-Inputs", "X-Bertkit-Truncated-Tokens")


@dataclass
class Plan:
    """A validated request: what to run, on what, and how to shape the answer."""
    task: str
    options: dict
    inputs: dict[str, list]
    tokens: int
    answer: Callable[[list], Any]


def texts_and_pairs(texts: list, pairs: list | None) -> dict[str, list]:
    """A Plan's inputs: the texts, and their second segments when there are any."""
    return {"texts": texts} if pairs is None else {"texts": texts, "pairs": pairs}


def add_post(app: FastAPI, api: Api, path: str, plan: Callable[[Api, bytes], Plan], body: type[BaseModel],
             summary: str, response_model: type[BaseModel] | None = None, render_off_loop: bool = False) -> None:
    """POST `path`: a body through `plan` (named `<route>_plan`) to the model. A route that only some
    heads answer (`ENDPOINT_HEADS`) answers 404 on the others, and /docs leaves it out there."""
    gated = path in ENDPOINT_HEADS

    async def route(request: Request):
        if gated:
            api.need(path)
        return await api.handle(request, partial(plan, api), render_off_loop)
    app.post(path, response_model=response_model, include_in_schema=not gated or path in api.available,
             summary=summary, openapi_extra=body_schema(body), name=plan.__name__.removesuffix("_plan"))(route)


def body_schema(model: type[BaseModel]) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


def parse_body(body: bytes, status: int = 422) -> Any:
    try:
        return parse_json(body)
    except BodyError as e:
        raise LimitError(status, str(e)) from None


def validate(model: type[BaseModel], body: bytes | Any, status: int = 422) -> Any:
    """The request model of a body (bytes) or of an already parsed value; errors name the field
    and never echo the input."""
    value = parse_body(body, status) if isinstance(body, bytes) else body
    try:
        return model.model_validate(value)
    except ValidationError as e:
        errs = e.errors(include_url=False, include_input=False, include_context=False)
        where = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'body'}: {err['msg']}" for err in errs[:3])
        raise LimitError(status, f"invalid request ({len(errs)} error{'s' * (len(errs) > 1)}): {where}") from None


def vectors(rows: list, encoding: str) -> list:
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
        tokens = Tokens(sum(min(n, limit) for n in lengths))
        tokens.truncated, tokens.cut = sum(n > limit for n in lengths), sum(max(n - limit, 0) for n in lengths)
        return tokens

    async def offload(self, fn: Callable, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.prep, fn, *args)

    async def handle(self, request: Request, prepare: Callable[[bytes], Plan], render_off_loop: bool = False) -> Response:
        """body -> prepare (parse, validate, tokenise) -> the model -> plan.answer -> JSON bytes;
        the steps around the model run on a worker thread for a large body (and the answer for
        embeddings, unless orjson renders it), never holding the event loop for long."""
        body = await request.body()                 # already read and bounded by the guard
        small = len(body) <= INLINE_BYTES           # answers grow with the request (words, masks, texts)
        plan = prepare(body) if small else await self.offload(prepare, body)
        results = await self.run(plan) if next(iter(plan.inputs.values())) else []

        def render() -> bytes:
            return dump_json(plan.answer(results))
        slow = render_off_loop and fast_json() is None        # json.dumps of a vector answer holds the loop
        data = await self.offload(render) if slow or not small else render()
        cut = (getattr(plan.tokens, "truncated", 0), getattr(plan.tokens, "cut", 0))
        if cut[0]:
            log.warning("%s: truncated %d of %d inputs to %d tokens (%d tokens cut)", request.url.path, cut[0],
                        len(next(iter(plan.inputs.values()))), self.cfg.max_length, cut[1])
        return Response(data, media_type="application/json", headers=dict(zip(TRUNCATION_HEADERS, map(str, cut))))

    async def run(self, plan: Plan) -> list:
        job = Job(plan.task, tuple(sorted(plan.options.items())), plan.inputs, plan.tokens,
                  asyncio.get_running_loop().create_future())
        try:
            return await self.batcher.submit(job)
        except (LimitError, PredictorError):
            raise
        except Exception as e:              # the model failed on this request: 500, keep serving
            raise LimitError(500, f"model error: {type(e).__name__}: {str(e)[:300]}") from None
