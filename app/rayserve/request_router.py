"""ServingReplicaRouter: Ray Serve's request router for the engine deployments, skipping replicas that
cannot serve.

Serve's default router (power of two choices) sends a request to the less loaded of two random replicas.
A replica whose engine has died refuses at once, so it always looks the least loaded (docs/operations.md,
"Wedged and dead engines"); its health check fails too, but Serve acts on it only after `health_check_period_s`.

Each engine replica reports `{"serving": bool, "room": int}` through Serve's own routing-stats channel
(`record_routing_stats`, polled by the controller every `ROUTING_STATS_PERIOD_S`); this router draws its
two choices among the replicas that serve, preferring those with room in their admission (running +
queued below capacity), and falls back to all replicas when none qualifies (they then answer 503 or 429
themselves, honestly, instead of a request waiting in the router). Among its two, Serve's usual queue-length
probe still picks. A request the ingress retries (handle_backend.py) names the replicas that refused it, and they
are left out while any other remains. Built on Serve's public `RequestRouter` with its FIFO and locality mixins.
"""

from __future__ import annotations

import random

from ray.serve.request_router import FIFOMixin, LocalityMixin, PendingRequest, RequestRouter, RunningReplica

# How often each replica's `record_routing_stats` is polled: a dead engine leaves the routing set within
# about this long plus one broadcast. The call is a dict of two fields: cheap at 1 s.
ROUTING_STATS_PERIOD_S = 1.0
ROUTING_STATS_TIMEOUT_S = 5.0


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
    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        candidates = not_avoided(candidate_replicas, avoided(pending_request))
        local = set(self.apply_locality_routing(pending_request))  # same node first, as Serve's default does
        nearby = [r for r in candidates if r.replica_id in local and _serving(r)]
        return [pick_two(nearby or candidates)]
