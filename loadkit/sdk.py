"""The `openai` SDK as a real client uses it (AsyncOpenAI), every attempt on the wire counted by the transport.

The kit's own client only where the point is the SDK itself: its retries (by default max_retries=2, honouring
Retry-After) and what each attempt got (status, error code, Retry-After), which `vllm bench serve` neither does nor
records; a closed-loop throughput sweep is `vllm bench serve`'s (loadkit.bench.load).

Outcomes: ok (the whole answer) | refused (the last attempt got 429, or 503 other than a queue timeout) |
timed_out (the SDK's timeout, a server's queue timeout, or cut off by the harness at the end of a window) |
failed (anything else: other statuses, broken streams, connection errors).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx2
import openai

from loadkit.record import Attempt, Record
from loadkit.workload import PromptMaker

OUTCOMES = ("ok", "refused", "timed_out", "failed")
WASTED = ("refused", "timed_out", "failed")
REFUSAL_STATUSES = (429, 503)
HEADER = "x-loadkit-request"  # the SDK sends the same extra headers on every attempt: attempts are joined by it


class AttemptLog(httpx2.AsyncBaseTransport):
    """A transport around the real one that notes every attempt of every request, by the request's header."""

    def __init__(self, inner: httpx2.AsyncBaseTransport):
        self.inner = inner
        self.attempts: dict[str, list[Attempt]] = {}

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        key, t0 = request.headers.get(HEADER, ""), time.monotonic()
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException as err:  # a timeout, a refused connection, the harness's cut-off
            self.attempts.setdefault(key, []).append(Attempt(None, time.monotonic() - t0, type(err).__name__))
            raise
        self.attempts.setdefault(key, []).append(Attempt(response.status_code, time.monotonic() - t0,
                                                         retry_after=response.headers.get("retry-after")))
        return response

    def take(self, key: str) -> list[Attempt]:
        return self.attempts.pop(key, [])

    async def aclose(self) -> None:
        await self.inner.aclose()


def make_client(base_url: str, timeout_s: float, api_key: str | None = None,
                inner: httpx2.AsyncBaseTransport | None = None,
                max_retries: int = openai.DEFAULT_MAX_RETRIES) -> tuple[openai.AsyncOpenAI, AttemptLog]:
    """The SDK client every request of a system shares (its default max_retries, 2, unless told), on a pool large
    enough that the load generator is never the queue (`inner`: another transport, for tests)."""
    log = AttemptLog(inner or httpx2.AsyncHTTPTransport(limits=httpx2.Limits(max_connections=4096,
                                                                              max_keepalive_connections=256)))
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key or "none", timeout=timeout_s,
                                max_retries=max_retries,
                                http_client=openai.DefaultAsyncHttpx2Client(transport=log))
    return client, log


def error_code(body: object) -> str | None:
    """The `code` of an OpenAI-style error body (the SDK hands over the inner `error` object, or the whole body)."""
    if not isinstance(body, dict):
        return None
    inner = body.get("error")
    return (inner if isinstance(inner, dict) else body).get("code")


def status_outcome(status: int, body: object) -> str:
    if status == 503 and error_code(body) == "queue_timeout":
        return "timed_out"
    return "refused" if status in REFUSAL_STATUSES else "failed"


async def _create(client: openai.AsyncOpenAI, model: str, prompts: PromptMaker, rec: Record, key: str) -> None:
    ask = rec.ask
    args = {"model": model, "messages": prompts.messages(ask), "max_tokens": ask.max_tokens, "temperature": 0,
            "extra_body": {"ignore_eos": True}, "extra_headers": {HEADER: key}}
    if not ask.stream:
        answer = await client.chat.completions.create(**args)
        rec.output_tokens = answer.usage.completion_tokens if answer.usage else 0
        rec.outcome, rec.status = "ok", 200
        return
    stream = await client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args)
    rec.status, chunks, finished = 200, 0, False
    async for chunk in stream:
        if chunk.usage:
            rec.output_tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                chunks += 1
                if rec.chunk_times is not None:
                    rec.chunk_times.append(time.monotonic())
                if rec.ttft is None:
                    rec.ttft = time.monotonic() - rec.start
            finished = finished or choice.finish_reason is not None
    rec.output_tokens = rec.output_tokens or chunks
    rec.outcome = "ok" if finished else "failed"
    rec.detail = "" if finished else "stream ended without a finish_reason"


async def send(client: openai.AsyncOpenAI, log: AttemptLog, model: str, prompts: PromptMaker, rec: Record) -> Record:
    """Sends `rec.ask` and fills `rec` in (`rec.chunk_times`, if a list, gets each content chunk's arrival); a
    cancellation (the harness's cut-off) is recorded, then re-raised."""
    key = uuid.uuid4().hex
    try:
        await _create(client, model, prompts, rec, key)
    except asyncio.CancelledError:
        rec.outcome, rec.detail = "timed_out", "cut off at the end of the window"
        raise
    except openai.APITimeoutError:
        rec.outcome, rec.detail = "timed_out", "client timeout"
    except openai.APIStatusError as err:
        rec.status, rec.detail, rec.code = err.status_code, str(err)[:200], error_code(err.body)
        rec.outcome = status_outcome(err.status_code, err.body)
    except httpx2.TimeoutException as err:  # inside a stream, after its 200
        rec.outcome, rec.detail = "timed_out", f"client timeout in the stream ({type(err).__name__})"
    except Exception as err:  # openai.OpenAIError, httpx2.HTTPError, a malformed answer: one request fails, not the run
        rec.outcome, rec.detail = "failed", f"{type(err).__name__}: {err}"[:200]
    finally:
        rec.end = time.monotonic()
        rec.attempts = log.take(key)
    return rec
