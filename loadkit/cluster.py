"""A running local Ray cluster of `python -m app cluster up` (Ray's own `ray start --block` per node), and the
operations a user or KubeRay runs against it: `serve deploy`, `serve status`, Ray's state API, and the loss of a
node (`python -m app cluster lose-node`). Each runs as its own process with the cluster's client environment, as
a user's shell would; the cluster is known by the state file that `cluster up` writes (`APP_CLUSTER_DIR`).

Deploying onto it is the path users take with an existing cluster (`RAY_ADDRESS`, `serve deploy`), and what
KubeRay gives a RayService. tests/support/ray_cluster.py starts one for the tests; the chaos driver
(loadkit/chaos) one of its own through the CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from loadkit.proctree import engine_core_of
from loadkit.service import child_env
from loadkit.waiting import wait_until

# What `python -m app cluster up` puts in every node's environment, and what its clients need (app/cli/local_cluster).
AUTH_ENV = {"RAY_AUTH_MODE": "token"}
CLUSTER_DIR_ENV = "APP_CLUSTER_DIR"
SERVE = str(Path(sys.executable).with_name("serve"))


def cluster_cli(env: dict[str, str], *args: str) -> str:
    """`python -m app cluster <args>` with `env` (its state dir in `CLUSTER_DIR_ENV`); its last line of output."""
    done = subprocess.run([sys.executable, "-m", "app", "cluster", *args], env=env, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"`python -m app cluster {' '.join(args)}` failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""


@dataclass(frozen=True)
class ReplicaActor:
    replica_id: str  # Serve's replica id (the last part of the actor's name)
    node: str  # the worker node's resource name ("worker-1", ...), "" if none
    pid: int


class LocalCluster:
    """The cluster whose state file is in `state_dir` (`python -m app cluster up`'s)."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        state = json.loads((state_dir / "cluster.json").read_text())
        self.address: str = state["address"]
        self.dashboard: str = state["dashboard"]
        self.tag: str = state["tag"]
        self.temp_dir: str | None = state.get("temp_dir")

    def env(self, **extra: str) -> dict[str, str]:
        return child_env(**AUTH_ENV, RAY_ADDRESS=self.address, **extra)

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
                core = engine_core_of(psutil.Process(replica.pid))
            except psutil.NoSuchProcess:
                continue
            if core is not None:
                found[replica.replica_id] = core
        return found

    def lose_node(self, name: str) -> str:
        """Node `name` killed outright (`python -m app cluster lose-node`: SIGKILL to every process of it, as a lost
        pod); returns what the command said."""
        env = {**self.env(), CLUSTER_DIR_ENV: str(self.state_dir)}
        done = subprocess.run([sys.executable, "-m", "app", "cluster", "lose-node", name], env=env,
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"cluster lose-node {name} failed ({done.returncode}): {done.stderr[-2000:]}")
        return (done.stderr + done.stdout).strip()

    def worker_lines(self, text: str) -> list[str]:
        """Lines of every Ray worker's log (Ray keeps each worker's stderr: the replicas', the ingress's) that
        contain `text`."""
        lines = []
        for path in self.session_logs().glob("worker-*.err"):
            lines += [ln for ln in path.read_text(errors="replace").splitlines() if text in ln]
        return lines

    def replica_log_lines(self, pid: int) -> list[dict]:
        """The service's own JSON log lines of the replica process `pid` (Ray keeps a worker's stderr per pid)."""
        lines = []
        for path in self.session_logs().glob(f"worker-*-{pid}.err"):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    try:
                        lines.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
        return lines

    def engine_serving(self, replica: ReplicaActor) -> bool:
        """Whether the replica's engine serves: its last engine line is a ready one (its start, or a restart in
        place), not a restart begun."""
        last = None
        for line in self.replica_log_lines(replica.pid):
            message = line.get("message", "")
            if " ready in " in message or "restarted in place" in message:
                last = True
            elif "restarting in place" in message:
                last = False
        return bool(last)

    def session_logs(self) -> Path:
        """Ray's log folder of this cluster's session (its temp dir's session_latest)."""
        return Path(self.temp_dir or "/tmp/ray") / "session_latest" / "logs"


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
