"""The clients of `python -m loadkit fairness`: streamed chats over httpx with the usage on every chunk, sent on
an open-loop schedule (one task per arrival), in a closed loop (the capacity), or all at once (the burst).

A run ends at its duration: whatever is still open is cancelled (closing a stream aborts its engine request), and
the service is left idle before the next run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator

import httpx

from loadkit.fairness.account import OPEN, Answer
from loadkit.fairness.plan import DEFAULT, Shape
from loadkit.report import progress
from loadkit.sdk import error_code
from loadkit.server_stats import wait_idle
from loadkit.sse import ChatStream
from loadkit.workload import Ask, PromptMaker

say = progress("fairness")


class Driver:
    """Sends chats to one service; every prompt is new (a run-wide counter opens each), so no run is served from
    another's prefix cache."""

    def __init__(self, base_url: str, model: str, admin_key: str, prompts: PromptMaker,
                 numbers: Iterator[int] | None = None):
        self.base_url, self.model, self.admin_key, self.prompts = base_url, model, admin_key, prompts
        self.numbers = numbers if numbers is not None else itertools.count(1)

    def client(self, connections: int = 600) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=64)
        return httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(180, connect=30), limits=limits,
                                 headers={"Authorization": f"Bearer {self.admin_key}"})

    def body(self, shape: Shape) -> dict:
        ask = Ask(index=next(self.numbers), prompt_tokens=shape.prompt, max_tokens=shape.output, stream=True)
        return {"model": self.model, "messages": self.prompts.messages(ask), "max_tokens": shape.output,
                "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}

    async def send(self, http: httpx.AsyncClient, key: str, shape: Shape, answer: Answer, t0: float) -> None:
        """Fills `answer` as the stream goes (times from `t0`)."""
        try:
            async with http.stream("POST", "/v1/chat/completions", json=self.body(shape),
                                   headers={"Authorization": f"Bearer {key}"}) as r:
                answer.status = r.status_code
                if r.status_code != 200:
                    try:
                        body = json.loads(await r.aread())
                        answer.code = error_code(body) or ""
                        answer.message = str((body.get("error") or {}).get("message", ""))[:300]
                    except (ValueError, AttributeError):
                        answer.code = answer.code or "?"
                    return
                async for event in ChatStream(r).events():
                    usage = event.get("usage") or {}
                    generated = usage.get("completion_tokens") or 0
                    answer.prompt_tokens = usage.get("prompt_tokens") or answer.prompt_tokens
                    if generated > answer.generated:
                        now = time.monotonic() - t0
                        answer.first = now if answer.first is None else answer.first
                        answer.progress.append((now, generated))
        except httpx.HTTPError as err:
            answer.status, answer.code = answer.status or 0, answer.code or f"transport: {type(err).__name__}"
        except asyncio.CancelledError:
            if answer.status != 200:
                answer.status, answer.code = 0, OPEN
            raise
        finally:
            answer.ended = time.monotonic() - t0

    async def settle(self, http: httpx.AsyncClient, timeout_s: float = 180) -> None:
        idle = await wait_idle(http, self.model, timeout_s)
        if not idle.reached:
            say(f"the service was not idle {idle.took_s:.0f} s after the run")

    async def open_loop(self, schedule: list[tuple[str, str, Shape, float]], duration: float) -> list[Answer]:
        """Sends each (client, key, shape, at) at its time; cancels what is open at `duration`."""
        answers: list[Answer] = []
        async with self.client() as http:
            t0 = time.monotonic()

            async def fire(client: str, key: str, shape: Shape, at: float) -> None:
                await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
                answer = Answer(client, sent=time.monotonic() - t0)
                answers.append(answer)
                await self.send(http, key, shape, answer, t0)

            tasks = [asyncio.create_task(fire(*item)) for item in sorted(schedule, key=lambda item: item[3])]
            await asyncio.sleep(max(0.0, t0 + duration - time.monotonic()))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.settle(http)
        return answers

    async def closed_loop(self, key: str, streams: int, duration: float) -> list[Answer]:
        """`streams` clients, each sending the next default-shape request when its last ends, for `duration`. Their
        first requests are of different lengths, so that they do not all prefill and end in step."""
        answers: list[Answer] = []
        async with self.client() as http:
            t0 = time.monotonic()

            async def loop(i: int) -> None:
                shape = Shape(DEFAULT.prompt, 1 + i * DEFAULT.output // streams)
                while time.monotonic() < t0 + duration:
                    answer = Answer("capacity", sent=time.monotonic() - t0)
                    answers.append(answer)
                    await self.send(http, key, shape, answer, t0)
                    shape = DEFAULT
                    if answer.status != 200:
                        await asyncio.sleep(0.2)

            tasks = [asyncio.create_task(loop(i)) for i in range(streams)]
            await asyncio.sleep(duration)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.settle(http)
        return answers

    async def burst(self, key: str, count: int, timeout_s: float = 300) -> list[Answer]:
        """`count` default-shape requests at once, each to its end."""
        answers = [Answer("burst", sent=0.0) for _ in range(count)]
        async with self.client() as http:
            t0 = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*(self.send(http, key, DEFAULT, a, t0) for a in answers)),
                                   timeout_s)
            await self.settle(http)
        return answers

    async def calibrate(self) -> None:
        async with self.client() as http:
            await self.prompts.calibrate(http, self.model)
