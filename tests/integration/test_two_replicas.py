"""The scenario issue 12 opened with: `configs/cpu.yaml` with `num_replicas: 2` under `python -m app serve` (one
machine, its own Ray), 4 plain and 2 streaming SDK clients, one engine killed, and issue 13's: long greedy
streams in flight on it. Two replicas get the ingress tier, which listens on the port itself, retries on the
other replica what the dead one refuses, and continues there the requests the dead engine was answering
(app/continuation.py); the killed engine's replica restarts it in place. No request fails, before or after
the kill; every long stream ends whole, and the two engines compute on cores of their own (core_claims.py).
A stack of its own (two engines on the machine)."""

from __future__ import annotations

import os
import re
import threading
import time

import httpx
import openai
import psutil
import pytest

from tests.integration.conftest import API_KEY, MODEL, base_config, free_port, running_stack
from tests.support.engine_procs import engine_cores
from tests.support.steady_load import SteadyLoad
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

LONG = {"messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}],
        "max_tokens": 96, "temperature": 0, "ignore_eos": True}
STREAMS = 4  # long greedy streams in flight at the kill: some are on the killed engine
# Room on one replica for everything (4 long streams, 6 clients of the steady load): while the killed engine is
# replaced the other replica holds it all; the test's usual 4 + 4 would refuse some of it, honestly, with 429.
LIMITS = {"max_ongoing_requests": 8, "max_queued_requests": 16}


class LongStream(threading.Thread):
    """One long greedy stream through the SDK: its text, its finish reason and its usage, or its error."""

    def __init__(self, base_url: str):
        super().__init__(daemon=True)
        self.base_url = base_url
        self.text, self.finish, self.usage, self.error, self.tokens_seen = "", None, None, None, 0

    def run(self) -> None:
        try:
            with openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=300) as c:
                stream = c.chat.completions.create(model=MODEL, stream=True, stream_options={"include_usage": True},
                                                   extra_body={"ignore_eos": True}, max_tokens=LONG["max_tokens"],
                                                   temperature=0, messages=LONG["messages"])
                for chunk in stream:
                    if chunk.usage is not None:
                        self.usage = chunk.usage
                    for choice in chunk.choices:
                        self.text += choice.delta.content or ""
                        self.tokens_seen += 1
                        self.finish = choice.finish_reason or self.finish
        except Exception as err:  # recorded and asserted on: a broken stream is the failure under test
            self.error = f"{type(err).__name__}: {err}"


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


def test_a_killed_engine_costs_no_request_sent_after_the_first_seconds(tmp_path):
    config = base_config(free_port())
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
            bound = [set(os.sched_getaffinity(p.pid)) for p in psutil.Process(svc.proc.pid).children(recursive=True)
                     if "VLLM::Worker" in p.name()]
            assert len(bound) == 2 and not bound[0] & bound[1], bound
        with openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=300) as c:
            reference = c.chat.completions.create(model=MODEL, extra_body={"ignore_eos": True},
                                                  **{k: v for k, v in LONG.items() if k != "ignore_eos"})
        with SteadyLoad(svc.base_url, API_KEY, MODEL, plain=4, streaming=2) as load:
            load.wait_served(10, what="steady load served")
            streams = [LongStream(svc.base_url) for _ in range(STREAMS)]
            for s in streams:
                s.start()
            wait_until(lambda: all(s.tokens_seen >= 3 for s in streams), timeout_s=300, interval_s=0.2,
                       what="every long stream under way")
            killed_at = time.monotonic()
            cores[0].kill()
            for s in streams:
                s.join(timeout=600)
            wait_until(lambda: len(engine_cores(svc)) == 2 and cores[0] not in engine_cores(svc), timeout_s=300,
                       interval_s=1, what="a new engine in place of the killed one")
            load.wait_served(10, what="the load served with both engines again")
        migrated = _migrated(svc.base_url)
    same = sum(s.text == reference.choices[0].message.content for s in streams)
    print(f"around the kill: {load.summary(killed_at)}; long greedy streams: {STREAMS} whole, {same} identical "
          f"to the uninterrupted answer; choices resumed on the other replica: {migrated:g}")
    assert not load.failures(), load.summary()
    assert len(load.since(killed_at)) >= 10
    for s in streams:
        assert s.error is None, s.error
        assert s.finish == "length" and s.usage is not None, (s.finish, s.usage)
        assert s.usage.completion_tokens == LONG["max_tokens"], s.usage  # counted over the whole answer
        assert s.usage.prompt_tokens == reference.usage.prompt_tokens  # the prompt once, not the continuation's
    assert migrated >= 1, "no stream was on the killed engine: the test proved nothing about moving one"
