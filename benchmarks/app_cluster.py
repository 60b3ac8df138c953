"""System for `python -m loadkit bench`: this project's multi-replica topology on a real multi-node Ray cluster on
this machine, deployed as KubeRay deploys it.

Starts `python -m app cluster up`'s cluster (app/cli/local_cluster.py: a head with a loopback dashboard and two worker
nodes, each its own raylet confined to its own core) in a short Ray temp dir of its own, sends the given Serve
config (the KubeRay CPU manifest's serveConfigV2, made by loadkit/peers.py) with `serve deploy
--address <dashboard>`, waits with `serve status` until every replica runs, finds the replicas' nodes and pids
with Ray's state API, writes those facts (and the time from `serve deploy` to every replica running) to
--facts, and serves until SIGINT/SIGTERM. Then `serve shutdown`, `local_cluster.down`, a copy of the session's
logs beside the facts, and the temp dir removed: no process left behind.

    python benchmarks/app_cluster.py --serve-config FILE --facts FILE [--workers 2 --startup-timeout 900]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, also before `pip install -e .` knows it

from app import local_cluster  # noqa: E402
from loadkit.peers import (  # noqa: E402
    APP_NAME,
    ENGINE_DEPLOYMENT,
    INGRESS_DEPLOYMENT,
    replicas_in,
)
from loadkit.service import child_env  # noqa: E402

SERVE = str(Path(sys.executable).with_name("serve"))
STATUS_EVERY_S = 2.0  # `serve status` is a process of its own (~1 CPU-s here): not in a tight loop

# Run in a process of its own with the cluster's environment (Ray reads its auth mode when it is imported).
_LIST_REPLICAS = """
import json, sys
from ray.util.state import list_actors, list_nodes
dashboard, deployments = sys.argv[1], sys.argv[2].split(",")
names = {n.node_id: next((k for k in n.resources_total if k.startswith("worker-")), "head")
         for n in list_nodes(address=dashboard)}
print(json.dumps([{"deployment": a.class_name.rsplit(":", 1)[-1], "replica_id": a.name.rsplit("#", 1)[-1],
                   "node": names.get(a.node_id, "?"), "pid": a.pid}
                  for a in list_actors(address=dashboard, filters=[("state", "=", "ALIVE")], limit=1000)
                  if a.class_name.rsplit(":", 1)[-1] in deployments]))
"""


def _say(message: str) -> None:
    print(f"[app-cluster {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Cluster:
    """The cluster while it runs, and the Serve commands a user (or KubeRay) runs against it."""

    def __init__(self, state: local_cluster.ClusterState):
        self.state = state
        self.env = child_env(**local_cluster.env_for_clients(state.address))

    def run(self, args: list[str], timeout_s: float = 120) -> str:
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:3])} failed ({done.returncode}): {done.stderr[-2000:]}")
        return done.stdout

    def deploy(self, config: Path) -> None:
        self.run([SERVE, "deploy", "--address", self.state.dashboard, str(config)])

    def shutdown_serve(self) -> None:
        self.run([SERVE, "shutdown", "--yes", "--address", self.state.dashboard], timeout_s=300)

    def app_status(self) -> dict:
        status = yaml.safe_load(self.run([SERVE, "status", "--address", self.state.dashboard])) or {}
        return (status.get("applications") or {}).get(APP_NAME) or {}

    def replicas(self) -> list[dict]:
        out = self.run([sys.executable, "-c", _LIST_REPLICAS, self.state.dashboard,
                        f"{ENGINE_DEPLOYMENT},{INGRESS_DEPLOYMENT}"])
        return json.loads(out)


def _all_running(app: dict, wanted: dict[str, int]) -> bool:
    deployments = app.get("deployments") or {}
    return app.get("status") == "RUNNING" and all(
        (deployments.get(name) or {}).get("replica_states") == {"RUNNING": n} for name, n in wanted.items())


def wait_running(cluster: Cluster, wanted: dict[str, int], timeout_s: float, stop: threading.Event) -> None:
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        app = cluster.app_status()
        if _all_running(app, wanted):
            return
        if app.get("status") == "DEPLOY_FAILED":
            raise RuntimeError(f"serve deploy failed: {str(app.get('message'))[:2000]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every replica running within {timeout_s:.0f} s: {app}")
        stop.wait(STATUS_EVERY_S)
    raise RuntimeError("stopped while deploying")


def main() -> int:
    p = argparse.ArgumentParser(description="this project on a local multi-node Ray cluster "
                                            "(for `python -m loadkit bench`)")
    p.add_argument("--serve-config", type=Path, required=True)
    p.add_argument("--facts", type=Path, required=True, help="where the deployment's facts are written (JSON)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--startup-timeout", type=float, default=900.0)
    args = p.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _s, _f: stop.set())
    serve_config = yaml.safe_load(args.serve_config.read_text())
    wanted = {d: replicas_in(serve_config, d) for d in (ENGINE_DEPLOYMENT, INGRESS_DEPLOYMENT)}
    temp_dir = Path(tempfile.mkdtemp(prefix="bc-", dir="/tmp"))  # short: Ray's unix sockets live under it
    state_dir = args.facts.with_suffix(".state")
    cluster: Cluster | None = None
    deployed = False
    try:
        started = time.monotonic()
        cluster = Cluster(local_cluster.up(args.workers, state_dir=state_dir, env={}, temp_dir=temp_dir))
        cluster_up_s = time.monotonic() - started
        _say(f"cluster up in {cluster_up_s:.0f} s: {cluster.state.address}, dashboard {cluster.state.dashboard}")
        deploy_at = time.monotonic()
        cluster.deploy(args.serve_config)
        deployed = True
        wait_running(cluster, wanted, args.startup_timeout, stop)
        deploy_to_ready_s = time.monotonic() - deploy_at
        facts = {"cluster_up_s": cluster_up_s, "deploy_to_ready_s": deploy_to_ready_s,
                 "logs_dir": str(temp_dir / "session_latest" / "logs"), "dashboard": cluster.state.dashboard,
                 "replicas": cluster.replicas(), "wanted": wanted}
        args.facts.write_text(json.dumps(facts, indent=2))
        _say(f"every replica running {deploy_to_ready_s:.0f} s after serve deploy: {facts['replicas']}")
        stop.wait()
        return 0
    except Exception as err:  # the harness reports the last error line of this log
        _say(f"RuntimeError: {err}")
        return 1
    finally:
        if cluster is not None and deployed:
            try:
                cluster.shutdown_serve()  # the engines stop as Serve stops them, before their nodes go
            except Exception as err:
                _say(f"serve shutdown failed: {err}")
        leftovers = local_cluster.down(state_dir=state_dir)
        _say(f"cluster down; {leftovers} leftover process(es) killed" if leftovers else "cluster down; nothing left")
        logs = temp_dir / "session_latest" / "logs"
        if logs.is_dir():
            shutil.copytree(logs, args.facts.with_suffix(".ray-logs"), dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.sock", "*.socket"))
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
