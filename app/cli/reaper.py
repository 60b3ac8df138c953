"""The processes the local service starts: orphans reaped as they die, and whatever is left killed at the end.

vLLM's EngineCore was seen outliving `ray stop` (and ignoring SIGTERM for seconds); as a child subreaper the
CLI inherits such orphans and can reap or kill them, so a stopped service leaves no process behind.
"""

from __future__ import annotations

import ctypes
import os

import psutil


def become_subreaper() -> None:
    """Orphans of our descendants (an EngineCore whose parent died) re-parent to us, so we can reap them."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except OSError:
        pass


def reap_zombies() -> None:
    """As subreaper we inherit orphans (e.g. the worker of a killed EngineCore); collect the dead ones."""
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.NoSuchProcess, ChildProcessError):
            pass


def kill_descendants(grace_s: float = 5.0) -> int:
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
