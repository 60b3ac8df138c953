"""`python -m loadkit burst`: the burst that opened issue 15, as a new user tries it: N chat requests at once
against a running service (`make serve`), each sent once.

The goodput benchmark's seeded mix goes through the real `openai` SDK with no retries, so every request's own fate
shows (its status, error code and Retry-After, which `vllm bench serve` does not keep); the summary is what the
promise is about: the first token of every admitted request against the service's target, how fast and how
honestly (Retry-After) the rest were refused, and whether any request waited only to be refused. Prints
Markdown; exit status 0 only if every check passes. docs/overload.md has the issue's figures and the runs since.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass

import httpx

from loadkit.record import Record
from loadkit.sdk import make_client, send
from loadkit.stats import percentile
from loadkit.workload import PromptMaker, mix


@dataclass
class BurstResult:
    records: list[Record]
    wall_s: float  # from the burst's start until its last answer
    ttft_target_s: float | None  # the service's first-token target, as told (the config's default: 10 s)

    @property
    def codes(self) -> Counter[str]:
        """Answers by kind: "200", "429 over_time_target", "503 queue_timeout", ..."""
        return Counter(outcome_key(r) for r in self.records)

    @property
    def served(self) -> list[Record]:
        return [r for r in self.records if r.outcome == "ok"]

    @property
    def first_tokens(self) -> list[float]:
        """Seconds to the first token of each served stream."""
        return [r.ttft for r in self.served if r.ttft is not None]

    @property
    def refused(self) -> list[Record]:
        return [r for r in self.records if r.outcome == "refused"]

    @property
    def queue_timeouts(self) -> list[Record]:
        """Those that waited out the queue timeout only to be refused (503 queue_timeout)."""
        return [r for r in self.records if r.code == "queue_timeout"]


def outcome_key(rec: Record) -> str:
    """The status and, for an error, its OpenAI error code: how a client tells the reasons apart."""
    if rec.outcome == "ok":
        return "200"
    return f"{rec.status or 'no response'} {rec.code or rec.outcome}"


def retry_after_s(rec: Record) -> float | None:
    values = [a.retry_after for a in rec.attempts if a.retry_after]
    try:
        return float(values[-1]) if values else None
    except ValueError:
        return None


async def run_burst(base_url: str, count: int, seed: int, api_key: str | None, model: str | None,
                    timeout_s: float, ttft_target_s: float | None) -> BurstResult:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as http:
        listed = (await http.get("/v1/models")).raise_for_status().json()["data"]
        model = model or listed[0]["id"]
        prompts = PromptMaker()
        await prompts.calibrate(http, model)
    client, log = make_client(base_url, timeout_s, api_key=api_key, max_retries=0)
    try:
        t0 = time.monotonic()
        records = [Record(t0, ask=ask, scheduled=t0) for ask in mix(seed, count)]
        await asyncio.gather(*(send(client, log, model, prompts, rec) for rec in records))
        wall = max(r.end for r in records) - t0
    finally:
        await client.close()
    return BurstResult(records, wall, ttft_target_s)


def _p(values: list[float], q: float, scale: float = 1.0, digits: int = 2) -> str:
    v = percentile(values, q)
    return "-" if v is None else f"{v * scale:.{digits}f}"


def summary(result: BurstResult) -> list[str]:
    """Markdown lines: what every request got, and the promise's figures."""
    recs, served, firsts, refused = result.records, result.served, result.first_tokens, result.refused
    refusal_ms = [r.attempts[-1].seconds for r in refused if r.attempts]
    retry = [v for r in refused if (v := retry_after_s(r)) is not None]
    queue_timeouts = result.queue_timeouts
    target = result.ttft_target_s
    lines = [f"- {len(recs)} requests at once, each sent once (no retries); the last answer after "
             f"{result.wall_s:.1f} s.",
             "- Answers: " + ", ".join(f"{k}: {n}" for k, n in sorted(result.codes.items())) + "."]
    within = f"; {sum(t <= target for t in firsts)} of {len(firsts)} within the {target:g} s target" if target else ""
    lines.append(f"- Served: {len(served)}. First token of the served streams p50 / p99 / max "
                 f"{_p(firsts, 50)} / {_p(firsts, 99)} / {max(firsts):.2f} s{within}." if firsts else
                 f"- Served: {len(served)} (no streamed first token to time).")
    whole = [r.latency for r in served]
    if whole:
        lines.append(f"- Whole answer of the served p50 / p99 / max {_p(whole, 50)} / {_p(whole, 99)} / "
                     f"{max(whole):.2f} s.")
    if refused:
        lines.append(f"- Refused: {len(refused)}, answered in p50 / p99 / max {_p(refusal_ms, 50, 1000, 0)} / "
                     f"{_p(refusal_ms, 99, 1000, 0)} / {max(refusal_ms) * 1000:.0f} ms; Retry-After on "
                     f"{len(retry)} of them, {min(retry):g}-{max(retry):g} s." if retry else
                     f"- Refused: {len(refused)}, answered in p50 / p99 {_p(refusal_ms, 50, 1000, 0)} / "
                     f"{_p(refusal_ms, 99, 1000, 0)} ms; no Retry-After.")
    waited = [r.latency for r in queue_timeouts]
    lines.append(f"- Waited only to be refused (503 queue_timeout): {len(queue_timeouts)}"
                 + (f", after {min(waited):.1f}-{max(waited):.1f} s." if waited else "."))
    others = [r for r in recs if r.outcome in ("failed", "timed_out") and r not in queue_timeouts]
    if others:
        lines.append(f"- Failed or timed out otherwise: {len(others)} ({Counter(r.detail[:60] for r in others)}).")
    return lines


def honest(result: BurstResult, tolerance_s: float = 2.0) -> list[str]:
    """The promise's checks, as PASS/FAIL lines: every served first token within the target (plus `tolerance_s`
    for the client's own clock), no queue timeout, a Retry-After on every refusal (whole seconds, at least 1)."""
    firsts, refused = result.first_tokens, result.refused
    retry = [retry_after_s(r) for r in refused]
    checks = []
    if result.ttft_target_s is not None and firsts:
        late = [t for t in firsts if t > result.ttft_target_s + tolerance_s]
        checks.append((f"served first tokens within the target + {tolerance_s:g} s", not late,
                       f"{len(late)} of {len(firsts)} later"))
    timeouts = len(result.queue_timeouts)
    checks.append(("no request waited out the queue timeout", timeouts == 0, f"{timeouts}"))
    bad = [v for v in retry if v is None or v < 1 or not math.isfinite(v)]
    checks.append(("every refusal has a Retry-After of at least 1 s", not bad, f"{len(bad)} of {len(refused)} without"))
    return [f"- {'PASS' if ok else 'FAIL'}: {name} ({detail})" for name, ok, detail in checks]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m loadkit burst", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the running service (default: make serve's)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer key, if the service has keys")
    p.add_argument("--model", default=None, help="model id (default: the first /v1/models lists)")
    p.add_argument("--count", type=int, default=240, help="requests sent at once (default 240)")
    p.add_argument("--seed", type=int, default=15, help="seed of the request mix (default 15)")
    p.add_argument("--ttft-target", type=float, default=10.0,
                   help="the service's first-token target, s (default 10: deployment.ttft_target_s's default)")
    p.add_argument("--timeout", type=float, default=300.0, help="the SDK's timeout per request, s (default 300)")
    args = p.parse_args(argv)
    try:
        result = asyncio.run(run_burst(args.base_url.rstrip("/"), args.count, args.seed, args.api_key, args.model,
                                       args.timeout, args.ttft_target))
    except httpx.HTTPError as err:
        print(f"burst: cannot reach the service at {args.base_url} ({type(err).__name__}: {err}); start it with "
              "`make serve`, or give --base-url (and --api-key if it has keys)", file=sys.stderr)
        return 2
    lines = summary(result)
    checks = honest(result)
    print("\n".join(["## Burst", "", *lines, "", *checks]))
    return 0 if all(c.startswith("- PASS") for c in checks) else 1
