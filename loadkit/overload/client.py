"""The overload driver's raw client: one chat completion over httpx (a stream read as SSE), classified; and one
client's closed loop. Raw, not `vllm bench serve` nor the SDK: the point is each answer's status, error code and
Retry-After, early hang-ups by design, and a refused client's own back-off.

Outcomes: ok | hangup (by design) | refused (at arrival: queue full, or 429 over its time target; `code` says
which) | queue_timeout | error_5xx | error_4xx | stream_error (an error event inside a 200 stream, or a stream
without `[DONE]`) | transport | hung (no answer within the service's request timeout plus a grace).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from typing import Any

import httpx

from loadkit.overload.mix import Mix
from loadkit.record import Record
from loadkit.sse import ChatStream, delta_text
from loadkit.workload import Ask, PromptMaker

BACKOFF_CAP_S = 1.0  # honour Retry-After, but never wait longer: the phase must stay overloaded
HUNG_GRACE_S = 10.0  # a request with no response within request_timeout + this is "hung"
FAILURES = ("error_5xx", "error_4xx", "transport", "stream_error")


def classify_error(rec: Record, status: int, body: bytes, headers: httpx.Headers) -> None:
    rec.status = status
    rec.detail = body[:300].decode("utf-8", "replace")
    try:
        rec.code = (json.loads(body).get("error") or {}).get("code")
    except (ValueError, AttributeError):
        rec.code = None
    try:
        rec.retry_after = float(headers.get("retry-after")) if headers.get("retry-after") else None
    except ValueError:
        rec.retry_after = None
    if (rec.code == "queue_full" and status in (429, 503)) or (rec.code == "over_time_target" and status == 429):
        rec.outcome = "refused"
    elif rec.code == "queue_timeout" and status == 503:
        rec.outcome = "queue_timeout"
    elif status >= 500:
        rec.outcome = "error_5xx"
    else:
        rec.outcome = "error_4xx"


async def _streaming(http: httpx.AsyncClient, body: dict, ask: Ask, rec: Record) -> None:
    async with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Request-Id": rec.request_id}) as r:
        if r.status_code != 200:
            classify_error(rec, r.status_code, await r.aread(), r.headers)
            return
        rec.status = 200
        chunks = 0
        stream = ChatStream(r)
        async for event in stream.events():
            if "error" in event:
                rec.outcome, rec.code = "stream_error", (event["error"] or {}).get("code")
                rec.detail = json.dumps(event)[:300]
                continue
            if event.get("usage"):
                rec.output_tokens = event["usage"].get("completion_tokens", 0)
                rec.prompt_tokens = event["usage"].get("prompt_tokens", 0)
            if delta_text(event):
                chunks += 1
                if rec.ttft is None:
                    rec.ttft = time.monotonic() - rec.start
                if ask.hangup and chunks >= ask.hangup_chunks:
                    rec.outcome = "hangup"  # leaving the block closes the connection mid-stream
                    return
        if stream.done:
            rec.outcome = rec.outcome or "ok"
            return
        rec.outcome = rec.outcome or "stream_error"  # the stream ended without [DONE]
        rec.code = rec.code or "no_done_marker"


async def _plain(http: httpx.AsyncClient, body: dict, ask: Ask, rec: Record) -> None:
    try:
        post = http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": rec.request_id})
        r = await (asyncio.wait_for(post, timeout=ask.hangup_after_s) if ask.hangup else post)
    except TimeoutError:
        rec.outcome = "hangup"
        return
    if r.status_code != 200:
        classify_error(rec, r.status_code, r.content, r.headers)
        return
    rec.status, rec.outcome = 200, "ok"
    usage = r.json()["usage"]
    rec.output_tokens, rec.prompt_tokens = usage["completion_tokens"], usage["prompt_tokens"]


async def one_request(http: httpx.AsyncClient, model: str, prompts: PromptMaker, ask: Ask,
                      hung_after_s: float) -> Record:
    body: dict[str, Any] = {"model": model, "messages": prompts.messages(ask), "max_tokens": ask.max_tokens,
                            "temperature": 0, "ignore_eos": True, "stream": ask.stream}
    if ask.stream:
        body["stream_options"] = {"include_usage": True}
    rec = Record(time.monotonic(), ask=ask, request_id=f"ovl-{uuid.uuid4().hex}")
    try:
        async with asyncio.timeout(hung_after_s):
            await (_streaming if ask.stream else _plain)(http, body, ask, rec)
    except TimeoutError:
        rec.outcome = "hung"
    except httpx.HTTPError as err:
        rec.outcome, rec.code, rec.detail = "transport", type(err).__name__, str(err)[:300]
    rec.end = time.monotonic()
    return rec


async def client_loop(http: httpx.AsyncClient, model: str, prompts: PromptMaker, mix: Mix, deadline: float,
                      hung_after_s: float, out: list[Record], seed: int) -> None:
    """Requests back to back until `deadline`; a refused request is retried after a short, capped backoff."""
    rng = random.Random(seed)  # backoff jitter only; the mix has its own generator
    ask = None
    while time.monotonic() < deadline:
        ask = ask or mix.next()
        rec = await one_request(http, model, prompts, ask, hung_after_s)
        out.append(rec)
        if rec.outcome in ("refused", "queue_timeout"):
            wait = min(rec.retry_after or BACKOFF_CAP_S, BACKOFF_CAP_S) * rng.uniform(0.75, 1.0)
            await asyncio.sleep(min(wait, max(0.0, deadline - time.monotonic())))
            continue
        ask = None
        if rec.outcome in FAILURES:
            await asyncio.sleep(min(BACKOFF_CAP_S, max(0.0, deadline - time.monotonic())))
