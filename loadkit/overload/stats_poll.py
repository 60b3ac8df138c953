"""What the service shows while a phase runs: /stats snapshots, /livez and /stats latency, the process tree's
RSS, and this driver's own event-loop lag (how far to trust its clock)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from loadkit.proctree import ProcessTree


@dataclass(frozen=True)
class Stats:
    """One model's entry of the service's /stats, the fields the report reads."""

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
    def from_json(cls, d: dict) -> Stats:
        engine, admission, pace = d.get("engine") or {}, d.get("admission") or {}, d.get("pace") or {}
        return cls(engine_running=engine.get("running", 0),
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


@dataclass
class Watch:
    """What the pollers saw during one phase."""

    samples: list[Stats] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    rss_peak_roles: dict[str, int] = field(default_factory=dict)
    stats_latency: list[float] = field(default_factory=list)
    livez_latency: list[float] = field(default_factory=list)
    loop_lag: list[float] = field(default_factory=list)
    poll_errors: int = 0

    def peak(self, attr: str) -> int | float | str:
        return max((getattr(s, attr) for s in self.samples), default="-")


@dataclass(frozen=True)
class Idle:
    """The outcome of waiting for the service to have nothing running or queued."""

    reached: bool
    took_s: float
    stats: Stats


async def get_stats(http: httpx.AsyncClient, model: str) -> Stats:
    r = await http.get("/stats", timeout=30)
    r.raise_for_status()
    return Stats.from_json(r.json()[model])


async def wait_idle(http: httpx.AsyncClient, model: str, timeout_s: float) -> Idle:
    t0 = time.monotonic()
    while True:
        s = await get_stats(http, model)
        if s.idle:
            return Idle(True, time.monotonic() - t0, s)
        if time.monotonic() - t0 > timeout_s:
            return Idle(False, time.monotonic() - t0, s)
        await asyncio.sleep(0.25)


async def _sleep_or(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds))
    except TimeoutError:
        pass


async def watch(http: httpx.AsyncClient, model: str, tree: ProcessTree, w: Watch, stop: asyncio.Event) -> None:
    """Polls until `stop` is set, filling `w`."""

    async def stats_loop():
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                r = await http.get("/stats", timeout=10)
                w.stats_latency.append(time.monotonic() - t0)
                w.samples.append(Stats.from_json(r.json()[model]))
            except Exception:
                w.poll_errors += 1
            await _sleep_or(stop, 0.25 - (time.monotonic() - t0))

    async def livez_loop():  # the proxy + ingress path alone, no engine replica: the floor for any answer
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                await http.get("/livez", timeout=10)
                w.livez_latency.append(time.monotonic() - t0)
            except Exception:
                w.poll_errors += 1
            await _sleep_or(stop, 0.25 - (time.monotonic() - t0))

    async def rss_loop():
        while not stop.is_set():
            sample = await asyncio.to_thread(tree.rss)
            if tree.root_pid is not None:
                if sample.total >= max(w.rss, default=0):
                    w.rss_peak_roles = sample.by_role
                w.rss.append(sample.total)
            await _sleep_or(stop, 0.5)

    async def lag_loop():  # a 50 ms sleep that wakes late means every latency measured here is late by as much
        while not stop.is_set():
            t0 = time.monotonic()
            await asyncio.sleep(0.05)
            w.loop_lag.append(max(0.0, time.monotonic() - t0 - 0.05))

    await asyncio.gather(stats_loop(), livez_loop(), rss_loop(), lag_loop())
