"""One replica's figures for /stats and /metrics, as they cross the Ray handle: the types of `host` that the HTTP
front door reads, and `combined`, the single figure for several replicas."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

from app.engine.engine_stats import EngineStats
from app.host.pace import PaceStats


@dataclass(frozen=True)
class AdmissionStats:
    running: int
    waiting: int
    in_system: int
    tokens_in_use: int
    token_budget: int
    peak_waiting: int
    refused_queue_full: int
    refused_queue_timeout: int
    refused_over_time_target: int
    predicted_first_token_s: float | None  # the latest arrival's prediction (None: not yet measured)
    aside: int = 0  # out of the engine while their clients do not read, not counted in in_system
    sequences: int = 0  # engine sequences held (a request of n choices holds n): the pace's batch


@dataclass(frozen=True)
class ReplicaStats:
    """One replica's figures for /stats and /metrics; crosses the Ray handle as this dataclass."""

    model: str
    ready: bool
    healthy: bool
    admission: AdmissionStats
    engine: EngineStats
    kv_cache_tokens: int
    pace: PaceStats = PaceStats()
    wedged_total: int = 0  # engines this replica declared wedged (no progress past the bound)
    restarts_total: int = 0  # in-place engine restarts completed
    restarting: bool = False


_T = TypeVar("_T")


def _summed(items: Sequence[_T]) -> _T:
    """Counts and totals (ints) added up, shares (floats) averaged, the rest the first's."""
    values: dict[str, Any] = {}
    for f in fields(items[0]):  # type: ignore[arg-type]
        column = [getattr(i, f.name) for i in items]
        if all(isinstance(v, bool) for v in column):
            continue
        if all(isinstance(v, int) for v in column):
            values[f.name] = sum(column)
        elif all(isinstance(v, float) for v in column):
            values[f.name] = sum(column) / len(column)
    return replace(items[0], **values)  # type: ignore[type-var]


def combined(replicas: Sequence[ReplicaStats]) -> ReplicaStats:
    """Several replicas of one model as one figure: counts and totals summed, KV use averaged; healthy only when
    every one is, ready when any is; the pace of the replica that has measured the most; the latest prediction
    the longest."""
    predictions = [r.admission.predicted_first_token_s for r in replicas
                   if r.admission.predicted_first_token_s is not None]
    return replace(
        _summed(replicas),
        ready=any(r.ready for r in replicas),
        healthy=all(r.healthy for r in replicas),
        restarting=any(r.restarting for r in replicas),
        admission=replace(_summed([r.admission for r in replicas]),
                          predicted_first_token_s=max(predictions) if predictions else None),
        engine=_summed([r.engine for r in replicas]),
        pace=max((r.pace for r in replicas), key=lambda p: p.samples),
    )
