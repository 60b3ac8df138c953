"""The refusals by time: a request predicted to miss its latency targets, from a busy replica or even alone.

`over_time`: the predicted first token, end or start (from now) of a request `waited_s` into its wait comes
after its targets or the queue timeout: `OverTimeTarget`, Retry-After the predicted excess, at most a minute
(as every other refusal's). `never_in_time`: it would miss them even with the replica to itself: `NeverInTime`,
with no Retry-After, since waiting cannot help it (docs/sizing.md, "Admission by time").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.errors import NeverInTime, OverTimeTarget
from app.host.pace import Prediction

MAX_RETRY_AFTER_S = 60


@dataclass(frozen=True)
class Targets:
    """A request's latency targets, seconds from its arrival at the replica; None: no target."""

    first_token_s: float | None = None
    finish_s: float | None = None
    counts_demand: bool = True  # a refusal by time counts as demand here (host/demand.py); False: its sender counts


NO_TARGETS = Targets()


def over_time(prediction: Prediction, targets: Targets, waited_s: float, queue_timeout_s: float | None
              ) -> OverTimeTarget | None:
    """The refusal of a request `waited_s` into its wait whose predicted first token or end (from now) comes after
    its `targets`, or whose start after the queue timeout; None when all are met."""
    for what, predicted, target in (
        ("first token", prediction.first_token_s, targets.first_token_s),
        ("end", prediction.finish_s, targets.finish_s),
        ("start", prediction.start_s, queue_timeout_s),
    ):
        if target is None or predicted <= target - waited_s:
            continue
        limit = "queue timeout" if what == "start" else "target"
        when = (f"after {waited_s:.1f} s in the queue, this request's {what} is predicted in {predicted:.1f} s "
                "more" if waited_s else f"this request's {what} is predicted in {predicted:.1f} s")
        return OverTimeTarget(
            f"Server is busy: {when}, later than its {target:g} s {limit}; retry after the Retry-After delay "
            "(or ask for fewer tokens)",
            retry_after_s=min(MAX_RETRY_AFTER_S, max(1, math.ceil(predicted + waited_s - target))),
        )
    return None


def never_in_time(alone: Prediction | None, targets: Targets) -> NeverInTime | None:
    """The refusal of a request that misses a target even with nothing else to wait for, or None."""
    if alone is None:
        return None
    for what, predicted, target in (("first token", alone.first_token_s, targets.first_token_s),
                                    ("end", alone.finish_s, targets.finish_s)):
        if target is not None and predicted > target:
            return NeverInTime(
                f"This request's {what} is predicted in {predicted:.1f} s even with this replica to itself, later "
                f"than its {target:g} s target: it is served only by an idle replica. Shorten the prompt, ask for "
                "fewer tokens, or send a longer target (docs/api.md)")
    return None
