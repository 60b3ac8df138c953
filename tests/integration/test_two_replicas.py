"""The scenario issue 12 opened with: `configs/cpu.yaml` with `num_replicas: 2` under `python -m app serve` (one
machine, its own Ray), 4 plain and 2 streaming SDK clients, and issue 13's: long greedy streams in flight on an
engine that breaks. Two replicas get the ingress tier, which listens on the port itself, retries on the other
replica what the broken one refuses, and continues there the requests the broken engine was answering
(app/rayserve/migration.py). The engine is stopped (SIGSTOP: alive and silent, which vLLM's health check does not
see): its replica declares it wedged (progress_watch.py) and restarts it in place. No request fails; every long
stream ends whole, and the two engines compute on cores of their own (core_claims.py).
A killed engine (SIGKILL) is the cluster's test (test_local_cluster.py): the same 503 after answering reaches the
ingress, and its replica restarts the engine in place as here.
A stack of its own (two engines on the machine)."""

from __future__ import annotations

import contextlib
import os
import re
import time

import httpx
import openai
import psutil
import pytest

from loadkit.long_stream import LONG, LongStream
from loadkit.steady_load import SteadyLoad
from tests.support.engine_procs import engine_cores
from tests.support.service import API_KEY, MODEL, base_config, free_port, running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.stack("own")]

STREAMS = 4  # long greedy streams in flight at the kill: some are on the killed engine
# Room on one replica for everything (4 long streams, 6 clients of the steady load): while the killed engine is
# replaced the other replica holds it all; the test's usual 4 + 4 would refuse some of it, honestly, with 429.
LIMITS = {"max_ongoing_requests": 8, "max_queued_requests": 16}


def _migrated(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    found = re.findall(r'^app_requests_migrated_total\{[^}]*outcome="resumed"[^}]*\} (\S+)$', text, re.M)
    return sum(float(v) for v in found)


def _two(found: list[psutil.Process]) -> list[psutil.Process] | None:
    return found if len(found) == 2 else None


def _both_ready(svc) -> list[psutil.Process] | None:
    ready = svc.log_path.read_text(errors="replace").count(f"model {MODEL} ready in")
    return _two(engine_cores(svc)) if ready >= 2 else None


def _tree(svc) -> list[str]:
    out = []
    for p in psutil.Process(svc.proc.pid).children(recursive=True):
        try:
            out.append(f"{p.pid}<{p.ppid()} {p.status()} {' '.join(p.cmdline())[:80]}")
        except psutil.NoSuchProcess:
            continue
    return out


def _story(svc, last: int = 60) -> str:
    """The service log's lines about replicas and engines (no access or request lines): what to read when the
    two engines are not both there."""
    keep = ("ready in", "restart", "wedge", "Error", "error", "died", "unhealthy", "Adding", "Removing", "replica",
            "killed")
    lines = [ln[:300] for ln in svc.log_path.read_text(errors="replace").splitlines()
             if any(k in ln for k in keep) and "engine request" not in ln and '"access"' not in ln]
    return "\n".join(lines[-last:])


def test_a_stopped_engine_costs_no_request_and_its_streams_continue_on_the_other_replica(tmp_path):
    config = base_config(free_port(), short_clocks=False)
    config["models"][0]["deployment"].update(num_replicas=2, **LIMITS)
    with running_stack(tmp_path, config) as svc:
        # The ingress answers /health once one replica serves; the other may still be loading its engine. Each
        # replica logs its ready line (the CLI's log carries the replicas' lines), and then has its EngineCore.
        try:
            cores = wait_until(lambda: _both_ready(svc), timeout_s=420, interval_s=1,
                               what="both replicas' engines ready, each with its EngineCore process")
        except TimeoutError as e:
            raise AssertionError(f"{e}; its processes: {_tree(svc)}; the service's story:\n{_story(svc)}") from None
        if len(os.sched_getaffinity(0)) >= 2:
            bound = [set(os.sched_getaffinity(w.pid)) for core in cores for w in core.children()]  # each's worker
            assert len(bound) == 2 and not bound[0] & bound[1], bound
        with openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=300) as c:
            reference = c.chat.completions.create(model=MODEL, extra_body={"ignore_eos": True}, **LONG)
        before = _migrated(svc.base_url)
        try:
            load, streams, stopped_at = _stop_an_engine_under_load(svc, cores[0])
        except TimeoutError as e:
            raise AssertionError(f"{e}; its processes: {_tree(svc)}; the service's story:\n{_story(svc)}") from None
        resumed = _migrated(svc.base_url) - before
    same = sum(s.text == reference.choices[0].message.content for s in streams)
    print(f"around the SIGSTOP: {load.summary(stopped_at)}; long greedy streams: "
          f"{sum(s.whole() is None for s in streams)} of {len(streams)} whole, {same} identical to the "
          f"uninterrupted answer; choices resumed on the other replica: {resumed:g}")
    assert not load.failures(), load.summary(stopped_at)
    assert len(load.since(stopped_at)) >= 10
    for s in streams:
        assert s.whole() is None, s.whole()  # finish "length", usage counted over the whole answer
        assert s.usage.prompt_tokens == reference.usage.prompt_tokens  # the prompt once, not the continuation's
    assert resumed >= 1, "no stream was on the stopped engine: the test proved nothing about moving one"


def _restarts(svc) -> int:
    return svc.log_path.read_text(errors="replace").count("restarted in place in")


def _stop_an_engine_under_load(svc, victim: psutil.Process) -> tuple[SteadyLoad, list[LongStream], float]:
    """SIGSTOP of `victim` (an EngineCore: alive, silent, so vLLM's health check passes) under the steady load and
    long streams: its replica sees no progress past its bound (progress_watch.py), ends its requests with a
    retryable 503 and restarts the engine in place; the ingress continues them on the other replica. Returns once
    every stream ended, the new engine is ready (its replica's "restarted in place" line: an EngineCore process
    appears well before its engine serves) and the load is served again."""
    restarts = _restarts(svc)
    try:
        with SteadyLoad(svc.base_url, API_KEY, MODEL, plain=4, streaming=2) as load:
            load.wait_served(10, what="steady load served before the SIGSTOP")
            streams = [LongStream(svc.base_url, API_KEY, MODEL) for _ in range(STREAMS)]
            for s in streams:
                s.start()
            wait_until(lambda: all(s.chunks >= 3 for s in streams), timeout_s=300, interval_s=0.2,
                       what="every long stream under way")
            at = time.monotonic()
            victim.suspend()
            for s in streams:
                s.join(timeout=600)
            wait_until(lambda: "restarting in place (wedged" in svc.log_path.read_text(errors="replace"),
                       timeout_s=300, interval_s=1, what="the stopped engine declared wedged")
            wait_until(lambda: _restarts(svc) > restarts and len(engine_cores(svc)) == 2, timeout_s=300,
                       interval_s=1, what="a new engine ready in place of the stopped one")
            load.wait_served(10, what="the load served with both engines again")
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.kill()  # a stopped process outlives SIGTERM: never leave one behind a failed test
    return load, streams, at
