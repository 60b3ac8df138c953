"""ServingReplicaRouter: Ray Serve's request router for the engine deployments, skipping replicas that
cannot serve.

Serve's default router (power of two choices) sends a request to the less loaded of two random replicas.
A replica whose engine has died refuses at once, so it always looks the least loaded (docs/operations.md,
"Wedged and dead engines"); its health check fails too, but Serve acts on it only after `health_check_period_s`.

Each engine replica reports whether it serves and its room (`host/replica_load.ReplicaLoad`) through Serve's own
routing-stats channel
(`record_routing_stats`, polled by the controller every `ROUTING_STATS_PERIOD_S`); this router draws its
two choices among the replicas that serve, preferring those with room in their admission (running +
queued below capacity), and falls back to all replicas when none qualifies (they then answer 503 or 429
themselves, honestly, instead of a request waiting in the router). Among its two, Serve's usual queue-length
probe still picks. A request the ingress retries (handle_backend.py) names the replicas that refused it, and they
are left out while any other remains. Built on Serve's public `RequestRouter` with its FIFO and locality mixins; the
FIFO one hands a replica chosen for one call to the oldest call waiting, so a ranking or an address made for one call
served another (two /metrics calls addressed to two replicas both reached one): here a replica goes to the call it
was chosen for (matched by its Serve request id: each call has its own, rayserve/call_ids.py) while that one waits.

With fleet routing (the default for several replicas; app/routing/), the ingress ranks the replicas itself before
each call, from what they report here (`replica_loads`) and which prompt prefixes each holds, and passes the ranking
as the call's third argument (`generate_remote`'s `prefer`): this router then offers Serve the replicas in that order,
one at a time, the first that accepts taking the request. Without a ranking it draws two as above.

The ingress also asks every replica for its figures (/metrics, /stats): a call whose first argument is an
`Addressed` goes to that replica only, and `replica_ids` lists the replicas this process's router knows.
"""

from __future__ import annotations

import random
import weakref
from dataclasses import dataclass
from typing import Any

from ray.serve._private.common import RequestMetadata
from ray.serve.request_router import FIFOMixin, LocalityMixin, PendingRequest, RequestRouter, RunningReplica

from app.host.replica_load import ReplicaLoad

# How often each replica's `record_routing_stats` is polled: a dead engine leaves the routing set within about this
# long plus one broadcast, and the fleet router's view of each replica's queue is about this old. The call simulates
# the replica's queue once (~1 ms for 64 queued); at 1 s the fleet router's view lagged a burst of 4 requests enough
# to pile them onto one replica (the routing run of 01:03, W3: 0.84x power-of-two's tokens/s).
ROUTING_STATS_PERIOD_S = 0.5
ROUTING_STATS_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Addressed:
    """The first argument of a call meant for one replica (its Serve id), whatever its load."""

    replica_id: str


_ROUTERS: weakref.WeakValueDictionary[Any, ServingReplicaRouter] = weakref.WeakValueDictionary()


def replica_ids(deployment_id: Any) -> list[str]:
    """The replicas of `deployment_id` (a Serve `DeploymentID`) known to a router in this process; [] before its
    first call has made one."""
    router = _ROUTERS.get(deployment_id)
    return sorted(r.unique_id for r in router.curr_replicas) if router is not None else []


def replica_loads(deployment_id: Any) -> dict[str, ReplicaLoad]:
    """What each replica of `deployment_id` last reported (`EngineReplica.record_routing_stats`), by its id; {}
    before this process's router exists."""
    router = _ROUTERS.get(deployment_id)
    if router is None:
        return {}
    return {r.replica_id.unique_id: ReplicaLoad.of(r.routing_stats) for r in list(router.curr_replicas.values())}


def preferred(pending_request: PendingRequest | None) -> tuple[tuple[str, ...], ...]:
    """The ranking the ingress sent with the call (`generate_remote`'s `prefer`): groups of replica ids, best first,
    each offered to Serve together (its probe takes the least loaded of a group); () for none."""
    if pending_request is None or len(pending_request.args) < 3 or not isinstance(pending_request.args[2], tuple):
        return ()
    return tuple(tuple(str(r) for r in group) if isinstance(group, tuple) else (str(group),)
                 for group in pending_request.args[2])


def _addressed(pending_request: PendingRequest | None) -> str | None:
    first: Any = pending_request.args[0] if pending_request is not None and pending_request.args else None
    # By name: where Serve has pickled this module by value, its `Addressed` is a copy of the caller's class.
    return str(first.replica_id) if type(first).__name__ == Addressed.__name__ else None


def _serving(replica: RunningReplica) -> bool:
    return bool(replica.routing_stats.get("serving", True))  # no stats yet: a new replica is ready (it loaded)


def _has_room(replica: RunningReplica) -> bool:
    return int(replica.routing_stats.get("room", 1)) > 0


def avoided(pending_request: PendingRequest | None) -> frozenset[str]:
    """Replicas that already refused this request (`EngineReplica.generate_remote`'s `avoid`; handle_backend.py)."""
    if pending_request is None or len(pending_request.args) < 2 or not isinstance(pending_request.args[1], tuple):
        return frozenset()
    return frozenset(str(r) for r in pending_request.args[1])


def not_avoided(replicas: list[RunningReplica], avoid: frozenset[str]) -> list[RunningReplica]:
    """The replicas that have not refused this request yet; all of them when every one has."""
    return [r for r in replicas if r.replica_id.unique_id not in avoid] or replicas


def pick_two(replicas: list[RunningReplica]) -> list[RunningReplica]:
    """Two random replicas (or the one) among those that serve and have room, else those that serve, else all."""
    serving = [r for r in replicas if _serving(r)] or replicas
    pool = [r for r in serving if _has_room(r)] or serving
    return random.sample(pool, min(2, len(pool)))


class ServingReplicaRouter(FIFOMixin, LocalityMixin, RequestRouter):
    def _get_pending_request_matching_metadata(
        self, request_metadata: RequestMetadata | None = None
    ) -> PendingRequest | None:
        """The call a replica was chosen for, where it still waits (FIFOMixin then hands the replica to the oldest
        waiting call only where it does not)."""
        return self._get_pending_request_matching_internal_request_id(request_metadata)

    def initialize_state(self, **kwargs: Any) -> None:
        # Imported here, not read as a global: Serve pickles this class by value, and a copy of the registry would
        # be one `replica_ids` never sees.
        from app.rayserve import request_router

        request_router._ROUTERS[self._deployment_id] = self

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        target = _addressed(pending_request)
        if target is not None:  # that replica only; gone meanwhile: any, which answers with its own id
            return [[r for r in candidate_replicas if r.replica_id.unique_id == target] or candidate_replicas]
        candidates = not_avoided(candidate_replicas, avoided(pending_request))
        ranking = preferred(pending_request)
        if ranking:  # the ingress ranked them (app/routing/): in that order, then any other as a last resort
            by_id = {r.replica_id.unique_id: r for r in candidates}
            ranked = [[by_id[r] for r in group if r in by_id] for group in ranking]
            named = {r for group in ranking for r in group}
            rest = [r for r in candidates if r.replica_id.unique_id not in named]
            return [group for group in ranked if group] + ([pick_two(rest)] if rest else [])
        local = set(self.apply_locality_routing(pending_request))  # same node first, as Serve's default does
        nearby = [r for r in candidates if r.replica_id in local and _serving(r)]
        return [pick_two(nearby or candidates)]
