"""What one hostile run found, its JSON form for the work dir, and the figures it is judged and reported by: per
kind of hostile socket, how many the server ended and how soon; the polite client before, during and after; the
event-loop lag window; the replica's memory and descriptors.

Times inside are monotonic seconds; `rel(t)` turns one into seconds since the attack began.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadkit.hostile.attack import Attack
from loadkit.hostile.plan import Clocks, Plan
from loadkit.hostile.polite import between, longest_unserved_s, served_again_s, status_counts
from loadkit.hostile.server_view import EngineFacts, Histogram, Sample, max_range, quantile_bound
from loadkit.hostile.sockets import SocketRecord
from loadkit.record import Record
from loadkit.report import Check
from loadkit.server_stats import Idle
from loadkit.stats import percentile


@dataclass
class HostileResult:
    plan: Plan
    clocks: Clocks
    model: str
    engine: EngineFacts
    attack: Attack
    sockets: list[SocketRecord]
    polite: list[Record]
    lag_before: Histogram | None
    lag_after: Histogram | None
    baseline: Sample | None  # the replica before the attack
    samples: list[Sample]  # the replica during and after the attack
    after: Sample | None  # the replica once the service was idle again
    idle_after: Idle
    paris: Check
    view: str  # who listens, who is the replica
    leftover: list[str] | None = None  # an own service: what outlived its stop (None: not ours to stop)
    notes: list[str] = field(default_factory=list)

    def rel(self, t: float | None) -> float | None:
        return None if t is None else t - self.attack.started

    def of(self, kind: str) -> list[SocketRecord]:
        return [r for r in self.sockets if r.kind == kind]

    @property
    def lag_window(self) -> Histogram | None:
        if self.lag_before is None or self.lag_after is None:
            return None
        return self.lag_after.minus(self.lag_before)

    def during_attack(self) -> list[Sample]:
        return [s for s in self.samples if self.attack.started <= s.t <= self.attack.ended]


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return value


def write_json(path: Path, result: HostileResult, extra: dict[str, Any]) -> Path:
    """The whole result (every socket, every polite request, every sample) plus `extra` (targets, facts)."""
    data = {**_plain(extra), "result": _plain(result)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


# -- the figures -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KindFigures:
    kind: str
    planned: int
    connected: int
    open_errors: dict[str, int]
    ended: int  # connected sockets the server ended before the attack was over
    ended_by: dict[str, int]  # how the end was seen (eof, reset, pollhup, ... or 'server released')
    answers: dict[str, int]  # statuses the server wrote before closing (kinds that read)
    p50_s: float | None  # time from open to the server's end, over those it ended
    max_s: float | None
    end_states: dict[str, int]  # non-readers: what a MSG_PEEK found at the end
    still_open: int = 0  # connected sockets the server had not ended by the end of the attack
    unread_p50: float | None = None  # those non-readers: bytes unread in the client's buffer at the end
    queued_p50: float | None = None  # those non-readers: bytes in the server's kernel send queue at the end
    queued_max: int | None = None

    @property
    def all_ended(self) -> bool:
        return self.connected > 0 and self.ended == self.connected


def kind_figures(result: HostileResult, kind: str) -> KindFigures:
    recs: list[SocketRecord] = result.of(kind)
    connected = [r for r in recs if r.opened_at is not None]
    ended = [r for r in connected if r.ended_at is not None and r.ended_at <= result.attack.ended]
    times = [t for r in ended if (t := r.time_to_end) is not None]
    # the client's own view names the end where it saw one; else only the server's connection table did
    by = Counter(r.how if r.closed_at is not None and r.closed_at <= result.attack.ended else "server released (table)"
                 for r in ended)
    ended_ids = {id(r) for r in ended}
    still = [r for r in connected if id(r) not in ended_ids]
    unread = [r.unread_bytes for r in still if r.unread_bytes is not None]
    queued = [r.server_queued for r in still if r.server_queued is not None]
    return KindFigures(
        kind=kind, planned=result.plan.count(kind), connected=len(connected),
        open_errors=dict(Counter(r.open_error for r in recs if r.opened_at is None)),
        ended=len(ended), ended_by=dict(by.most_common()),
        answers=dict(Counter(str(r.answer) for r in ended if r.answer is not None).most_common()),
        p50_s=percentile(times, 50), max_s=max(times, default=None),
        end_states=dict(Counter(r.end_state for r in recs if r.end_state).most_common()),
        still_open=len(still), unread_p50=percentile(unread, 50), queued_p50=percentile(queued, 50),
        queued_max=max(queued, default=None))


@dataclass(frozen=True)
class PoliteFigures:
    baseline: dict[str, int]
    during: dict[str, int]
    after: dict[str, int]
    served_again_s: float | None  # from the attack's start to the first 200 sent after it began
    longest_unserved_s: float  # during the attack
    p50_s: float | None  # latency of every polite request sent during the attack
    p99_s: float | None
    served_p50_s: float | None  # latency of those served (200) during the attack
    served_p99_s: float | None
    after_all_ok: bool


def polite_figures(result: HostileResult) -> PoliteFigures:
    a, recs = result.attack, result.polite
    during = between(recs, a.started, a.ended)
    after = [r for r in recs if r.start >= a.ended]
    lat = [r.latency for r in during]
    served = [r.latency for r in during if r.outcome == "ok"]
    return PoliteFigures(
        baseline=status_counts([r for r in recs if r.start < a.started]), during=status_counts(during),
        after=status_counts(after), served_again_s=served_again_s(recs, a.started),
        longest_unserved_s=longest_unserved_s(recs, a.started, a.ended),
        p50_s=percentile(lat, 50), p99_s=percentile(lat, 99),
        served_p50_s=percentile(served, 50), served_p99_s=percentile(served, 99),
        after_all_ok=bool(after) and all(r.outcome == "ok" for r in after))


@dataclass(frozen=True)
class LagFigures:
    heartbeats: float
    p99_bound_s: float | None
    max_range_s: tuple[float, float] | None
    mean_s: float | None
    worst_window_p99_s: float | None  # the worst p99 bound over the /metrics snapshots during the attack


def lag_figures(result: HostileResult) -> LagFigures | None:
    window = result.lag_window
    if window is None:
        return None
    snaps = [result.lag_before, *(h for _, h in result.attack.lag), result.lag_after]
    windows = [b.minus(a) for a, b in zip(snaps, snaps[1:], strict=False) if a is not None and b is not None]
    bounds = [q for w in windows if (q := quantile_bound(w, 0.99)) is not None]
    return LagFigures(window.count, quantile_bound(window, 0.99), max_range(window), window.mean,
                      max(bounds, default=None))


@dataclass(frozen=True)
class ReplicaFigures:
    baseline_rss: int
    peak_rss: int
    peak_rss_at_s: float | None
    end_rss: int | None  # once idle after the attack
    baseline_fds: int
    peak_fds: int
    end_fds: int | None
    peak_connections: int


def replica_figures(result: HostileResult) -> ReplicaFigures | None:
    base, samples = result.baseline, [s for s in result.samples if s.t >= result.attack.started]
    if base is None or not samples:
        return None
    top = max(samples, key=lambda s: s.rss)
    end = result.after
    return ReplicaFigures(base.rss, top.rss, result.rel(top.t), end.rss if end else None, base.fds,
                          max(s.fds for s in samples), end.fds if end else None,
                          max(s.connections for s in samples))


def mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:,.0f} MiB"


def secs(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f} s"


def counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items()) or "none"
