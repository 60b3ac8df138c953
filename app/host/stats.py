"""One replica's figures for /stats and /metrics, as they cross the Ray handle: the types of `host` that the HTTP
front door reads."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.interface import EngineStats
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
