"""EngineProcesses: the processes an engine's start left running under this one, and killing them for certain.

vLLM's `AsyncLLM.shutdown` sends its `EngineCore` SIGTERM and waits (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS,
5 s) before it kills: time wasted on an engine that is known to be wedged, and a process stopped with
SIGSTOP does not act on SIGTERM at all. SIGKILL ends a stopped process too. So the host records which
processes appeared while an engine started, kills those (and their children) before it shuts a wedged engine
down, and kills whatever of them is still alive after any shutdown, so a restart in place leaves nothing
behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import psutil

from app.engine.cpu.affinity import pin
from app.engine.interface import Engine

log = logging.getLogger(__name__)
KILL_WAIT_S = 10.0  # SIGKILL is not refusable; this only bounds a process stuck in uninterruptible I/O
_POLL_S = 0.02


def _descendants() -> set[psutil.Process]:
    try:
        return set(psutil.Process().children(recursive=True))
    except psutil.Error:
        return set()


class EngineProcesses:
    def __init__(self, processes: set[psutil.Process] | None = None):
        self._processes = processes or set()

    @classmethod
    def started_by(cls, start: Callable[[], None]) -> EngineProcesses:
        """Runs `start` (an engine's blocking start) and returns the processes that appeared under this one
        meanwhile. If `start` raises, those processes are killed and the error re-raised."""
        before = _descendants()
        try:
            start()
        except BaseException:
            cls(_descendants() - before).kill()
            raise
        return cls(_descendants() - before)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(sorted(p.pid for p in self._processes))

    def alive(self) -> list[psutil.Process]:
        found: set[psutil.Process] = set()
        for process in self._processes:
            with contextlib.suppress(psutil.Error):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    found.add(process)
                    found.update(process.children(recursive=True))
        return sorted(found, key=lambda p: p.pid)

    def kill(self) -> int:
        """SIGKILL to every one still alive (a stopped one too), waited for; returns how many were killed."""
        targets = self.alive()
        for process in targets:
            with contextlib.suppress(psutil.Error):
                process.kill()
        still = _wait_gone(targets)
        if still:
            log.error("engine processes still alive %.0f s after SIGKILL: %s", KILL_WAIT_S, [p.pid for p in still])
        return len(targets)


def _gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_gone(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Until each is dead (a zombie counts): not `psutil.wait_procs`, which would reap our own children from
    under `multiprocessing`, whose `is_alive` then reports them alive for ever (vLLM's shutdown would wait)."""
    deadline = time.monotonic() + KILL_WAIT_S
    left = [p for p in processes if not _gone(p)]
    while left and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        left = [p for p in left if not _gone(p)]
    return left


def start_engine(engine: Engine, affinity: set[int]) -> tuple[EngineProcesses, float]:
    """Starts `engine` (blocking: call it on a thread) with this process's cores as `affinity` (what the process
    had before any engine narrowed it); returns its processes and how long the start took."""
    started = time.monotonic()
    if affinity:
        with contextlib.suppress(psutil.Error, OSError):
            pin(psutil.Process(), affinity)
    try:
        processes = EngineProcesses.started_by(engine.start)
    except BaseException:
        with contextlib.suppress(Exception):
            engine.shutdown()
        raise
    return processes, time.monotonic() - started


async def stop_engine(engine: Engine, processes: EngineProcesses, wedged: bool, name: str, timeout_s: float) -> None:
    """Every process `engine` started ends: a wedged engine's are SIGKILLed first (a stopped EngineCore would sit
    out vLLM's SIGTERM grace), then the engine shuts down (off the event loop, within `timeout_s`), then whatever of
    its processes is still alive is SIGKILLed."""
    if wedged:
        killed = await asyncio.to_thread(processes.kill)
        log.warning("engine for %s: SIGKILLed %d wedged engine process(es) %s", name, killed, processes.pids)
    try:
        await asyncio.wait_for(asyncio.to_thread(engine.shutdown), timeout_s)
    except TimeoutError:
        log.error("engine for %s: shutdown did not finish in %.0f s; going on", name, timeout_s)
    except Exception:
        log.exception("engine for %s: shutdown failed; going on", name)
    await asyncio.to_thread(processes.kill)
