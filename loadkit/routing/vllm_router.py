"""The routing benchmark's other peer: `vllm-router` (PyPI, the vLLM project's Rust router) in cache-aware mode, its
default policy, in front of two bare vLLM servers (`python -m vllm.entrypoints.openai.api_server`), one per core.

Each server gets the service's engine settings and KV cache (the same `engine` the Ray Serve LLM peer gets) and is
confined to one core, its compute threads bound there (`VLLM_CPU_OMP_THREADS_BIND`), as each of the cluster's worker
nodes is; the router runs unconfined, like the service's ingress on the head. The servers' own /metrics give the
prefix-cache counters and each one's prompt tokens, labelled by server (`metrics`). `VllmRouterFleet` stops every
process it started, by process group.
"""

from __future__ import annotations

import os
import shutil
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from loadkit.routing.figures import scrape
from loadkit.service import Server, child_env, free_port

SYSTEM = "vllm_router"
POLICY = "cache_aware"
START_S = 900.0  # a vLLM start on a busy core (the cluster's raylets idle beside it)


def server_command(port: int, model_id: str, model_dir: str, engine: dict[str, Any]) -> list[str]:
    """One bare vLLM server with the service's engine settings (`engine`: its `engine:` section)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--served-model-name", model_id, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", str(engine.get("dtype", "auto")), "--max-model-len", str(engine["max_model_len"]),
            "--max-num-seqs", str(engine["max_num_seqs"]),
            "--kv-cache-memory-bytes", str(int(engine["kv_cache_gib"] * 2**30)),
            *(["--enforce-eager"] if engine.get("enforce_eager", True) else []),
            "--enable-prompt-tokens-details", "--disable-uvicorn-access-log"]


def router_command(port: int, workers: list[str]) -> list[str]:
    router = shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or "vllm-router"
    return [router, "--host", "127.0.0.1", "--port", str(port), "--policy", POLICY, "--worker-urls", *workers,
            "--log-level", "warning"]


class VllmRouterFleet:
    """Two pinned vLLM servers and the router at `port`, started on entry and stopped on exit."""

    def __init__(self, port: int, model_id: str, model_dir: str, engine: dict[str, Any], work: Path):
        self.port, self.model_id, self.model_dir, self.engine, self.work = port, model_id, model_dir, engine, work
        self.servers: list[Server] = []
        self._stack = ExitStack()

    def __enter__(self) -> VllmRouterFleet:
        try:
            cores = sorted(os.sched_getaffinity(0))
            for i in range(2):
                core = cores[i % len(cores)]
                port = free_port()
                command = ["taskset", "-c", str(core), *server_command(port, self.model_id, self.model_dir,
                                                                       self.engine)]
                env = child_env(VLLM_CPU_OMP_THREADS_BIND=str(core), PYTHONUNBUFFERED="1")
                server = Server(command, port=port, log_path=self.work / f"vllm-{i}.log", env=env)
                self._stack.callback(server.stop)
                self.servers.append(server)
            for server in self.servers:  # both load at once, each on its own core
                if problem := server.wait_ready(START_S, self.model_id):
                    raise RuntimeError(f"a bare vLLM server did not start: {problem}")
            router = Server(router_command(self.port, [s.base_url for s in self.servers]), port=self.port,
                            log_path=self.work / "vllm-router.log")
            self._stack.callback(router.stop)
            if problem := router.wait_ready(120, self.model_id):
                raise RuntimeError(f"vllm-router did not start: {problem}")
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def metrics(self) -> dict[str, dict[str, float]]:
        """Both servers' counters, each server as a replica (`vllm-0`, `vllm-1`)."""
        out: dict[str, dict[str, float]] = {}
        for i, server in enumerate(self.servers):
            for name, per in scrape(httpx.get(f"{server.base_url}/metrics", timeout=30).text).items():
                out.setdefault(name, {})[f"vllm-{i}"] = sum(per.values())
        return out
