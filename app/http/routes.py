"""The OpenAI API's generation routes: chat, completions, responses, embeddings. Thin by design.

Each route parses its body (protocol models), picks the model's backend, and for generation awaits
the first item of the backend's stream, so that validation, admission and queue errors get a real
status code before any byte is sent; then it either streams SSE or returns one JSON body.
Response shapes are `openai/answers.py`'s; the SSE framing is `http/sse.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from app.engine.interface import Embeddings, EmbedRequest, GenerateRequest, GenerationParams, PromptInput
from app.errors import InternalError, InvalidRequest, ServiceError, wrong_runner
from app.http import sse
from app.http.client_targets import client_targets, session_hint
from app.http.clocks import CLIENT_READING
from app.http.ingress_state import state_of
from app.http.metrics import RequestTimer
from app.http.wire_json import JSONBody, dumps_yielding
from app.openai import completion_batch as batch_stream
from app.openai import embeddings
from app.openai.answers import Responder, StreamWriter
from app.openai.chat import ChatCompletionRequest
from app.openai.chat_batch import BatchChatCompletionRequest, BatchChatShape
from app.openai.choice_shapes import ChatShape, CompletionShape
from app.openai.completions import CompletionRequest
from app.openai.responses_api import ResponsesRequest, responses_param, summary
from app.openai.responses_events import ResponsesWriter
from app.tenancy import cache_salt

log = logging.getLogger("app.ingress")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client hung up first"; only the access log sees it
# The OpenAPI document names both bodies a generation route answers with.
_STREAMED: dict[int | str, dict[str, Any]] = {200: {"content": {sse.MEDIA_TYPE: {}},
                                                     "description": "JSON, or server-sent events with `stream`"}}

router = APIRouter()
# Builds the object that turns one request's engine output into its API's body or stream events, from the
# request id and the model id (known once the request is admitted).
WriterFactory = Callable[[str, str], StreamWriter]


@router.post("/v1/chat/completions", responses=_STREAMED)
async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
    def writer(request_id: str, model_id: str) -> StreamWriter:
        shape = ChatShape(body.forced_tool_choice, body.echo_text, body.response_role, body.top_logprobs_shown)
        return Responder(request_id, model_id, shape, body.n,
                         include_usage=body.include_usage, continuous_usage=body.continuous_usage,
                         return_token_ids=bool(body.return_token_ids),
                         prompt_tokens_details=_prompt_tokens_details(request))

    return await _generate_unless_gone(request, body, writer, "chatcmpl")


@router.post("/v1/chat/completions/batch")
async def chat_completions_batch(request: Request, body: BatchChatCompletionRequest) -> Response:
    """vLLM's batched chat: conversation i's answer is choice i (app/openai/chat_batch.py)."""
    def writer(request_id: str, model_id: str) -> StreamWriter:
        shape = BatchChatShape(body.conversations())
        return Responder(request_id, model_id, shape, len(body.messages), include_usage=body.include_usage,
                         return_token_ids=bool(body.return_token_ids),
                         prompt_tokens_details=_prompt_tokens_details(request))

    return await _generate_unless_gone(request, body, writer, "chatcmpl")


@router.post("/v1/completions", responses=_STREAMED)
async def completions(request: Request, body: CompletionRequest) -> Response:
    def writer(request_id: str, model_id: str) -> StreamWriter:
        # A batch's choices: prompt i's choice j is choice i * n + j (app/openai/completion_batch.py).
        shape = CompletionShape(n=body.n, echo_texts=body.echo_texts, echo_logprobs=body.echo_logprobs,
                                echo_in_text=not body.return_token_ids,  # vLLM's: the prompt's ids, not its text
                                echo_only=body.echo_only)
        return Responder(request_id, model_id, shape, body.n * body.prompt_count,
                         include_usage=body.include_usage, continuous_usage=body.continuous_usage,
                         return_token_ids=bool(body.return_token_ids),
                         prompt_tokens_details=_prompt_tokens_details(request))

    return await _generate_unless_gone(request, body, writer, "cmpl")


def _prompt_tokens_details(request: Request) -> bool:
    return state_of(request).config.service.enable_prompt_tokens_details


@router.post("/v1/responses", responses=_STREAMED)
async def create_response(request: Request, body: ResponsesRequest) -> Response:
    """The Responses API, served as the chat completion it amounts to (app/openai/responses_api.py)."""
    chat = body.to_chat()
    settings = summary(body)

    def writer(request_id: str, model_id: str) -> StreamWriter:
        return ResponsesWriter(Responder(request_id, model_id, ChatShape(chat.forced_tool_choice), 1), settings,
                               body.request_id)

    try:
        return await _generate_unless_gone(request, chat, writer, "resp")
    except InvalidRequest as err:  # chat's refusal, about a parameter the client sent under its Responses name
        raise type(err)(err.message, param=responses_param(err.param), retry_after_s=err.retry_after_s) from None


@router.post("/v1/embeddings")
async def create_embeddings(request: Request, body: embeddings.EmbeddingRequest) -> Response:
    """Embeddings of a model served with `runner: embed` (app/openai/embeddings.py), admitted as one request."""
    work = _embed(request, body)
    return await (work if state_of(request).behind_serve_proxy else _cancel_on_disconnect(request, work))


async def _embed(request: Request, body: embeddings.EmbeddingRequest) -> Response:
    state = state_of(request)
    model, backend = state.backend_for(body.model)
    request.state.model = model.id
    if model.runner != "embed":
        raise wrong_runner(model.id, model.runner, "embeddings")
    engine_request = EmbedRequest(
        request_id=embeddings.new_request_id(), inputs=body.to_inputs(model.limits),
        timeout_s=state.config.service.request_timeout_s, dimensions=body.dimensions,
        trace_id=request.state.request_id, tenant=request.state.tenant,
        ttft_target_s=client_targets(request.headers, stream=False).first_token_s)

    async def answer() -> AsyncGenerator[Embeddings, None]:
        yield await backend.embed(engine_request)

    timer = RequestTimer(state.metrics, model.id, request.state.arrived)
    reserved = state.capacity.limits.reserve_together(request.state.tenant, engine_request.inputs)
    stream = state.capacity.track(model.id, answer(), request.state.tenant, reserved)  # full: refused here
    try:
        result = await anext(stream)
        timer.done(time.perf_counter())
    finally:
        if not timer.finished:
            timer.client_left(request.url.path)
        await stream.aclose()
    answer_id = _answer_id(request, body.request_id, embeddings.ID_PREFIX) or engine_request.request_id
    payload = embeddings.response_body(answer_id, model.id, result, body.encoding_format)
    return Response(await dumps_yielding(payload, "data"), media_type="application/json")


async def _generate_unless_gone(
    request: Request, body: ChatCompletionRequest | CompletionRequest, writer: WriterFactory, prefix: str
) -> Response:
    work = _generate(request, body, writer, prefix)
    return await (work if state_of(request).behind_serve_proxy else _cancel_on_disconnect(request, work))


async def _generate(
    request: Request, body: ChatCompletionRequest | CompletionRequest, make_writer: WriterFactory, prefix: str
) -> Response:
    state = state_of(request)
    model, backend = state.backend_for(body.model)
    request.state.model = model.id
    if model.runner != "generate":
        raise wrong_runner(model.id, model.runner, "generation")
    if isinstance(body, BatchChatCompletionRequest):
        prompts = [c.to_prompt(model.limits) for c in body.conversations()]
        params = body.to_params(model.limits, model.engine.tool_call_parser)
    elif isinstance(body, ChatCompletionRequest):
        prompts = [body.to_prompt(model.limits)]
        params = body.to_params(model.limits, model.engine.tool_call_parser)
    else:
        prompts, params = body.to_prompts(model.limits), body.to_params(model.limits)
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    engine_requests = _engine_requests(request, body, request_id, prompts, params)
    timer = RequestTimer(state.metrics, model.id, request.state.arrived)
    tenant = request.state.tenant
    request.state.asked_tokens = len(prompts) * params.n * params.max_tokens  # counted against a tenant if refused
    # Its tokens_per_minute, for the most each may cost.
    reservations = state.capacity.limits.reserve_each(tenant, prompts, params.n * params.max_tokens)
    # A stream's connection, when this process holds it: a client that stops reading is paused out of the engine.
    client = request.scope.get("extensions", {}).get(CLIENT_READING, {}).get("connection") if body.stream else None
    streams = [state.capacity.track(model.id, backend.generate(r, client), tenant, reserved)  # full: refused here
               for r, reserved in zip(engine_requests, reservations, strict=True)]
    stream, admitted = await _admitted(streams, params.n)  # validation and admission errors: before the 200
    writer = make_writer((prefix != "resp" and _answer_id(request, body.request_id, prefix)) or request_id, model.id)
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


def _answer_id(request: Request, body_id: str | None, prefix: str) -> str | None:
    """vLLM's id for an answer the client named (its X-Request-Id, else the body's `request_id`); the engine request
    keeps an id of its own, unique whatever is sent."""
    given = request.state.request_id if "x-request-id" in request.headers else body_id
    return f"{prefix}-{given}" if given else None


def _engine_requests(request: Request, body: ChatCompletionRequest | CompletionRequest, request_id: str,
                     prompts: list[PromptInput], params: GenerationParams) -> list[GenerateRequest]:
    """One engine request per prompt (a batch's each with its own id), with the client's targets and tenant."""
    targets = client_targets(request.headers, stream=bool(body.stream))
    session = session_hint(request.headers, body.session_id or body.prompt_cache_key)
    params = replace(params, cache_salt=cache_salt(request.state.tenant, params.cache_salt))  # a tenant's own blocks
    return [GenerateRequest(request_id=request_id if len(prompts) == 1 else f"{request_id}-{i}", prompt=prompt,
                            params=params, timeout_s=state_of(request).config.service.request_timeout_s,
                            want_prompt_text=isinstance(body, CompletionRequest) and body.echo,
                            trace_id=request.state.request_id, ttft_target_s=targets.first_token_s,
                            finish_target_s=targets.finish_s, session_id=session, tenant=request.state.tenant)
            for i, prompt in enumerate(prompts)]


async def _admitted(streams: list[AsyncGenerator[Any, None]], n: int) -> tuple[AsyncGenerator[Any, None], list[Any]]:
    """The one stream of deltas and what admitted each prompt: all of them, or the first refusal raised."""
    if len(streams) > 1:
        batch = batch_stream.Batch(streams, n)
        admitted = await batch.admitted()  # the others aborted on a refusal
        return batch.deltas(), admitted
    try:
        return streams[0], [await anext(streams[0])]
    except BaseException:
        await streams[0].aclose()
        raise


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
