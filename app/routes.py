"""The OpenAI API routes: chat, completions, models, tokenize, detokenize. Thin by design.

Each route parses its body (protocol models), picks the model's backend, and for generation awaits
the first item of the backend's stream, so that validation, admission and queue errors get a real
status code before any byte is sent; then it either streams SSE or returns one JSON body.
Response shapes are `responses.py`'s; the SSE framing is `sse.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from app import sse
from app.client_targets import client_targets
from app.config import ModelConfig
from app.engine import Admitted, GenerateRequest, PromptInput
from app.errors import InternalError, InvalidRequest, ServiceError
from app.ingress_state import IngressState
from app.metrics import RequestTimer
from app.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from app.responses import ChatShape, CompletionShape, Responder
from app.wire_json import JSONBody

log = logging.getLogger("app.ingress")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client hung up first"; only the access log sees it
# The OpenAPI document names both bodies a generation route answers with.
_STREAMED: dict[int | str, dict[str, Any]] = {
    200: {"content": {sse.MEDIA_TYPE: {}}, "description": "JSON, or server-sent events with `stream`"}
}

router = APIRouter()


def _state(request: Request) -> IngressState:
    state: IngressState = request.app.state.ingress
    return state


@router.post("/v1/chat/completions", responses=_STREAMED)
async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
    return await _generate_unless_gone(request, body, ChatShape(), "chatcmpl")


@router.post("/v1/completions", responses=_STREAMED)
async def completions(request: Request, body: CompletionRequest) -> Response:
    shape = CompletionShape(echo_text=(body.prompt if isinstance(body.prompt, str) else "") if body.echo else None)
    if body.echo and isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], str):
        shape.echo_text = body.prompt[0]
    return await _generate_unless_gone(request, body, shape, "cmpl")


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(m) for m in _state(request).config.models]}


@router.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> dict[str, Any]:
    model, _ = _state(request).backend_for(model_id)
    return _model_card(model)


@router.post("/tokenize")
async def tokenize(request: Request, body: TokenizeRequest) -> Response:
    model, backend = _state(request).backend_for(body.model)
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
    # Our encoder, straight to bytes: FastAPI's jsonable_encoder walks every id on the event loop.
    return JSONBody({"count": len(tokens), "max_model_len": model.engine.max_model_len, "tokens": tokens})


@router.post("/detokenize")
async def detokenize(request: Request, body: DetokenizeRequest) -> Response:
    _, backend = _state(request).backend_for(body.model)
    if any(t < 0 for t in body.tokens):
        raise InvalidRequest("'tokens' must not be negative", param="tokens")
    return JSONBody({"prompt": await backend.detokenize(body.tokens)})


def _model_card(model: ModelConfig) -> dict[str, Any]:
    return {
        "id": model.id,
        "object": "model",
        "created": 0,
        "owned_by": "app",
        "max_model_len": model.engine.max_model_len,
    }


async def _generate_unless_gone(
    request: Request, body: ChatCompletionRequest | CompletionRequest, shape: ChatShape | CompletionShape, prefix: str
) -> Response:
    work = _generate(request, body, shape, prefix)
    return await (work if _state(request).behind_serve_proxy else _cancel_on_disconnect(request, work))


async def _generate(
    request: Request, body: ChatCompletionRequest | CompletionRequest, shape: ChatShape | CompletionShape, prefix: str
) -> Response:
    state = _state(request)
    model, backend = state.backend_for(body.model)
    request.state.model = model.id
    prompt, params = body.to_prompt(model.limits), body.to_params(model.limits)
    targets = client_targets(request.headers, stream=bool(body.stream))
    engine_request = GenerateRequest(
        request_id=f"{prefix}-{uuid.uuid4().hex}",
        prompt=prompt,
        params=params,
        timeout_s=state.config.service.request_timeout_s,
        want_prompt_text=isinstance(shape, CompletionShape) and shape.echo_text is not None,
        trace_id=request.state.request_id,
        ttft_target_s=targets.first_token_s,
        finish_target_s=targets.finish_s,
    )
    timer = RequestTimer(state.metrics, model.id, request.state.arrived)
    stream = state.capacity.track(model.id, backend.generate(engine_request))  # a full service refuses here
    try:
        admitted: Admitted = await anext(stream)  # validation and admission errors surface here, before the 200
    except BaseException:
        await stream.aclose()
        raise
    if isinstance(shape, CompletionShape) and admitted.prompt_text is not None:
        shape.echo_text = admitted.prompt_text
    responder = Responder(engine_request.request_id, model.id, shape, params.n, include_usage=body.include_usage,
                          continuous_usage=body.continuous_usage)
    responder.admitted(admitted)
    if body.stream:
        return StreamingResponse(
            _events(responder, stream, timer, request.url.path), media_type=sse.MEDIA_TYPE, headers=sse.HEADERS
        )
    timer.token(time.perf_counter())
    try:
        result = await responder.collect(stream)
        timer.done(time.perf_counter())
        return JSONBody(result)
    finally:
        if not timer.finished:
            timer.client_left(request.url.path)
        await stream.aclose()


async def _events(
    responder: Responder, stream: AsyncGenerator[Any, None], timer: RequestTimer, endpoint: str
) -> AsyncGenerator[bytes, None]:
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
