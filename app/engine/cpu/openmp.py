"""The OpenMP placement of a CPU engine whose EngineCore computes itself (to_vllm.py's `computes_in_process`).

vLLM's multiprocessing executor places its CPU worker's OpenMP threads through the worker's environment
(vllm/utils/ompmultiprocessing.py `configure_omp_envs`); the in-process executor places nothing. So the replica
sets the same variables, from its core plan, while vLLM spawns the EngineCore, which inherits them; the replica's
own OpenMP runtime read its environment long before and is not moved.

    with spawned_with(openmp_env(plan)):   # around AsyncLLM's construction
        ...
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from app.engine.cpu.core_plan import CorePlan


def openmp_env(plan: CorePlan, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """vLLM's variables for one worker computing on `plan`'s cores, one thread per core, by the OpenMP runtime
    LD_PRELOAD names: Intel's (or LLVM's), else GNU's. {} where nothing is bound (`nobind`) or more than one worker
    computes."""
    if plan.source == "nobind" or len(plan.compute_by_rank) != 1 or not plan.compute_by_rank[0]:
        return {}
    cores = [str(c) for c in plan.compute_by_rank[0]]
    env = {"OMP_NUM_THREADS": str(len(cores))}
    preload = (os.environ if environ is None else environ).get("LD_PRELOAD", "")
    if "libiomp" in preload or "libomp" in preload:
        env.update(KMP_AFFINITY=f"granularity=fine,explicit,proclist=[{','.join(cores)}]", KMP_BLOCKTIME="5",
                   KMP_TPAUSE="0")
    else:  # GNU's: vLLM's CPU platform preloads torch's libgomp where no other runtime is, before the spawn
        env["GOMP_CPU_AFFINITY"] = " ".join(cores)
    return env


@contextmanager
def spawned_with(env: Mapping[str, str]) -> Iterator[None]:
    """`env` in this process's environment while the block starts child processes, restored after."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
