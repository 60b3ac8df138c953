"""How many engine replicas the demand needs, from what the replicas report (host/replica_load.scaling_figures).

Demand is counted in decode steps per second (one per stream per output token): what the replicas served plus what
they refused by time (a refused request counts as the output it would have had). A count of requests says little
for an LLM (one asks for 20 tokens, the next for 2,000), and this service refuses at once the requests it predicts
would miss their first-token target, so unmet demand never shows as a queue a count-based policy could see.

One replica's capacity is what it makes at a full batch, as it last measured near one (host/pace.py; the median of the
replicas that have measured any); the policy plans for `target_utilization` of it:

    desired = ceil(demand / (capacity x target_utilization))

Scale up: to `desired`, and by one at least while an arrival's predicted first token on the soonest replica is past
the target or a busy fleet refuses by time (the demand a saturated fleet can measure is capped by what it serves).
Scale down: to the fewest replicas the demand fits with a margin (`DOWN_MARGIN`), in one step, so that removing
replicas cannot itself call for one again, and a step of load costs one scale event each way. Serve applies
`upscale_delay_s` and `downscale_delay_s` to the answer (the desire must hold that long), and the bounds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# Scale down only when the demand fits in the smaller fleet at this share of its planned capacity: with the planned
# 0.8, a fleet of 2 goes to 1 below 0.68 of one replica's capacity, and comes back above 0.8 (no flapping between).
# At 0.7 a load of 0.55 of one replica kept two after the step trace's peak (the simulation, docs/autoscaling.md).
DOWN_MARGIN = 0.85


@dataclass(frozen=True)
class ReplicaFigures:
    """One replica's report, averaged over the look-back window."""

    served: float = 0.0  # decode steps per second served
    refused: float = 0.0  # ... refused by time
    capacity: float | None = None  # ... it makes at a full batch; None until measured
    wait_s: float | None = None  # the first token a newcomer would see now; None until measured
    full_batch: float = 0.0  # the share of the window its capacity was measured near a full batch, not extrapolated


@dataclass(frozen=True)
class Knobs:
    min_replicas: int
    max_replicas: int
    target_utilization: float = 0.8
    ttft_target_s: float | None = 10.0


def planning_capacities(replicas: list[ReplicaFigures]) -> list[float]:
    """The capacities to plan on: those measured near a full batch, where any replica has (a light load's
    extrapolation reads a third to half of it: 144 beside 225 tokens/s after the real cluster's step, docs/
    autoscaling.md); else every one reported."""
    full = [r.capacity for r in replicas if r.capacity and r.full_batch >= 0.5]
    return full or [r.capacity for r in replicas if r.capacity]


def _demand(replicas: list[ReplicaFigures]) -> float:
    return sum(r.served + r.refused for r in replicas)


def desired_replicas(current: int, replicas: list[ReplicaFigures], knobs: Knobs,
                     recent: list[ReplicaFigures] | None = None) -> int:
    """The replica count the demand needs, within the bounds; `current` when nothing is measured yet.

    `replicas`: each replica's figures averaged over the look-back window; `recent`: over the last few seconds
    (default: the same). Up follows the recent figures (a step shows there within seconds; the look-back average put
    the first decision 30 s later and then asked for one replica at a time), down only what both windows allow."""
    recent = recent if recent is not None else replicas
    measured = planning_capacities([*replicas, *recent])
    waits = [r.wait_s for r in recent if r.wait_s is not None]
    planned = statistics.median(measured) * knobs.target_utilization if measured else None
    busy = planned is None or _demand(recent) > current * planned * DOWN_MARGIN
    # Late: the soonest replica's next first token is past the target, or a busy fleet refuses by time (a quiet
    # fleet's refusals are requests too long for the target even alone: more replicas would not help them).
    late = (knobs.ttft_target_s is not None and bool(waits) and min(waits) > knobs.ttft_target_s) or (
        busy and any(r.refused > 0 for r in recent))
    desired = current
    if planned is not None:
        up, down = _demand(recent), max(_demand(recent), _demand(replicas))
        needed = math.ceil(up / planned) if up > 0 else knobs.min_replicas
        fewest = max(1, math.ceil(down / (planned * DOWN_MARGIN)))  # where the demand fits with the margin
        if needed > current:
            desired = needed
        elif fewest < current and not late:
            desired = fewest
    if late:
        desired = max(desired, current + 1)
    return max(knobs.min_replicas, min(knobs.max_replicas, desired))
