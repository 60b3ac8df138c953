"""How many engine replicas the demand needs, from what the replicas report (host/replica_load.scaling_figures).

Demand is counted in decode steps per second (one per stream per output token): what the replicas served plus what
they refused by time (a refused request counts as the output it would have had). A count of requests says little
for an LLM (one asks for 20 tokens, the next for 2,000), and this service refuses at once the requests it predicts
would miss their first-token target, so unmet demand never shows as a queue a count-based policy could see.

One replica's capacity is what it makes at a full batch, as it last measured near one (host/pace.py; the median of the
replicas that have measured any); the policy plans for `target_utilization` of it:

    desired = ceil(demand / (capacity x target_utilization))

Replicas that share hardware (engines on one machine's cores, beside the ingress) measure less each the more of them
run: on the 2-core machine two engines each kept 71-91 output tokens/s from their full batches where one alone kept
240 (docs/autoscaling.md). So the figure is remembered by fleet size (`by_size`, kept by the caller): a smaller fleet
is planned on at least what one replica measured at that size, a larger one at most, since removing a replica never
slows the others and adding one never speeds them up.

Scale up: to `desired` once the demand passes the planned share by `UP_TOLERANCE`, and by one at least while an
arrival's predicted first token on the soonest replica is past the target or every replica of a busy fleet refuses
by time (the demand a saturated fleet can measure is capped by what it serves); while late, with no tolerance.
Scale down: to the fewest replicas the demand fits with a margin (`DOWN_MARGIN`), in one step, so that removing
replicas cannot itself call for one again, and a step of load costs one scale event each way. Serve applies
`upscale_delay_s` and `downscale_delay_s` to the answer (the desire must hold that long), and the bounds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# Scale down only when the demand fits in the smaller fleet at this share of its planned capacity: with the planned
# 0.8, a fleet of 2 goes to 1 below 0.68 of one replica's capacity, and comes back above 0.88 (0.8 while late): no
# flapping between.
# At 0.7 a load of 0.55 of one replica kept two after the step trace's peak (the simulation, docs/autoscaling.md).
DOWN_MARGIN = 0.85
# While arrivals are in time, scale up only once the demand passes the planned share by this much (Kubernetes HPA's
# tolerance is 10 %): at 8-16 replicas a 10 s window's swing of 10-15 % added 1-3 replicas after the step's
# scale-up in the simulation, with no refusal to show for it (docs/autoscaling.md).
UP_TOLERANCE = 0.1


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


def full_batch_capacities(replicas: list[ReplicaFigures]) -> list[float]:
    """The capacities measured near a full batch within the window."""
    return [r.capacity for r in replicas if r.capacity and r.full_batch >= 0.5]


def planning_capacities(replicas: list[ReplicaFigures]) -> list[float]:
    """The capacities to plan on: those measured near a full batch, where any replica has (a light load's
    extrapolation reads a third to half of it: 144 beside 225 tokens/s after the real cluster's step, docs/
    autoscaling.md); else every one reported."""
    return full_batch_capacities(replicas) or [r.capacity for r in replicas if r.capacity]


def _per_replica(current: int, replicas: list[ReplicaFigures], by_size: dict[int, float]) -> float | None:
    """One replica's capacity in the fleet as it runs: measured near a full batch in the window; else what was
    measured at this fleet size before (a figure a replica kept from another size, or extrapolated, is worse);
    else what the replicas report."""
    if current in by_size and not full_batch_capacities(replicas):
        return by_size[current]
    measured = planning_capacities(replicas)
    return statistics.median(measured) if measured else None


def _at_size(size: int, current: int, now: float, by_size: dict[int, float]) -> float:
    """One replica's capacity in a fleet of `size`, from its capacity `now` in the fleet of `current` and what was
    measured at the sizes between: never less in a smaller fleet, never more in a larger one."""
    if size < current:
        return max([now, *(c for n, c in by_size.items() if size <= n < current)])
    return min([now, *(c for n, c in by_size.items() if current < n <= size)])


def _demand(replicas: list[ReplicaFigures]) -> float:
    return sum(r.served + r.refused for r in replicas)


def desired_replicas(current: int, replicas: list[ReplicaFigures], knobs: Knobs,
                     recent: list[ReplicaFigures] | None = None, by_size: dict[int, float] | None = None,
                     measured_at: int | None = None) -> int:
    """The replica count the demand needs, within the bounds; `current` when nothing is measured yet.

    `replicas`: each replica's figures averaged over the look-back window; `recent`: over the last few seconds
    (default: the same). Up follows the recent figures (a step shows there within seconds; the look-back average put
    the first decision 30 s later and then asked for one replica at a time), down only what both windows allow.
    `by_size`: one replica's capacity measured near a full batch at each fleet size, where known; `measured_at`: the
    fleet size the windows' figures were measured at (default `current`; the one before, just after a change)."""
    recent = recent if recent is not None else replicas
    by_size = by_size or {}
    measured_at = measured_at or current
    capacity = _per_replica(measured_at, [*replicas, *recent], by_size)
    if capacity is not None:
        capacity = _at_size(current, measured_at, capacity, by_size)
    waits = [r.wait_s for r in recent if r.wait_s is not None]
    planned = capacity * knobs.target_utilization if capacity is not None else None
    busy = planned is None or _demand(recent) > current * planned * DOWN_MARGIN
    # Late: the soonest replica's next first token is past the target, or a busy fleet refuses by time on every
    # replica (a quiet fleet's refusals are requests too long for the target even alone: more replicas would not help
    # them; one replica still refusing the backlog of a step beside new ones with room added a third replica where
    # two were planned, in the simulation's step at 2 s reports).
    late = (knobs.ttft_target_s is not None and bool(waits) and min(waits) > knobs.ttft_target_s) or (
        busy and bool(recent) and all(r.refused > 0 for r in recent))
    desired = current
    if capacity is not None:
        up, down = _demand(recent), max(_demand(recent), _demand(replicas))

        def fits(size: int, demand: float, share: float) -> bool:
            return demand <= size * _at_size(size, current, capacity, by_size) * share

        if not fits(current, up, knobs.target_utilization * (1.0 if late else 1.0 + UP_TOLERANCE)):
            desired = next((n for n in range(current + 1, knobs.max_replicas + 1)
                            if fits(n, up, knobs.target_utilization)), knobs.max_replicas)
        elif not late:  # to the fewest where the demand fits with the margin
            desired = next(n for n in range(1, current + 1)
                           if n == current or fits(n, down, knobs.target_utilization * DOWN_MARGIN))
    if late:
        desired = max(desired, current + 1)
    return max(knobs.min_replicas, min(knobs.max_replicas, desired))
