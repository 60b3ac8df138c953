"""ReplicaLoad: what one engine replica tells the router about itself, through Serve's routing-stats channel
(`record_routing_stats`, a plain dict), polled about once a second.

The fleet router (app/routing/) predicts a request's first token on this replica as `wait_s` plus
`prefill_s_per_token` for each prompt token the replica does not hold in its prefix cache: the same linear model
the replica's own admission by time uses (host/pace.py), so the router and the replica agree on what is late.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


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

    def as_stats(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, stats: dict[str, Any] | None) -> ReplicaLoad:
        """From a replica's routing stats; keys it does not send (or sends unknown) are left at their defaults."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (stats or {}).items() if k in known})
