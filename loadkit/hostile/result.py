"""What one hostile run found, as the targets and the report read it, and its JSON form for the work dir.

Times inside are monotonic seconds; `rel(t)` turns one into seconds since the attack began.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadkit.hostile.attack import Attack
from loadkit.hostile.checks import Check, EngineFacts, Idle
from loadkit.hostile.lag import Histogram
from loadkit.hostile.plan import Clocks, Plan
from loadkit.hostile.polite import PoliteRecord
from loadkit.hostile.server_view import Sample
from loadkit.hostile.sockets import SocketRecord


@dataclass
class HostileResult:
    plan: Plan
    clocks: Clocks
    model: str
    engine: EngineFacts
    attack: Attack
    sockets: list[SocketRecord]
    polite: list[PoliteRecord]
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
