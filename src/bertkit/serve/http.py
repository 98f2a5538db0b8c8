"""What stands between the network and `bertkit serve`'s app: the bind rule, the API key, bounded
request bodies, deadlines for slow clients, memory handed back to the OS.

    connection -> GuardedProtocol: request line + headers within header_timeout_s, a blocked
                  response write dropped after send_timeout_s (uvicorn times only idle keep-alive)
               -> guard (ASGI): API key -> body read as it streams in, counted whatever the framing
                  (Content-Length or chunked): over max_body_bytes = 413 at once, not complete
                  within body_timeout_s = 408; both close the connection
               -> the FastAPI app, which receives the body already read

Nothing here imports FastAPI; uvicorn only inside `guarded_protocol`.
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import ipaddress
import json
import logging
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Callable

from ..errors import BertkitError
from ..runconfig import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Rule, check_fields

log = logging.getLogger("bertkit")


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    """Address to bind; the default answers only this machine."""
    port: Annotated[int, Rule("within 1..65535", lambda v: 1 <= v <= 65535)] = 8000
    """TCP port to listen on."""
    max_batch_tokens: Annotated[int, AT_LEAST_1] = 2048
    """Most real tokens one batching round may hold (`bertkit serve` uses 8192 on a GPU)."""
    max_wait_ms: Annotated[float, NON_NEGATIVE] = 0.0
    """How long the batcher waits for more requests once one has arrived (0: a round takes what
    queued while the model was busy; on 2 CPU cores a wait only added latency)."""
    max_queue: Annotated[int, AT_LEAST_1] = 256
    """Most requests waiting for the model; beyond it requests get 503 with Retry-After."""
    max_length: Annotated[int, AT_LEAST_1] = 512
    """Most tokens of one text (with [CLS]/[SEP]); longer texts get 413 unless "truncate": true."""
    max_request_items: Annotated[int, AT_LEAST_1] = 64
    """Most texts (or questions) in one request; more is 413."""
    max_body_bytes: Annotated[int, AT_LEAST_1] = 1_000_000
    """Largest request body, counted as it arrives whatever the framing (chunked too); more is 413."""
    window_factor: Annotated[int, AT_LEAST_1] = 16
    """/v1/ner and /v1/qa read long texts in windows: up to window_factor x max_length tokens."""
    retry_after_s: Annotated[int, AT_LEAST_1] = 1
    """The Retry-After (seconds) of a 503 when the queue is full."""
    header_timeout_s: Annotated[float, POSITIVE] = 10.0
    """A connection must send a request's line and headers within this (slow clients are dropped)."""
    body_timeout_s: Annotated[float, POSITIVE] = 30.0
    """A request's whole body must arrive within this after its headers; later is 408."""
    keep_alive_s: Annotated[float, POSITIVE] = 5.0
    """An idle keep-alive connection is closed after this."""
    send_timeout_s: Annotated[float, POSITIVE] = 30.0
    """A client that reads none of its response for this long is dropped."""
    shutdown_timeout_s: Annotated[float, POSITIVE] = 15.0
    """After SIGTERM, in-flight requests get this long to finish; the rest are cancelled."""
    max_connections: Annotated[int, AT_LEAST_1] = 1024
    """Open connections (and requests) at most; beyond it new requests get 503."""
    served_model_name: str = "bertkit"
    """The `model` that /v1/embeddings and /v1/models report."""
    embed_pooling: str = "mean"
    """Pooling of /v1/embed (when the request names none) and /v1/embeddings: the checkpoint's own
    (`sentence_transformers_pooling`)."""
    embed_normalize: bool = False
    """Whether /v1/embed normalises when the request does not say (/v1/embeddings always does)."""
    warmup: bool = True
    """Before serving, build the kernels of every GEMM shape a batching round can take (prepacked
    CPU weights: ~100 row counts up to max_batch_tokens). Memory is then flat from the first
    request and no request waits for a kernel build; costs a few seconds at start."""
    api_key: str | None = field(default=None, repr=False)
    """When set, every route but /healthz and / needs `Authorization: Bearer KEY` (else 401)."""

    def __post_init__(self):
        check_fields(self)                          # the ranges on the fields
        if not self.served_model_name.strip():
            raise BertkitError("served_model_name is empty")

    def public(self) -> dict:
        """The limits and settings /v1/model shows (never the key)."""
        d = asdict(self)
        d.pop("api_key")
        d["api_key_required"] = self.api_key is not None
        return d


INSECURE_FLAG = "--insecure-no-api-key"
OPEN_PATHS = frozenset({"/healthz", "/"})
"""Routes answered without the API key: the liveness probe, and the try-it page, which is static
(it holds no model output; its requests to the API carry the key the user types in)."""


# ---- the bind rule and the key --------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and 'localhost' answer only this machine; anything else (0.0.0.0, ::, a
    LAN address, a host name) may answer the network."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None, insecure: bool = False) -> None:
    """Refuse to listen beyond loopback without an API key, unless the user said so explicitly."""
    if api_key is not None and not api_key.strip():
        raise BertkitError("the API key is empty (--api-key / BERTKIT_API_KEY)")
    if not is_loopback(host) and api_key is None and not insecure:
        raise BertkitError(f"--host {host} answers beyond this machine: set --api-key (or BERTKIT_API_KEY), "
                           f"or pass {INSECURE_FLAG} to serve without authentication")


def key_matches(header: bytes | None, key: bytes) -> bool:
    """`Authorization: Bearer KEY`, compared in constant time."""
    if not header:
        return False
    scheme, _, token = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)


# ---- JSON in and out ----------------------------------------------------------------------------
class BodyError(ValueError):
    """A request body that is not acceptable JSON (answered 4xx, never 500)."""


def _reject_constant(name: str):
    raise BodyError(f"{name} is not valid JSON (numbers must be finite)")


def parse_json(body: bytes) -> Any:
    """Strict JSON: no NaN / Infinity, no lone surrogates (\\ud800) in any string or key, nesting
    within the interpreter's limit; every failure is a one-line BodyError."""
    if not body.strip():
        raise BodyError("the request body is empty; send JSON")
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except BodyError:
        raise
    except RecursionError:
        raise BodyError("the JSON is nested too deeply") from None
    except UnicodeDecodeError as e:
        raise BodyError(f"the body is not UTF-8 text: {e.reason} at byte {e.start}") from None
    except ValueError as e:                         # JSONDecodeError, int over 4300 digits
        raise BodyError(f"malformed JSON: {str(e)[:200]}") from None
    _check_value(value, BodyError("a number is out of range (1e400 and the like are not finite)"))
    return value


def _check_value(value: Any, not_finite: Exception) -> None:
    """Every string (dict keys too) valid Unicode, every number finite (else `not_finite`), through
    lists, tuples and dicts."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                raise not_finite
        elif isinstance(v, str):
            _utf8(v)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str):
                    _utf8(k)
                stack.append(x)


def _utf8(s: str) -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            raise BodyError(f"a string holds a lone surrogate (\\u{ord(s[e.start]):04x}); send valid Unicode") from None


def dump_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; a non-finite number is a ValueError (the server answers 500: the model
    produced it, the client did not). With orjson installed (the `serve` extra) the same JSON in a
    tenth of the time, a visible share of a short request (docs/serve-measurements.md)."""
    orjson = fast_json()
    if orjson is None:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    data = orjson.dumps(value, default=_number, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    if b"null" in data:          # orjson writes NaN and infinity as null: a None, or a number to refuse
        _check_value(value, ValueError("Out of range float values are not JSON compliant"))
    return data


def _number(value: Any) -> Any:
    """What json.dumps takes and orjson does not: subclasses of float and int."""
    for kind in (float, int):
        if isinstance(value, kind):
            return kind(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


@functools.cache
def fast_json():
    """orjson where it is installed, else None."""
    try:
        import orjson
    except ImportError:
        return None
    return orjson


# ---- the ASGI guard -------------------------------------------------------------------------------
async def send_json(send, status: int, payload: dict, close: bool = False, headers: list | None = None) -> None:
    body = dump_json(payload)
    h = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())] + (headers or [])
    if close:
        h.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": h})
    await send({"type": "http.response.body", "body": body})


def error_payload(path: str, status: int, message: str) -> dict:
    """{"detail": ...}, or OpenAI's {"error": {...}} on the OpenAI-compatible routes."""
    if path.startswith(("/v1/embeddings", "/v1/models")):
        kind = {401: "authentication_error", 404: "not_found_error", 503: "server_error"}.get(
            status, "server_error" if status >= 500 else "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": None,
                          "code": "invalid_api_key" if status == 401 else None}}
    return {"detail": message}


class Guard:
    """ASGI middleware: the API key, then the whole request body read under a size limit and a
    deadline (`cfg`'s api_key, max_body_bytes, body_timeout_s) before the app sees it; the app's
    uncaught errors become 500 (the server keeps serving). `observe(path, status, seconds)` is called
    once per request. `headers` go on every response (the precision that computed it: X-Bertkit-Precision)."""

    def __init__(self, app, cfg: ServeConfig, observe: Callable[[str, int, float], None],
                 headers: dict[str, str] | None = None):
        self.app, self.cfg, self.observe = app, cfg, observe
        self.extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
        self.key = cfg.api_key.encode() if cfg.api_key else None
        self.in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [0]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if self.extra:
                    message = {**message, "headers": [*message.get("headers", []), *self.extra]}
            await send(message)

        self.in_flight += 1
        try:
            await self.handle(scope, receive, send_status)
        finally:
            self.in_flight -= 1
            self.observe(scope["path"], status[0] or 499, time.perf_counter() - start)

    async def handle(self, scope, receive, send) -> None:
        path = scope["path"]
        headers = dict(scope["headers"])            # lower-case names (ASGI)
        if self.key is not None and path not in OPEN_PATHS and not key_matches(headers.get(b"authorization"), self.key):
            return await send_json(send, 401, error_payload(path, 401, "missing or wrong API key: send "
                                   "'Authorization: Bearer KEY'"), headers=[(b"www-authenticate", b"Bearer")])
        body = b""
        if scope["method"] in ("POST", "PUT", "PATCH"):
            body = await self.read_body(scope, headers, receive, send)
            if body is None:
                return
        first = iter([{"type": "http.request", "body": body, "more_body": False}])

        async def replay():
            return next(first, None) or await receive()     # later calls: wait for the disconnect

        started = [False]

        async def send_started(message):
            started[0] = started[0] or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, replay, send_started)
        except Exception as e:                       # last resort: answer 500, keep serving
            log.exception("unhandled error on %s", path)
            if not started[0]:
                await send_json(send, 500, error_payload(path, 500, f"server error: {type(e).__name__}"))

    async def read_body(self, scope, headers: dict, receive, send) -> bytes | None:
        """The body, or None after answering 413 / 408 (or when the client went away)."""
        limit, path = self.cfg.max_body_bytes, scope["path"]
        size = headers.get(b"content-length")
        if size is not None and (not size.isdigit() or int(size) > limit):
            await send_json(send, 413, error_payload(path, 413, f"request body is {size.decode('latin-1')[:30]} "
                            f"bytes; the limit is {limit} (--max-body-bytes)"), close=True)
            return None
        deadline = time.monotonic() + self.cfg.body_timeout_s
        chunks, total = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except asyncio.TimeoutError:
                await send_json(send, 408, error_payload(path, 408, f"the request body did not arrive within "
                                f"{self.cfg.body_timeout_s:g} s (--body_timeout_s)"), close=True)
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:                        # chunked bodies have no Content-Length to check first
                await send_json(send, 413, error_payload(path, 413, f"request body is over {limit} bytes "
                                "(--max-body-bytes)"), close=True)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


# ---- connection deadlines -------------------------------------------------------------------------
def guarded_protocol(header_timeout_s: float, send_timeout_s: float) -> type:
    """uvicorn's HTTP protocol (httptools when installed, else h11) with two deadlines uvicorn
    lacks: a connection must deliver a request's line and headers within header_timeout_s of
    opening or of the previous response (a slowloris client trickling header bytes is dropped;
    uvicorn's keep-alive timer restarts on every byte), and a response write blocked by a client
    that does not read is dropped after send_timeout_s."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class GuardedProtocol(AutoHTTPProtocol):        # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _send_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_deadline)

        def _header_deadline(self) -> None:
            self._header_timer = None
            idle = self.cycle is None or self.cycle.response_complete    # no request under way
            if idle and not self.transport.is_closing():
                self.transport.close()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._send_timer is None:
                self._send_timer = self.loop.call_later(send_timeout_s, self._send_deadline)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

        def _send_deadline(self) -> None:
            self._send_timer = None
            log.warning("a client read no response for %g s: connection dropped", send_timeout_s)
            self.transport.abort()

        def shutdown(self) -> None:
            # uvicorn waits for a request whose body is still arriving; it will not be served anyway
            if self.cycle is not None and not self.cycle.response_complete and getattr(self.cycle, "more_body", False):
                self.transport.close()
                return
            super().shutdown()

        def connection_lost(self, exc) -> None:
            for timer in (self._header_timer, self._send_timer):
                if timer is not None:
                    timer.cancel()
            self._header_timer = self._send_timer = None
            super().connection_lost(exc)

    return GuardedProtocol


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
        self.model_errors = self.rejected = self.queue_depth = self.in_flight = 0

    def request(self, path: str, code: int, seconds: float) -> None:
        path = path if path in KNOWN_PATHS else "other"         # bounded label set
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
            for name, h, text in (("bertkit_batch_items", self.batch_items, "Inputs per model call."),
                                  ("bertkit_batch_tokens", self.batch_tokens, "Real tokens per model call.")):
                out += [f"# HELP {name} {text}", f"# TYPE {name} histogram", *h.lines(name)]
            for name, kind, text, value in (
                    ("bertkit_model_errors_total", "counter", "Model calls that raised.", self.model_errors),
                    ("bertkit_rejected_total", "counter", "Requests refused because the queue was full (503).",
                     self.rejected),
                    ("bertkit_queue_depth", "gauge", "Requests waiting for the model.", self.queue_depth),
                    ("bertkit_in_flight_requests", "gauge", "Requests being handled.", self.in_flight)):
                out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(out) + "\n"


KNOWN_PATHS = {"/v1/embed", "/v1/classify", "/v1/fill-mask", "/v1/ner", "/v1/qa", "/v1/embeddings", "/v1/models",
               "/embed", "/predict", "/rerank", "/v1/inspect", "/", "/healthz", "/readyz", "/metrics", "/v1/model",
               "/docs", "/openapi.json"}
