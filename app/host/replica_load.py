"""ReplicaLoad: what one engine replica tells the router about itself, through Serve's routing-stats channel
(`record_routing_stats`, a plain dict), polled twice a second; and `scaling_figures`, what it tells Serve's
autoscaling policy (`record_autoscaling_stats`).

The fleet router (app/routing/) predicts a request's first token on this replica as `wait_s` plus
`prefill_s_per_token` for each prompt token the replica does not hold in its prefix cache: the same linear model
the replica's own admission by time uses (host/pace.py), so the router and the replica agree on what is late.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.host.admission import Admission
    from app.host.supervisor import EngineSupervisor


@dataclass(frozen=True)
class ReplicaLoad:
    serving: bool = True  # engine loaded and alive, not draining (a new replica with no stats yet is: it loaded)
    room: int = 1  # more requests its admission holds before refusing
    in_system: int = 0  # requests admitted or queued
    # The first token of a newcomer with nothing to prefill, queued now, in seconds; the seconds each prompt token
    # to prefill adds, and each more request in the batch. None until the replica's pace is measured.
    wait_s: float | None = None
    prefill_s_per_token: float | None = None
    per_request_s: float | None = None
    block_tokens: int = 0  # the prefix cache's block size (0: unknown)
    cache_blocks: int = 0  # how many blocks the KV cache holds
    # When a place is expected to free once its slots are full (what a full front door, whose requests have not all
    # reached the replica yet, says as Retry-After).
    free_in_s: float | None = None

    @classmethod
    def of_replica(cls, sup: EngineSupervisor, a: Admission) -> ReplicaLoad:
        pace, block, in_system = a.pace, sup.engine.cache_block_tokens if sup.ready else 0, a.stats().in_system
        return cls(sup.serving, a.max_running + a.max_queued - in_system, in_system, a.predicted_wait_s(),
                   pace.prefill_s_per_token() if pace else None, pace.per_request_s() if pace else None,
                   block, sup.engine.kv_cache_tokens // block if block else 0,
                   a.retry_after_s(arriving=a.max_running))

    def would_take(self, first_token_s: float | None) -> bool:
        """A request arriving now would be let in, as far as these figures tell: serving, a place free, and a
        newcomer's first token within `first_token_s` (where both are known)."""
        in_time = first_token_s is None or self.wait_s is None or self.wait_s <= first_token_s
        return self.serving and self.room > 0 and in_time

    def as_stats(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, stats: dict[str, Any] | None) -> ReplicaLoad:
        """From a replica's routing stats; keys it does not send (or sends unknown) are left at their defaults."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (stats or {}).items() if k in known})


def scaling_figures(a: Admission) -> dict[str, float]:
    """Decode steps per second (one per stream per token) this replica served and refused by time over the last
    10 s (host/demand.py), what it makes at a full batch for the prompts it serves (`capacity`, once measured;
    `full_batch` 1 where measured near one, 0 where extrapolated from a lighter load) and the first token a newcomer
    would see now (`wait_s`, once measured). Serve averages each over the policy's look-back window."""
    served, refused = a.demand.rates()
    figures = {"served": served, "refused": refused, "in_system": float(a.stats().in_system)}
    capacity = a.pace.capacity(a.max_running) if a.pace is not None else None
    wait = a.predicted_wait_s()
    figures.update({k: v for k, v in (("capacity", capacity), ("wait_s", wait)) if v is not None})
    if capacity is not None and a.pace is not None:
        figures["full_batch"] = 1.0 if a.pace.measured_full_batch else 0.0
    return figures


def refused_at_ingress(a: Admission, max_steps: int) -> None:
    """Requests the ingress refused by time for the whole deployment, counted here as refused demand: their most
    output times the share of it requests really use (this replica's measure)."""
    a.demand.refused(max_steps * (a.pace.output_share if a.pace is not None else 1.0))
