"""Sends one workload (workloads.py) to a service and records every request as its client saw it: streamed, greedy,
`ignore_eos` so every answer has the same length, usage included (the engine's cached tokens with it).

Completions go out `concurrency` at a time; chat sessions all at once (a chat service's users do not wait for each
other), each turn after the previous answer and a think time, the answer kept in the history, the session named in
`X-Session-Id`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

from loadkit.routing.workloads import OUTPUT_TOKENS, Request

THINK_S = 1.0
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Outcome:
    status: int
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0


async def _stream(client: httpx.AsyncClient, path: str, body: dict, headers: dict[str, str]) -> tuple[Outcome, str]:
    started = time.monotonic()
    ttft, text, usage = None, [], {}
    async with client.stream("POST", path, json=body, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            return Outcome(response.status_code), ""
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                piece = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                if piece is not None and ttft is None:
                    ttft = time.monotonic() - started
                text.append(piece or "")
            usage = chunk.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return Outcome(200, ttft, time.monotonic() - started, int(usage.get("completion_tokens") or 0),
                   int(usage.get("prompt_tokens") or 0), int(details.get("cached_tokens") or 0)), "".join(text)


def _body(model: str) -> dict:
    return {"model": model, "max_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


async def drive(base_url: str, model: str, requests: list[Request], concurrency: int, key: str = ""
                ) -> tuple[list[Outcome], float]:
    """Every request's outcome (a session's, one per turn) and the run's wall time."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    gate = asyncio.Semaphore(concurrency)
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=max(concurrency, len(requests)) * 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT_S, limits=limits) as client:

        async def completion(request: Request) -> None:
            async with gate:
                outcome, _ = await _stream(client, "/v1/completions", {**_body(model), "prompt": request.prompt},
                                           headers)
                outcomes.append(outcome)

        async def session(request: Request) -> None:
            messages = [{"role": "system", "content": request.system}]
            for i, turn in enumerate(request.turns):
                if i:
                    await asyncio.sleep(THINK_S)
                messages.append({"role": "user", "content": turn})
                outcome, answer = await _stream(client, "/v1/chat/completions", {**_body(model), "messages": messages},
                                                {**headers, "X-Session-Id": request.session})
                outcomes.append(outcome)
                if outcome.status != 200:
                    return
                messages.append({"role": "assistant", "content": answer})

        started = time.monotonic()
        await asyncio.gather(*(session(r) if r.is_session else completion(r) for r in requests))
        return outcomes, time.monotonic() - started
