"""The engine processes of a running stack, found from its `app serve` process: for tests that kill one."""

from __future__ import annotations

import psutil

from app.rayserve.builder import engine_deployment_name
from loadkit.proctree import engine_core_of
from tests.support.service import MODEL


def engine_cores(service, model: str = MODEL) -> list[psutil.Process]:
    """Live EngineCore processes under the replica(s) of `model`'s engine deployment."""
    found = []
    for replica in psutil.Process(service.proc.pid).children(recursive=True):
        try:
            if f"ServeReplica:llm:{engine_deployment_name(model)}" not in replica.name() + " ".join(replica.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        core = engine_core_of(replica)
        if core is not None:
            found.append(core)
    return found
