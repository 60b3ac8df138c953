"""A server's process tree, and its memory and CPU by role.

The tree is the root process, its descendants (Ray's raylet and workers, Serve replicas, vLLM's EngineCore) and
anything carrying the run's tag in its environment (a Ray worker re-parented away from the tree still counts;
another person's engine never does). `PeakSampler` follows the summed RSS in a thread while a load runs.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass, field

import psutil

TAG_ENV = "LOADKIT_TAG"  # set on every process the kit starts; every descendant inherits it

LOAD_GENERATOR = "load generator (this script)"
ENGINE_CORE = "vLLM EngineCore"
_ROLES = (("EngineCore", ENGINE_CORE), ("VLLM::Worker", "vLLM worker"), ("ProxyActor", "Serve proxy"),
          ("ServeController", "Serve controller"), ("raylet", "raylet"), ("gcs_server", "gcs_server"))


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


def role_of(p: psutil.Process, root_pid: int | None) -> str:
    """What a process of the stack is, from its name and command line."""
    try:
        text = p.name() + " " + " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if p.pid == root_pid:
        return "service (driver)"
    for marker, role in _ROLES:
        if marker in text:
            return role
    if "multiprocessing.spawn" in text and _spawned_by_replica(p):
        return ENGINE_CORE  # not yet (or never) retitled: engine_core_of says why
    if "ServeReplica" in text:
        return "ingress replica" if "ingress" in text else "engine replica"
    return "other Ray helpers"


def _spawned_by_replica(p: psutil.Process) -> bool:
    try:
        parent = p.parent()
        return parent is not None and "ServeReplica" in parent.name() + " ".join(parent.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def engine_core_of(replica: psutil.Process) -> psutil.Process | None:
    """The live EngineCore process an engine replica runs, or None (none yet, or it died): its descendant whose
    role is the EngineCore's. vLLM titles it `VLLM::EngineCore`, but a serving engine may still carry the title
    of the multiprocessing child its replica spawned, so that child counts too (the replica's other
    multiprocessing child, the resource tracker, is not spawned through `multiprocessing.spawn`)."""
    try:
        for p in replica.children(recursive=True):
            if p.status() != psutil.STATUS_ZOMBIE and role_of(p, root_pid=None) == ENGINE_CORE:
                return p
    except psutil.NoSuchProcess:
        pass
    return None


@dataclass(frozen=True)
class Seen:
    proc: psutil.Process
    created: float
    role: str


@dataclass(frozen=True)
class RssSample:
    total: int
    by_role: dict[str, int] = field(default_factory=dict)


class ProcessTree:
    """Every process of one server that was ever observed, by pid (with its start time, so a reused pid is
    not mistaken for it). `root_pid` may be set later (the server starts after the tree is made)."""

    def __init__(self, root_pid: int | None, tag: str | None = None):
        self.root_pid, self.tag = root_pid, tag
        self.seen: dict[int, Seen] = {}
        self._scans = 0

    def processes(self) -> list[psutil.Process]:
        """The tree as it is now (and, every tenth call, the tagged processes: reading every process's
        environment is too slow for every tick)."""
        if self.root_pid is None:
            return []
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        if self.tag and self._scans % 10 == 0:
            known = {p.pid for p in procs}
            procs += [p for p in tagged_processes(self.tag) if p.pid not in known]
        self._scans += 1
        for p in procs:
            if p.pid not in self.seen:
                try:
                    self.seen[p.pid] = Seen(p, p.create_time(), role_of(p, self.root_pid))
                except psutil.NoSuchProcess:
                    pass
        return procs

    def _role(self, pid: int) -> str:
        seen = self.seen.get(pid)
        return seen.role if seen else "?"

    def rss(self) -> RssSample:
        total, by_role = 0, Counter()
        for p in self.processes():
            try:
                rss = p.memory_info().rss
            except psutil.Error:
                continue
            total += rss
            by_role[self._role(p.pid)] += rss
        return RssSample(total, dict(by_role))

    def cpu(self) -> dict[str, float]:
        """CPU seconds (user + system) so far, by role, with this process's own as the load generator's."""
        by_role = Counter()
        for p in self.processes():
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            by_role[self._role(p.pid)] += t.user + t.system
        t = psutil.Process().cpu_times()
        by_role[LOAD_GENERATOR] = t.user + t.system
        return dict(by_role)

    def _is_alive(self, seen: Seen) -> bool:
        try:
            p = psutil.Process(seen.proc.pid)
            return abs(p.create_time() - seen.created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def engine_pids(self) -> set[int]:
        self.processes()
        return {pid for pid, s in self.seen.items() if s.role == ENGINE_CORE and self._is_alive(s)}

    def alive(self) -> list[str]:
        """'pid (role)' of every observed process still alive."""
        return [f"{pid} ({s.role})" for pid, s in self.seen.items() if self._is_alive(s)]

    def known(self) -> list[psutil.Process]:
        return [s.proc for s in self.seen.values()]


class PeakSampler:
    """Samples a tree's summed RSS every `interval_s` in a thread; `peak` since the last `reset_peak()`."""

    def __init__(self, tree: ProcessTree, interval_s: float = 0.5):
        self.tree, self.interval_s = tree, interval_s
        self.peak = self.last = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PeakSampler:
        self._thread.start()
        return self

    def sample(self) -> int:
        with self._lock:
            self.last = self.tree.rss().total
            self.peak = max(self.peak, self.last)
            return self.last

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.last

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # sampling must never take the harness down
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def known(self) -> list[psutil.Process]:
        with self._lock:
            return self.tree.known()
