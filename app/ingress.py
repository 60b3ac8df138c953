"""The HTTP front door: a FastAPI app speaking the OpenAI API. No vLLM here.

Routes stay thin: parse (protocol models), pick the model's backend, await the
first item of its stream so that validation, admission and queue errors get a
real status code, then either stream SSE or return one JSON body. A backend is
anything with `EngineHost`'s methods: the host itself in tests, a Ray Serve
handle adapter (`builder.HandleBackend`) in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Mapping, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import sse
from app.config import AppConfig, ModelConfig
from app.errors import (HeadersTooLarge, InternalError, InvalidRequest, MethodNotAllowed, ModelNotFound, NotFound, PayloadTooLarge,
                        ServiceError, ServiceUnavailable, Unauthorized, queue_full_class)
from app.protocol import Admitted, ChatCompletionRequest, CompletionRequest, GenerateRequest, PromptInput
from app.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from app.metrics import Metrics, RequestTimer
from app.serving import ChatShape, CompletionShape, Responder

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/livez", "/metrics"})  # probes and scrapes need no key
KNOWN_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize", "/detokenize",
                             "/health", "/livez", "/stats", "/metrics"})
GENERATION_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions"})
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client hung up first"; only the access log sees it
QUIET_ENDPOINTS = frozenset({"/health", "/livez", "/metrics"})  # probes and scrapes would drown the access log
access_log = logging.getLogger("app.access")


class Backend(Protocol):
    def generate(self, request: GenerateRequest) -> AsyncIterator[Any]: ...
    async def tokenize(self, prompt: PromptInput) -> list[int]: ...
    async def detokenize(self, token_ids: list[int]) -> str: ...
    async def check_health(self) -> None: ...
    async def check_ready(self) -> None: ...
    async def stats(self) -> dict[str, Any]: ...


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    tokens: list[int] = Field(..., max_length=1_000_000)


class _JSONResponse(JSONResponse):
    """JSONResponse that survives a client's lone surrogates ("\\ud800" is legal JSON, not UTF-8): they go
    back as the same JSON escape instead of a UnicodeEncodeError (a 500) when echoed in an error or a prompt."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                          separators=(",", ":")).encode("utf-8", "backslashreplace")


def _error_response(err: ServiceError) -> JSONResponse:
    return _JSONResponse(err.body(), status_code=err.status, headers=err.headers())


class Capacity:
    """What this ingress has in flight per model, against what the model's replicas can hold at most
    (replicas x (max_ongoing + max_queued)). Past that, the replicas would refuse anyway: refusing
    here costs no Ray call, so a refusal stays cheap when it matters most, under overload. The
    replicas' own admission remains the authority (with several ingress replicas this is per ingress)."""

    def __init__(self, config: AppConfig):
        self.limit = {m.id: m.deployment.num_replicas * (m.deployment.max_ongoing_requests + m.deployment.max_queued_requests)
                       for m in config.models}
        self.inflight = {m.id: 0 for m in config.models}
        self._refusal = queue_full_class(config.service.refusal_status)

    def refusal_if_all_full(self) -> ServiceError | None:
        """Every model at capacity: any generation request would be refused, whatever its body says."""
        if all(self.inflight[m] >= self.limit[m] for m in self.limit):
            return self._refusal("Server is at capacity; retry after the Retry-After delay, with backoff", retry_after_s=1)
        return None

    async def track(self, model_id: str, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """`stream`, counted from its first `anext` until it is closed, however that happens: by the
        end of the stream, an error, the client leaving, or garbage collection of a body never sent."""
        if self.inflight[model_id] >= self.limit[model_id]:
            await stream.aclose()
            raise self._refusal(f"Server is at capacity for '{model_id}' ({self.limit[model_id]} requests running or queued); "
                                "retry after the Retry-After delay, with backoff", retry_after_s=1)
        self.inflight[model_id] += 1
        try:
            async for item in stream:
                yield item
        finally:
            self.inflight[model_id] -= 1
            await stream.aclose()


class Lifecycle:
    """Requests in flight, and whether the service is draining for shutdown."""

    def __init__(self) -> None:
        self.inflight = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.inflight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def drain(self, grace_s: float) -> int:
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=grace_s)
        except asyncio.TimeoutError:
            pass
        return self.inflight


class Gate:
    """Pure ASGI middleware in front of every route: request id, API key, body size.

    Pure ASGI (not BaseHTTPMiddleware) so streams and client disconnects pass
    through untouched and the token path pays for no extra task.
    """

    def __init__(self, app, keys: list[bytes], max_body_bytes: int, max_header_bytes: int, lifecycle: Lifecycle,
                 echo_request_id: bool, metrics: Metrics, capacity: Capacity):
        self.app = app
        self.capacity = capacity
        self.max_header_bytes = max_header_bytes
        self.metrics = metrics
        self.echo_request_id = echo_request_id
        self.keys = keys
        self.max_body_bytes = max_body_bytes
        self.lifecycle = lifecycle

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        request_id = headers.get(b"x-request-id", b"").decode("latin-1")[:128] or uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["arrived"] = started = time.perf_counter()
        id_header = (b"x-request-id", request_id.encode("latin-1"))
        status = 0

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if self.echo_request_id:
                    message = {**message, "headers": [*message.get("headers", []), id_header]}
            await send(message)

        async def refuse(err: ServiceError):
            self.metrics.refusals.labels("-", err.code or err.type).inc()
            await _error_response(err)(scope, receive, send_with_id)
            self._record(scope, status, started)

        if self.keys and scope["path"] not in OPEN_PATHS and not _authorized(headers.get(b"authorization", b""), self.keys):
            return await refuse(Unauthorized("Missing or invalid API key; send 'Authorization: Bearer <key>'"))
        header_bytes = sum(len(k) + len(v) for k, v in scope.get("headers", ()))
        if header_bytes > self.max_header_bytes:
            return await refuse(HeadersTooLarge(f"Request headers total {header_bytes} bytes; the limit is {self.max_header_bytes}"))
        if self.lifecycle.draining and scope["path"] != "/livez":
            return await refuse(ServiceUnavailable("The service is shutting down; retry on another instance", retry_after_s=5))
        if scope["path"] in GENERATION_ENDPOINTS and (full := self.capacity.refusal_if_all_full()):
            return await refuse(full)  # before reading or parsing the body: under overload most requests end here
        too_large = PayloadTooLarge(f"Request body is larger than the {self.max_body_bytes}-byte limit; send a smaller request")
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return await refuse(too_large)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise too_large
            return message

        self.lifecycle.enter()
        try:
            return await self.app(scope, limited_receive, send_with_id)
        finally:
            self.lifecycle.leave()
            self._record(scope, status, started)

    def _record(self, scope, status: int, started: float) -> None:
        """One metric sample and one access-log line per request, when it ends."""
        path = scope["path"]
        endpoint = path if path in KNOWN_ENDPOINTS else "other"
        model = scope["state"].get("model", "-")
        self.metrics.requests.labels(model, endpoint, str(status)).inc()
        if endpoint not in QUIET_ENDPOINTS:
            access_log.info("request", extra={"request_id": scope["state"]["request_id"], "method": scope["method"],
                                              "path": endpoint, "status": status, "model": model,
                                              "duration_ms": round((time.perf_counter() - started) * 1000, 1)})


async def _cancel_on_disconnect(request: Request, work: Awaitable[Response]) -> Response:
    """Runs a route's `work`, cancelling it if the client hangs up first. Serve's proxy cancels the
    task itself; a plain uvicorn only reports it as an `http.disconnect` from `receive()`, which no
    one reads while a non-streaming request generates (a stream's body notices on its own). The
    cancellation then takes the usual path: `finally` blocks abort the engine request."""

    async def until_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(until_disconnect())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and watch.exception() is not None:  # receive() failed: no word on the client
            await asyncio.wait((task,))
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():  # the client left; nobody reads this, but the access log shows why it ended
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return task.result()


def create_app(config: AppConfig, backends: Mapping[str, Backend], behind_serve_proxy: bool = False) -> FastAPI:
    """The OpenAI API over `backends` (model id -> backend). `behind_serve_proxy`: Serve's HTTP proxy
    answers the socket; it returns X-Request-Id itself and cancels the request's task when the client
    hangs up. Without it (a plain uvicorn, tests), the app does both."""
    api = FastAPI(title="LLM service (OpenAI-compatible)", version="0.1.0")
    models: dict[str, ModelConfig] = {m.id: m for m in config.models}
    timeout_s = config.service.request_timeout_s
    metrics = Metrics()
    capacity = api.state.capacity = Capacity(config)

    # -- errors: every one in the OpenAI shape --------------------------------

    @api.exception_handler(ServiceError)
    async def _service_error(request: Request, err: ServiceError):
        metrics.refusals.labels(getattr(request.state, "model", "-"), err.code or err.type).inc()
        return _error_response(err)

    @api.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            return _error_response(InvalidRequest("The request body is not valid JSON", param=None))
        param = loc[0] if loc else None
        where = ".".join(loc) or "body"
        return _error_response(InvalidRequest(f"Invalid value for '{where}': {first.get('msg', 'invalid')}", param=param))

    @api.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        if err.status_code == 404:
            return _error_response(NotFound(f"No route {request.method} {request.url.path}; see docs/api.md for the endpoints"))
        if err.status_code == 405:
            return _error_response(MethodNotAllowed(f"Method {request.method} is not allowed on {request.url.path}"))
        if isinstance(err.__cause__, ServiceError):  # e.g. Gate's PayloadTooLarge, wrapped by FastAPI's body reader
            return _error_response(err.__cause__)
        fallback = InvalidRequest(str(err.detail)) if 400 <= err.status_code < 500 else ServiceError(str(err.detail))
        fallback.status = err.status_code  # keep the status; never turn a client error into a 500
        return _error_response(fallback)

    @api.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception):
        log.exception("unexpected error on %s", request.url.path)
        return _error_response(InternalError("The server hit an unexpected error; it has been logged"))

    def backend_for(model_id: str) -> tuple[ModelConfig, Backend]:
        model = models.get(model_id)
        if model is None:
            raise ModelNotFound(f"The model '{model_id}' does not exist; GET /v1/models lists the served models", param="model")
        return model, backends[model_id]

    # -- model-facing routes ---------------------------------------------------

    async def _generate(request: Request, body: ChatCompletionRequest | CompletionRequest, shape, prefix: str):
        model, backend = backend_for(body.model)
        request.state.model = model.id
        prompt, params = body.to_prompt(model.limits), body.to_params(model.limits)
        engine_request = GenerateRequest(
            request_id=f"{prefix}-{uuid.uuid4().hex}",
            prompt=prompt,
            params=params,
            deadline=time.time() + timeout_s,
            want_prompt_text=isinstance(shape, CompletionShape) and shape.echo_text is not None,
            trace_id=request.state.request_id,
        )
        timer = RequestTimer(metrics, model.id, request.state.arrived)
        stream = capacity.track(model.id, backend.generate(engine_request))  # a full service refuses here, no Ray call
        try:
            admitted: Admitted = await anext(stream)  # validation and admission errors surface here, before the 200
        except BaseException:
            await stream.aclose()
            raise
        if isinstance(shape, CompletionShape) and admitted.prompt_text is not None:
            shape.echo_text = admitted.prompt_text
        responder = Responder(engine_request.request_id, model.id, shape, params.n, include_usage=body.include_usage)
        responder.admitted(admitted)
        if body.stream:
            return StreamingResponse(_events(responder, stream, timer, request.url.path), media_type=sse.MEDIA_TYPE, headers=sse.HEADERS)
        timer.token(time.perf_counter())
        try:
            result = await responder.collect(stream)
            timer.done(time.perf_counter())
            return _JSONResponse(result)
        finally:
            if not timer.finished:
                timer.client_left(request.url.path)
            await stream.aclose()

    # The OpenAPI document names both bodies a generation route answers with; /metrics is Prometheus text.
    streamed = {200: {"content": {sse.MEDIA_TYPE: {}}, "description": "JSON, or server-sent events with `stream`"}}

    async def generate(request: Request, body: ChatCompletionRequest | CompletionRequest, shape, prefix: str):
        work = _generate(request, body, shape, prefix)
        return await (work if behind_serve_proxy else _cancel_on_disconnect(request, work))

    @api.post("/v1/chat/completions", responses=streamed)
    async def chat_completions(request: Request, body: ChatCompletionRequest):
        return await generate(request, body, ChatShape(), "chatcmpl")

    @api.post("/v1/completions", responses=streamed)
    async def completions(request: Request, body: CompletionRequest):
        shape = CompletionShape(echo_text=(body.prompt if isinstance(body.prompt, str) else "") if body.echo else None)
        if body.echo and isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], str):
            shape.echo_text = body.prompt[0]
        return await generate(request, body, shape, "cmpl")

    @api.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [_model_card(m) for m in config.models]}

    @api.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        model, _ = backend_for(model_id)
        return _model_card(model)

    @api.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        model, backend = backend_for(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise InvalidRequest("Send exactly one of 'prompt' or 'messages'", param="prompt")
        if body.messages is not None:
            try:
                chat = ChatCompletionRequest(model=body.model, messages=body.messages)
            except ValidationError as err:  # a bad message is the client's 400, not a 500
                raise InvalidRequest(f"Invalid 'messages': {err.errors()[0]['msg']}", param="messages") from None
            prompt = chat.to_prompt(model.limits)
        else:
            prompt = PromptInput(text=body.prompt)
        tokens = await backend.tokenize(prompt)
        return {"count": len(tokens), "max_model_len": model.engine.max_model_len, "tokens": tokens}

    @api.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        _, backend = backend_for(body.model)
        if any(t < 0 for t in body.tokens):
            raise InvalidRequest("'tokens' must not be negative", param="tokens")
        return {"prompt": await backend.detokenize(body.tokens)}

    # -- operations --------------------------------------------------------------

    @api.get("/livez")
    async def livez():
        return {"status": "alive"}

    @api.get("/health")
    async def health():
        results = await asyncio.gather(*(_healthy(b) for b in backends.values()))
        per_model = dict(zip(backends.keys(), results))
        ok = all(per_model.values())
        return JSONResponse({"status": "ok" if ok else "unavailable", "models": per_model}, status_code=200 if ok else 503)

    @api.get("/stats")
    async def stats():
        return {model_id: await b.stats() for model_id, b in backends.items()}

    @api.get("/metrics", response_class=PlainTextResponse)
    async def prometheus_metrics():
        per_model = {}
        for model_id, b in backends.items():
            try:
                per_model[model_id] = await asyncio.wait_for(b.stats(), timeout=5)
            except Exception:  # a dead or busy replica must not break the scrape of everything else
                pass
        return Response(metrics.render(per_model), media_type=METRICS_CONTENT_TYPE)

    api.state.lifecycle = Lifecycle()
    api.add_middleware(Gate, keys=[k.encode() for k in config.api_keys()], max_body_bytes=config.service.max_body_bytes,
                       max_header_bytes=config.service.max_header_bytes,
                       lifecycle=api.state.lifecycle, echo_request_id=not behind_serve_proxy, metrics=metrics, capacity=capacity)
    return api


def _authorized(header: bytes, keys: list[bytes]) -> bool:
    scheme, _, token = header.partition(b" ")
    if scheme.lower() != b"bearer" or not token:
        return False
    presented = token.strip()
    matched = False
    for key in keys:  # compare against every key so timing says nothing about which matched
        matched |= hmac.compare_digest(presented, key)
    return matched


async def _healthy(backend: Backend) -> bool:
    try:
        await asyncio.wait_for(backend.check_ready(), timeout=5)
        return True
    except Exception:
        return False


def _model_card(model: ModelConfig) -> dict[str, Any]:
    return {"id": model.id, "object": "model", "created": 0, "owned_by": "app",
            "max_model_len": model.engine.max_model_len}


async def _events(responder: Responder, stream: AsyncIterator[Any], timer: RequestTimer, endpoint: str) -> AsyncIterator[bytes]:
    """The SSE body of a stream. Closing the stream (client gone) aborts the engine request."""
    clock = time.perf_counter
    ended = False
    try:
        async for delta in stream:
            timer.token(clock())
            yield sse.event(responder.chunk(delta))
        if responder.include_usage:
            yield sse.event(responder.usage_chunk())
        timer.done(clock())
        ended = True
    except ServiceError as err:
        ended = True
        yield sse.error_event(err.body())
    except Exception:
        ended = True
        log.exception("stream %s failed", responder.request_id)
        yield sse.error_event(InternalError("The stream failed on the server; it has been logged").body())
    finally:
        if not ended:
            timer.client_left(endpoint)
        await stream.aclose()
    yield sse.DONE
