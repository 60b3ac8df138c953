"""SimFleet: a model's engine replicas in simulated time: arrivals routed as the ingress routes them, replicas started
and stopped as Serve does, and the figures each replica reports to Serve's controller (every `PUSH_S`, each a
sample a second, averaged over the look-back window)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from app.scaling.serve_policy import REPORT_EVERY_S
from scalesim.replica import CostModel, Job, SimReplica

# What the service's engine deployments set as Serve's `metrics_interval_s`, for every policy simulated (Serve's
# default is 10 s; its RAY_SERVE_*_PUSH_INTERVAL_S variables are read by nothing).
PUSH_S = REPORT_EVERY_S
DRAIN_GRACE_S = 30.0  # the service's drain_grace_s: what a stopped replica cannot finish then continues elsewhere


@dataclass
class Counts:
    offered: int = 0
    refused: int = 0
    moved: int = 0  # requests a stopped replica handed on unfinished (continued elsewhere; none lost)
    finished: list[Job] = field(default_factory=list)


class SimFleet:
    def __init__(self, cost: CostModel, replicas: int, start_delay_s: float, ttft_target_s: float,
                 output_share: float, look_back_s: float = 30.0):
        self.cost, self.start_delay_s, self.ttft_target_s = cost, start_delay_s, ttft_target_s
        self.output_share, self.look_back_s = output_share, look_back_s
        self.replicas = [SimReplica(cost, ready_at=0.0) for _ in range(replicas)]
        self.counts = Counts()
        self._samples: dict[int, deque[tuple[float, dict[str, float]]]] = {}
        self._seen: dict[int, list[tuple[float, dict[str, float]]]] = {}  # what Serve has been pushed

    # -- requests -------------------------------------------------------------------------------

    def offer(self, job: Job, now: float) -> None:
        """The ingress's routing (app/routing/fleet_router.py): the serving replica with the earliest first token; a
        refusal at once when even that one misses the target (never because of an idle replica). The refused
        request's output counts as unmet demand on that replica (the ingress reports it, app/rayserve)."""
        self.counts.offered += 1
        predicted = [(r.first_token_s(job.prompt), i, r) for i, r in enumerate(self.replicas) if r.serving(now)]
        first_s, _, best = min(predicted, default=(0.0, 0, None))
        if best is None or (best.ongoing and first_s > self.ttft_target_s):
            self.counts.refused += 1
            if best is not None:
                best.meter.refused(job.max_tokens * self.output_share, now)
            return
        best.queue.append(job)

    def advance(self, now: float, dt: float) -> None:
        for replica in self.replicas:
            if now >= replica.ready_at:
                self.counts.finished.extend(replica.advance(now, dt))
        for replica in [r for r in self.replicas if r.stopping_since is not None]:
            if not replica.ongoing:
                self.replicas.remove(replica)
            elif now - (replica.stopping_since or now) >= DRAIN_GRACE_S:
                self._hand_on(replica, now)

    def _hand_on(self, replica: SimReplica, now: float) -> None:
        """What a stopped replica did not finish within the grace continues on another (app/engine/continuation.py):
        its prompt and the tokens made so far are prefilled there, and it decodes the rest."""
        self.replicas.remove(replica)
        serving = [r for r in self.replicas if r.serving(now)]
        for job in [*replica.running, *replica.queue]:
            self.counts.moved += 1
            target = min(serving, key=lambda r: r.first_token_s(job.prompt))
            target.queue.appendleft(job)

    # -- scaling --------------------------------------------------------------------------------

    @property
    def target(self) -> int:
        return sum(1 for r in self.replicas if r.stopping_since is None)

    def running(self, now: float) -> list[SimReplica]:
        return [r for r in self.replicas if r.serving(now)]

    def scale_to(self, target: int, now: float) -> None:
        """Serve's scheduler: new replicas serve after the start delay; it stops replicas not yet running first,
        then the newest (2.60's `_get_replicas_to_stop`, one node)."""
        while self.target < target:
            self.replicas.append(SimReplica(self.cost, ready_at=now + self.start_delay_s))
        live = [r for r in self.replicas if r.stopping_since is None]
        for replica in sorted(live, key=lambda r: (r.ready_at <= now, -r.ready_at))[:max(0, self.target - target)]:
            replica.stopping_since = now
            if replica.ready_at > now:
                self.replicas.remove(replica)

    # -- what Serve sees ------------------------------------------------------------------------

    def record(self, now: float) -> None:
        """Each running replica's sample of this second; pushed to Serve every PUSH_S (each replica on its own
        phase)."""
        for replica in self.running(now):
            key = id(replica)
            self._samples.setdefault(key, deque()).append((now, replica.figures(now, self.output_share)))
            if int(now - replica.ready_at) % int(PUSH_S) == 0:
                self._seen[key] = list(self._samples[key])
            while self._samples[key] and self._samples[key][0][0] < now - self.look_back_s:
                self._samples[key].popleft()

    def reported(self, now: float) -> dict[str, dict[int, list[tuple[float, float]]]]:
        """Per figure, each running replica's samples within the look-back that it has pushed (what Serve's
        controller holds); replicas that have pushed nothing yet are left out, as Serve leaves them."""
        out: dict[str, dict[int, list[tuple[float, float]]]] = {}
        for index, replica in enumerate(self.running(now)):
            for t, sample in self._seen.get(id(replica), []):
                if t >= now - self.look_back_s:
                    for name, value in sample.items():
                        out.setdefault(name, {}).setdefault(index, []).append((t, value))
        return out
