"""A real stack as a user starts it: `python -m app serve` (Ray Serve + vLLM on the CPU, the default model) on the
test config, healthy for the duration of a block, then stopped with Ctrl-C (SIGINT to its process group), after
which no Ray or engine process may remain. Starting, stopping and the search for leftover processes are
loadkit.service's, the same as the benchmark's and the overload check's. The fixtures that hold the session's
stack are tests/support/stacks.py's."""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from app.cli.serve_steps import wait_healthy
from loadkit.service import STACK_MARKERS, ProcessGroup, child_env, processes_started_since
from loadkit.service import free_port as free_port  # re-exported: the tests' import of it stays

REPO = Path(__file__).resolve().parents[2]
API_KEY = "test-key-integration"
MODEL = "smollm2-135m-instruct"
SECOND_MODEL = "smollm2-embed"
# Small limits so overload and queueing are reachable with a handful of requests.
MAX_ONGOING = 4
MAX_QUEUED = 4
STARTUP_TIMEOUT_S = 420
# The connection clocks of the test config (`base_config`'s `short_clocks`), in seconds: cut from the defaults so
# that the hostile-client tests see them run out quickly.
SHORT_CLOCKS = {"header_timeout": 3.0, "body_timeout": 5.0, "write_stall_timeout": 5.0}


def service_processes(since: float) -> list[str]:
    """Ray and engine processes started since `since` (epoch seconds) that are still there."""
    return processes_started_since(since, STACK_MARKERS)


class Service:
    def __init__(self, base_url: str, group: ProcessGroup):
        self.base_url = base_url
        self.group = group
        self.proc = group.proc
        self.log_path = group.log_path
        self.started_at = group.started_at
        self.headers = {"Authorization": f"Bearer {API_KEY}"}

    def stats(self, model: str = MODEL) -> dict:
        r = httpx.get(f"{self.base_url}/stats", headers=self.headers, timeout=30)
        r.raise_for_status()
        return r.json()[model]

    def wait_idle(self, timeout_s: float = 30) -> dict:
        """Wait until no request is in the engine or the admission queue; return the last stats."""
        deadline = time.monotonic() + timeout_s
        while True:
            s = self.stats()
            if s["engine"]["running"] == 0 and s["admission"]["in_system"] == 0:
                return s
            if time.monotonic() > deadline:
                return s
            time.sleep(0.2)

    def wait_healthy(self, timeout_s: float) -> bool:
        return wait_healthy(self.base_url, timeout_s, gave_up=lambda: self.proc.poll() is not None)


def base_config(port: int, short_clocks: bool = True) -> dict:
    """The default config (one model, so HTTP is served by the engine replicas themselves) with test limits, and
    with `short_clocks` the connection clocks cut to seconds, so the hostile-client tests see them run out quickly
    (the stacks that test faults under load keep the defaults: a starved client is not what they test)."""
    config = yaml.safe_load((REPO / "configs" / "cpu.yaml").read_text())
    config["service"].update({"port": port, "api_keys": [API_KEY], "request_timeout_s": 120, "drain_grace_s": 10})
    if short_clocks:
        config["service"].update({f"{k}_s": v for k, v in SHORT_CLOCKS.items()})
    model = config["models"][0]
    model["engine"].update({"kv_cache_gib": 1, "max_num_seqs": 16})
    model["deployment"].update({"max_ongoing_requests": MAX_ONGOING, "max_queued_requests": MAX_QUEUED,
                                "queue_timeout_s": 60, "health_check_period_s": 2, "health_check_timeout_s": 10,
                                # no model-wide time target: the count-bound tests hold slots on purpose; the
                                # time-bound tests give theirs per request (X-TTFT-Target-S)
                                "ttft_target_s": None})
    return config


def with_second_model(config: dict) -> dict:
    """The same weights served a second time, under another name, as an embedding model (vLLM's pooling runner)
    with tighter limits: two engine deployments behind a separate ingress that routes by `model` (the multi-model
    topology)."""
    model = config["models"][0]
    config["models"].append({
        "id": SECOND_MODEL, "source": "default", "runner": "embed",
        "engine": {**model["engine"], "max_model_len": 1024},
        "deployment": {**model["deployment"], "max_ongoing_requests": 2, "max_queued_requests": 2},
        "limits": {"max_tokens": 16, "default_max_tokens": 8, "max_n": 1, "max_embedding_inputs": 4},
    })
    return config


@contextmanager
def running_stack(tmp: Path, config: dict, extra_args: tuple[str, ...] = ()) -> Iterator[Service]:
    """`python -m app serve` on `config`, healthy, for the duration of the block; then Ctrl-C."""
    port = config["service"]["port"]
    config_path = tmp / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    # Its own process group with SIGINT at its default, so "Ctrl-C" reaches only the service, and does.
    group = ProcessGroup([sys.executable, "-m", "app", "serve", "--config", str(config_path),
                          "--startup-timeout", str(STARTUP_TIMEOUT_S), *extra_args],
                         cwd=REPO, env=child_env(), log_path=tmp / "service.log")
    svc = Service(f"http://127.0.0.1:{port}", group)
    try:
        if not svc.wait_healthy(STARTUP_TIMEOUT_S):
            pytest.fail(f"service did not become healthy; log tail:\n{group.log_tail(4000)}")
        yield svc
    finally:
        stop_service(svc)


def stop_service(svc: Service) -> None:
    """Ctrl-C (SIGINT to its process group), SIGKILL after 120 s; then whatever of it outlived the service is
    killed, and said (a warning in the test summary: test_shutdown is the test that fails on it)."""
    report = svc.group.stop(sigint_wait_s=120, sigterm_wait_s=0, sigkill_wait_s=30, leftover_wait_s=20)
    if not report.clean:
        warnings.warn(f"the service left processes behind: {report.text(20)}", stacklevel=2)
