"""The figures of one system at one offered rate, from its requests' records, pooled over rounds (every request
of every round, the windows' lengths summed: never a mean of per-round figures); and a run's launches as saved
in results.json.

- goodput: requests that completed within both targets, per second of the arrival window, and their output
  tokens per second. A streaming request must show its first token within the first-token target and finish
  within the whole-request target; a non-streaming one cannot show a first token, so only the latter applies.
- latency p50/p99 of served requests (first token: streaming ones; whole request: all), from the request's
  first attempt, so the SDK's retries and back-offs count; refusal latency p50/p99 per refused attempt (429/503:
  what the client waited for each "no").
- wasted wait: client-seconds of requests that ended refused, timed out or failed, over all client-seconds.
- attempts per served request (1.0: no retries), percentiles by numpy (loadkit.stats).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from loadkit.goodput.launch import LaunchRun, WindowRun
from loadkit.goodput.loops import Rate
from loadkit.record import Record
from loadkit.sdk import OUTCOMES, REFUSAL_STATUSES, WASTED
from loadkit.stats import percentile


@dataclass(frozen=True)
class Targets:
    ttft_s: float = 10.0
    total_s: float = 60.0


def is_good(rec: Record, targets: Targets) -> bool:
    if rec.outcome != "ok" or rec.latency > targets.total_s:
        return False
    return not rec.ask.stream or (rec.ttft is not None and rec.ttft <= targets.ttft_s)


def wasted_share(records: list[Record]) -> float:
    total = sum(r.latency for r in records)
    return sum(r.latency for r in records if r.outcome in WASTED) / total if total > 0 else 0.0


def refusal_seconds(records: list[Record]) -> list[float]:
    return [a.seconds for r in records for a in r.attempts if a.status in REFUSAL_STATUSES]


def attempts_per(records: list[Record]) -> float | None:
    """Mean attempts on the wire per request (a request whose attempts were not seen counts as one)."""
    return sum(max(1, len(r.attempts)) for r in records) / len(records) if records else None


@dataclass
class Figures:
    offered_rps: float
    window_s: float  # the arrival windows' total length (the denominator of every rate)
    sent: int
    outcomes: dict[str, int]
    good: int
    goodput_rps: float
    goodput_tok_s: float
    served_tok_s: float  # every served request's output tokens, within the targets or not
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    total_p50_s: float | None
    total_p99_s: float | None
    refusal_p50_s: float | None
    refusal_p99_s: float | None
    refused_attempts: int
    wasted_share: float
    attempts_per_served: float | None
    attempts_per_request: float | None
    ttft_target_met_p99: bool | None  # served streaming requests' first token at p99 within the target
    max_lag_s: float  # the latest a request left after its scheduled time (the harness's own delay)
    peak_rss_bytes: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def figures(records: list[Record], window_s: float, offered_rps: float, targets: Targets,
            peak_rss_bytes: int = 0) -> Figures:
    served = [r for r in records if r.outcome == "ok"]
    good = [r for r in served if is_good(r, targets)]
    ttfts = [r.ttft for r in served if r.ask.stream and r.ttft is not None]
    totals = [r.latency for r in served]
    refusals = refusal_seconds(records)
    ttft_p99 = percentile(ttfts, 99)

    def per_s(x: float) -> float:
        return x / window_s if window_s > 0 else 0.0

    return Figures(
        offered_rps=offered_rps, window_s=window_s, sent=len(records),
        outcomes={o: sum(r.outcome == o for r in records) for o in OUTCOMES}, good=len(good),
        goodput_rps=per_s(len(good)), goodput_tok_s=per_s(sum(r.output_tokens for r in good)),
        served_tok_s=per_s(sum(r.output_tokens for r in served)),
        ttft_p50_s=percentile(ttfts, 50), ttft_p99_s=ttft_p99, total_p50_s=percentile(totals, 50),
        total_p99_s=percentile(totals, 99), refusal_p50_s=percentile(refusals, 50),
        refusal_p99_s=percentile(refusals, 99), refused_attempts=len(refusals), wasted_share=wasted_share(records),
        attempts_per_served=attempts_per(served), attempts_per_request=attempts_per(records),
        ttft_target_met_p99=None if ttft_p99 is None else ttft_p99 <= targets.ttft_s,
        max_lag_s=max((r.start - r.scheduled for r in records if r.scheduled), default=0.0),
        peak_rss_bytes=peak_rss_bytes)


@dataclass
class Row:
    system: str
    multiple: float
    rounds: int
    figures: Figures


def pool(launches: list[LaunchRun], targets: Targets) -> list[Row]:
    """One row per system (in launch order) and multiple (in run order)."""
    groups: dict[tuple[str, float], list[WindowRun]] = {}
    for launch in launches:
        for w in launch.windows:
            groups.setdefault((launch.system, w.multiple), []).append(w)
    rows = []
    for (system, multiple), windows in groups.items():
        records = [r for w in windows for r in w.records]
        f = figures(records, sum(w.duration_s for w in windows), sum(w.offered_rps for w in windows) / len(windows),
                    targets, max(w.peak_rss_bytes for w in windows))
        rows.append(Row(system, multiple, len(windows), f))
    return rows


def launch_to_dict(launch: LaunchRun) -> dict:
    return asdict(launch)


def launch_from_dict(d: dict) -> LaunchRun:
    windows = [WindowRun(**{**w, "records": [Record.from_dict(r) for r in w["records"]]}) for w in d["windows"]]
    capacity = Rate(**d["capacity"]) if d.get("capacity") else None
    own = Rate(**d["own_capacity"]) if d.get("own_capacity") else None
    return LaunchRun(**{**d, "windows": windows, "capacity": capacity, "own_capacity": own})
