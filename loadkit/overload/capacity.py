"""The service under test and its capacity: an own `python -m app serve` on a generated config, or a running
service given by URL (whose process tree is found through the port it listens on)."""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import yaml

from loadkit.overload.phases import log
from loadkit.overload.timing import DEFAULT_TTFT_TARGET_S
from loadkit.precision import precision_label, resolved_dtype
from loadkit.proctree import ProcessTree
from loadkit.service import ProcessGroup, StopReport, child_env, free_port, wait_until


@dataclass
class Capacity:
    max_ongoing: int
    max_queued: int
    queue_timeout_s: float
    request_timeout_s: float
    refusal_status: int | None = None
    ttft_target_s: float | None = DEFAULT_TTFT_TARGET_S  # deployment.ttft_target_s in effect; None: off
    ttft_target_given: bool = False  # set by --ttft-target (else: the config's own, or the service's default)
    ttft_target_source: str = "the service's default, assumed: not read from a running service"


@dataclass(frozen=True)
class Liveness:
    ok: bool
    detail: str


@dataclass
class UrlService:
    """A running service; `pid`: its `app serve` process when known (for RSS and CPU)."""

    base_url: str
    api_key: str | None
    model: str | None
    pid: int | None
    tree: ProcessTree = field(init=False)

    def __post_init__(self):
        self.tree = ProcessTree(self.pid)

    @property
    def mode(self) -> str:
        seen = f" (process tree of pid {self.pid})" if self.pid else " (process not found: no RSS)"
        return f"running service at {self.base_url}{seen}"

    @property
    def precision(self) -> str:
        return "as that service is configured (not read)"

    def alive(self) -> Liveness:
        if not self.pid:
            return Liveness(True, "pid unknown")
        return Liveness(psutil.pid_exists(self.pid), f"service pid {self.pid} alive")


class OwnService:
    """`python -m app serve` on `base_config` with a free port, a fresh API key and `cap`; stopped with Ctrl-C
    to its process group, and whatever of its tree outlives it is killed (and reported)."""

    def __init__(self, repo: Path, base_config: Path, cap: Capacity, startup_timeout_s: float):
        self.repo = repo
        self.base_name = os.path.relpath(base_config, repo)
        self.dir = Path(tempfile.mkdtemp(prefix="overload-"))
        self.port = free_port()
        self.api_key = "overload-" + secrets.token_hex(8)
        config = yaml.safe_load(base_config.read_text())
        config["service"].update({"host": "127.0.0.1", "port": self.port, "api_keys": [self.api_key],
                                  "request_timeout_s": cap.request_timeout_s, "drain_grace_s": 10})
        model = config["models"][0]
        model["deployment"].update({"max_ongoing_requests": cap.max_ongoing, "max_queued_requests": cap.max_queued,
                                    "queue_timeout_s": cap.queue_timeout_s})
        if cap.ttft_target_given:
            model["deployment"]["ttft_target_s"] = cap.ttft_target_s  # None: null, no time target
            cap.ttft_target_source = "--ttft-target"
        elif "ttft_target_s" in model["deployment"]:
            cap.ttft_target_s, cap.ttft_target_source = model["deployment"]["ttft_target_s"], f"{self.base_name}"
        else:
            cap.ttft_target_s, cap.ttft_target_source = DEFAULT_TTFT_TARGET_S, "the config's default"
        cap.refusal_status = config["service"].get("refusal_status", 429)
        self.model = model["id"]
        self.config = config
        self.config_path = self.dir / "overload.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = self.dir / "service.log"
        self.startup_timeout_s = startup_timeout_s
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.group: ProcessGroup | None = None
        self.tree = ProcessTree(None)
        self.stop_report: StopReport | None = None

    @property
    def mode(self) -> str:
        engine, deployment = self.config["models"][0]["engine"], self.config["models"][0]["deployment"]
        return (f"own `python -m app serve` on a config derived from {self.base_name} (free port, the capacity "
                f"below, engine {json.dumps(engine)}, deployment {json.dumps(deployment)})")

    @property
    def precision(self) -> str:
        """The configured dtype, and (for `auto`) what the engine's start-up log line said it became."""
        asked = str(self.config["models"][0].get("engine", {}).get("dtype", "the service's default"))
        return precision_label(asked, resolved_dtype(self.log_text()))

    def start(self) -> bool:
        """Starts the service; True once /health answers 200."""
        self.group = ProcessGroup([sys.executable, "-m", "app", "serve", "--config", str(self.config_path),
                                   "--startup-timeout", str(int(self.startup_timeout_s))],
                                  cwd=self.repo, env=child_env(), log_path=self.log_path)
        self.tree.root_pid, self.tree.tag = self.group.pid, self.group.tag
        log(f"started the service (pid {self.group.pid}) on {self.base_url}; log {self.log_path}")
        return wait_until(self._healthy, self.startup_timeout_s, gave_up=lambda: not self.group.running(),
                          interval_s=1.0)

    def _healthy(self) -> bool:
        # Not app.cli.main.wait_healthy: the kit imports nothing from app/, so it can drive any deployment by URL.
        try:
            return httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def alive(self) -> Liveness:
        return Liveness(self.group is not None and self.group.running(), f"service pid {self.group.pid} running")

    def stop(self) -> StopReport | None:
        if self.group is None:
            return None
        self.tree.processes()  # a last look at the tree, so that every process it had is checked
        if self.group.running():
            log("stopping the service (SIGINT to its process group)")
        self.stop_report = self.group.stop(sigint_wait_s=120, sigterm_wait_s=0, sigkill_wait_s=30,
                                           leftover_wait_s=20, seen=self.tree.known())
        left = self.leftover()
        log(f"service stopped (exit {self.group.proc.returncode}); {len(self.tree.seen)} processes observed, "
            f"{len(left)} left behind" + (f": {left}" if left else ""))
        return self.stop_report

    def leftover(self) -> list[str]:
        r = self.stop_report
        return [] if r is None else [*r.killed, *r.still_alive]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_text()[-chars:]


def find_service_pid(base_url: str) -> int | None:
    """For a service given by URL: the `app serve` process above whoever listens on the port (same user)."""
    port = httpx.URL(base_url).port or 80
    try:
        listeners = [c.pid for c in psutil.net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid]
    except psutil.AccessDenied:
        return None
    for pid in listeners:
        try:
            p = psutil.Process(pid)
            for q in [p, *p.parents()]:
                cmd = " ".join(q.cmdline())
                if "app serve" in cmd or "app.cli" in cmd:
                    return q.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def wait_for_health(service: OwnService) -> bool:
    t0 = time.monotonic()
    ok = service.start()
    if ok:
        log(f"healthy after {time.monotonic() - t0:.0f} s")
    else:
        log(f"the service did not become healthy; log tail:\n{service.log_tail()}")
    return ok

