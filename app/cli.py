"""Command line: `python -m app serve | prepare-model | check-config`.

`serve` owns the whole local lifecycle, written out in order: prepare the model,
start a private Ray on loopback, deploy, wait until healthy, serve until SIGINT
or SIGTERM, drain, stop Serve and Ray, and finally kill anything the service
started that is still alive (vLLM's EngineCore was seen outliving `ray stop`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.api_keys import ApiKeys
from app.config import DEFAULT_MODEL_SOURCE, AppConfig, ConfigError, ModelConfig, ServiceConfig, load_config

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "cpu.yaml"
APP_NAME = "llm"
PROXY_TIMEOUT_MARGIN_S = 5.0
log = logging.getLogger("app.cli")


def _say(message: str) -> None:
    print(f"[app] {message}", file=sys.stderr, flush=True)


def _become_subreaper() -> None:
    """Orphans of our descendants (an EngineCore whose parent died) re-parent to us, so we can reap them."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except OSError:
        pass


def _reap_zombies() -> None:
    """As subreaper we inherit orphans (e.g. the worker of a killed EngineCore); collect the dead ones."""
    import psutil

    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.NoSuchProcess, ChildProcessError):
            pass


def kill_descendants(grace_s: float = 5.0) -> int:
    import psutil

    me = psutil.Process()
    procs = me.children(recursive=True)
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return len(procs)


def wait_healthy(
    base_url: str,
    timeout_s: float,
    gave_up: Callable[[], bool] = lambda: False,
    pause: Callable[[float], object] = time.sleep,
) -> bool:
    """Polls `base_url`/health until it answers 200 (True), or `timeout_s` passes or `gave_up()` (False).
    Also what the integration tests wait with."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not gave_up():
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return True
        except Exception:  # not listening yet, or 503 while starting
            pass
        pause(1.0)
    return False


# The private Ray's background work competes with the engine for the CPU (on a small CPU host, for the
# very core its scheduler runs on). Nothing reads Ray's own metrics or task events there (no dashboard;
# the service's /metrics is its own), and a 0.5 s Serve control loop (default 0.1 s) only delays
# reactions to replica failures by as much. Idle CPU of Ray's processes: 7.6 % -> 3.9 % of a core
# (docs/benchmarks.md). Each can still be overridden from the environment.
# The private Ray with Ray's token authentication on (Ray 2.60 turns it on for a new local cluster unless
# RAY_AUTH_MODE says otherwise; forced here so neither an inherited setting nor a changed default turns it off).
SECURE_PRIVATE_RAY = {"RAY_AUTH_MODE": "token"}
QUIET_PRIVATE_RAY = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_enable_metrics_collection": "0",
    "RAY_task_events_report_interval_ms": "0",
}


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
    from app.http_listener import CannotListen, bind_socket

    try:
        bind_socket(config.service.host, config.service.port, reuse_port=False).close()
    except CannotListen as err:
        _say(str(err))
        return False
    return True


def start_ray(own_ray: bool) -> None:
    """Our own private, loopback-only Ray (no dashboard, nothing listening beyond 127.0.0.1), or the
    cluster at RAY_ADDRESS."""
    import ray

    if own_ray:
        ray.init(address="local", include_dashboard=False, num_cpus=os.cpu_count(), logging_level=logging.WARNING)
    else:
        ray.init(logging_level=logging.WARNING)


def proxy_http_options(service: ServiceConfig) -> dict[str, Any]:
    """Serve's proxy gets the clocks Ray lets us set: the keep-alive idle time, and an overall request
    timeout a little past ours, so the service's own 504 or error event normally comes first. Header, body
    and write-stall clocks cannot be set on it; docs/configuration.md says what to put in front."""
    return {
        "host": service.host,
        "port": service.port,
        "keep_alive_timeout_s": service.keep_alive_timeout_s,
        "request_timeout_s": service.request_timeout_s + PROXY_TIMEOUT_MARGIN_S,
    }


def deploy(config: AppConfig, listen: bool) -> bool:
    """Starts Serve (with no HTTP proxy when a replica listens itself) and deploys the app, not waiting
    for it to be ready; False (after saying why) when the deployment fails."""
    from ray import serve

    from app.builder import build_from_config

    if listen:
        serve.start(proxy_location="Disabled")
    else:
        serve.start(http_options=proxy_http_options(config.service))
    try:
        serve.run(build_from_config(config, listen=listen), name=APP_NAME, route_prefix="/", blocking=False)
    except RuntimeError as err:
        _say(f"deployment failed; the replica logs above say why. {err}")
        return False
    return True


def drain_and_stop(config: AppConfig) -> None:
    """Lets requests in flight finish (up to `drain_grace_s`), then shuts Serve down."""
    from ray import serve

    from app.builder import ingress_deployment_name

    grace = config.service.drain_grace_s
    try:
        handle = serve.get_deployment_handle(ingress_deployment_name(config), APP_NAME)
        left = handle.drain.remote(grace).result(timeout_s=grace + 10)
        if left:
            _say(f"{left} request(s) still in flight after the grace period; stopping them")
    except Exception as err:  # draining is best effort; shutting down is not
        _say(f"drain skipped: {err}")
    serve.shutdown()


class _DeployFailure:
    """Watches Serve's status of the app while it starts: a replica whose constructor keeps failing (a corrupt
    model folder, a config the replica refuses) makes Serve mark the app DEPLOY_FAILED after a few tries;
    waiting out the whole start-up timeout would only reload the weights again and again."""

    def __init__(self) -> None:
        self.message = ""

    def seen(self) -> bool:
        from ray import serve

        try:
            app = serve.status().applications.get(APP_NAME)
        except Exception:  # the controller is busy or restarting: no word yet
            return False
        if app is not None and app.status == "DEPLOY_FAILED":  # ApplicationStatus is a str enum
            details = [d.message for d in app.deployments.values() if d.message]
            self.message = " | ".join([app.message, *details] if app.message else details) or str(app.status)
            return True
        return False


def serve_shutdown_quietly() -> None:
    from ray import serve

    with contextlib.suppress(Exception):
        serve.shutdown()


def _preflight(config: AppConfig) -> bool:
    """What can be checked before Ray starts, said once: each model's folder exists and holds a model."""
    from app.model_store import resolve_source

    for model in config.models:
        if model.engine_kind != "vllm":
            continue
        try:
            resolve_source(model.source)
        except FileNotFoundError as err:
            _say(f"model '{model.id}': {err}")
            return False
    return True


def serve_command(config_path: Path, startup_timeout_s: float, via_serve_proxy: bool = False) -> int:
    """The local lifecycle in order: check, prepare the model, start Ray, deploy, wait until ready,
    serve until a signal, drain and stop, and reap whatever is left."""
    config = load_config(config_path)
    own_ray = not os.environ.get("RAY_ADDRESS")
    if own_ray and not _port_free(config):
        return 1
    logging.basicConfig(level=config.service.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if any(m.source == DEFAULT_MODEL_SOURCE and m.engine_kind == "vllm" for m in config.models):
        from app.model_store import prepare_default_model

        prepare_default_model()
    if not _preflight(config):
        return 1
    stop = _Stop()
    stop.install()
    _become_subreaper()
    started = time.monotonic()
    if own_ray:
        # Ray binds its servers (GCS, raylet, workers, agents) to the node IP; with this set before
        # `import ray`, a local node's IP is loopback, so no Ray port is reachable from the network.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        for name, value in QUIET_PRIVATE_RAY.items():
            os.environ.setdefault(name, value)
        os.environ.update(SECURE_PRIVATE_RAY)  # not overridable: an inherited RAY_AUTH_MODE=disabled must not win
    # Ray folds log lines it deems similar into "[repeated Nx]"; per-request JSON lines must all get through.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray

    from app.builder import one_http_replica

    # On our own single-node Ray, one replica answering all HTTP listens on the port itself (no proxy
    # hop per token); several replicas, an existing cluster, or --serve-proxy use Serve's HTTP proxy.
    listen = own_ray and one_http_replica(config) and not via_serve_proxy
    try:
        start_ray(own_ray)
        stop.install()  # ray.init may have installed its own handlers
        if not deploy(config, listen):
            return 1
        local = "127.0.0.1" if config.service.host in ("0.0.0.0", "::") else config.service.host
        failed = _DeployFailure()
        if wait_healthy(
            f"http://{local}:{config.service.port}",
            startup_timeout_s,
            gave_up=lambda: stop.event.is_set() or failed.seen(),
            pause=stop.event.wait,
        ):
            keys = len(ApiKeys.of(config.with_resolved_keys().service.api_keys).digests)
            _say(
                f"serving {', '.join(m.id for m in config.models)} at http://{config.service.host}:"
                f"{config.service.port}/v1 (ready in {time.monotonic() - started:.0f} s; HTTP answered by "
                f"{'the replica itself' if listen else 'the Serve proxy'}; "
                f"{f'authentication on, {keys} key(s)' if keys else 'authentication OFF'}); Ctrl-C to stop"
            )
            while not stop.event.wait(2.0):
                _reap_zombies()
        elif failed.message:
            _say(f"the deployment failed, Serve gave up on it: {failed.message}")
            serve_shutdown_quietly()
            return 1
        elif not stop.event.is_set():
            _say(f"the service did not become healthy within {startup_timeout_s:.0f} s; stopping")
            return 1
        signum = stop.received[0] if stop.received else "-"
        _say(f"stopping (signal {signum}): draining requests in flight, up to {config.service.drain_grace_s:.0f} s")
        drain_and_stop(config)
        return 0
    finally:
        if own_ray:
            try:
                ray.shutdown()
            finally:
                n = kill_descendants()
                _say(f"stopped; {n} leftover process(es) reaped" if n else "stopped; no process left behind")


def engine_setup_here(model: ModelConfig) -> str:
    """What the engine of `model` would be set up with on this machine: the precision `engine.dtype` resolves
    to and why, and on a CPU the compute and front-end cores (what the replica logs at start)."""
    if model.engine_kind == "fake":
        return "fake engine (no model, no precision)"
    from app.core_plan import describe, plan_cores
    from app.precision import resolve_cpu_precision

    choice = resolve_cpu_precision(model.engine.dtype, on_gpu=model.on_gpu)
    cores = None if model.on_gpu else plan_cores(world_size=model.engine.tensor_parallel_size)
    line = f"engine.dtype {model.engine.dtype} -> " + describe(
        choice, cores, None if model.on_gpu else model.engine.kv_cache_gib
    )
    warnings = [w for w in (choice.warning, *(cores.warnings if cores else ())) if w]
    return line + "".join(f"\n    warning: {w}" for w in warnings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m app", description="OpenAI-compatible LLM service: vLLM engines in Ray Serve replicas."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="start the service in the foreground (Ctrl-C drains and stops it)")
    p_serve.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, help=f"YAML config (default: {DEFAULT_CONFIG.name})"
    )
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
    p_check.add_argument("config", type=Path)
    args = parser.parse_args(argv)

    try:
        if args.command == "serve":
            return serve_command(args.config, args.startup_timeout, via_serve_proxy=args.serve_proxy)
        if args.command == "prepare-model":
            from app.model_store import prepare_default_model

            print(prepare_default_model(force=args.force))
            return 0
        config: AppConfig = load_config(args.config)
        print(f"{args.config}: valid ({len(config.models)} model(s): {', '.join(m.id for m in config.models)})")
        for model in config.models:
            print(f"  {model.id}: {engine_setup_here(model)}")
        return 0
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
