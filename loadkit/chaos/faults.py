"""The faults the chaos driver injects, each on a deployment of two engine replicas on two worker nodes.

A fault is injected by `inject` (returning what it did, in words) and is over when `whole` holds: the
deployment has its replicas again, each with an engine that serves (its replica's own ready line; an EngineCore
process appears well before its engine serves). What a client may see meanwhile is the round's to measure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from loadkit.cluster import LocalCluster, ReplicaActor


@dataclass
class Target:
    """The deployment under fault: the cluster, the application and engine deployment, its Serve config."""

    cluster: LocalCluster
    app: str
    deployment: str
    serve_config: dict
    work_dir: Path
    replicas: int = 2
    add_worker: Callable[[], str] = field(default=lambda: "")  # joins a new worker node; returns what it said

    def engines(self) -> dict[str, psutil.Process]:
        return self.cluster.engine_cores(self.deployment)

    def whole(self, since_ids: set[str] | None = None) -> bool:
        """`replicas` replicas RUNNING (and no other state), each with an engine that serves; `since_ids`: and
        none of those replicas among them (a rolling update replaces them all)."""
        if self.cluster.replica_states(self.app, self.deployment) != {"RUNNING": self.replicas}:
            return False
        live = self.cluster.replicas(self.deployment)
        if len(live) != self.replicas or (since_ids and since_ids & {r.replica_id for r in live}):
            return False
        return all(self.cluster.engine_serving(r) for r in live)


@dataclass(frozen=True)
class Fault:
    name: str
    what: str  # as the table says it
    inject: Callable[[Target], Callable[[], bool]]  # does it; returns the "whole again" condition


def _first_replica(target: Target) -> ReplicaActor:
    return sorted(target.cluster.replicas(target.deployment), key=lambda r: r.node)[0]


def _engine_of(target: Target, replica: ReplicaActor) -> psutil.Process:
    return target.engines()[replica.replica_id]


def _replaced(target: Target, engine: psutil.Process) -> Callable[[], bool]:
    """Whole again once `engine` is gone from the live engines and its replacement serves (the replica logs its
    restart before the new EngineCore exists, so a new process means the ready line decides)."""
    def whole() -> bool:
        engines = target.engines()
        return len(engines) == target.replicas and engine not in engines.values() and target.whole()

    return whole


def engine_kill(target: Target) -> Callable[[], bool]:
    engine = _engine_of(target, _first_replica(target))
    engine.kill()
    return _replaced(target, engine)


def engine_stop(target: Target) -> Callable[[], bool]:
    engine = _engine_of(target, _first_replica(target))
    engine.suspend()  # the replica's progress watch declares it wedged and SIGKILLs it (app/host/progress_watch.py)
    return _replaced(target, engine)


def replica_kill(target: Target) -> Callable[[], bool]:
    replica = _first_replica(target)
    psutil.Process(replica.pid).kill()
    return lambda: target.whole(since_ids={replica.replica_id})


def node_loss(target: Target) -> Callable[[], bool]:
    replica = _first_replica(target)
    target.cluster.lose_node(replica.node)
    target.add_worker()  # as a new pod is scheduled: Serve's replacement needs a node (one replica per node)
    return lambda: target.whole(since_ids={replica.replica_id})


def rolling_update(target: Target) -> Callable[[], bool]:
    """A changed limit in the application's config: new args, so Serve replaces every replica. The manifest's
    `max_surge_percent` starts a new replica before it stops an old one; that replica needs a node of its own
    (one per node), which a worker joining gives it, as KubeRay's autoscaler adds a pod for the pending replica."""
    old = {r.replica_id for r in target.cluster.replicas(target.deployment)}
    config = json.loads(json.dumps(target.serve_config))
    limits = config["applications"][0]["args"]["config"]["models"][0]["limits"]
    limits["default_max_tokens"] = max(1, limits["default_max_tokens"] - 1)
    target.serve_config = config
    target.cluster.deploy(config, target.work_dir)
    target.add_worker()
    return lambda: target.whole(since_ids=old)


FAULTS = {
    f.name: f
    for f in (
        Fault("engine-kill", "engine SIGKILL (`VLLM::EngineCore`)", engine_kill),
        Fault("engine-stop", "engine SIGSTOP (alive, silent)", engine_stop),
        Fault("replica-kill", "replica SIGKILL (the actor's process)", replica_kill),
        Fault("node-loss", "worker node lost (every process SIGKILLed), a new one joins", node_loss),
        Fault("rolling-update", "rolling update (`serve deploy`, new args; a node joins for the surge)",
              rolling_update),
    )
}
