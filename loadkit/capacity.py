"""`python -m loadkit capacity`: the capacity one replica reports (`pace.capacity_tokens_per_s` in /stats, what the
autoscaling policy plans on) beside what it serves, through a light load, a full batch and a light load again
(docs/autoscaling.md, "A replica's capacity at light load").

One stack (`python -m app serve` on configs/cpu.yaml, one replica); closed-loop clients (`SteadyLoad`, plain
answers), each sending one chat at a time for `--output-tokens` tokens (ignore_eos, so every answer is as long; a
client refused waits a second); /stats read every `--poll-s`. A light load's own fit, extrapolated to the full
batch, understated the capacity by 2.4-3x: what the replica keeps from a full batch is the figure to compare with
what it served.

    python -m loadkit capacity [--light 2] [--full 40] [--phase-s 60]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field

import httpx

from loadkit.report import progress
from loadkit.server_stats import stats_json
from loadkit.service import BASE_CONFIG, OwnService
from loadkit.steady_load import SteadyLoad

PROMPT = "Write a short story about a lighthouse keeper and a storm at sea, with a twist at the end. " * 3
say = progress("capacity")


@dataclass
class Phase:
    name: str
    clients: int
    seconds: float
    reported: list[float] = field(default_factory=list)  # capacity_tokens_per_s, one per poll
    output_tokens: int = 0
    refused: int = 0  # 429: more clients than the replica admits in time
    failed: int = 0

    def row(self) -> str:
        low, high = (f"{min(self.reported):.0f}", f"{max(self.reported):.0f}") if self.reported else ("-", "-")
        return (f"| {self.name}: {self.clients} clients, {self.seconds:.0f} s | {low}-{high} output tokens/s | "
                f"{self.output_tokens / self.seconds:.0f} tokens/s | {self.refused} | {self.failed} |")


async def _poll(base_url: str, model: str, phase: Phase, stop_at: float, poll_s: float) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        while time.monotonic() < stop_at:
            await asyncio.sleep(min(poll_s, max(0.0, stop_at - time.monotonic())))
            pace = (await stats_json(http, model)).get("pace") or {}
            if pace.get("capacity_tokens_per_s") is not None:
                phase.reported.append(pace["capacity_tokens_per_s"])
                say(f"{phase.name}: capacity reported {pace['capacity_tokens_per_s']:.0f} output tokens/s")


def _run_phase(service: OwnService, model: str, phase: Phase, poll_s: float, output_tokens: int) -> None:
    started = time.monotonic()
    with SteadyLoad(service.base_url, service.api_key or "none", model, plain=phase.clients, streaming=0,
                    max_tokens=output_tokens, timeout_s=300, question=PROMPT, sampling={}, ignore_eos=True,
                    refused_pause_s=1.0) as load:
        asyncio.run(_poll(service.base_url, model, phase, started + phase.seconds, poll_s))
    # The answers finished after the phase's end still count: the phase's clients asked for them within it.
    records = load.since(started)
    phase.output_tokens = sum(r.output_tokens for r in records)
    phase.refused = sum(r.status == 429 for r in records)
    phase.failed = len(load.failures(since=started)) - phase.refused


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadkit capacity", description=__doc__.split("\n\n")[0])
    ap.add_argument("--light", type=int, default=2, help="clients of the light phases")
    ap.add_argument("--full", type=int, default=40, help="clients of the full phase (more than the replica's slots)")
    ap.add_argument("--phase-s", type=float, default=60)
    ap.add_argument("--poll-s", type=float, default=10)
    ap.add_argument("--output-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    phases = [Phase("light", args.light, args.phase_s), Phase("full batch", args.full, args.phase_s),
              Phase("light again", args.light, args.phase_s)]
    service = OwnService(BASE_CONFIG, "capacity", key=False)
    try:
        why = service.start(600, ready_model=service.model)
        if why is not None:
            raise SystemExit(f"the service did not start: {why}")
        for phase in phases:
            _run_phase(service, service.model or "", phase, args.poll_s, args.output_tokens)
    finally:
        report = service.stop()
        say(f"stack stopped: {report.text() if report else 'never started'}")
    print("| phase | capacity the replica reported | what it served | refused (429) | failed |\n|---|---|---|---|---|")
    print("\n".join(phase.row() for phase in phases))
    return 0
