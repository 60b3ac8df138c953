"""What a running service says about itself on /stats: one model's entry as `Stats`, and the wait until it has
nothing running or queued (`wait_idle`, polled every 0.25 s); and whether it still answers a normal chat."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from loadkit.report import Check
from loadkit.waiting import NotReached, until

QUESTION = "What is the capital of France?"


@dataclass(frozen=True)
class Stats:
    """One model's entry of the service's /stats, the fields the report reads."""

    t: float = 0.0  # when it was read (monotonic)
    engine_running: int = 0
    generation_tokens_total: int | None = None
    kv_cache_usage: float = 0.0
    preemptions_total: int = 0
    running: int = 0  # admission: admitted and in the engine
    waiting: int = 0  # admission: queued
    in_system: int = 0
    peak_waiting: int = 0
    refused_queue_full: int = 0
    refused_queue_timeout: int = 0
    refused_over_time_target: int = 0
    predicted_first_token_s: float | None = None  # the latest arrival's prediction (None: not yet measured)
    pace_samples: int | None = None  # pace.*: the replica's measured rates (None: an older service)
    pace_prefill_tokens_per_s: float | None = None
    pace_decode_s_per_token: float | None = None
    pace_output_share: float | None = None
    token_budget: int | str = "?"
    kv_cache_tokens: int | str = "?"
    healthy: bool = True

    @classmethod
    def from_json(cls, d: dict, t: float = 0.0) -> Stats:
        engine, admission, pace = d.get("engine") or {}, d.get("admission") or {}, d.get("pace") or {}
        return cls(t=t, engine_running=engine.get("running", 0),
                   generation_tokens_total=engine.get("generation_tokens_total"),
                   kv_cache_usage=engine.get("kv_cache_usage", 0.0),
                   preemptions_total=engine.get("preemptions_total", 0),
                   running=admission.get("running", 0), waiting=admission.get("waiting", 0),
                   in_system=admission.get("in_system", 0), peak_waiting=admission.get("peak_waiting", 0),
                   refused_queue_full=admission.get("refused_queue_full", 0),
                   refused_queue_timeout=admission.get("refused_queue_timeout", 0),
                   refused_over_time_target=admission.get("refused_over_time_target", 0),
                   predicted_first_token_s=admission.get("predicted_first_token_s"),
                   pace_samples=pace.get("samples"), pace_prefill_tokens_per_s=pace.get("prefill_tokens_per_s"),
                   pace_decode_s_per_token=pace.get("decode_s_per_token"),
                   pace_output_share=pace.get("output_share"),
                   token_budget=admission.get("token_budget", "?"), kv_cache_tokens=d.get("kv_cache_tokens", "?"),
                   healthy=d.get("healthy", True))

    @property
    def idle(self) -> bool:
        return self.engine_running == 0 and self.in_system == 0


@dataclass(frozen=True)
class Idle:
    """The outcome of waiting for the service to have nothing running or queued: the last /stats read (None: none
    could be read)."""

    reached: bool
    took_s: float
    stats: Stats | None


async def stats_json(http: httpx.AsyncClient, model: str) -> dict:
    """One model's entry of /stats, as the service wrote it."""
    r = await http.get("/stats", timeout=30)
    r.raise_for_status()
    return r.json()[model]


async def get_stats(http: httpx.AsyncClient, model: str) -> Stats:
    return Stats.from_json(await stats_json(http, model), time.monotonic())


async def wait_idle(http: httpx.AsyncClient, model: str, timeout_s: float) -> Idle:
    """Polls /stats until engine.running == 0 and admission.in_system == 0, or `timeout_s` (a poll that fails is
    one more poll)."""
    t0, last = time.monotonic(), [None]

    async def idle() -> bool:
        try:
            last[0] = await get_stats(http, model)
        except (httpx.HTTPError, KeyError, ValueError):
            return False
        return last[0].idle

    try:
        await until(idle, timeout_s, what="the service idle", interval_s=0.25)
        return Idle(True, time.monotonic() - t0, last[0])
    except NotReached:
        return Idle(False, time.monotonic() - t0, last[0])


async def normal_chat(http: httpx.AsyncClient, model: str, timeout_s: float = 60, expect: str = "",
                      shown: int = 60) -> Check:
    """One normal chat at temperature 0: answered (200, some text, containing `expect` if given), and how."""
    t0 = time.monotonic()
    try:
        r = await http.post("/v1/chat/completions", timeout=timeout_s, json={
            "model": model, "temperature": 0, "max_tokens": 20, "messages": [{"role": "user", "content": QUESTION}]})
        text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text
    except Exception as err:  # whatever broke, the check failed: said, not raised
        return Check(False, f"{type(err).__name__}: {err}")
    ok = r.status_code == 200 and bool(text.strip()) and expect in text
    return Check(ok, f"HTTP {r.status_code} in {time.monotonic() - t0:.2f} s: {text.strip()[:shown]!r}")
