"""A multi-node Ray cluster on this one machine, made with Ray's own `ray start`: a head and N worker nodes.

Each node is its own raylet, started by `ray start --block` in a session of its own, so stopping that session
stops every process of the node (what a pod loss does on KubeRay). The cluster runs with Ray's token
authentication; its nodes use this machine's interface address (see CLUSTER_ENV). `up` leaves the cluster
running and writes its address and nodes to a state file; `down` stops what the state file names and then
anything still carrying the cluster's tag.
Deploy onto it with `RAY_ADDRESS=<address> python -m app serve ...` or `serve deploy --address ...`.

    python -m app cluster up --workers 2      # prints the address to use as RAY_ADDRESS
    python -m app cluster down
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

STATE_DIR = Path(os.environ.get("APP_CLUSTER_DIR", Path.home() / ".cache" / "app-llm-serve" / "cluster"))
TAG_ENV = "APP_LOCAL_CLUSTER"
# Token authentication on every node and client. Not RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which keeps a single
# node on loopback: with it no worker node may join ("Multi-node Ray clusters are not supported"); so Ray turns
# 127.0.0.1 into this machine's interface address and its servers listen there too (token auth guards them).
CLUSTER_ENV = {"RAY_AUTH_MODE": "token"}
_RAY = str(Path(sys.executable).with_name("ray"))


class ClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class Node:
    name: str  # "head", "worker-1", ...
    pid: int  # the `ray start --block` leader; its session id is its pid
    log: str


@dataclass(frozen=True)
class ClusterState:
    address: str
    tag: str
    nodes: tuple[Node, ...]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> ClusterState:
        data = json.loads(path.read_text())
        return cls(address=data["address"], tag=data["tag"], nodes=tuple(Node(**n) for n in data["nodes"]))


def env_for_clients(address: str) -> dict[str, str]:
    """What a process needs in its environment to use the cluster (the CLI with RAY_ADDRESS, `serve deploy`)."""
    return {**CLUSTER_ENV, "RAY_ADDRESS": address}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_node(name: str, args: list[str], tag: str, state_dir: Path) -> Node:
    log = state_dir / f"{name}.log"
    env = {**os.environ, **CLUSTER_ENV, TAG_ENV: tag}
    env.pop("RAY_ADDRESS", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [_RAY, "start", "--block", "--disable-usage-stats", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Node(name=name, pid=proc.pid, log=str(log))


def _alive_nodes(address: str) -> int:
    os.environ.update(CLUSTER_ENV)  # before `import ray`: Ray reads its auth mode when it loads
    import ray

    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        return sum(1 for n in ray.nodes() if n["Alive"])
    finally:
        ray.shutdown()


def up(workers: int, cpus_per_worker: int = 1, state_dir: Path = STATE_DIR, timeout_s: float = 300) -> ClusterState:
    """A head (no CPUs: it runs Ray's control plane and Serve's controller only) and `workers` worker nodes,
    each with `cpus_per_worker` CPUs and a resource `worker-<i>` naming it."""
    state_path = state_dir / "cluster.json"
    if state_path.exists():
        raise ClusterError(f"a cluster is already up (state in {state_path}); `python -m app cluster down` first")
    state_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    tag = f"app-cluster-{port}"
    nodes = [
        _start_node("head", ["--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false"], tag, state_dir)
    ]
    state = ClusterState(address=address, tag=tag, nodes=tuple(nodes))
    state.save(state_path)  # saved at once: `down` can stop a half-started cluster too
    deadline = time.monotonic() + timeout_s
    while not _listening(port):
        if time.monotonic() > deadline or psutil.Process(nodes[0].pid).status() == psutil.STATUS_ZOMBIE:
            raise ClusterError(f"the head did not start; see {nodes[0].log}")
        time.sleep(0.5)  # polling the GCS port
    for i in range(1, workers + 1):  # one at a time: several raylets registering at once overloaded the GCS here
        worker_args = [
            f"--address={address}",
            f"--num-cpus={cpus_per_worker}",
            f"--resources={json.dumps({f'worker-{i}': 1})}",
        ]
        nodes.append(_start_node(f"worker-{i}", worker_args, tag, state_dir))
        state = ClusterState(address=address, tag=tag, nodes=tuple(nodes))
        state.save(state_path)
        while _alive_nodes(address) < 1 + i:
            if time.monotonic() > deadline:
                raise ClusterError(f"worker-{i} did not join within {timeout_s:.0f} s; logs in {state_dir}")
            time.sleep(1.0)  # polling the cluster's node table
    return state


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tagged(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(TAG_ENV) == tag:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_node(node: Node, grace_s: float = 40) -> None:
    """SIGTERM to the node's session (`ray start --block` then stops its node), SIGKILL after `grace_s`."""
    try:
        os.killpg(node.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        psutil.Process(node.pid).wait(timeout=grace_s)
    except psutil.TimeoutExpired:
        os.killpg(node.pid, signal.SIGKILL)
    except psutil.NoSuchProcess:
        pass


def down(state_dir: Path = STATE_DIR) -> int:
    """Stops every node (workers first, then the head) and kills whatever still carries the cluster's tag;
    returns how many such leftovers there were."""
    state_path = state_dir / "cluster.json"
    if not state_path.exists():
        return 0
    state = ClusterState.load(state_path)
    for node in reversed(state.nodes):
        stop_node(node)
    leftovers = _tagged(state.tag)
    for p in leftovers:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(leftovers, timeout=10)
    state_path.unlink()
    return len(leftovers)
