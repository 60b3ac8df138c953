"""What the service shows while a phase of the overload run goes on, polled side by side: /stats snapshots, /livez
and /stats latency, the process tree's RSS, and this driver's own event-loop lag (how far to trust its clock)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from loadkit.proctree import ProcessTree
from loadkit.server_stats import Stats
from loadkit.waiting import every


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


async def watch(http: httpx.AsyncClient, model: str, tree: ProcessTree, w: Watch, stop: asyncio.Event) -> None:
    """Polls until `stop` is set, filling `w`."""

    async def stats() -> None:
        t0 = time.monotonic()
        try:
            r = await http.get("/stats", timeout=10)
            w.stats_latency.append(time.monotonic() - t0)
            w.samples.append(Stats.from_json(r.json()[model], t0))
        except Exception:
            w.poll_errors += 1

    async def livez() -> None:  # the proxy + ingress path alone, no engine replica: the floor for any answer
        t0 = time.monotonic()
        try:
            await http.get("/livez", timeout=10)
            w.livez_latency.append(time.monotonic() - t0)
        except Exception:
            w.poll_errors += 1

    async def rss() -> None:
        sample = await asyncio.to_thread(tree.rss)
        if tree.root_pid is not None:
            if sample.total >= max(w.rss, default=0):
                w.rss_peak_roles = sample.by_role
            w.rss.append(sample.total)

    async def lag_loop():  # a 50 ms sleep that wakes late means every latency measured here is late by as much
        while not stop.is_set():
            t0 = time.monotonic()
            await asyncio.sleep(0.05)
            w.loop_lag.append(max(0.0, time.monotonic() - t0 - 0.05))

    await asyncio.gather(every(0.25, stop, stats), every(0.25, stop, livez), every(0.5, stop, rss), lag_loop())
