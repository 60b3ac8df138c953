"""The steps of running the service on Ray, each on its own: start Ray, deploy, wait until ready (or until
Serve gives up), drain and stop. `cli.serve_command` runs them in order; the integration tests and loadkit
wait with the same `wait_healthy`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from app.config.app_config import AppConfig
from app.config.service import ServiceConfig

APP_NAME = "llm"
PROXY_TIMEOUT_MARGIN_S = 5.0


def say(message: str) -> None:
    """The CLI's voice: one line on stderr, whatever the log configuration."""
    print(f"[app] {message}", file=sys.stderr, flush=True)


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


# The private Ray with Ray's token authentication on (Ray 2.60 turns it on for a new local cluster unless
# RAY_AUTH_MODE says otherwise; forced here so neither an inherited setting nor a changed default turns it off).
SECURE_PRIVATE_RAY = {"RAY_AUTH_MODE": "token"}
# The private Ray's background work competes with the engine for the CPU (on a small CPU host, for the
# very core its scheduler runs on). Nothing reads Ray's own metrics or task events there (no dashboard;
# the service's /metrics is its own), and a 0.5 s Serve control loop (default 0.1 s) only delays
# reactions to replica failures by as much. Idle CPU of Ray's processes: 7.6 % -> 3.9 % of a core
# (docs/benchmarks.md). Each can still be overridden from the environment.
QUIET_PRIVATE_RAY = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_enable_metrics_collection": "0",
    "RAY_task_events_report_interval_ms": "0",
}


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

    from app.rayserve.builder import build_from_config

    if listen:
        serve.start(proxy_location="Disabled")
    else:
        serve.start(http_options=proxy_http_options(config.service))
    try:
        serve.run(build_from_config(config, listen=listen), name=APP_NAME, route_prefix="/", blocking=False)
    except RuntimeError as err:
        say(f"deployment failed; the replica logs above say why. {err}")
        return False
    return True


def drain_and_stop(config: AppConfig) -> None:
    """Lets requests in flight finish (up to `drain_grace_s`), then shuts Serve down."""
    from ray import serve

    from app.rayserve.builder import ingress_deployment_name

    grace = config.service.drain_grace_s
    try:
        handle = serve.get_deployment_handle(ingress_deployment_name(config), APP_NAME)
        left = handle.drain.remote(grace).result(timeout_s=grace + 10)
        if left:
            say(f"{left} request(s) still in flight after the grace period; stopping them")
    except Exception as err:  # draining is best effort; shutting down is not
        say(f"drain skipped: {err}")
    serve.shutdown()


class DeployFailure:
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
