"""One real stack per test session: `python -m app serve` (Ray Serve + vLLM on the CPU, the
default model), started as a user starts it, and stopped with Ctrl-C (SIGINT to its process
group) at the end, after which no Ray or engine process may remain."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import psutil
import pytest
import yaml

from app.cli import wait_healthy

REPO = Path(__file__).resolve().parents[2]
API_KEY = "test-key-integration"
MODEL = "smollm2-135m-instruct"
SECOND_MODEL = "smollm2-short"
# Small limits so overload and queueing are reachable with a handful of requests.
MAX_ONGOING = 4
MAX_QUEUED = 4
STARTUP_TIMEOUT_S = 420
SERVICE_PROCESS_MARKERS = ("VLLM::EngineCore", "VLLM::Worker", "raylet", "gcs_server", "ray::", "ServeReplica", "ServeController")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_processes(since: float) -> list[str]:
    found = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "create_time"]):
        try:
            if p.info["create_time"] < since - 1:
                continue
            text = " ".join(p.info["cmdline"] or []) + " " + (p.info["name"] or "")
            if any(m in text for m in SERVICE_PROCESS_MARKERS):
                found.append(f"{p.info['pid']}: {text[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


class Service:
    def __init__(self, base_url: str, proc: subprocess.Popen, log_path: Path, started_at: float):
        self.base_url = base_url
        self.proc = proc
        self.log_path = log_path
        self.started_at = started_at
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


def base_config(port: int) -> dict:
    """The default config (one model, so HTTP is served by the engine replicas themselves) with test limits."""
    config = yaml.safe_load((REPO / "configs" / "cpu.yaml").read_text())
    config["service"].update({"port": port, "api_keys": [API_KEY], "request_timeout_s": 120, "drain_grace_s": 10})
    model = config["models"][0]
    model["engine"].update({"kv_cache_gib": 1, "max_num_seqs": 16})
    model["deployment"].update({"max_ongoing_requests": MAX_ONGOING, "max_queued_requests": MAX_QUEUED,
                                "queue_timeout_s": 60, "health_check_period_s": 2, "health_check_timeout_s": 10})
    return config


def with_second_model(config: dict) -> dict:
    """The same weights served a second time, under another name, with tighter limits: two engine
    deployments behind a separate ingress that routes by `model` (the multi-model topology)."""
    model = config["models"][0]
    config["models"].append({
        "id": SECOND_MODEL, "source": "default",
        "engine": {**model["engine"], "max_model_len": 1024},
        "deployment": {**model["deployment"], "max_ongoing_requests": 2, "max_queued_requests": 2},
        "limits": {"max_tokens": 16, "default_max_tokens": 8, "max_n": 1},
    })
    return config


@contextmanager
def running_stack(tmp: Path, config: dict, extra_args: tuple[str, ...] = ()) -> Iterator[Service]:
    """`python -m app serve` on `config`, healthy, for the duration of the block; then Ctrl-C."""
    port = config["service"]["port"]
    config_path = tmp / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = tmp / "service.log"
    started_at = time.time()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "APP_API_KEYS")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--config", str(config_path), "--startup-timeout", str(STARTUP_TIMEOUT_S), *extra_args],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,  # its own process group, so "Ctrl-C" reaches only the service
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # not inherited as ignored
        )
    svc = Service(f"http://127.0.0.1:{port}", proc, log_path, started_at)
    try:
        if not svc.wait_healthy(STARTUP_TIMEOUT_S):
            tail = log_path.read_text(errors="replace")[-4000:]
            pytest.fail(f"service did not become healthy; log tail:\n{tail}")
        yield svc
    finally:
        stop_service(svc)


@pytest.fixture(scope="session")
def service(tmp_path_factory) -> Iterator[Service]:
    with running_stack(tmp_path_factory.mktemp("stack"), base_config(free_port())) as svc:
        yield svc



def stop_service(svc: Service) -> None:
    if svc.proc.poll() is None:
        os.killpg(svc.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        try:
            svc.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(svc.proc.pid, signal.SIGKILL)
            svc.proc.wait()


@pytest.fixture(scope="session")
def base_url(service: Service) -> str:
    return service.base_url


@pytest.fixture(scope="session")
def client(service: Service):
    import openai

    with openai.OpenAI(base_url=f"{service.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture
async def async_client(service: Service):
    import openai

    async with openai.AsyncOpenAI(base_url=f"{service.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def http(service: Service):
    with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=120) as c:
        yield c
