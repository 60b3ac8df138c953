"""What one overload run set and found: the admission settings under test, the phases' figures, the refusals'
time joined with the service's own access log, and how the service fared; as the targets and the report read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from loadkit.overload.phases import Phase
from loadkit.record import Record
from loadkit.report import Check
from loadkit.server_stats import Idle
from loadkit.workload import PromptMaker

DEFAULT_TTFT_TARGET_S = 10.0  # the service's default deployment.ttft_target_s (docs/configuration.md)
_ACCESS_LINE = re.compile(
    r'"logger": "app\.access".*?"request_id": "(ovl-[0-9a-f]{32})".*?"status": (\d{3}).*?"duration_ms": ([\d.]+)')


@dataclass
class Admission:
    """The service's admission settings the run drives against (set in an own service's config; told for one
    given by URL)."""

    max_ongoing: int
    max_queued: int
    queue_timeout_s: float
    request_timeout_s: float
    refusal_status: int | None = None
    ttft_target_s: float | None = DEFAULT_TTFT_TARGET_S  # deployment.ttft_target_s in effect; None: off
    ttft_target_given: bool = False  # set by --ttft-target (else: the config's own, or the service's default)
    ttft_target_source: str = "the service's default, assumed: not read from a running service"


@dataclass(frozen=True)
class Liveness:
    ok: bool
    detail: str


@dataclass
class Breakdown:
    """Seconds, one entry per refusal joined by X-Request-Id with the service's `app.access` line: what the client
    measured, what the service spent, and what lay outside the service (this driver's event loop, the kernel,
    and, with `--serve-proxy`, Serve's proxy)."""

    client: list[float] = field(default_factory=list)
    service: list[float] = field(default_factory=list)
    client_minus_service: list[float] = field(default_factory=list)

    @property
    def joined(self) -> int:
        return len(self.client)


def refusal_breakdown(log_text: str, refused: list[Record]) -> Breakdown:
    served = {m[1]: float(m[3]) / 1000 for m in _ACCESS_LINE.finditer(log_text) if m[2] in ("429", "503")}
    out = Breakdown()
    for r in refused:
        if r.request_id in served:
            out.client.append(r.latency)
            out.service.append(served[r.request_id])
            out.client_minus_service.append(r.latency - served[r.request_id])
    return out


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
