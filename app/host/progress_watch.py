"""ProgressWatch: whether an engine with requests in it still makes forward progress.

vLLM 0.32's `check_health` reports only an engine that has already errored: an `EngineCore` stopped with
SIGSTOP (or stuck in a kernel, a deadlock, a livelocked step) passes it forever, and every request in it
waits until its own timeout. So the host also watches progress: while the engine has unfinished requests,
it must produce some output (any token of any request, seen either by the host or in the engine's own
token counters) or move its KV cache use (a chunked prefill allocates blocks chunk by chunk; vLLM counts a
prompt's tokens only at its first output) within a bound derived from what is in flight. Past the bound it
is declared wedged.

The bound, and why it never trips on a busy engine:

- Nothing can keep every request from emitting for longer than it takes to prefill the prompts still waiting
  for their first output (`prefill_tokens`: those of the requests in flight the host has seen no output
  of): once any of them is prefilled it emits, and a decoding request emits every step. That sum, over the
  measured prefill rate, times `margin` (the rate is fitted on the prompts seen so far, and attention makes a
  long prompt slower per token than a short one), plus `floor_s`. The rate is the slowest measured so far
  (a slow engine is slow, not wedged); before any is measured, `UNMEASURED_PREFILL_TOKENS_PER_S`, slower than a
  7B model on a few CPU cores (docs/operations.md).
- A request that was waiting for its first output on an engine declared wedged (`patient`) counts its prompt
  `PATIENT_FACTOR` times: if it was the slow one rather than the engine, it does not wedge the next engine
  too, and the next, one after another.
- `floor_s` covers what is not prefill (a decode step at a full batch, a preempted request's recompute, a GC
  pause, a starved CPU); it is also what detection costs when requests are decoding. Why one step's worth of
  prefill is not enough, and the figures: docs/operations.md, "Wedged and dead engines".
Progress is read two ways because either alone misleads: the host sees a request's output only when its
consumer pulls it (a client that reads slowly would look like a stall), and the engine's counters move
only when it emits. A client slower than the engine is not a stall either: with no unfinished request in
the engine (`engine_busy` false) there is nothing to wait for, and the clock restarts.

Time the host itself could not look (its event loop blocked: a look more than two ticks after the previous
one) is not counted against the engine: the engine's outputs are read on that same loop (vLLM's output
handler runs there), so they would have been late by as much.

Pure bookkeeping on a clock that tests may replace; `EngineHost` looks every `tick_s` and acts on `stalled`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

FLOOR_S = 30.0
MARGIN = 2.0
UNMEASURED_PREFILL_TOKENS_PER_S = 10.0
PATIENT_FACTOR = 10


@dataclass(frozen=True)
class Stall:
    """A wedge: no output for `quiet_s`, past the `bound_s` that what was in flight allowed."""

    quiet_s: float
    bound_s: float
    request_ids: tuple[str, ...]
    waiting_ids: tuple[str, ...]  # those with no output yet: the prefill the bound was waiting for
    prefill_tokens: int
    prefill_tokens_per_s: float

    def describe(self) -> str:
        return (
            f"no output for {self.quiet_s:.1f} s with {len(self.request_ids)} request(s) in the engine "
            f"(bound {self.bound_s:.1f} s: {self.prefill_tokens} prompt tokens at "
            f"{self.prefill_tokens_per_s:.0f} tokens/s)"
        )


class ProgressWatch:
    def __init__(
        self,
        floor_s: float = FLOOR_S,
        margin: float = MARGIN,
        unmeasured_prefill_tokens_per_s: float = UNMEASURED_PREFILL_TOKENS_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.floor_s = floor_s
        self.margin = margin
        self.unmeasured_prefill_tokens_per_s = unmeasured_prefill_tokens_per_s
        self._clock = clock
        self._prompts: dict[str, int] = {}  # request id -> prompt tokens, for requests handed to the engine
        self._unprefilled: dict[str, int] = {}  # those of them with no output seen yet
        self._quiet_since = clock()  # the last moment the engine was known to be making progress, or idle
        self._engine_progress: object = None  # the engine's own counters at the last look
        self._slowest_rate: float | None = None  # the slowest prefill rate reported so far
        self._last_look: float | None = None

    def renewed(self) -> ProgressWatch:
        """A watch with the same settings and rate, and nothing in flight, for a new engine."""
        fresh = ProgressWatch(self.floor_s, self.margin, self.unmeasured_prefill_tokens_per_s, self._clock)
        fresh._slowest_rate = self._slowest_rate  # the same model on the same machine
        return fresh

    # -- what the host tells it ---------------------------------------------------------------

    def entered(self, request_id: str, prompt_tokens: int, patient: bool = False) -> None:
        """A request is handed to the engine (`patient`: see the module's text)."""
        if not self._prompts:
            self._quiet_since = self._clock()  # an idle engine owed nothing until now
        self._prompts[request_id] = prompt_tokens
        self._unprefilled[request_id] = prompt_tokens * (PATIENT_FACTOR if patient else 1)

    def output(self, request_id: str) -> None:
        """The host saw an output of `request_id`: progress, and its prompt is prefilled."""
        self._quiet_since = self._clock()
        self._unprefilled.pop(request_id, None)

    def left(self, request_id: str) -> None:
        """The request is out of the engine (finished, aborted, failed)."""
        self._prompts.pop(request_id, None)
        self._unprefilled.pop(request_id, None)

    @property
    def in_flight(self) -> int:
        return len(self._prompts)

    def request_ids(self) -> tuple[str, ...]:
        return tuple(self._prompts)

    # -- judging ------------------------------------------------------------------------------

    def prefill_tokens(self) -> int:
        """The prompt tokens the engine may be prefilling with nothing to emit: those of the requests in it
        with no output yet (see the module's text)."""
        return sum(self._unprefilled.values())

    def bound_s(self, prefill_tokens_per_s: float | None) -> float:
        rate = self._rate(prefill_tokens_per_s)
        return self.floor_s + self.margin * self.prefill_tokens() / rate

    def _rate(self, prefill_tokens_per_s: float | None) -> float:
        if prefill_tokens_per_s is not None and prefill_tokens_per_s > 0:
            slowest = self._slowest_rate
            self._slowest_rate = prefill_tokens_per_s if slowest is None else min(slowest, prefill_tokens_per_s)
        if self._slowest_rate is None:
            return self.unmeasured_prefill_tokens_per_s
        return self._slowest_rate

    def stalled(
        self, engine_progress: object, engine_busy: bool, prefill_tokens_per_s: float | None
    ) -> Stall | None:
        """Looks at the engine now: `engine_progress` its own counters (token counts, KV cache use: any change is
        progress), `engine_busy` whether it has unfinished requests; a `Stall` once it has been quiet past the
        bound, else None."""
        now = self._clock()
        if self._last_look is not None:
            late = now - self._last_look - 2 * self.tick_s()
            if late > 0:  # the host could not look meanwhile: not the engine's time
                self._quiet_since = min(now, self._quiet_since + late)
        self._last_look = now
        if engine_progress != self._engine_progress:
            self._engine_progress = engine_progress
            self._quiet_since = now
        if not self._prompts or not engine_busy:
            self._quiet_since = now  # nothing owed: whatever is in flight waits for its reader, not the engine
            return None
        quiet, bound = now - self._quiet_since, self.bound_s(prefill_tokens_per_s)
        if quiet <= bound:
            return None
        return Stall(
            quiet_s=quiet,
            bound_s=bound,
            request_ids=self.request_ids(),
            waiting_ids=tuple(self._unprefilled),
            prefill_tokens=self.prefill_tokens(),
            prefill_tokens_per_s=self._rate(prefill_tokens_per_s),
        )

    def tick_s(self) -> float:
        """How often the host should look: a small share of the shortest bound, at most a second."""
        return min(1.0, max(0.01, self.floor_s / 10))
