"""The figures of `python -m loadkit fairness`, computed from the answers alone (pure: no service needed).

Each request is an `Answer`: when it was sent, its status, and the usage the stream reported chunk by chunk. A
tenant's service is counted as the fair queue counts it (prompt tokens once, when its first token arrives, each
generated token twice, as it arrives), divided by its weight, per window of the run. A tenant is backlogged in a
window when at least `MIN_COVER` of the window had one of its requests waiting for its first token; the gap
between two tenants is their cumulative difference in weighted service over a stretch of windows in which both were
backlogged (VTC bounds it; an unfair queue lets it grow with the stretch).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations

from loadkit.fairness.plan import DEFAULT, Capacity
from loadkit.stats import percentile

MIN_COVER = 0.9
OPEN = "open at the end"  # a request the run's end cut before it had an answer


@dataclass
class Answer:
    """One request; times are seconds from the run's start."""

    client: str
    sent: float
    status: int = 0
    code: str = ""
    message: str = ""  # a refusal's own words (a refusal by time names the predicted wait)
    first: float | None = None  # its first generated token
    ended: float | None = None
    prompt_tokens: int = 0
    progress: list[tuple[float, int]] = field(default_factory=list)  # (when, generated tokens so far)

    @property
    def generated(self) -> int:
        return self.progress[-1][1] if self.progress else 0

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    def waiting(self, end: float) -> tuple[float, float]:
        """When it waited for its first token (or for its refusal)."""
        until = self.first if self.first is not None else self.ended if self.ended is not None else end
        return self.sent, min(until, end)


def charges(answer: Answer) -> list[tuple[float, float]]:
    """(when, VTC units) of one answer: its prompt at its first token, then 2 per generated token."""
    if answer.first is None:
        return []
    out, before = [(answer.first, float(answer.prompt_tokens))], 0
    for t, generated in answer.progress:
        out.append((t, 2.0 * (generated - before)))
        before = generated
    return out


def windows(duration: float, window: float) -> int:
    return max(1, math.ceil(duration / window - 1e-9))


def service_per_window(answers: list[Answer], weights: dict[str, float], window: float,
                       duration: float) -> dict[str, list[float]]:
    """Each client's weighted service (VTC units / weight) in each window of [0, duration)."""
    n = windows(duration, window)
    out = {client: [0.0] * n for client in weights}
    for a in answers:
        for t, units in charges(a):
            if 0 <= t < duration:
                out[a.client][min(n - 1, int(t // window))] += units / weights[a.client]
    return out


def covered(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """The fraction of [start, end) that the union of `intervals` covers."""
    total, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total / (end - start) if end > start else 0.0


def backlogged(answers: list[Answer], client: str, window: float, duration: float,
               min_cover: float = MIN_COVER) -> list[bool]:
    """Per window, whether `client` had a request waiting for at least `min_cover` of it."""
    waits = [a.waiting(duration) for a in answers if a.client == client]
    return [covered(waits, k * window, min((k + 1) * window, duration)) >= min_cover
            for k in range(windows(duration, window))]


@dataclass(frozen=True)
class Gap:
    """The largest cumulative difference in weighted service between two tenants over one stretch of windows in
    which both were backlogged, and its largest value in each half of that stretch."""

    pair: tuple[str, str] = ("", "")
    largest: float = 0.0
    windows: int = 0
    first_half: float = 0.0
    second_half: float = 0.0


def largest_gap(service: dict[str, list[float]], backlog: dict[str, list[bool]]) -> Gap:
    best = Gap()
    for a, b in combinations(sorted(service), 2):
        both = [x and y for x, y in zip(backlog[a], backlog[b], strict=True)]
        k = 0
        while k < len(both):
            if not both[k]:
                k += 1
                continue
            run, cumulative = [], 0.0
            while k < len(both) and both[k]:
                cumulative += service[a][k] - service[b][k]
                run.append(abs(cumulative))
                k += 1
            half = (len(run) + 1) // 2
            gap = Gap((a, b), max(run), len(run), max(run[:half]), max(run[half:], default=0.0))
            if gap.largest > best.largest or (gap.largest == best.largest and gap.windows > best.windows):
                best = gap
    return best


def output_tok_s(answers: list[Answer], duration: float) -> float:
    """Generated tokens delivered in [0, duration), per second."""
    total, before = 0, dict[int, int]()
    for i, a in enumerate(answers):
        for t, generated in a.progress:
            if t < duration:
                total += generated - before.get(i, 0)
                before[i] = generated
    return total / duration if duration > 0 else 0.0


def measure_capacity(answers: list[Answer], start: float, end: float) -> Capacity:
    """The saturated rate over [start, end) of a closed loop of default-shape requests (weight 1)."""
    span, units, output, prompts = end - start, 0.0, 0.0, 0.0
    for a in answers:
        for i, (t, amount) in enumerate(charges(a)):
            if start <= t < end:
                units += amount
                output += amount / 2 if i else 0.0
                prompts += 0.0 if i else amount
    if span <= 0 or units <= 0:
        raise ValueError("no service measured")
    return Capacity(service_s=units / span, output_tok_s=output / span, tokens_s=(prompts + output) / span)


def refusals(answers: list[Answer]) -> Counter[str]:
    """Refusals and failures by error code (or status), not counting requests the run's end cut."""
    return Counter(a.code or str(a.status) for a in answers if a.status != 200 and a.code != OPEN)


def ttfts(answers: list[Answer]) -> list[float]:
    return [t for a in answers if (t := a.ttft) is not None]


def first_token_text(answers: list[Answer]) -> str:
    values = ttfts(answers)
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return "-" if p50 is None or p99 is None else f"{p50:.2f} / {p99:.2f}"


@dataclass(frozen=True)
class Overrun:
    budget: int
    used: int
    answered: int
    refused: Counter[str]
    fits: int  # how many default-shape requests the budget holds by their real use

    @property
    def overrun(self) -> int:
        return max(0, self.used - self.budget)


def overrun(answers: list[Answer], budget: int) -> Overrun:
    """Tokens the answered requests of a burst used (prompt + generated, from their usage) against `budget`."""
    done = [a for a in answers if a.status == 200]
    return Overrun(budget=budget, used=sum(a.prompt_tokens + a.generated for a in done), answered=len(done),
                   refused=refusals(answers), fits=budget // DEFAULT.tokens)
