"""What an operator sees: Prometheus metrics and JSON logs that carry the request id end to end."""

from __future__ import annotations

import json
import os
import re
import uuid

import httpx
import psutil
import pytest

from loadkit.proctree import engine_core_of
from tests.support.service import MODEL
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]


def _sample(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_count_requests_latency_disconnects_and_engine_figures(service, http):
    before = httpx.get(f"{service.base_url}/metrics").text  # open to scrapers, no key
    def chat(content: str, **extra) -> dict:
        return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}

    http.post("/v1/chat/completions", json=chat("Hi", max_tokens=5, stream=True))
    with http.stream("POST", "/v1/chat/completions",
                     json=chat("A long story", max_tokens=500, ignore_eos=True, stream=True)) as r:
        next(r.iter_lines())
    http.post("/v1/chat/completions", json=chat("x " * 3000, max_tokens=10))
    idle = service.wait_idle()  # the disconnected stream has been aborted and counted
    assert idle["engine"]["running"] == 0 and idle["admission"]["in_system"] == 0, idle
    after = httpx.get(f"{service.base_url}/metrics").text

    def grew(name, **labels):
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    assert grew("app_requests_total", model=MODEL, endpoint="/v1/chat/completions", status="200") >= 2
    assert grew("app_refusals_total", model=MODEL, reason="context_length_exceeded") == 1
    assert grew("app_client_disconnects_total", model=MODEL) == 1
    assert grew("app_time_to_first_token_seconds_count", model=MODEL) >= 2
    assert grew("app_inter_token_latency_seconds_count", model=MODEL) >= 4
    assert grew("vllm:generation_tokens_total", model_name=MODEL) >= 5
    assert _sample(after, "vllm:num_requests_running", model_name=MODEL) == 0
    assert _sample(after, "app_queue_depth", model_name=MODEL) == 0
    assert _sample(after, "app_engine_healthy", model_name=MODEL) == 1


def test_json_logs_carry_the_request_id_from_ingress_to_engine(service, http):
    trace = f"trace-{uuid.uuid4().hex}"
    r = http.post("/v1/chat/completions", headers={"X-Request-Id": trace},
                  json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
    assert r.status_code == 200 and r.headers["x-request-id"] == trace

    def records() -> dict[str, dict]:
        """The JSON log records that carry `trace`, by logger; both loggers' once both have been written."""
        found: dict[str, dict] = {}
        for line in service.log_path.read_text(errors="replace").splitlines():
            match = re.search(r"\{.*\}\s*$", line) if trace in line else None  # Ray prefixes "(Replica pid=...)"
            if match:
                record = json.loads(match.group(0))
                found[record["logger"]] = record
        return found if {"app.access", "app.server"} <= found.keys() else {}

    found = wait_until(records, timeout_s=30, interval_s=0.5, what="both log lines of the request in the log")
    assert found["app.access"]["request_id"] == trace and found["app.access"]["status"] == 200
    assert found["app.server"]["trace_id"] == trace and found["app.server"]["outcome"] == "finished"
    assert found["app.server"]["generated_tokens"] == 3
    engine_line = found["app.server"]  # where the first token's wait went: rendering, admission, the engine
    assert 0 <= engine_line["rendered_ms"] <= engine_line["admitted_ms"] <= engine_line["first_output_ms"]


def test_every_port_the_service_opens_is_on_loopback(service):
    pids = {service.proc.pid} | {p.pid for p in psutil.Process(service.proc.pid).children(recursive=True)}
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]
    assert listening, "found no listening sockets at all"
    exposed = [(c.laddr.ip, c.laddr.port, " ".join(psutil.Process(c.pid).cmdline())[:80])
               for c in listening if c.laddr.ip not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
    assert exposed == []


def test_the_engine_core_computes_itself_and_the_front_end_keeps_off_its_core(service):
    """On the CPU the EngineCore computes itself (no worker process to start: app/engine/vllm/to_vllm.py), its
    main thread bound to the planned compute core (app/engine/cpu/openmp.py); the replica (HTTP, token streaming)
    and the EngineCore's other threads (requests in, outputs out) are moved to the other cores, so they never
    preempt the computation."""
    tree = psutil.Process(service.proc.pid).children(recursive=True)
    assert not [p for p in tree if "VLLM::Worker" in p.name()]
    planned = set(service.stats()["engine"]["compute_cores"])
    everything = set(psutil.Process().cpu_affinity())
    if len(everything) < 2 or len(planned) != 1:
        pytest.skip("one core only, or more than one compute thread (the EngineCore's threads stay together)")
    def titled(p: psutil.Process, mark: str) -> bool:
        return mark in p.name() + " ".join(p.cmdline())  # process titles can outgrow the 15-character name

    replica = next(p for p in tree if titled(p, "ServeReplica"))
    engine_core = engine_core_of(replica)
    assert engine_core is not None
    assert planned < everything
    assert set(os.sched_getaffinity(engine_core.pid)) == planned  # its main thread computes
    others = [t.id for t in replica.threads()] + [t.id for t in engine_core.threads() if t.id != engine_core.pid]
    assert others
    for thread in others:
        assert set(os.sched_getaffinity(thread)).isdisjoint(planned), thread


def test_the_private_ray_runs_quietly(service):
    """The CLI's own Ray leaves out background work nobody reads (Ray's metrics, task events) and runs
    Serve's control loop at 0.5 s: those processes share the CPU with the engine."""
    from app.cli.main import QUIET_PRIVATE_RAY

    tree = psutil.Process(service.proc.pid).children(recursive=True)
    controller = next(p for p in tree if "ServeController" in p.name() + " ".join(p.cmdline()))
    environment = controller.environ()
    assert {name: environment.get(name) for name in QUIET_PRIVATE_RAY} == QUIET_PRIVATE_RAY


def test_one_replica_answering_all_http_listens_itself_with_no_serve_proxy(service):
    proxies = [p.name() for p in psutil.Process(service.proc.pid).children(recursive=True) if "ProxyActor" in p.name()]
    assert not proxies, "one replica answering all HTTP listens itself; no proxy process"
    # The replica answers /health (so the fixture is ready) a moment before the CLI prints its ready line.
    wait_until(lambda: "HTTP answered by the replica itself" in service.log_path.read_text(errors="replace"),
               timeout_s=60, what="the CLI's ready line saying the replica answers HTTP itself")
