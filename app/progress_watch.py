"""ProgressWatch: whether an engine with requests in it still makes forward progress.

vLLM 0.32's `check_health` reports only an engine that has already errored: an `EngineCore` stopped with
SIGSTOP (or stuck in a kernel, a deadlock, a livelocked step) passes it forever, and every request in it
waits until its own timeout. So the host also watches progress: while the engine has unfinished requests,
it must produce some output (any token of any request, seen either by the host or in the engine's own
token counters) within a bound derived from what is in flight. Past the bound it is declared wedged.

The bound, and why it never trips on a busy engine:

- An engine step emits a token for every request that is decoding, and the first token of every request
  whose prefill the step completes. So the longest stretch with no output at all is the steps spent
  prefilling before any request can emit: at most the prompt tokens one step takes (vLLM's
  `max_num_batched_tokens`; chunked prefill spreads a longer prompt over several steps, none of which emits),
  or the longest prompt in flight when it is longer, and never more than all the prompt tokens in flight
  (`prefill_tokens`). 32 prompts of 2048 tokens (configs/cpu.yaml's full context) do not add up: once the
  first is prefilled it emits a token every step while the others prefill behind it.
- That many tokens over the measured prefill rate (`EnginePace`'s fit of first-token time against the
  prefill backlog), times `margin` (3: the rate is fitted on the prompts seen so far, attention makes a
  long prompt slower per token than a short one, and a neighbour may take the core), plus `floor_s`.
- `floor_s` (30 s) covers what is not prefill: a decode step at a full batch (~0.1-0.3 s here), the Python
  front end, a GC pause, a CPU starved by another process. It is also what detection costs when the bound
  is short: a wedged engine is declared within `floor_s` + one tick of its last output.
- The rate trusted is the slowest the pace has reported since it measured one, and never below
  `UNMEASURED_PREFILL_TOKENS_PER_S` (100 tokens/s, far below what this CPU prefills), which is also the
  rate before any is measured: a fresh engine gets a generous bound, not a guess. The slowest, because the
  pace's fit serves predictions, not this: with concurrent arrivals it moves prefill time into its batch
  term, and the unit test's fake engine, prefilling at 20k tokens/s, was reported at 18k after requests one
  at a time and 126k after four at once. A rate that can only fall makes the bound only longer.

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
MARGIN = 3.0
UNMEASURED_PREFILL_TOKENS_PER_S = 100.0
# The prompt tokens one engine step may prefill when the model's config does not say (`max_num_batched_tokens`
# unset): the largest of vLLM 0.32's own defaults (2048-4096 on a CPU, up to 16384 on large GPUs).
DEFAULT_STEP_TOKENS = 16384


@dataclass(frozen=True)
class Stall:
    """A wedge: no output for `quiet_s`, past the `bound_s` that what was in flight allowed."""

    quiet_s: float
    bound_s: float
    request_ids: tuple[str, ...]
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
        step_tokens: int | None = None,
        unmeasured_prefill_tokens_per_s: float = UNMEASURED_PREFILL_TOKENS_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.floor_s = floor_s
        self.margin = margin
        self.step_tokens = step_tokens or DEFAULT_STEP_TOKENS
        self.unmeasured_prefill_tokens_per_s = unmeasured_prefill_tokens_per_s
        self._clock = clock
        self._prompts: dict[str, int] = {}  # request id -> prompt tokens, for requests handed to the engine
        self._quiet_since = clock()  # the last moment the engine was known to be making progress, or idle
        self._engine_tokens = -1  # the engine's own token counters at the last look
        self._slowest_rate: float | None = None  # the slowest prefill rate reported so far
        self._last_look: float | None = None

    def renewed(self) -> ProgressWatch:
        """A watch with the same settings and rate, and nothing in flight, for a new engine."""
        fresh = ProgressWatch(
            self.floor_s, self.margin, self.step_tokens, self.unmeasured_prefill_tokens_per_s, self._clock
        )
        fresh._slowest_rate = self._slowest_rate  # the same model on the same machine
        return fresh

    # -- what the host tells it ---------------------------------------------------------------

    def entered(self, request_id: str, prompt_tokens: int) -> None:
        """A request is handed to the engine."""
        if not self._prompts:
            self._quiet_since = self._clock()  # an idle engine owed nothing until now
        self._prompts[request_id] = prompt_tokens

    def output(self) -> None:
        """The host saw an output of some request."""
        self._quiet_since = self._clock()

    def left(self, request_id: str) -> None:
        """The request is out of the engine (finished, aborted, failed)."""
        self._prompts.pop(request_id, None)

    @property
    def in_flight(self) -> int:
        return len(self._prompts)

    def request_ids(self) -> tuple[str, ...]:
        return tuple(self._prompts)

    # -- judging ------------------------------------------------------------------------------

    def prefill_tokens(self) -> int:
        """The most prompt tokens the engine may be prefilling with nothing to emit (see the module's text)."""
        if not self._prompts:
            return 0
        return min(sum(self._prompts.values()), max(max(self._prompts.values()), self.step_tokens))

    def bound_s(self, prefill_tokens_per_s: float | None) -> float:
        rate = self._rate(prefill_tokens_per_s)
        return self.floor_s + self.margin * self.prefill_tokens() / rate

    def _rate(self, prefill_tokens_per_s: float | None) -> float:
        if prefill_tokens_per_s is not None and prefill_tokens_per_s > 0:
            slowest = self._slowest_rate
            self._slowest_rate = prefill_tokens_per_s if slowest is None else min(slowest, prefill_tokens_per_s)
        if self._slowest_rate is None:
            return self.unmeasured_prefill_tokens_per_s
        return max(self.unmeasured_prefill_tokens_per_s, self._slowest_rate)

    def stalled(
        self, engine_tokens: int, engine_busy: bool, prefill_tokens_per_s: float | None
    ) -> Stall | None:
        """Looks at the engine now: `engine_tokens` its prompt + generated token counters (any change is
        progress), `engine_busy` whether it has unfinished requests; a `Stall` once it has been quiet past the
        bound, else None."""
        now = self._clock()
        if self._last_look is not None:
            late = now - self._last_look - 2 * self.tick_s()
            if late > 0:  # the host could not look meanwhile: not the engine's time
                self._quiet_since = min(now, self._quiet_since + late)
        self._last_look = now
        if engine_tokens != self._engine_tokens:
            self._engine_tokens = engine_tokens
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
            prefill_tokens=self.prefill_tokens(),
            prefill_tokens_per_s=self._rate(prefill_tokens_per_s),
        )

    def tick_s(self) -> float:
        """How often the host should look: a small share of the shortest bound, at most a second."""
        return min(1.0, max(0.01, self.floor_s / 10))
