"""A fleet router's decision for one request: each replica's prediction (`Candidate`), ranked (`rank`), and how
Serve's router is to offer them (`Decision.ranks`)."""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Collection
from dataclasses import dataclass

from app.errors import OverTimeTarget

TIE_S = 0.002  # predictions this close are the same: the random draw decides
# Predictions within this much of the best (absolute, or a share of it) are near-ties. Between equally warm ones Serve
# is offered them together, whose probe of each replica's ongoing requests (live, where the reports are up to a second
# old) then takes the less loaded. Without it, unrelated prompts went 0.84x power-of-two's tokens/s (routing runs of
# 01:03 and 01:18, W3).
NEAR_S, NEAR_SHARE = 0.05, 0.1


@dataclass(frozen=True)
class Candidate:
    """One replica's prediction for one request."""

    replica: str
    first_token_s: float
    cached_tokens: int
    measured: bool  # its wait comes from a measured pace (not the cold estimate)


@dataclass(frozen=True)
class Decision:
    """Where a request goes: `ranked` best first (the first group are replicas with room)."""

    key: int
    candidates: tuple[Candidate, ...]  # in rank order
    names: tuple[int, ...]  # the prompt's block names (empty: its tokens are unknown here)
    prompt_tokens: int
    block_tokens: int
    refusal: OverTimeTarget | None = None
    session: str = ""
    near: int = 1  # how many leading candidates are offered together (`ranks`)

    @property
    def ranked(self) -> tuple[str, ...]:
        return tuple(c.replica for c in self.candidates)

    @property
    def ranks(self) -> tuple[tuple[str, ...], ...]:
        """The groups Serve's router offers in turn: the near-best together, then one by one."""
        return (self.ranked[:self.near], *((r,) for r in self.ranked[self.near:]))

    def predicted_for(self, replica: str) -> Candidate | None:
        return next((c for c in self.candidates if c.replica == replica), None)


def rank(candidates: list[Candidate], with_room: Collection[str], first_block: int | None, rng: random.Random
         ) -> tuple[list[Candidate], int, Candidate]:
    """`candidates` best first (those `with_room` before the others), how many lead as near-ties, and the soonest of
    them (what a refusal by time is judged on). Among near-ties those that hold the most of the prompt lead: the same
    first token for less work, and one copy of a prefix in the fleet instead of two (W1's prefixes fit the two caches
    only once each). Exact ties are ordered by the prompt's `first_block` and the replica (rendezvous hashing, stable
    across processes), so that every ingress replica puts a new prefix on the same replica while prefixes spread; at
    random for a prompt under a block."""
    ordered = sorted(candidates, key=lambda c: (
        c.replica not in with_room, math.floor(c.first_token_s / TIE_S),
        zlib.crc32(f"{first_block}:{c.replica}".encode()) if first_block is not None else rng.random()))
    soonest = ordered[0]
    slack = max(NEAR_S, NEAR_SHARE * soonest.first_token_s)
    near = [c for c in ordered if (c.replica in with_room) == (soonest.replica in with_room)
            and c.first_token_s <= soonest.first_token_s + slack]
    most = max(c.cached_tokens for c in near)
    warmest = [c for c in near if c.cached_tokens == most]
    return warmest + [c for c in ordered if c not in warmest], len(warmest), soonest
