"""The multi-node local Ray cluster of `python -m app cluster up` (app/local_cluster.py: Ray's own
`ray start --block` per node), for the tests that deploy onto an existing cluster (`running_local_cluster`).

`--block` makes each `ray start` process own its node: stopping its session stops every process of that node.
Deploying onto it is the path users take with an existing cluster (`RAY_ADDRESS`, `serve deploy`), and what
KubeRay gives a RayService.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from app import local_cluster
from loadkit.service import child_env
from tests.support.waiting import wait_until

SERVE = str(Path(sys.executable).with_name("serve"))


@dataclass(frozen=True)
class ReplicaActor:
    replica_id: str  # Serve's replica id (the last part of the actor's name)
    node: str  # the worker node's resource name ("worker-1", ...), "" if none
    pid: int


class LocalCluster:
    """A head and worker nodes made by `python -m app cluster up`'s code (app/local_cluster.py), and the Serve
    operations a user or KubeRay runs against it: `serve deploy`, `serve status`, Ray's state API. Each runs as
    its own process with the cluster's client environment, as a user's shell would."""

    def __init__(self, state: local_cluster.ClusterState):
        self.state = state
        self.address = state.address
        self.dashboard = state.dashboard

    def env(self, **extra: str) -> dict[str, str]:
        return child_env(**local_cluster.env_for_clients(self.address), **extra)

    def _run(self, args: list[str], timeout_s: float = 120) -> str:
        done = subprocess.run(args, env=self.env(), capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"{args[:3]} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        return done.stdout

    def deploy(self, serve_config: dict, tmp: Path) -> None:
        """`serve deploy` of `serve_config` (a Serve config file's contents) through the dashboard."""
        path = tmp / f"serve-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(serve_config))
        self._run([SERVE, "deploy", "--address", self.dashboard, str(path)])

    def shutdown_serve(self) -> None:
        """`serve shutdown`: every application and its replicas stop as Serve stops them (engines included)."""
        self._run([SERVE, "shutdown", "--yes", "--address", self.dashboard], timeout_s=300)

    def status(self) -> dict:
        """`serve status` as data."""
        return yaml.safe_load(self._run([SERVE, "status", "--address", self.dashboard]))

    def replica_states(self, app: str, deployment: str) -> dict[str, int]:
        apps = self.status().get("applications") or {}
        dep = (apps.get(app) or {}).get("deployments", {}).get(deployment) or {}
        return dict(dep.get("replica_states") or {})

    def wait_replicas(self, app: str, deployment: str, running: int, timeout_s: float = 600) -> None:
        """Until exactly `running` replicas run and none is starting, stopping or updating."""
        wait_until(lambda: self.replica_states(app, deployment) == {"RUNNING": running}, timeout_s=timeout_s,
                   interval_s=2, what=f"{running} running replica(s) of {deployment} and no other")

    def replicas(self, deployment: str) -> list[ReplicaActor]:
        """The live replica actors of `deployment`, with the worker node each runs on (Ray's state API)."""
        out = self._run([sys.executable, "-c", _LIST_REPLICAS, self.dashboard, deployment])
        return [ReplicaActor(**r) for r in json.loads(out)]

    def engine_cores(self, deployment: str) -> dict[str, psutil.Process]:
        """Replica id -> the live EngineCore process under that replica."""
        found = {}
        for replica in self.replicas(deployment):
            try:
                for p in psutil.Process(replica.pid).children(recursive=True):
                    if p.status() != psutil.STATUS_ZOMBIE and "EngineCore" in p.name() + " ".join(p.cmdline()):
                        found[replica.replica_id] = p
            except psutil.NoSuchProcess:
                continue
        return found

    def session_logs(self) -> Path:
        """Ray's log folder of this cluster's session (its temp dir's session_latest)."""
        return Path(self.state.temp_dir or "/tmp/ray") / "session_latest" / "logs"


# Run in a process of its own with the cluster's environment (Ray reads its auth mode when it is imported).
_LIST_REPLICAS = """
import json, sys
from ray.util.state import list_actors, list_nodes
dashboard, deployment = sys.argv[1], sys.argv[2]
names = {n.node_id: next((k for k in n.resources_total if k.startswith("worker-")), "")
         for n in list_nodes(address=dashboard)}
print(json.dumps([{"replica_id": a.name.rsplit("#", 1)[-1], "node": names.get(a.node_id, ""), "pid": a.pid}
                  for a in list_actors(address=dashboard, filters=[("state", "=", "ALIVE")], limit=1000)
                  if a.class_name.endswith(":" + deployment)]))
"""


@contextmanager
def running_local_cluster(tmp: Path, workers: int = 2, env: dict[str, str] | None = None) -> Iterator[LocalCluster]:
    """`python -m app cluster up`'s cluster for the duration of the block; stopped after, leaving no process."""
    temp_dir = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))  # short: Ray's unix sockets live under it
    state_dir = tmp / "cluster-state"
    try:
        state = local_cluster.up(workers, state_dir=state_dir, env=env or {}, temp_dir=temp_dir)
        yield LocalCluster(state)
    finally:
        leftovers = local_cluster.down(state_dir=state_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert leftovers == 0, f"{leftovers} process(es) of the local cluster outlived its nodes and were killed"
