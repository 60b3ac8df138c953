"""Admission by time as the overload driver sees it: refusals by reason with the latency their clients saw, the
first tokens of served streams against `deployment.ttft_target_s`, the replica's measured pace (the last values
/stats showed in a phase), and the targets on them.

The service refuses at arrival (429 `over_time_target`) a request whose predicted first token is later than
its target, so with a time target on a request should neither wait out the queue timeout (503 `queue_timeout`)
nor, once admitted, see its first token much later than the target.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass

from loadkit.overload.phases import Phase
from loadkit.record import Record
from loadkit.server_stats import Stats
from loadkit.stats import fmt_pcts

# The service predicts from the request's arrival at the replica; the client times from before it sends: between
# them, tokenizing the prompt and this load generator's own event-loop lag (its row in the table; docs/overload.md
# has the figures), and the prediction's own error.
TTFT_TOLERANCE_S = 2.0
REASONS = ("queue_full", "over_time_target", "queue_timeout", "other")


def parse_target_s(text: str) -> float | None:
    """--ttft-target: seconds > 0, or '0' / 'none' / 'off' for no time target (None)."""
    if text.strip().lower() in ("none", "off", "null"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds nor 'none': {text!r}") from None
    if not 0 <= value < float("inf"):  # also NaN
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds (0: off): {text!r}")
    return value or None


def reason(rec: Record) -> str | None:
    """Why `rec` was refused (one of REASONS), or None if it was not: 'other' is any other 429 or 503 (an
    engine that is starting or gone, a draining replica)."""
    if rec.outcome == "refused":
        return rec.code if rec.code in REASONS else "other"
    if rec.outcome == "queue_timeout":
        return "queue_timeout"
    if rec.outcome in ("error_4xx", "error_5xx") and rec.status in (429, 503):
        return "other"
    return None


def by_reason(records: Iterable[Record]) -> dict[str, list[float]]:
    """Client-side latencies (seconds) of the refusals, by reason, every reason present (maybe empty)."""
    out: dict[str, list[float]] = {k: [] for k in REASONS}
    for r in records:
        why = reason(r)
        if why is not None:
            out[why].append(r.latency)
    return out


def first_tokens(records: Iterable[Record]) -> list[float]:
    """Seconds to the first token of every admitted stream that got one: served in full, or hung up by design
    after its first chunks (both were admitted, and the target is on the first token)."""
    return [r.ttft for r in records if r.outcome in ("ok", "hangup") and r.ttft is not None]


def share_within(values: list[float], limit_s: float) -> float | None:
    """The share of `values` at or below `limit_s`; None for no values."""
    return sum(v <= limit_s for v in values) / len(values) if values else None


@dataclass(frozen=True)
class PaceSeen:
    """The replica's pace as the last /stats poll of a phase showed it (each figure: its last non-null value)."""

    polls: int = 0
    samples: int | None = None
    prefill_tokens_per_s: float | None = None
    decode_s_per_token: float | None = None
    output_share: float | None = None
    predicted_first_token_s: float | None = None


def last_pace(samples: list[Stats]) -> PaceSeen:
    def last(attr: str):
        return next((getattr(s, attr) for s in reversed(samples) if getattr(s, attr) is not None), None)

    return PaceSeen(polls=len(samples), samples=last("pace_samples"),
                    prefill_tokens_per_s=last("pace_prefill_tokens_per_s"),
                    decode_s_per_token=last("pace_decode_s_per_token"), output_share=last("pace_output_share"),
                    predicted_first_token_s=last("predicted_first_token_s"))


def refusal_cell(values: list[float]) -> str:
    """'n; p50 / p99 ms' of one reason's client-side latencies."""
    return "0" if not values else f"{len(values)}; {fmt_pcts(values, 1000, ' ms', 1, qs=(50, 99))}"


def ttft_cell(values: list[float]) -> str:
    return fmt_pcts(values, 1, " s", 2, qs=(50, 99))


def share_cell(values: list[float], target_s: float | None) -> str:
    if target_s is None:
        return "- (no target)"
    share = share_within(values, target_s)
    return "-" if share is None else f"{share * 100:.1f}% of {len(values)}"


def target_text(target_s: float | None) -> str:
    return "off" if target_s is None else f"{target_s:g} s"


def _opt(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def pace_cell(p: Phase) -> str:
    seen = last_pace(p.watch.samples)
    if seen.samples is None and seen.prefill_tokens_per_s is None and seen.decode_s_per_token is None:
        return "- (not in /stats)"
    return (f"{_opt(seen.prefill_tokens_per_s, ',.0f')} tok/s / {_opt(seen.decode_s_per_token, '.4f')} s / "
            f"{_opt(seen.output_share, '.2f')} / {_opt(seen.samples, 'd')}")


def predicted_cell(p: Phase) -> str:
    value = last_pace(p.watch.samples).predicted_first_token_s
    seen = [s.predicted_first_token_s for s in p.watch.samples if s.predicted_first_token_s is not None]
    return "- (none yet)" if value is None else f"{value:.2f} s (polled max {max(seen):.2f} s)"


def time_rows(target_s: float | None) -> list[tuple[str, object]]:
    """(label, cell of a phase) rows of the report's admission-by-time table."""
    rows: list[tuple[str, object]] = [
        (f"refused: {why} (count; client latency p50 / p99)", (lambda p, w=why: refusal_cell(by_reason(p.records)[w])))
        for why in REASONS]
    rows += [
        ("server-counted over_time_target refusals (/stats)",
         lambda p: str(p.after.refused_over_time_target - p.before.refused_over_time_target)),
        ("admitted streams: first token p50 / p99 (client)", lambda p: ttft_cell(first_tokens(p.records))),
        (f"admitted streams: first token within ttft_target_s ({target_text(target_s)})",
         lambda p: share_cell(first_tokens(p.records), target_s)),
        ("pace at the phase's end: prefill / decode per token / output share / samples", pace_cell),
        ("latest arrival's predicted first token (admission.predicted_first_token_s)",
         predicted_cell),
    ]
    return rows
