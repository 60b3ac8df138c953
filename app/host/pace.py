"""EnginePace: how fast this replica's engine works, measured while it serves, and the waits that follow.

Admission by count alone let 32 admitted requests wait 33-52 s for their first token and 64 queued ones
wait the whole 30 s queue timeout only to get a 503 (issue 15). To refuse at arrival the requests that
would miss their first-token target, a replica predicts each arrival's wait from three rates it learns
from its own requests, with no figure hard-coded per machine:

- first token: seconds from admission to first output, as a line in the prompt tokens the engine still
  has to prefill up to and including this request's (`backlog`) and the batch it joins:
  `ttft = a + b * backlog + c * batch` (vLLM schedules prefill in chunks between decode steps, so both
  matter);
- decode: seconds per output token of one stream, as a line in the batch: `step = d + e * batch`, learnt from steps
  that prefilled no other prompt (`decoded`); the prefill a running stream waits through is added from the first
  token's rate `b`: the prompts still to prefill, and those that take the slots freed while it decodes;
- output length: the share of `max_tokens` a request really generates (most stop at end-of-sequence).

Each is a least-squares fit (numpy) over a window of recent samples, so the estimates follow a change of
engine speed (a noisy neighbour, a longer context) within `WINDOW` requests or tokens.

`predict` simulates the admission queue: the slots (engine sequences: a request of n 4 holds four) of running
requests free at their predicted ends, the waiting requests take them in arrival order, and the newcomer's first
token comes after its own start plus the prefill backlog of those started before it. Nothing is predicted until
`MIN_SAMPLES` requests have been measured and a decode sample taken with no prompt prefilling (`decoded`): until then
admission is by count alone (a fresh replica refuses nothing by time).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from app.host.demand import effective_capacity
from app.host.rate_fit import RateFit

# Lateness: how much later than the model said admitted requests really got their first token, as the 90th
# percentile of actual / predicted over the last LATENESS_WINDOW admissions that waited for one (at least
# LATENESS_MIN_SAMPLES), clamped to [1, LATENESS_MAX]; every prediction is multiplied by it. The model alone
# was 25 % early in overload (the run of 14:14: first tokens p99 12.4 s against a 10 s target), where
# decode slows as the batch fills faster than its window follows.
LATENESS_WINDOW = 64
LATENESS_MIN_SAMPLES = 8
LATENESS_MAX = 4.0
MIN_SAMPLES = 4  # first-token samples before any prediction
# The least standard deviation of a feature in the window for its rate to be fitted (else held, RateFit): a stream
# more or less in the batch, a short sentence more or less to prefill.
BATCH_SPREAD = 1.0
TOKENS_SPREAD = 8.0
SETTLED = 32  # finished requests and first tokens before the prefill rate counts against capacity
# A decode window whose largest batch reached this share of the slots measured a full batch's pace (a short
# extrapolation); from a light load alone (1-3 streams) the fit's slope times 32 put capacity at 25-96 output tokens/s
# on the 2-core EPYC where full batches measured 189-295 (docs/autoscaling.md).
FULL_BATCH_SHARE = 0.5
# Decode samples taken while another prompt prefilled are not learnt from (the prefill is counted on its own, from
# the first-token fit): a fresh replica's first batch made 2.81 s a token where the same batch decoded at 0.09 once
# its prompts were in (docs/overload.md), and a flood's first 32 prompts put a warm replica's step at 1.1 s against
# 0.15 (docs/tenants.md). Until a clean sample comes, such samples are learnt after this many per slot.
PREFILL_STORM_SAMPLES = 8


@dataclass(frozen=True)
class Work:
    """One request as the predictor sees it."""

    prompt_tokens: int
    max_tokens: int  # the most decode steps it can take (its max_tokens)
    generated: int = 0  # steps so far (running requests)
    started_s_ago: float = 0.0  # running requests: since admission
    first_output: bool = False  # running requests: has it produced its first output yet
    # A running request's prefill that waits for the newcomer's: a batch request before an interactive newcomer, the
    # engine taking prompts by class (vLLM's `scheduling_policy: priority`).
    prefill_after: bool = False
    choices: int = 1  # the engine sequences it runs (n): of the `max_running` the engine holds, as admission counts


@dataclass(frozen=True)
class Prediction:
    """Seconds from now; the start and first token times the measured first-token lateness (below), the decode
    after it as measured; `model_first_token_s` without the lateness."""

    start_s: float  # until it would be admitted to the engine
    first_token_s: float  # until its first token
    finish_s: float  # until its last token (at the expected output length)
    model_first_token_s: float = 0.0


@dataclass(frozen=True)
class PaceStats:
    """The measured rates, for /stats and /metrics."""

    samples: int = 0  # first-token samples in the window
    prefill_tokens_per_s: float | None = None  # 1 / b: prompt tokens prefilled per second
    first_token_base_s: float | None = None  # a + c * (current batch): the first token of a tiny prompt, now
    decode_s_per_token: float | None = None  # d + e * (current batch): one stream's time per token, now
    output_share: float = 1.0  # share of max_tokens generated, on average
    lateness: float = 1.0  # predictions are multiplied by this (actual / predicted first token, p90)
    capacity_tokens_per_s: float | None = None  # at a full batch, for the prompts served (what autoscaling plans on)


class EnginePace:
    def __init__(self) -> None:
        self._ttft = RateFit(min_spread=(TOKENS_SPREAD, BATCH_SPREAD))  # (backlog tokens, batch) -> seconds
        self._decode = RateFit(min_spread=(BATCH_SPREAD,))  # (batch,) -> seconds per token
        self._output_share = 1.0  # moving average of generated / max_tokens; 1.0 (the worst case) at first
        self._prompt_mean = self._output_mean = 0.0  # moving averages of a finished request's prompt and output
        self._finished = 0
        self._late: deque[float] = deque(maxlen=LATENESS_WINDOW)  # actual / predicted first token
        self._full_batch: float | None = None  # output tokens/s last measured near a full batch
        self._clean = False  # a decode sample was taken with no other prompt prefilling (PREFILL_STORM_SAMPLES)
        self._skipped = 0

    # -- learning ------------------------------------------------------------------------------

    def first_token(self, backlog_tokens: int, batch: int, seconds: float) -> None:
        """A request admitted with `backlog_tokens` to prefill (its own included) into a batch of `batch`
        engine sequences had its first output `seconds` after admission."""
        self._ttft.add((backlog_tokens, batch), seconds)

    def decoded(self, batch: int, tokens: int, seconds: float, max_running: int = 0, prefilling: bool = False) -> None:
        """One stream produced `tokens` more tokens in `seconds` while `batch` sequences ran, of at most
        `max_running` (0: not said), other prompts `prefilling` meanwhile or not (such a sample is left out, see
        PREFILL_STORM_SAMPLES). A sample near a full batch (FULL_BATCH_SHARE) renews the full-batch figure `capacity`
        keeps: the window's pace at `max_running`, measured while the batch is that full. Renewed while the window
        held any such sample (as before), the last light samples of a window would have set it to nearly the light
        load's extrapolation."""
        if tokens <= 0 or seconds <= 0:
            return
        if prefilling and (self._clean or self._skipped < PREFILL_STORM_SAMPLES * max(1, max_running)):
            self._skipped += 1
            return
        self._clean = self._clean or not prefilling
        self._decode.add((batch,), seconds / tokens)
        if max_running and batch >= FULL_BATCH_SHARE * max_running:
            self._full_batch = self.output_tokens_per_s(max_running)

    def observed(self, predicted_s: float, actual_s: float) -> None:
        """An admitted request predicted (by the model, `Prediction.model_first_token_s`) to see its first
        token after `predicted_s` saw it after `actual_s`."""
        if predicted_s > 0:
            self._late.append(actual_s / max(predicted_s, 0.05))

    def lateness(self) -> float:
        if len(self._late) < LATENESS_MIN_SAMPLES:
            return 1.0
        return float(min(LATENESS_MAX, max(1.0, np.quantile(np.asarray(self._late), 0.9))))

    def finished(self, generated: int, max_tokens: int, prompt_tokens: int = 0) -> None:
        if max_tokens > 0:
            share = min(1.0, generated / max_tokens)
            weight = 1.0 / (self._finished + 1) if self._finished < 20 else 0.05
            self._output_share += weight * (share - self._output_share)
            self._prompt_mean += weight * (prompt_tokens - self._prompt_mean)
            self._output_mean += weight * (generated - self._output_mean)
            self._finished += 1

    # -- predicting ----------------------------------------------------------------------------

    @property
    def output_share(self) -> float:
        return self._output_share

    def prompt_per_output(self) -> float | None:
        """Prompt tokens per output token of the requests served (None: too few measured for the prefill rate:
        four first tokens put a 135M model's capacity at 11 tokens/s instead of hundreds)."""
        if self._finished < SETTLED or len(self._ttft) < SETTLED or self._output_mean <= 0:
            return None
        return self._prompt_mean / self._output_mean

    @property
    def ready(self) -> bool:
        return len(self._ttft) >= MIN_SAMPLES and len(self._decode) > 0

    def _first_token_s(self, backlog: int, batch: int) -> float:
        return max(0.0, self._ttft.at(backlog, batch) or 0.0)

    def _per_token_s(self, batch: int) -> float:
        return max(0.0, self._decode.at(batch) or 0.0)

    def predict(
        self, newcomer: Work, running: Iterable[Work], waiting: Iterable[Work], max_running: int
    ) -> Prediction | None:
        """When `newcomer`, queued behind `waiting`, would start, see its first token and finish; None
        until the pace has been measured."""
        predictions = self.predict_queue(running, [*waiting, newcomer], max_running)
        return predictions[-1] if predictions else None

    def predict_queue(self, running: Iterable[Work], queue: Sequence[Work], max_running: int) -> list[Prediction]:
        """When each of `queue` (in order) would start, see its first token and finish: one simulation for all
        of them; [] until the pace has been measured."""
        if not self.ready or not queue:
            return []
        running = list(running)
        batch = max(1, min(max_running, sum(w.choices for w in running) + sum(w.choices for w in queue)))
        prefill_s = self._prefill_s_per_token()
        per_token = self._per_token_s(batch) + batch * (self.prompt_per_output() or 0.0) * prefill_s  # + churn
        pending_s = prefill_s * sum(w.prompt_tokens for w in running if not w.first_output)
        # Slots: when each frees (running requests at their expected end; free slots now).
        slots: list[float] = []
        # (first token at, prompt tokens, before the queue's) of prefills not yet done
        backlog: list[tuple[float, int, bool]] = []
        for work in running:
            first = pending_s  # a decoding stream waits through the prompts still to prefill
            if not work.first_output:
                ahead = sum(tokens for _, tokens, _ in backlog)
                first = max(0.0, self._first_token_s(ahead + work.prompt_tokens, batch) - work.started_s_ago)
                backlog.append((first, work.prompt_tokens, not work.prefill_after))
            left = max(0.0, self._output_share * work.max_tokens - work.generated)
            slots += [first + left * per_token] * work.choices
        slots += [0.0] * max(0, max_running - len(slots))
        heapq.heapify(slots)
        # The lateness is measured on first tokens and corrects them (and the start before them); the decode after
        # is the decode fit's own, measured directly. Scaling the decode too (as before) predicted 158 s for a
        # 48-token answer that took ~60 s in the chaos driver's rolling update, and refused 1,070 of 1,126.
        late = self.lateness()
        out = []
        for work in queue:
            takes = max(1, min(work.choices, max_running))  # one bigger than the engine runs alone
            start = max(heapq.heappop(slots) for _ in range(takes))
            ahead = sum(tokens for first, tokens, before in backlog if before and first > start)
            first = start + self._first_token_s(ahead + work.prompt_tokens, batch)
            backlog.append((first, work.prompt_tokens, True))
            finish = first + self._output_share * work.max_tokens * per_token
            for _ in range(takes):
                heapq.heappush(slots, finish)
            out.append(Prediction(start_s=start * late, first_token_s=first * late,
                                  finish_s=first * late + finish - first, model_first_token_s=first))
        return out

    def _prefill_s_per_token(self) -> float:
        """The first-token fit's `b`, without the lateness: the engine's time per prompt token."""
        coef = self._ttft.coef()
        return float(coef[1]) if coef is not None else 0.0

    def prefill_s_per_token(self) -> float | None:
        """Seconds each more prompt token to prefill adds to a first token (the fit's `b`, times the lateness)."""
        coef = self._ttft.coef() if self.ready else None
        return None if coef is None else float(coef[1]) * self.lateness()

    def prefill_tokens_per_s(self) -> float | None:
        """Prompt tokens prefilled per second (1 / the fit's `b`; None: not measured, or no rate in the window)."""
        b = self._prefill_s_per_token()
        return 1.0 / b if b > 0 else None

    def output_tokens_per_s(self, batch: int) -> float | None:
        """Output tokens per second the engine makes with `batch` streams decoding (None: not measured)."""
        step = self._per_token_s(max(1, batch)) if len(self._decode) else 0.0
        return batch / step if step > 0 else None

    @property
    def measured_full_batch(self) -> bool:
        """Whether `capacity` comes from a decode pace measured near a full batch (else it is extrapolated)."""
        return self._full_batch is not None

    def capacity(self, max_running: int) -> float | None:
        """Output tokens per second at a full batch of `max_running` for the prompts served (host/demand.py): the
        decode pace last measured near a full batch (`decoded`), or extrapolated until one was, less the engine
        time the prompts' prefill takes. The prefill rate is the fit's own, without the lateness: that corrects
        predicted waits in a queue, not the engine's work."""
        decode = self._full_batch if self._full_batch is not None else self.output_tokens_per_s(max_running)
        prefill = self._prefill_s_per_token() if self.ready else None
        return None if decode is None else effective_capacity(decode, prefill, self.prompt_per_output() or 0.0)

    def per_request_s(self) -> float | None:
        """Seconds each more request in the batch adds to a first token (the fit's `c`, times the lateness)."""
        coef = self._ttft.coef() if self.ready else None
        return None if coef is None else float(coef[2]) * self.lateness()

    def stats(self, batch: int, max_running: int) -> PaceStats:
        coef, capacity, prefill = self._ttft.coef(), self.capacity(max_running), self.prefill_tokens_per_s()
        batch = max(1, batch)
        return PaceStats(
            samples=len(self._ttft),
            prefill_tokens_per_s=None if prefill is None else round(prefill, 1),
            first_token_base_s=round(self._first_token_s(1, batch), 4) if coef is not None else None,
            decode_s_per_token=round(self._per_token_s(batch), 5) if len(self._decode) else None,
            output_share=round(self._output_share, 3),
            lateness=round(self.lateness(), 3),
            capacity_tokens_per_s=None if capacity is None else round(capacity, 1),
        )
