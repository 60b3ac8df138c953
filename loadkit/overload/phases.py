"""A phase of the overload run: N clients for a window of time, and the figures of what it served.

Throughput counts only requests completed inside the window, over the window's length, so a phase whose last
clients drain for a while after the window is not flattered by them.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loadkit.overload.client import client_loop
from loadkit.overload.mix import SEED, Mix
from loadkit.overload.stats_poll import Watch, watch
from loadkit.probe import ProbeFindings
from loadkit.proctree import ProcessTree
from loadkit.record import Record
from loadkit.report import progress
from loadkit.server_stats import Stats, get_stats
from loadkit.service import pythonpath
from loadkit.workload import PromptMaker

log = progress("overload")


@dataclass
class Phase:
    name: str
    clients: int
    duration: float
    records: list[Record] = field(default_factory=list)
    watch: Watch = field(default_factory=Watch)
    t0: float = 0.0
    drained_s: float = 0.0  # from the end of the window until the last client returned
    before: Stats = field(default_factory=Stats)
    after: Stats = field(default_factory=Stats)
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds by role during the phase
    loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)
    probe: ProbeFindings = field(default_factory=ProbeFindings)  # the refusal probe's findings, in seconds

    @property
    def window_end(self) -> float:
        return self.t0 + self.duration

    def of(self, *outcomes: str) -> list[Record]:
        return [r for r in self.records if r.outcome in outcomes]

    def served_in_window(self) -> list[Record]:
        return [r for r in self.of("ok") if r.end <= self.window_end]

    @property
    def req_per_s(self) -> float:
        return len(self.served_in_window()) / self.duration

    @property
    def tok_per_s(self) -> float:
        return sum(r.output_tokens for r in self.served_in_window()) / self.duration

    @property
    def engine_tok_per_s(self) -> float | None:
        if self.after.generation_tokens_total is None or self.before.generation_tokens_total is None:
            return None
        return (self.after.generation_tokens_total - self.before.generation_tokens_total) / (
            self.duration + self.drained_s)

    @property
    def rss_peak(self) -> int | None:
        return max(self.watch.rss, default=None)

    def cpu_of(self, *roles: str) -> float:
        return sum(self.cpu.get(r, 0.0) for r in roles)


@dataclass(frozen=True)
class Driving:
    """What every phase drives with: the client, the model, the prompts, the tree and the hung threshold."""

    http: httpx.AsyncClient
    model: str
    prompts: PromptMaker
    tree: ProcessTree
    hung_after_s: float


def start_probe(base_url: str, model: str, api_key: str | None, duration_s: float, out: Path) -> subprocess.Popen:
    """The refusal probe in its own process: a newcomer's view of the service, free of this process's
    event-loop lag."""
    cmd = [sys.executable, "-m", "loadkit", "probe", "--base-url", base_url, "--model", model,
           "--duration", str(duration_s), "--out", str(out), *(["--api-key", api_key] if api_key else [])]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": pythonpath()})


async def idle_phase(d: Driving, seconds: float) -> Phase:
    """Phase a: nothing sent, only watched."""
    idle = Phase("idle", 0, seconds)
    idle.before = await get_stats(d.http, d.model)
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(d.http, d.model, d.tree, idle.watch, stop))
    await asyncio.sleep(seconds)
    stop.set()
    await watcher
    return idle


async def run_phase(phase: Phase, d: Driving, probe: tuple[str, str | None] | None = None) -> Phase:
    """`phase.clients` closed-loop clients for `phase.duration`; `probe`: (base_url, api_key) to run the
    refusal probe beside them for the window."""
    log(f"phase {phase.name}: {phase.clients} clients for {phase.duration:.0f} s")
    phase.before = await get_stats(d.http, d.model)
    cpu0 = await asyncio.to_thread(d.tree.cpu)
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(d.http, d.model, d.tree, phase.watch, stop))
    mix = Mix(SEED)  # the same sequence of requests in every phase
    phase.t0 = time.monotonic()
    deadline = phase.window_end
    probe_out = Path(tempfile.mkstemp(prefix="refusal-probe-", suffix=".json")[1]) if probe else None
    prober = start_probe(probe[0], d.model, probe[1], phase.duration, probe_out) if probe else None
    await asyncio.gather(*(client_loop(d.http, d.model, d.prompts, mix, deadline, d.hung_after_s, phase.records,
                                       seed=i) for i in range(phase.clients)))
    phase.drained_s = max(0.0, time.monotonic() - deadline)
    if prober is not None:
        try:
            await asyncio.to_thread(prober.wait, d.hung_after_s + 30)
            phase.probe = ProbeFindings.from_json(probe_out.read_text())
        except (subprocess.TimeoutExpired, ValueError, TypeError) as err:
            prober.kill()
            prober.wait()
            log(f"refusal probe failed: {err!r}")
        probe_out.unlink(missing_ok=True)
    stop.set()
    await watcher
    cpu1 = await asyncio.to_thread(d.tree.cpu)
    phase.cpu = {k: cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in cpu1}
    phase.after = await get_stats(d.http, d.model)
    phase.loadavg = os.getloadavg()
    counts = Counter(r.outcome for r in phase.records)
    log(f"phase {phase.name} done: {dict(counts)}; served {phase.req_per_s:.2f} req/s, {phase.tok_per_s:.1f} tok/s; "
        f"last client back {phase.drained_s:.1f} s after the window")
    return phase
