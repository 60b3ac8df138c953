"""The service under test and the processes it runs as: started in a session of its own, stopped leaving nothing.

A `ProcessGroup` is one command in its own session: stopped with SIGINT to the group (Ctrl-C in a terminal),
then SIGTERM, then SIGKILL, then its leftovers. Every process started here carries a tag in its environment that
every descendant inherits (Ray workers and vLLM's EngineCore included): that is how leftovers are told apart from
other people's engines and Rays on the same machine, which are never touched. A `Server` is a system under test
(this project or a peer) as such a group on a free loopback port, its process tree followed, ready once it
answers. `OwnService` is this project's service on a config derived from a base config; `RunningService` one
already running, driven by URL (loopback only).
"""

from __future__ import annotations

import ipaddress
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import yaml

from loadkit.proctree import TAG_ENV, PeakSampler, ProcessTree, tagged_processes
from loadkit.waiting import NotReached, wait_until

REPO = Path(__file__).resolve().parents[1]  # the checkout the kit runs from: configs/, benchmarks/, `python -m app`
BASE_CONFIG = REPO / "configs" / "cpu.yaml"  # what every derived config starts from unless told otherwise
# Names and command-line fragments of what a stack leaves when it dies badly (Ray, Serve, vLLM, the peers).
STACK_MARKERS = ("VLLM::EngineCore", "VLLM::Worker", "raylet", "gcs_server", "ray::", "ServeReplica",
                 "ServeController")
PEER_MARKERS = (*STACK_MARKERS, "vllm.entrypoints", "naive_fastapi", "ray_serve_llm", "app serve")


# Ports for the services a run starts: below the kernel's ephemeral range (32768-60999 on Linux), whence every
# process that binds port 0 draws, and above Ray's worker ports (10002-19999). A port drawn from the ephemeral range
# was free when drawn and taken by one of Ray's own processes before the replica bound it (the hostile run of
# 2026-12-05 17:09: "Address already in use" on 36155). app/cli/ports.py picks the same way (loadkit imports no app).
PORTS = range(20000, 32768)


def free_port() -> int:
    """A free loopback port from PORTS (never 8000, the service's default: a run must not meet someone's `make
    serve`)."""
    while True:
        port = random.choice(PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def child_env(drop: Iterable[str] = ("RAY_ADDRESS", "APP_API_KEYS"), **extra: str) -> dict[str, str]:
    """This process's environment without what would attach a child to someone else's Ray or keys."""
    dropped = set(drop)
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(extra)
    return env


def pythonpath(repo: Path = REPO) -> str:
    """PYTHONPATH with the checkout first: a child imports the kit (and runs `-m loadkit ...`) before a reinstall."""
    return os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])


def _restore_sigint() -> None:
    # A process started in the background by a non-interactive shell has SIGINT ignored, and an ignored
    # signal stays ignored across exec: without this, "Ctrl-C" to the group would test nothing.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def processes_started_since(since: float, markers: Iterable[str] = STACK_MARKERS,
                            untagged_only: bool = False) -> list[str]:
    """'pid: command' of every process started after `since` (epoch seconds) whose name or command line has a
    marker; `untagged_only`: only those that carry no loadkit tag (someone else's)."""
    markers, found = tuple(markers), []
    for p in psutil.process_iter(["pid", "name", "cmdline", "create_time"]):
        try:
            if p.info["create_time"] < since - 1:
                continue
            text = " ".join(p.info["cmdline"] or []) + " " + (p.info["name"] or "")
            if any(m in text for m in markers) and not (untagged_only and TAG_ENV in p.environ()):
                found.append(f"{p.info['pid']}: {' '.join(text.split())[:120]}")
        except (psutil.Error, OSError):
            continue
    return found


def describe(p: psutil.Process) -> str:
    try:
        name = p.name()
        cmd = " ".join(p.cmdline()[:3])
        return f"{p.pid} {name if name.startswith(('VLLM', 'ray::')) else cmd or name}"[:80]
    except psutil.Error:
        return str(p.pid)


def _alive(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:  # a psutil.Process remembers its start time, so a reused pid is not mistaken for it
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            pass
    return alive


def kill_descendants(grace_s: float = 5.0) -> int:
    """SIGTERM, then SIGKILL, to every descendant of this process; how many there were. For a peer's own
    shutdown (Ray's `ray.shutdown()` was seen leaving vLLM's EngineCore running)."""
    procs = psutil.Process().children(recursive=True)
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


@dataclass
class StopReport:
    """How a process group went away, and what had to be killed after it."""

    how: str
    returncode: int | None
    killed: list[str] = field(default_factory=list)  # leftovers still alive after the leader exited
    still_alive: list[str] = field(default_factory=list)  # not even SIGKILL helped

    @property
    def clean(self) -> bool:
        return not self.killed and not self.still_alive

    def text(self, leftover_wait_s: float = 10) -> str:
        if self.clean:
            return f"{self.how}; no process left behind"
        text = (f"{self.how}; {len(self.killed)} process(es) still alive {leftover_wait_s:.0f} s after the server "
                f"exited, killed: {', '.join(sorted(set(self.killed)))}")
        return text + (f"; STILL ALIVE: {', '.join(self.still_alive)}" if self.still_alive else "")


class ProcessGroup:
    """One command in its own session and process group, output to `log_path`, tagged for the leftover search."""

    def __init__(self, command: list[str], *, cwd: Path, env: dict[str, str] | None = None, log_path: Path,
                 tag: str | None = None):
        self.command, self.log_path = command, Path(log_path)
        self.tag = tag or f"loadkit-{uuid.uuid4().hex[:12]}"
        env = dict(os.environ if env is None else env)
        env[TAG_ENV] = self.tag
        self.started_at = time.time()
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: our "Ctrl-C" reaches only this server
                preexec_fn=_restore_sigint)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _signal(self, sig: signal.Signals) -> bool:
        try:
            os.killpg(self.proc.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def stop(self, sigint_wait_s: float = 60, sigterm_wait_s: float = 15, sigkill_wait_s: float = 15,
             leftover_wait_s: float = 10, seen: Iterable[psutil.Process] = ()) -> StopReport:
        """SIGINT the group (what Ctrl-C does); if it has not exited within `sigint_wait_s`, SIGTERM, then
        SIGKILL (a wait of 0 skips that step). Then leftovers: processes carrying the tag or seen in the tree
        (`seen` adds those a sampler saw while it ran) still alive `leftover_wait_s` after the leader exited
        are killed."""
        seen = {p.pid: p for p in (*self.tree(), *seen)}
        how = "exited by itself before the stop"
        if self.running():
            how = "stopped by SIGINT"
            steps = [(sig, wait_s) for sig, wait_s in ((signal.SIGINT, sigint_wait_s), (signal.SIGTERM, sigterm_wait_s),
                                                       (signal.SIGKILL, sigkill_wait_s)) if wait_s > 0]
            for i, (sig, wait_s) in enumerate(steps):
                if not self._signal(sig):
                    break
                try:
                    self.proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    if i + 1 < len(steps):
                        how = f"{sig.name} not enough within {wait_s:.0f} s; {steps[i + 1][0].name}"
        self.proc.poll()
        # The leader is gone; whatever it started gets a few seconds to follow on its own.
        leftovers = self.leftovers(seen.values())
        if leftovers:
            _, leftovers = psutil.wait_procs(leftovers, timeout=leftover_wait_s)
        report = StopReport(how=how, returncode=self.proc.returncode)
        if leftovers:
            report.killed = [describe(p) for p in leftovers]
            self._signal(signal.SIGKILL)
            for p in leftovers:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(leftovers, timeout=10)
            report.still_alive = [describe(p) for p in self.leftovers(seen.values())]
        return report

    def leftovers(self, seen: Iterable[psutil.Process] = ()) -> list[psutil.Process]:
        found = {p.pid: p for p in tagged_processes(self.tag)}
        for p in seen:
            found.setdefault(p.pid, p)
        return _alive(found.values())



def last_error_line(log: str) -> str:
    """The line of a log that says why a process died (the exception of its last traceback), or its last line."""
    lines = [line.strip() for line in log.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line.split(":", 1)[0] or line.startswith(("ModuleNotFoundError", "ImportError")):
            return line[:300]
    return lines[-1][:300] if lines else "(empty log)"


class Server:
    """A system under test running as a process group on a loopback port (this project, or a peer): its whole
    process tree followed (its peak RSS sampled in a thread, with `sample_peak`), ready once it answers, stopped
    leaving nothing behind."""

    def __init__(self, command: list[str], *, port: int, log_path: Path, cwd: Path = REPO,
                 env: dict[str, str] | None = None, sample_peak: bool = False):
        self.command, self.port, self.log_path = command, port, Path(log_path)
        self.group = ProcessGroup(command, cwd=cwd, env=child_env() if env is None else env, log_path=self.log_path)
        self.tree = ProcessTree(self.group.pid, self.group.tag)
        self.sampler = PeakSampler(self.tree).start() if sample_peak else None
        self.started = time.monotonic()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.group.running()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 3000) -> str:
        return self.group.log_tail(chars)

    def wait_ready(self, timeout_s: float, model: str | None = None, api_key: str | None = None) -> str | None:
        """None once it answers, else why not. With `model`: once /v1/models lists it and one tiny chat completion
        succeeds (what every OpenAI-compatible peer answers); without: once /health answers 200."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        last = ["no answer yet"]

        def answers() -> bool:
            try:
                if model is None:
                    r = httpx.get(f"{self.base_url}/health", headers=headers, timeout=5)
                    last[0] = f"/health: HTTP {r.status_code}"
                    return r.status_code == 200
                r = httpx.get(f"{self.base_url}/v1/models", headers=headers, timeout=5)
                if r.status_code != 200 or model not in r.text:
                    last[0] = f"/v1/models: HTTP {r.status_code}"
                    return False
                r = httpx.post(f"{self.base_url}/v1/chat/completions", headers=headers, timeout=120, json={
                    "model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
                    "temperature": 0})
                last[0] = f"probe chat completion: HTTP {r.status_code}: {r.text[:300]}"
                return r.status_code == 200
            except httpx.HTTPError as err:  # not listening yet
                last[0] = f"{type(err).__name__}: {err}"
                return False

        try:
            wait_until(answers, timeout_s, interval_s=1.0, gave_up=lambda: not self.running())
            return None
        except NotReached:
            if not self.running():
                return (f"exited with status {self.group.proc.returncode} while starting: "
                        f"{last_error_line(self.group.log_tail(20000))}")
            return f"not ready within {timeout_s:.0f} s (last: {last[0]})"

    def stop(self, sigint_wait_s: float = 60, sigterm_wait_s: float = 15, sigkill_wait_s: float = 15,
             leftover_wait_s: float = 10) -> StopReport:
        """Stops the group (SIGINT, then harder) and every process its tree ever showed."""
        if self.sampler is not None:
            self.sampler.sample()  # a last look, so that every process it had is checked
            self.sampler.close()
        else:
            self.tree.processes()
        return self.group.stop(sigint_wait_s=sigint_wait_s, sigterm_wait_s=sigterm_wait_s,
                               sigkill_wait_s=sigkill_wait_s, leftover_wait_s=leftover_wait_s,
                               seen=self.tree.known())


# -- this project's service ---------------------------------------------------------------------------------------

def derive_config(base: Path | dict, port: int, api_key: str | None = None, *, service: dict | None = None,
                  model: dict | None = None, engine: dict | None = None, deployment: dict | None = None,
                  limits: dict | None = None) -> dict:
    """A copy of `base` (a service config, or the path of one) listening on 127.0.0.1:`port` with `api_key` as its
    one key (None: no key), each section updated with the entries given (`model` and below: the first model's)."""
    config = yaml.safe_load(base.read_text()) if isinstance(base, Path) else yaml.safe_load(yaml.safe_dump(base))
    config.setdefault("service", {}).update({"host": "127.0.0.1", "port": port,
                                             "api_keys": [api_key] if api_key else [], **(service or {})})
    first = config["models"][0]
    first.update(model or {})
    for section, changes in (("engine", engine), ("deployment", deployment), ("limits", limits)):
        if changes:
            first.setdefault(section, {}).update(changes)
    if "num_replicas" in (deployment or {}):  # a fixed count in place of the base's autoscaling (one or the other)
        first["deployment"].pop("autoscaling", None)
    return config


def write_config(config: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def app_command(config_path: Path, *flags: str) -> list[str]:
    """This project's service, as a user starts it (a process: the kit imports nothing from app/)."""
    return [sys.executable, "-m", "app", "serve", "--config", str(config_path), *flags]


def prepare_model(repo: Path = REPO) -> str:
    """The default model's folder, as the service prepares it (`python -m app prepare-model`)."""
    out = subprocess.run([sys.executable, "-m", "app", "prepare-model"], cwd=repo, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip().splitlines()[-1]


class OwnService:
    """This project's service under test: `python -m app serve` on a config derived from `base_config` (a free
    loopback port, a fresh API key unless `key` is False, the section changes given), its config and log in a
    folder of its own; stopped with Ctrl-C to its process group, whatever outlives it killed and reported."""

    def __init__(self, base_config: Path, name: str, *, repo: Path = REPO, work_dir: Path | None = None,
                 key: bool = True, **changes: dict):
        self.repo, self.name = repo, name
        self.base_name = os.path.relpath(base_config, repo)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work_dir))
        self.host, self.port = "127.0.0.1", free_port()
        self.api_key = f"{name}-{secrets.token_hex(8)}" if key else None
        self.config = derive_config(base_config, self.port, self.api_key, **changes)
        self.model: str | None = self.config["models"][0]["id"]
        self.config_path = write_config(self.config, self.dir / f"{name}.yaml")
        self.log_path = self.dir / "service.log"
        self.server: Server | None = None
        self.tree = ProcessTree(None)
        self.stop_report: StopReport | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.server.group.pid if self.server else None

    def start(self, startup_timeout_s: float, ready_model: str | None = None) -> str | None:
        """Starts it; None once ready (/health 200, or with `ready_model` a chat answered), else why not."""
        self.server = Server(app_command(self.config_path, "--startup-timeout", str(int(startup_timeout_s))),
                             port=self.port, log_path=self.log_path, cwd=self.repo)
        self.tree = self.server.tree
        return self.server.wait_ready(startup_timeout_s, ready_model, self.api_key)

    def running(self) -> bool:
        return self.server is not None and self.server.running()

    def stop(self, sigint_wait_s: float = 120, sigterm_wait_s: float = 0, sigkill_wait_s: float = 30,
             leftover_wait_s: float = 20) -> StopReport | None:
        if self.server is None:
            return None
        self.stop_report = self.server.stop(sigint_wait_s, sigterm_wait_s, sigkill_wait_s, leftover_wait_s)
        return self.stop_report

    def leftover(self) -> list[str] | None:
        """What outlived its stop and was killed (None: not stopped)."""
        r = self.stop_report
        return None if r is None else [*r.killed, *r.still_alive]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_text()[-chars:]


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
        raise NotLoopback(f"{url}: {host or 'no host'} is not a loopback address; the kit drives loopback only")
    return ("127.0.0.1" if host == "localhost" else host), parts.port or 80


def service_pid(port: int, or_listener: bool = False) -> int | None:
    """The `app serve` process above whoever listens on `port` (same user); `or_listener`: else the listener."""
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
            if or_listener:
                return p.pid
        except psutil.Error:
            continue
    return None


@dataclass
class RunningService:
    """A service already running, driven by URL (loopback only); `pid`: the process whose tree is its (None:
    found through the port, `or_listener` as `service_pid` says)."""

    base_url: str
    api_key: str | None = None
    model: str | None = None
    pid: int | None = None
    or_listener: bool = False
    tree: ProcessTree = field(init=False)

    def __post_init__(self):
        self.base_url = self.base_url.rstrip("/")
        self.host, self.port = loopback_url(self.base_url)
        self.pid = self.pid or service_pid(self.port, self.or_listener)
        self.tree = ProcessTree(self.pid)

    def running(self) -> bool:
        return self.pid is not None and psutil.pid_exists(self.pid)

    def leftover(self) -> list[str] | None:
        return None  # not ours to stop
