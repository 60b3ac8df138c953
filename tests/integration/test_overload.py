"""Overload turns into queueing and fast, honest refusals; afterwards nothing is left running."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from loadkit.overload.client import one_request
from loadkit.proctree import ProcessTree
from loadkit.server_stats import get_stats, wait_idle
from loadkit.workload import Ask, PromptMaker
from tests.support.service import MAX_ONGOING, MAX_QUEUED, MODEL
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]

# Long enough to hold its slot for seconds on a fast CPU; short enough that the queued ones are not predicted to wait
# past the queue timeout (60 s) on a slow one, and refused by time instead of queued (float32 on a 2-core Xeon: 400
# tokens were).
LONG = {"model": MODEL, "messages": [{"role": "user", "content": "Count slowly."}], "max_tokens": 150,
        "ignore_eos": True, "temperature": 0, "stream": True}


async def _hold_stream(client: httpx.AsyncClient, started: asyncio.Event, release: asyncio.Event) -> int:
    """A long stream, read as it comes (a client that stops reading gives its slot back: app/host/pauses.py), until
    told to hang up or it ends."""
    async with client.stream("POST", "/v1/chat/completions", json=LONG) as r:
        started.set()
        if r.status_code == 200:
            async for _ in r.aiter_bytes():
                if release.is_set():
                    break
        return r.status_code


async def test_full_queue_refuses_at_once_with_retry_after(service, async_client):
    capacity = MAX_ONGOING + MAX_QUEUED
    release = asyncio.Event()
    async with httpx.AsyncClient(base_url=service.base_url, headers=service.headers, timeout=120) as client:
        holders = []
        for _ in range(capacity):
            started = asyncio.Event()
            holders.append(asyncio.create_task(_hold_stream(client, started, release)))
            await asyncio.sleep(0.05)
        # The queued ones have no status yet (the 200 waits for admission); wait for the replica to hold them all,
        # each in its place. A request counts in `in_system` from its capacity check, and joins `waiting` only once
        # its prompt is tokenized: a CI run on a loaded 2-core host saw in_system 8 with waiting still 0.
        deadline = time.monotonic() + 60
        while True:
            admission = (await asyncio.to_thread(service.stats))["admission"]
            if admission["running"] == MAX_ONGOING and admission["waiting"] == MAX_QUEUED:
                break
            assert time.monotonic() < deadline, f"the service never held the full capacity: {admission}"
            await asyncio.sleep(0.2)

        t0 = time.monotonic()
        refused = await client.post("/v1/chat/completions", json={**LONG, "stream": False, "max_tokens": 5})
        refusal_s = time.monotonic() - t0
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "queue_full"
        print(f"refusal answered in {refusal_s * 1000:.1f} ms")
        with pytest.raises(openai.RateLimitError) as err:
            await async_client.chat.completions.create(model=MODEL, messages=LONG["messages"], max_tokens=5)
        assert int(err.value.response.headers["retry-after"]) >= 1

        release.set()  # every holder hangs up
        statuses = await asyncio.gather(*holders)
        assert statuses.count(200) == capacity
    idle = service.wait_idle(timeout_s=30)
    assert idle["engine"]["running"] == 0 and idle["admission"]["in_system"] == 0, idle


async def test_the_overload_drivers_client_and_process_tree_read_the_real_service(service):
    """loadkit's overload pieces against the real stack: its client classifies a refusal as the driver counts it,
    its /stats reader sees the full queue, and its process tree finds the engine."""
    capacity = MAX_ONGOING + MAX_QUEUED
    release = asyncio.Event()
    async with httpx.AsyncClient(base_url=service.base_url, headers=service.headers, timeout=120) as client:
        prompts = PromptMaker()
        await prompts.calibrate(client, MODEL)
        assert prompts.base > 0 and prompts.per_word > 0
        holders = [asyncio.create_task(_hold_stream(client, asyncio.Event(), release)) for _ in range(capacity)]
        deadline = time.monotonic() + 60
        while (await get_stats(client, MODEL)).in_system < capacity:
            assert time.monotonic() < deadline, "the service never held the full capacity"
            await asyncio.sleep(0.2)
        refused = await one_request(client, MODEL, prompts, Ask(0, 60, 8, False, False, 0, 0), hung_after_s=60)
        # On a connection of its own: one that was just refused holds its next request to the refusal's Retry-After
        # (app/http/retry_pacing.py), by when the holders' streams may have ended and made room.
        async with httpx.AsyncClient(base_url=service.base_url, headers=service.headers, timeout=120) as other:
            streamed = await one_request(other, MODEL, prompts, Ask(1, 60, 8, True, False, 0, 0), hung_after_s=60)
        release.set()
        await asyncio.gather(*holders)
        idle = await wait_idle(client, MODEL, timeout_s=30)
    assert refused.outcome == "refused" and refused.code == "queue_full" and refused.retry_after >= 1, refused
    assert streamed.outcome == "refused", streamed  # refused before the stream starts: a status, not an SSE event
    assert idle.reached, idle
    # A fresh look each time (a process's role is read once, when first seen): one CI run found no EngineCore in
    # the tree while the service log shows the same one alive throughout (cause not found).
    found = wait_until(lambda: ProcessTree(service.proc.pid).engine_pids(), timeout_s=30, interval_s=1,
                       what="the engine's EngineCore in the service's process tree")
    assert found
    assert ProcessTree(service.proc.pid).rss().total > 2**30


def test_service_answers_normally_after_overload(service, client):
    r = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=20,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in r.choices[0].message.content
    stats = service.wait_idle()
    assert stats["admission"]["in_system"] == 0
    metrics = httpx.get(f"{service.base_url}/metrics").text
    refused = [line for line in metrics.splitlines()
               if line.startswith("app_refusals_total") and 'reason="queue_full"' in line]
    assert refused and sum(float(line.rsplit(" ", 1)[1]) for line in refused) >= 2  # the refusals above were counted
