"""A fleet router's decision for one request: each replica's prediction (`Candidate`), best first, and how Serve's
router is to offer them (`Decision.ranks`)."""

from __future__ import annotations

from dataclasses import dataclass

from app.errors import OverTimeTarget


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
