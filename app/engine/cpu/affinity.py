"""Keeps the front end off the engine's compute cores, on a CPU host.

vLLM's CPU worker binds its compute threads to some cores (all but the ones it reserves for the
front end). Everything else (this replica's event loop, which answers HTTP and streams tokens,
and vLLM's `EngineCore`, whose scheduling sits on every step's critical path) may still run on
those cores and preempt the computation. Restricting them to the remaining cores measured +3.5 to
+4 % output tokens/s at 16 concurrent streams on 2 cores (docs/benchmarks.md). On a GPU host the
workers are not bound, no core is set apart, and this does nothing.
"""

from __future__ import annotations

import logging
import os

import psutil

log = logging.getLogger(__name__)

WORKER_MARK = "VLLM::Worker"  # vLLM's process title for its compute workers


def pin(process: psutil.Process, cpus: set[int]) -> None:
    """Every thread of `process` (Linux keeps affinity per thread; new threads inherit their creator's)."""
    for thread in process.threads():
        os.sched_setaffinity(thread.id, cpus)


def keep_off_engine_cores(me: psutil.Process | None = None) -> set[int]:
    """Pins this process and its non-worker descendants (the EngineCore) to the cores no compute
    worker is bound to; returns those cores (empty: nothing done)."""
    me = me or psutil.Process()
    try:
        ours = set(me.cpu_affinity())
        family = me.children(recursive=True)
        workers = [p for p in family if WORKER_MARK in p.name()]
        compute = set().union(*(p.cpu_affinity() for p in workers)) if workers else set()
        front = ours - compute
        if not compute or not front:
            return set()
        for process in [me, *(p for p in family if p not in workers)]:
            pin(process, front)
    except (psutil.Error, OSError) as err:  # an optimisation only; never fail a start over it
        log.warning("could not keep the front end off the engine's cores: %r", err)
        return set()
    log.info(
        "engine computes on cores %s; this replica and the EngineCore run on cores %s", sorted(compute), sorted(front)
    )
    return front
