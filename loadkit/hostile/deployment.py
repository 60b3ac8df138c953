"""The service under attack: an own `python -m app serve` on a config generated from configs/cpu.yaml (a free
loopback port, a fresh API key, shorter connection clocks), or a running one given by URL, loopback only.

Either way it says where it is, what its clocks are, and which process tree is its (an own service: the
process group this driver started; by URL: the `app serve` process above whoever listens on the port).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import yaml

from loadkit.hostile.plan import SHORT_CLOCKS, Clocks
from loadkit.proctree import ProcessTree
from loadkit.service import ProcessGroup, StopReport, child_env, free_port, wait_until


class NotLoopback(ValueError):
    pass


def loopback_url(url: str) -> tuple[str, int]:
    """(host, port) of a loopback http URL; `NotLoopback` for anything else."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme != "http":
        raise NotLoopback(f"{url}: only plain http on loopback is driven")
    try:
        loop = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loop = False
    if not loop:
        raise NotLoopback(f"{url}: {host or 'no host'} is not a loopback address; this driver attacks loopback only")
    return ("127.0.0.1" if host == "localhost" else host), parts.port or 80


@dataclass
class UrlService:
    base_url: str
    api_key: str | None
    clocks: Clocks
    model: str | None = None
    tree: ProcessTree | None = field(default=None)

    def __post_init__(self):
        self.host, self.port = loopback_url(self.base_url)
        root = _service_root(self.port)
        self.tree = ProcessTree(root) if root else None

    @property
    def mode(self) -> str:
        seen = f"process tree of pid {self.tree.root_pid}" if self.tree else "its process tree not found"
        return f"a running service at {self.base_url} ({seen})"

    def leftover(self) -> list[str] | None:
        return None  # not ours to stop


class OwnService:
    """`python -m app serve` on `base_config` with a free port, a fresh key and the clocks given (or
    SHORT_CLOCKS); stopped with Ctrl-C to its process group, and whatever outlives it killed and said."""

    def __init__(self, repo: Path, base_config: Path, clocks: dict[str, float],
                 startup_timeout_s: float, work_dir: Path):
        self.repo, self.startup_timeout_s = repo, startup_timeout_s
        self.base_name = os.path.relpath(base_config, repo)
        self.dir = Path(tempfile.mkdtemp(prefix="hostile-", dir=work_dir))
        self.port, self.host = free_port(), "127.0.0.1"
        self.api_key = "hostile-" + secrets.token_hex(8)
        config = yaml.safe_load(base_config.read_text())
        self.overrides = {**SHORT_CLOCKS, **clocks}
        config["service"].update({"host": self.host, "port": self.port, "api_keys": [self.api_key],
                                  "drain_grace_s": 10, **self.overrides})
        self.config = config
        self.model: str | None = config["models"][0]["id"]
        self.clocks = Clocks.from_config(config, f"generated config, lowered from the defaults: "
                                                 f"{', '.join(f'{k} {v:g}' for k, v in self.overrides.items())}")
        self.config_path = self.dir / "hostile.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = self.dir / "service.log"
        self.base_url = f"http://{self.host}:{self.port}"
        self.group: ProcessGroup | None = None
        self.tree = ProcessTree(None)
        self.stop_report: StopReport | None = None

    @property
    def mode(self) -> str:
        return (f"own `python -m app serve` on a config generated from {self.base_name} (free loopback port, "
                f"a generated API key, the clocks below; capacity and engine as in {self.base_name})")

    def start(self) -> bool:
        """Starts the service; True once /health answers 200."""
        self.group = ProcessGroup([sys.executable, "-m", "app", "serve", "--config", str(self.config_path),
                                   "--startup-timeout", str(int(self.startup_timeout_s))],
                                  cwd=self.repo, env=child_env(), log_path=self.log_path)
        self.tree.root_pid, self.tree.tag = self.group.pid, self.group.tag
        return wait_until(self._healthy, self.startup_timeout_s, gave_up=lambda: not self.group.running(),
                          interval_s=1.0)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> StopReport | None:
        if self.group is None:
            return None
        self.tree.processes()  # a last look, so that every process it had is checked
        self.stop_report = self.group.stop(sigint_wait_s=120, sigterm_wait_s=0, sigkill_wait_s=30,
                                           leftover_wait_s=20, seen=self.tree.known())
        return self.stop_report

    def leftover(self) -> list[str] | None:
        r = self.stop_report
        return None if r is None else [*r.killed, *r.still_alive]

    def log_tail(self, chars: int = 3000) -> str:
        return self.group.log_tail(chars) if self.group else ""

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _service_root(port: int) -> int | None:
    """The `app serve` process above whoever listens on `port` (same user); else the listener itself."""
    try:
        pids = [c.pid for c in psutil.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid]
    except psutil.Error:
        return None
    for pid in pids:
        try:
            p = psutil.Process(pid)
            for q in [p, *p.parents()]:
                cmd = " ".join(q.cmdline())
                if "app serve" in cmd or "app.cli" in cmd:
                    return q.pid
            return p.pid
        except psutil.Error:
            continue
    return None
