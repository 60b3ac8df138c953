"""The engine processes of a running stack, found from its `app serve` process: for tests that kill one."""

from __future__ import annotations

import psutil

from app.builder import engine_deployment_name
from tests.integration.conftest import MODEL


def engine_cores(service, model: str = MODEL) -> list[psutil.Process]:
    """Live EngineCore processes under the replica(s) of `model`'s engine deployment."""
    found = []
    for replica in psutil.Process(service.proc.pid).children(recursive=True):
        try:
            if f"ServeReplica:llm:{engine_deployment_name(model)}" not in replica.name() + " ".join(replica.cmdline()):
                continue
            for p in replica.children(recursive=True):
                if p.status() != psutil.STATUS_ZOMBIE and "EngineCore" in " ".join(p.cmdline()) + p.name():
                    found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found
