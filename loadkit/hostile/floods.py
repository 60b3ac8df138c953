"""The hostile requests that are well-formed HTTP: giant prompts (each sent once, ~900 KB of text, far over any
context window, under the body limit) and a /tokenize flood (closed-loop clients, each sending the next
request as soon as the last is answered, up to a total count or the end of the attack). Each answer is kept:
status, error code, latency; a request with no answer within the timeout is 'hung'.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass

import httpx

from loadkit.hostile.plan import Plan
from loadkit.hostile.wire import giant_prompt_body, tokenize_body

GIANT = "giant prompt"
TOKENIZE = "/tokenize"


@dataclass
class Answer:
    kind: str
    start: float
    end: float = 0.0
    status: int | None = None
    code: str | None = None
    error: str = ""  # 'hung' (no answer within the timeout), 'unanswered' (at the end), a transport error's name

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def label(self) -> str:
        if self.status is None:
            return self.error or "?"
        return f"{self.status} {self.code}" if self.code else str(self.status)


def counts(answers: list[Answer]) -> dict[str, int]:
    return dict(Counter(a.label for a in answers).most_common())


async def _post(http: httpx.AsyncClient, kind: str, path: str, content: bytes, timeout_s: float,
                out: list[Answer]) -> None:
    """Appended before it is sent: one still unanswered when the attack is cancelled stays as 'unanswered'."""
    answer = Answer(kind, time.monotonic(), error="unanswered")
    out.append(answer)
    try:
        r = await http.post(path, content=content, headers={"Content-Type": "application/json"},
                            timeout=httpx.Timeout(timeout_s, connect=10))
        answer.status, answer.error = r.status_code, ""
        if r.status_code != 200:
            try:
                answer.code = (r.json().get("error") or {}).get("code")
            except (ValueError, AttributeError):
                answer.code = None
    except httpx.TimeoutException:
        answer.error = "hung"
    except httpx.TransportError as err:
        answer.error = type(err).__name__
    answer.end = time.monotonic()


async def giant_prompts(http: httpx.AsyncClient, model: str, plan: Plan, out: list[Answer]) -> None:
    """`plan.giant_prompts` chats of `plan.giant_prompt_bytes` characters each, all at once."""
    content = json.dumps(giant_prompt_body(model, plan.giant_prompt_bytes)).encode()

    async def one() -> None:
        await _post(http, GIANT, "/v1/chat/completions", content, plan.polite_timeout_s, out)

    await asyncio.gather(*(one() for _ in range(plan.giant_prompts)))


async def tokenize_flood(http: httpx.AsyncClient, model: str, plan: Plan, out: list[Answer]) -> None:
    """`plan.tokenize_clients` closed loops sharing `plan.tokenize_requests` requests (cancel to stop early)."""
    content = json.dumps(tokenize_body(model, plan.tokenize_prompt_words)).encode()
    left = [plan.tokenize_requests]

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            await _post(http, TOKENIZE, "/tokenize", content, plan.polite_timeout_s, out)

    await asyncio.gather(*(client() for _ in range(plan.tokenize_clients)))
