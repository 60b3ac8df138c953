"""The outcome of one overload run, as the targets and the report read it."""

from __future__ import annotations

from dataclasses import dataclass

from loadkit.overload.access_log import Breakdown
from loadkit.overload.capacity import Liveness
from loadkit.overload.mix import PromptMaker
from loadkit.overload.phases import Phase
from loadkit.overload.stats_poll import Idle


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


@dataclass
class OverloadResult:
    model: str
    prompts: PromptMaker
    loadavg_start: tuple[float, float, float]
    idle: Phase  # a. nothing sent
    capacity: Phase  # b. exactly max_ongoing_requests clients
    overload: Phase  # c. overload_factor times as many
    idle_after: Idle  # d. nothing running or queued afterwards
    normal: Check  # d. one normal request afterwards
    alive: Liveness  # the service, /health and its EngineCore, unchanged since idle
    breakdown: Breakdown | None = None  # an own service's log joined with the refusals
    leftover: list[str] | None = None  # an own service: what outlived its stop (None: not ours to stop)

    @property
    def loaded(self) -> list[Phase]:
        return [self.capacity, self.overload]
