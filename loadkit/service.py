"""A server under test as a process group: started in its own session, stopped leaving nothing behind.

Owns the life of the processes a test or a driver starts (this project's `app serve`, bare vLLM, a peer from
benchmarks/): start, stop (SIGINT to the group, as Ctrl-C in a terminal, then SIGTERM, then SIGKILL), and the
search for leftovers. Every process started here carries a tag in its environment, which every descendant
inherits (Ray workers and vLLM's EngineCore included): that is how leftovers are told apart from other
people's engines and Rays on the same machine, which are never touched.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

TAG_ENV = "LOADKIT_TAG"
# Names and command-line fragments of what a stack leaves when it dies badly (Ray, Serve, vLLM, the peers).
STACK_MARKERS = ("VLLM::EngineCore", "VLLM::Worker", "raylet", "gcs_server", "ray::", "ServeReplica",
                 "ServeController")
PEER_MARKERS = (*STACK_MARKERS, "vllm.entrypoints", "naive_fastapi", "ray_serve_llm", "app serve")


def free_port() -> int:
    """A free loopback port, never 8000 (the service's default: a run must not meet someone's `make serve`)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != 8000:
            return port


def child_env(drop: Iterable[str] = ("RAY_ADDRESS", "APP_API_KEYS"), **extra: str) -> dict[str, str]:
    """This process's environment without what would attach a child to someone else's Ray or keys."""
    dropped = set(drop)
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(extra)
    return env


def _restore_sigint() -> None:
    # A process started in the background by a non-interactive shell has SIGINT ignored, and an ignored
    # signal stays ignored across exec: without this, "Ctrl-C" to the group would test nothing.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Every process whose environment carries `tag` (reading environments is slow: not in a tight loop)."""
    me, found = os.getpid(), []
    for p in psutil.process_iter():
        try:
            if p.pid != me and p.environ().get(TAG_ENV) == tag:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


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


def wait_until(condition: Callable[[], bool], timeout_s: float, gave_up: Callable[[], bool] = lambda: False,
               interval_s: float = 0.5) -> bool:
    """Polls `condition` until it holds (True), or `timeout_s` passes or `gave_up()` (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not gave_up():
        if condition():
            return True
        time.sleep(interval_s)
    return False
