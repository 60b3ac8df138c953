"""What the service says about itself: over HTTP, /stats (the engine's and the admission's figures, the engine's
dtype), the wait until nothing is running, the normal chat afterwards, and /metrics; and, for a service this
driver started, its log's `engine request` lines (how each engine request ended).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from loadkit.hostile.lag import Histogram, parse_histogram

QUESTION = "What is the capital of France?"


@dataclass(frozen=True)
class StatsPoint:
    t: float  # monotonic
    engine_running: int
    admission_running: int
    waiting: int
    in_system: int
    refused_queue_full: int = 0
    refused_queue_timeout: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any], t: float) -> StatsPoint:
        engine, admission = d.get("engine") or {}, d.get("admission") or {}
        return cls(t, engine.get("running", 0), admission.get("running", 0), admission.get("waiting", 0),
                   admission.get("in_system", 0), admission.get("refused_queue_full", 0),
                   admission.get("refused_queue_timeout", 0))

    @property
    def idle(self) -> bool:
        return self.engine_running == 0 and self.in_system == 0


@dataclass(frozen=True)
class Idle:
    reached: bool
    took_s: float
    last: StatsPoint | None


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


@dataclass
class EngineFacts:
    dtype: str = "?"
    dtype_reason: str = ""
    compute_cores: list[int] = field(default_factory=list)


async def stats(http: httpx.AsyncClient, model: str) -> dict[str, Any]:
    r = await http.get("/stats", timeout=30)
    r.raise_for_status()
    return r.json()[model]


async def stats_point(http: httpx.AsyncClient, model: str) -> StatsPoint:
    return StatsPoint.from_json(await stats(http, model), time.monotonic())


async def engine_facts(http: httpx.AsyncClient, model: str) -> EngineFacts:
    engine = (await stats(http, model)).get("engine") or {}
    return EngineFacts(engine.get("dtype") or "?", engine.get("dtype_reason") or "",
                       list(engine.get("compute_cores") or []))


async def wait_idle(http: httpx.AsyncClient, model: str, timeout_s: float) -> Idle:
    """Polls /stats until engine.running == 0 and admission.in_system == 0, or `timeout_s`."""
    t0, last = time.monotonic(), None
    while True:
        try:
            last = await stats_point(http, model)
            if last.idle:
                return Idle(True, time.monotonic() - t0, last)
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        if time.monotonic() - t0 > timeout_s:
            return Idle(False, time.monotonic() - t0, last)
        await asyncio.sleep(0.25)  # a poll interval: how late the idle state is noticed, no more


async def capital_of_france(http: httpx.AsyncClient, model: str, timeout_s: float = 60) -> Check:
    """A normal chat at temperature 0 must still answer 'Paris'."""
    body = {"model": model, "temperature": 0, "max_tokens": 20, "messages": [{"role": "user", "content": QUESTION}]}
    t0 = time.monotonic()
    try:
        r = await http.post("/v1/chat/completions", json=body, timeout=timeout_s)
        text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text
    except (httpx.HTTPError, KeyError, ValueError) as err:
        return Check(False, f"{type(err).__name__}: {err}")
    took = time.monotonic() - t0
    ok = r.status_code == 200 and "Paris" in text
    return Check(ok, f"HTTP {r.status_code} in {took:.2f} s: {text.strip()[:80]!r}")


async def lag_histogram(http: httpx.AsyncClient) -> Histogram | None:
    try:
        r = await http.get("/metrics", timeout=30)
    except httpx.HTTPError:
        return None
    return parse_histogram(r.text) if r.status_code == 200 else None


def engine_outcomes(log_text: str) -> tuple[dict[str, int], dict[str, float]]:
    """From a service log: how many `engine request` lines ended each way, and the median generated tokens of
    each outcome."""
    outcomes: Counter[str] = Counter()
    tokens: dict[str, list[int]] = {}
    for line in log_text.splitlines():
        if '"engine request"' not in line or "{" not in line:
            continue
        try:
            d = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        outcome = str(d.get("outcome", "?"))
        outcomes[outcome] += 1
        tokens.setdefault(outcome, []).append(int(d.get("generated_tokens") or 0))
    medians = {k: sorted(v)[len(v) // 2] for k, v in tokens.items() if v}
    return dict(outcomes.most_common()), medians
