"""Keeps the front end off the engine's compute cores, on a CPU host.

vLLM's CPU worker binds its compute threads to some cores (all but the ones it reserves for the
front end); where the EngineCore computes itself, cpu/openmp.py binds it the same way. Everything
else (this replica's event loop, which answers HTTP and streams tokens, and the EngineCore's threads
that read requests and send outputs) may still run on those cores and preempt the computation.
Restricting them to the remaining cores measured +3.5 to +4 % output tokens/s at 16 concurrent
streams on 2 cores, with a worker process (docs/benchmarks.md). On a GPU host nothing is bound,
no core is set apart, and this does nothing.
"""

from __future__ import annotations

import logging
import os

import psutil

log = logging.getLogger(__name__)

WORKER_MARK = "VLLM::Worker"  # vLLM's process title for its compute workers


def pin(process: psutil.Process, cpus: set[int], keep: int | None = None) -> None:
    """Every thread of `process` but `keep` (Linux keeps affinity per thread; new threads inherit their creator's)."""
    for thread in process.threads():
        if thread.id != keep:
            os.sched_setaffinity(thread.id, cpus)


def keep_off_engine_cores(planned: set[int] | None = None, me: psutil.Process | None = None) -> set[int]:
    """Pins this process and its EngineCore to the cores no engine computes on; returns those cores (empty: nothing
    done). The compute cores are those vLLM's worker processes are bound to or, where the EngineCore computes
    itself (no worker process), `planned`: then the EngineCore's main thread computes and stays, and its other
    threads (reading requests, sending outputs) move only where the main thread is its one compute thread: with
    more, its OpenMP threads cannot be told from the rest."""
    me = me or psutil.Process()
    try:
        ours = set(me.cpu_affinity())
        family = me.children(recursive=True)
        workers = [p for p in family if WORKER_MARK in p.name()]
        compute = set().union(*(p.cpu_affinity() for p in workers)) if workers else set(planned or ())
        front = ours - compute
        if not compute or not front:
            return set()
        pin(me, front)
        for process in family:
            if workers and process not in workers:
                pin(process, front)
            elif not workers and len(compute) == 1:
                pin(process, front, keep=process.pid)
    except (psutil.Error, OSError) as err:  # an optimisation only; never fail a start over it
        log.warning("could not keep the front end off the engine's cores: %r", err)
        return set()
    log.info("engine computes on cores %s; the replica and the EngineCore's other threads run on cores %s",
             sorted(compute), sorted(front))
    return front
