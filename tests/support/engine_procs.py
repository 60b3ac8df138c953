"""The engine processes of a running stack, found from its `app serve` process: for tests that kill one."""

from __future__ import annotations

import psutil

from app.builder import engine_deployment_name
from tests.integration.conftest import MODEL


def _is_engine_core(p: psutil.Process, replica: psutil.Process) -> bool:
    """vLLM names it VLLM::EngineCore; a CI run (2026-12-02 04:26) found one of two engines, both serving, still
    titled as the multiprocessing child its replica spawned: that child, not the resource tracker, is the core."""
    text = " ".join(p.cmdline()) + p.name()
    return "EngineCore" in text or (p.ppid() == replica.pid and "multiprocessing.spawn" in text)


def engine_cores(service, model: str = MODEL) -> list[psutil.Process]:
    """Live EngineCore processes under the replica(s) of `model`'s engine deployment."""
    found = []
    for replica in psutil.Process(service.proc.pid).children(recursive=True):
        try:
            if f"ServeReplica:llm:{engine_deployment_name(model)}" not in replica.name() + " ".join(replica.cmdline()):
                continue
            for p in replica.children(recursive=True):
                if p.status() != psutil.STATUS_ZOMBIE and _is_engine_core(p, replica):
                    found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found
