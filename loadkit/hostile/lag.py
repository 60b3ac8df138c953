"""The service's event-loop lag, from its Prometheus histogram `app_event_loop_lag_seconds` on /metrics.

A histogram gives no exact percentile: what it gives is, for a window between two scrapes, how many
heartbeats fell in each bucket. The p99 is bounded by the upper edge of the bucket where the window's
cumulative count first reaches 99 % of its total, and the maximum lies in the highest bucket that gained a
count (between its lower and upper edge; past the last finite edge it is unbounded).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

LAG_METRIC = "app_event_loop_lag_seconds"
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LE = re.compile(r'le="([^"]+)"')


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts, ascending by upper edge (the last edge is +Inf), with count and sum."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    total: float  # the sum of observed values, seconds

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations between `earlier` and this scrape (same buckets)."""
        before = dict(earlier.buckets)
        return Histogram(tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
                         self.count - earlier.count, self.total - earlier.total)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None


def parse_histogram(text: str, name: str = LAG_METRIC) -> Histogram | None:
    """The histogram `name` (unlabelled but for `le`) from Prometheus text; None when absent."""
    buckets: dict[float, float] = {}
    count = total = None
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        metric, value = m["name"], float(m["value"])
        if metric == f"{name}_bucket":
            le = _LE.search(m["labels"] or "")
            if le:
                buckets[math.inf if le[1] in ("+Inf", "Inf") else float(le[1])] = value
        elif metric == f"{name}_count":
            count = value
        elif metric == f"{name}_sum":
            total = value
    if not buckets or count is None:
        return None
    return Histogram(tuple(sorted(buckets.items())), count, total or 0.0)


def quantile_bound(h: Histogram, q: float) -> float | None:
    """The upper edge of the bucket holding the q-quantile (0..1): the q-quantile is at most this (math.inf:
    past the last finite edge); None for an empty window."""
    if h.count <= 0:
        return None
    need = q * h.count
    for le, cumulative in h.buckets:
        if cumulative >= need - 1e-9:
            return le
    return math.inf


def max_range(h: Histogram) -> tuple[float, float] | None:
    """(lower, upper) edges of the highest bucket that gained an observation: the maximum lies in it."""
    if h.count <= 0:
        return None
    lower = 0.0
    for le, cumulative in h.buckets:
        if cumulative >= h.count - 1e-9:
            return lower, le
        lower = le
    return lower, math.inf


def seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    return "unbounded" if math.isinf(value) else f"{value * 1000:g} ms"
