"""Command line: `python -m app serve | prepare-model | check-config`.

`serve` owns the whole local lifecycle, written out in order: check, prepare the model,
start a private Ray on loopback, deploy, wait until healthy, serve until SIGINT
or SIGTERM, drain, stop Serve and Ray, and finally kill anything the service
started that is still alive. The steps are cli/serve_steps.py's, the reaping cli/reaper.py's.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from app.cli.reaper import become_subreaper, kill_descendants, reap_zombies
from app.cli.serve_steps import (
    QUIET_PRIVATE_RAY,
    SECURE_PRIVATE_RAY,
    DeployFailure,
    deploy,
    drain_and_stop,
    say,
    serve_shutdown_quietly,
    start_ray,
    wait_healthy,
)
from app.config.app_config import AppConfig, load_config
from app.config.common import DEFAULT_MODEL_SOURCE, ConfigError
from app.config.model import ModelConfig
from app.tenancy import Tenants

# configs/cpu.yaml, through the package's link to it: found from a checkout and from an installed wheel alike.
DEFAULT_CONFIG = Path(__file__).with_name("default.yaml").resolve()
log = logging.getLogger("app.cli")


class _Stop:
    """SIGINT/SIGTERM, installed explicitly: a process started in the background may inherit SIGINT as ignored."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.received: list[int] = []

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.received.append(signum)
        self.event.set()


def _port_free(config: AppConfig) -> bool:
    """Fails now, not after a minute of start-up, when the port is taken."""
    from app.http.listener import CannotListen, bind_socket

    try:
        bind_socket(config.service.host, config.service.port, reuse_port=False).close()
    except CannotListen as err:
        say(str(err))
        return False
    return True


def _preflight(config: AppConfig) -> bool:
    """What can be checked before Ray starts, said once: each model's folder exists and holds a model, and its CPU
    KV cache holds one request of `max_model_len`."""
    from app.engine.kv_sizing import kv_cache_short
    from app.engine.model_store import resolve_source

    for model in config.models:
        if model.engine_kind != "vllm":
            continue
        try:
            resolve_source(model.source)
        except FileNotFoundError as err:
            say(f"model '{model.id}': {err}")
            return False
        if short := kv_cache_short(model):
            say(f"model '{model.id}': {short}")
            return False
    return True


def serve_command(config_path: Path, startup_timeout_s: float, via_serve_proxy: bool = False) -> int:
    """The local lifecycle in order: check, prepare the model, start Ray, deploy, wait until ready,
    serve until a signal, drain and stop, and reap whatever is left."""
    config = load_config(config_path)
    own_ray = not os.environ.get("RAY_ADDRESS")
    if own_ray:
        config, notes = config.on_one_machine()
        for note in notes:
            say(note)
    if own_ray and not _port_free(config):
        return 1
    logging.basicConfig(level=config.service.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if any(m.source == DEFAULT_MODEL_SOURCE and m.engine_kind == "vllm" for m in config.models):
        from app.engine.model_store import prepare_default_model

        prepare_default_model()
    if not _preflight(config):
        return 1
    stop = _Stop()
    stop.install()
    become_subreaper()
    started = time.monotonic()
    _ray_environment(own_ray)
    import ray

    # On our own single-node Ray the one replica answering all HTTP (the engine replica of a single-replica
    # model, or the ingress) listens on the port itself: no proxy hop per token. An existing cluster or
    # --serve-proxy use Serve's HTTP proxy.
    listen = own_ray and not via_serve_proxy
    try:
        start_ray(own_ray)
        stop.install()  # ray.init may have installed its own handlers
        if not deploy(config, listen):
            return 1
        return _serve_until_stopped(config, stop, listen, started, startup_timeout_s)
    finally:
        if own_ray:
            try:
                ray.shutdown()
            finally:
                n = kill_descendants()
                say(f"stopped; {n} leftover process(es) reaped" if n else "stopped; no process left behind")


def _ray_environment(own_ray: bool) -> None:
    """What Ray must find in the environment before it is imported."""
    if own_ray:
        # Ray binds its servers (GCS, raylet, workers, agents) to the node IP; with this set before
        # `import ray`, a local node's IP is loopback, so no Ray port is reachable from the network.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        for name, value in QUIET_PRIVATE_RAY.items():
            os.environ.setdefault(name, value)
        os.environ.update(SECURE_PRIVATE_RAY)  # not overridable: an inherited RAY_AUTH_MODE=disabled must not win
    # Ray folds log lines it deems similar into "[repeated Nx]"; per-request JSON lines must all get through.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def _serve_until_stopped(config: AppConfig, stop: _Stop, listen: bool, started: float,
                         startup_timeout_s: float) -> int:
    """Deployed: wait until healthy, serve until a signal, then drain and stop Serve (the exit status)."""
    local = "127.0.0.1" if config.service.host in ("0.0.0.0", "::") else config.service.host
    failed = DeployFailure()
    if wait_healthy(
        f"http://{local}:{config.service.port}",
        startup_timeout_s,
        gave_up=lambda: stop.event.is_set() or failed.seen(),
        pause=stop.event.wait,
    ):
        keys = len(Tenants(config.with_resolved_keys()).keys.digests)
        say(
            f"serving {', '.join(m.id for m in config.models)} at http://{config.service.host}:"
            f"{config.service.port}/v1 (ready in {time.monotonic() - started:.0f} s; HTTP answered by "
            f"{'the replica itself' if listen else 'the Serve proxy'}; "
            f"{f'authentication on, {keys} key(s)' if keys else 'authentication OFF'}); Ctrl-C to stop"
        )
        while not stop.event.wait(2.0):
            reap_zombies()
    elif failed.message:
        say(f"the deployment failed, Serve gave up on it: {failed.message}")
        serve_shutdown_quietly()
        return 1
    elif not stop.event.is_set():
        say(f"the service did not become healthy within {startup_timeout_s:.0f} s; stopping")
        return 1
    signum = stop.received[0] if stop.received else "-"
    say(f"stopping (signal {signum}): draining requests in flight, up to {config.service.drain_grace_s:.0f} s")
    drain_and_stop(config)
    return 0


def engine_setup_here(model: ModelConfig) -> str:
    """What the engine of `model` would be set up with on this machine: the precision `engine.dtype` resolves
    to and why, and on a CPU the compute and front-end cores (what the replica logs at start)."""
    if model.engine_kind == "fake":
        return "fake engine (no model, no precision)"
    from app.engine.cpu.core_plan import describe, plan_cores
    from app.engine.cpu.precision import resolve_cpu_precision

    choice = resolve_cpu_precision(model.engine.dtype, on_gpu=model.on_gpu)
    cores = None if model.on_gpu else plan_cores(world_size=model.engine.tensor_parallel_size)
    line = f"engine.dtype {model.engine.dtype} -> " + describe(
        choice, cores, None if model.on_gpu else model.engine.kv_cache_gib
    )
    warnings = [w for w in (choice.warning, *(cores.warnings if cores else ())) if w]
    return line + "".join(f"\n    warning: {w}" for w in warnings)


def cluster_command(action: str, workers: int, cpus_per_worker: int, node: str | None = None) -> int:
    from app.cli import local_cluster

    if action == "down":
        leftovers = local_cluster.down()
        say(f"cluster down; {leftovers} leftover process(es) killed" if leftovers else "cluster down; nothing left")
        return 0
    try:
        if action == "lose-node":
            if not node:
                say("cluster lose-node needs the node's name (worker-1, ...)")
                return 2
            say(f"{node} lost: {local_cluster.lose_node(node)} process(es) SIGKILLed")
            return 0
        if action == "add-worker":
            added = local_cluster.add_worker(cpus_per_worker=cpus_per_worker)
            say(f"{added.name} joined the cluster")
            print(added.name)
            return 0
    except local_cluster.ClusterError as err:
        say(str(err))
        return 1
    try:
        state = local_cluster.up(workers, cpus_per_worker)
    except local_cluster.ClusterError as err:
        say(str(err))
        local_cluster.down()
        return 1
    env = " ".join(f"{k}={v}" for k, v in local_cluster.env_for_clients(state.address).items())
    say(
        f"cluster up: a head and {workers} worker node(s) at {state.address}; deploy with `{env} python -m app serve "
        f"--config ...` or `RAY_AUTH_MODE=token serve deploy --address {state.dashboard} <serve config>`; "
        "stop with `python -m app cluster down`"
    )
    print(state.address)
    print(state.dashboard)
    return 0


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    """The config file, as `serve FILE` or `serve --config FILE` alike (each command once took only one of them, and
    the other form was the first thing a newcomer typed)."""
    parser.add_argument("config_file", type=Path, nargs="?", metavar="CONFIG",
                        help=f"YAML config (default: {DEFAULT_CONFIG.name})")
    parser.add_argument("--config", type=Path, default=None, help="the same, by name")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m app", description="OpenAI-compatible LLM service: vLLM engines in Ray Serve replicas."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="start the service in the foreground (Ctrl-C drains and stops it)")
    _config_arguments(p_serve)
    p_serve.add_argument(
        "--startup-timeout", type=float, default=600.0, help="seconds to wait for the service to become healthy"
    )
    p_serve.add_argument(
        "--serve-proxy",
        action="store_true",
        help="answer HTTP through Ray Serve's proxy (the KubeRay path) even when one replica could listen itself",
    )
    p_prep = sub.add_parser("prepare-model", help="download and convert the default model (offline-capable, cached)")
    p_prep.add_argument("--force", action="store_true", help="prepare again even if cached")
    p_check = sub.add_parser("check-config", help="validate a config file without starting anything")
    _config_arguments(p_check)
    p_cluster = sub.add_parser("cluster", help="a multi-node Ray cluster on this machine (Ray's own `ray start`)")
    p_cluster.add_argument("action", choices=("up", "down", "lose-node", "add-worker"),
                           help="lose-node NODE: SIGKILL every process of one node (a lost pod); add-worker: one more")
    p_cluster.add_argument("node", nargs="?", help="the node to lose (lose-node): worker-1, ...")
    p_cluster.add_argument("--workers", type=int, default=2, help="worker nodes (up; default 2)")
    p_cluster.add_argument("--cpus-per-worker", type=int, default=1, help="CPUs per worker node (up, add-worker)")
    args = parser.parse_args(argv)
    if getattr(args, "config_file", None) is not None:
        if args.config is not None and args.config != args.config_file:
            parser.error(f"two configs given ({args.config_file} and --config {args.config}): give one")
        args.config = args.config_file
    args.config = getattr(args, "config", None) or DEFAULT_CONFIG

    try:
        if args.command == "serve":
            return serve_command(args.config, args.startup_timeout, via_serve_proxy=args.serve_proxy)
        if args.command == "cluster":
            return cluster_command(args.action, args.workers, args.cpus_per_worker, args.node)
        if args.command == "prepare-model":
            from app.engine.model_store import prepare_default_model

            print(prepare_default_model(force=args.force))
            return 0
        from app.engine.kv_sizing import kv_cache_short

        config: AppConfig = load_config(args.config)
        if shorts := [f"  models.{i}: {short}" for i, m in enumerate(config.models)
                      if (short := kv_cache_short(m))]:
            raise ConfigError(f"{args.config} is invalid on this machine:\n" + "\n".join(shorts))
        print(f"{args.config}: valid ({len(config.models)} model(s): {', '.join(m.id for m in config.models)})")
        for model in config.models:
            print(f"  {model.id}: {engine_setup_here(model)}")
        return 0
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
