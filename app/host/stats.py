"""One replica's figures for /stats and /metrics, as they cross the Ray handle: the one type of `host` that the
HTTP front door reads."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.interface import EngineStats
from app.host.admission import AdmissionStats
from app.host.pace import PaceStats


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
