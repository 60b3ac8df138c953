"""A multi-node Ray cluster on this one machine, made with Ray's own `ray start`: a head and N worker nodes.

Each node is its own raylet, started by `ray start --block` in a session of its own (stopping it stops the node, as
a pod's loss does on KubeRay), each worker confined to its own core(s) as a pod's cpuset confines it (its engine
computes there alone; app/engine/cpu/core_plan.py reads the affinity). The head runs Ray's dashboard on loopback for
`serve deploy`, and offers the `ingress` resource (INGRESS_RESOURCE) as the KubeRay manifest's head does, so that
losing a worker node loses engine replicas only, never a client's connection (docs/kuberay.md). Token
authentication; the nodes use this machine's interface address (CLUSTER_ENV).
`up` leaves the cluster running and writes its address and nodes to a state file; `down` stops what it names, then
anything still carrying the cluster's tag; `lose_node` SIGKILLs every process of one node (a pod lost, nothing
drained); `add_worker` joins a new worker node. Deploy onto it with `RAY_ADDRESS=<address> python -m app serve ...`
or `serve deploy --address <dashboard> ...`.

    python -m app cluster up --workers 2      # prints the address to use as RAY_ADDRESS, then the dashboard's
    python -m app cluster down
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from app.cli import ray_address
from app.cli.ports import free_port

STATE_DIR = Path(os.environ.get("APP_CLUSTER_DIR", Path.home() / ".cache" / "app-llm-serve" / "cluster"))
TAG_ENV = "APP_LOCAL_CLUSTER"
NODE_TAG_ENV = "APP_LOCAL_CLUSTER_NODE"  # "<cluster tag>/<node name>": every process of one node inherits it
# The head's own resource, which only the ingress tier asks for (configs/kuberay/*.yaml: the head's
# rayStartParams offer it, the ingress deployment's ray_actor_options take INGRESS_SHARE of it).
INGRESS_RESOURCE = "ingress"
# Token authentication on every node and client. Not RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (one node on loopback): no
# worker node may join with it; so Ray's servers listen on this machine's interface address (token auth guards them).
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
    dashboard: str  # http://127.0.0.1:<port>: `serve deploy --address` and `serve status --address`
    tag: str
    nodes: tuple[Node, ...]
    temp_dir: str | None = None  # Ray's session folder root; None: Ray's default, /tmp/ray

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> ClusterState:
        data = json.loads(path.read_text())
        nodes = tuple(Node(**n) for n in data["nodes"])
        return cls(data["address"], data["dashboard"], data["tag"], nodes, data.get("temp_dir"))


def env_for_clients(address: str) -> dict[str, str]:
    """What a process needs in its environment to use the cluster (the CLI with RAY_ADDRESS, `serve deploy`)."""
    return {**CLUSTER_ENV, "RAY_ADDRESS": address}


def worker_cores(workers: int, cpus_per_worker: int, cores: list[int]) -> list[set[int]]:
    """The cores each worker node is confined to: `cpus_per_worker` consecutive ones, round robin over `cores`
    (more workers than cores share them, as pods overcommitted on one host would)."""
    return [{cores[(i * cpus_per_worker + k) % len(cores)] for k in range(cpus_per_worker)} for i in range(workers)]


def _start_node(
    name: str, args: list[str], tag: str, state_dir: Path, env: Mapping[str, str], cores: set[int] | None = None
) -> Node:
    log = state_dir / f"{name}.log"
    node_env = {**os.environ, **env, **CLUSTER_ENV, TAG_ENV: tag, NODE_TAG_ENV: f"{tag}/{name}"}
    node_env.pop("RAY_ADDRESS", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen([_RAY, "start", "--block", "--disable-usage-stats", *args], env=node_env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    return Node(name=name, pid=proc.pid, log=str(log))


_ALIVE_WORKERS = """
import json, logging, sys, ray
ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)
print(json.dumps([k for n in ray.nodes() if n["Alive"] for k in n["Resources"] if k.startswith("worker-")]))
"""


def _alive_workers(address: str) -> set[str]:
    """The worker nodes (their `worker-<i>` resource) alive in the cluster's table, asked by a process of its own:
    Ray reads its auth mode (CLUSTER_ENV) when it is imported, and the caller may have imported Ray already (a
    test session, the CLI)."""
    env = {**os.environ, **CLUSTER_ENV}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-c", _ALIVE_WORKERS, address], env=env, capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        return set()
    try:
        return set(json.loads(done.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        return set()


def up(
    workers: int,
    cpus_per_worker: int = 1,
    state_dir: Path = STATE_DIR,
    timeout_s: float = 300,
    env: Mapping[str, str] | None = None,
    temp_dir: Path | None = None,
) -> ClusterState:
    """A head (no CPUs: it runs Ray's control plane, the dashboard and Serve's controller only) and `workers`
    worker nodes, each with `cpus_per_worker` CPUs confined to as many cores of this machine and a resource
    `worker-<i>` naming it. `env` is added to every node's environment (as a pod's env, e.g. APP_API_KEYS);
    `temp_dir`: Ray's session folder (logs included) instead of /tmp/ray (keep it short: Ray's sockets live there)."""
    state_path = state_dir / "cluster.json"
    if state_path.exists():
        raise ClusterError(f"a cluster is already up (state in {state_path}); `python -m app cluster down` first")
    state_dir.mkdir(parents=True, exist_ok=True)
    env = dict(env or {})
    _ensure_auth_token(env)
    port, dashboard_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    dashboard = f"http://127.0.0.1:{dashboard_port}"
    tag = f"app-cluster-{port}"
    head_args = ["--head", f"--port={port}", "--num-cpus=0", f"--resources={json.dumps({INGRESS_RESOURCE: 1})}",
                 "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]
    if temp_dir is not None:
        head_args.append(f"--temp-dir={temp_dir}")
    nodes = [_start_node("head", head_args, tag, state_dir, env)]
    state = ClusterState(address, dashboard, tag, tuple(nodes), None if temp_dir is None else str(temp_dir))
    state.save(state_path)  # saved at once: `down` can stop a half-started cluster too
    deadline = time.monotonic() + timeout_s
    while not _listening(port):
        if time.monotonic() > deadline or psutil.Process(nodes[0].pid).status() == psutil.STATUS_ZOMBIE:
            raise ClusterError(f"the head did not start; see {nodes[0].log}")
        time.sleep(0.5)  # polling the GCS port
    for i in range(1, workers + 1):  # one at a time: several raylets registering at once overloaded the GCS here
        state = _join_worker(state, i, cpus_per_worker, state_dir, env, deadline)
    while not _listening(dashboard_port):  # `serve deploy` talks to it; it starts after the GCS
        if time.monotonic() > deadline:
            raise ClusterError(f"the dashboard did not start on {dashboard}; see {nodes[0].log}")
        time.sleep(0.5)
    return state


def _ensure_auth_token(env: Mapping[str, str]) -> None:
    """`ray start --head` with token auth needs a token and, unlike `ray.init`, makes none: on a machine that never
    ran Ray it died with "Token authentication is enabled but no authentication token was found". Where neither the
    environment nor Ray's default file (~/.ray/auth_token) has one, Ray's own `ray get-auth-token --generate`
    writes that file, which every node and client on this machine then reads, as Ray's docs say to do for local
    development."""
    merged = {**os.environ, **env}
    default_file = Path(merged.get("HOME", Path.home())) / ".ray" / "auth_token"
    if merged.get("RAY_AUTH_TOKEN") or merged.get("RAY_AUTH_TOKEN_PATH") or default_file.exists():
        return
    done = subprocess.run([_RAY, "get-auth-token", "--generate"], env={**merged, **CLUSTER_ENV},
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ClusterError(f"`ray get-auth-token --generate` failed ({done.returncode}): {done.stderr[-2000:]}")


def _join_worker(
    state: ClusterState, i: int, cpus_per_worker: int, state_dir: Path, env: Mapping[str, str], deadline: float
) -> ClusterState:
    """Starts worker node `worker-<i>` (confined to its share of this machine's cores) and waits until it is in
    the cluster's node table; returns the state with it, saved."""
    cores = worker_cores(i, cpus_per_worker, sorted(os.sched_getaffinity(0)))[i - 1]
    args = [f"--address={state.address}", f"--num-cpus={cpus_per_worker}",
            f"--resources={json.dumps({f'worker-{i}': 1})}",
            *([f"--temp-dir={state.temp_dir}"] if state.temp_dir is not None else [])]
    node = _start_node(f"worker-{i}", args, state.tag, state_dir, env, cores)
    state = ClusterState(state.address, state.dashboard, state.tag, (*state.nodes, node), state.temp_dir)
    state.save(state_dir / "cluster.json")
    while f"worker-{i}" not in _alive_workers(state.address):
        if time.monotonic() > deadline or psutil.Process(node.pid).status() == psutil.STATUS_ZOMBIE:
            raise ClusterError(f"worker-{i} did not join; see {node.log}")
        time.sleep(1.0)  # polling the cluster's node table
    return state


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tagged(tag: str, node: str | None = None) -> list[psutil.Process]:
    """The processes carrying the cluster's tag (`node`: only that node's)."""
    key, value = (TAG_ENV, tag) if node is None else (NODE_TAG_ENV, f"{tag}/{node}")
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(key) == value:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_nodes(nodes: Sequence[Node], grace_s: float = 40) -> None:
    """SIGTERM to each node's `ray start --block` leader at once (the nodes drain side by side through the GCS), then
    to what is left of its session; SIGKILL after `grace_s`. The leader first: sent to the whole session, the head's
    GCS went first and the head's drain waited Ray's 30 s for it (33 s of every `cluster down`)."""
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for node in nodes:
        with contextlib.suppress(psutil.TimeoutExpired, psutil.NoSuchProcess):
            psutil.Process(node.pid).wait(timeout=max(0.0, deadline - time.monotonic()))
        rest = _session(node.pid)
        for p in rest:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.terminate()
        _, alive = psutil.wait_procs(rest, timeout=max(0.0, deadline - time.monotonic()))
        if alive or psutil.pid_exists(node.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)


def _session(sid: int) -> list[psutil.Process]:
    """The processes still in session `sid` (a node's `ray start` leader's)."""
    def sid_of(pid: int) -> int | None:
        with contextlib.suppress(OSError):
            return os.getsid(pid)
        return None
    return [p for p in psutil.process_iter() if sid_of(p.pid) == sid]


def add_worker(
    state_dir: Path = STATE_DIR, cpus_per_worker: int = 1, env: Mapping[str, str] | None = None,
    timeout_s: float = 300,
) -> Node:
    """Joins a new worker node (the next `worker-<i>`) to the running cluster, as an autoscaler's new pod would;
    `env` as `up`'s. Returns it once it is in the cluster's node table."""
    state_path = state_dir / "cluster.json"
    state = ClusterState.load(state_path)
    i = 1 + max((int(n.name.split("-")[1]) for n in state.nodes if n.name.startswith("worker-")), default=0)
    state = _join_worker(state, i, cpus_per_worker, state_dir, dict(env or {}), time.monotonic() + timeout_s)
    return state.nodes[-1]


def lose_node(name: str, state_dir: Path = STATE_DIR) -> int:
    """Kills node `name` outright, as a lost pod or machine: every process carrying its node tag (its raylet,
    its workers, the replicas and engines on it) gets SIGKILL at once; nothing on it drains or says goodbye.
    Returns how many processes it killed. The cluster notices through its own health checks."""
    state = ClusterState.load(state_dir / "cluster.json")
    if not any(n.name == name for n in state.nodes):
        raise ClusterError(f"no node {name!r} in this cluster; it has {[n.name for n in state.nodes]}")
    return _kill_all(_tagged(state.tag, node=name))


def down(state_dir: Path = STATE_DIR) -> int:
    """Stops every node (the workers together, then the head), kills whatever still carries the cluster's tag and
    removes the head's address from Ray's address file (app/cli/ray_address.py); returns how many leftovers there
    were."""
    state_path = state_dir / "cluster.json"
    if not state_path.exists():
        return 0
    state = ClusterState.load(state_path)
    stop_nodes(state.nodes[1:])  # the workers together, while the head still answers them
    stop_nodes(state.nodes[:1])
    leftovers = _kill_all(_tagged(state.tag))
    ray_address.forget(int(state.address.rsplit(":", 1)[1]), state.temp_dir)  # as `ray stop` does
    state_path.unlink()
    return leftovers


def _kill_all(processes: list[psutil.Process]) -> int:
    """SIGKILL to each (those already gone are skipped), waited for; returns how many there were."""
    for p in processes:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=10)
    return len(processes)
