"""Admission by time: with the engine's pace measured, a request that would miss its first-token target is
refused at arrival (429 `over_time_target`, Retry-After the predicted excess); one that can meet it is
admitted; the client can tighten the target by header, and the openai SDK's timeout header counts."""

from __future__ import annotations

import asyncio
import math
import time
import types

import pytest

from app.engine.fake import FakeEngine
from app.errors import NeverInTime, OverTimeTarget, QueueFull
from app.host import admission as admission_module
from app.host.admission import Admission, Targets, Ticket
from app.host.pace import EnginePace
from app.tenancy import Tenant
from tests.support.fake_stack import Stack, chat_body, make_config
from tests.support.waiting import until

TOKEN_S = 0.02  # the fake engine's time per token


def _paced(step_s: float = 0.1) -> EnginePace:
    pace = EnginePace()
    for backlog in (10, 50, 100, 200, 400):
        for batch in (1, 2):
            pace.first_token(backlog, batch, 0.01 * batch + backlog * 0.001)
            pace.decoded(batch, 1, step_s)
    return pace


async def test_a_request_predicted_past_its_target_is_refused_at_arrival_with_the_excess_as_retry_after():
    admission = Admission(max_running=1, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=_paced())
    running = admission.reserve()
    await running.admit(110, 30, prompt_tokens=10, max_steps=100)
    running.produced(1)  # its first token: 99 steps of 0.1 s left, about 9.9 s
    late = admission.reserve()
    with pytest.raises(OverTimeTarget) as refused:
        await late.admit(20, 30, Targets(first_token_s=2.0), prompt_tokens=10, max_steps=10)
    late.release()
    predicted = admission.stats().predicted_first_token_s
    assert predicted is not None and predicted > 9.5
    assert refused.value.retry_after_s == math.ceil(predicted - 2.0)
    assert admission.stats().refused_over_time_target == 1
    assert admission.stats().in_system == 1  # the refused one holds nothing


async def test_a_full_replica_counts_a_burst_still_tokenizing_in_its_retry_after():
    """A burst's places are reserved before its prompts are tokenized; once admitted they fill the free slots, but the
    predictor cannot see them yet, so a refusal meanwhile said 1 s (150 clients at once: 32 then ran 18 s more). It
    now says the mean time a request spends in the engine."""
    admission = Admission(max_running=2, max_queued=1, token_budget=10_000, queue_timeout_s=30, pace=_paced())
    admission._mean_run_s = 12.0  # as after requests of 12 s
    assert admission.retry_after_s() == 1.0  # empty: a place is free now
    assert admission.retry_after_s(arriving=2) == 12.0  # as a full front door says, its requests not here yet
    running = admission.reserve()
    await running.admit(20, 30, prompt_tokens=10, max_steps=10)
    burst = [admission.reserve(), admission.reserve()]  # still tokenizing: one free slot, two about to want it
    with pytest.raises(QueueFull) as refused:
        admission.reserve()
    assert refused.value.retry_after_s == 12.0
    await burst[0].admit(20, 30, prompt_tokens=10, max_steps=10)  # both slots taken, seen by the predictor again
    assert admission.retry_after_s() < 12.0
    for ticket in (running, *burst):
        ticket.release()


async def test_retry_after_for_a_late_request_is_capped_at_a_minute():
    """Issue 27: cold-start predictions of 273 s were sent as Retry-After: 273."""
    admission = Admission(max_running=1, max_queued=4, token_budget=10_000, queue_timeout_s=600,
                          pace=_paced(step_s=1.0))
    running = admission.reserve()
    await running.admit(1010, 600, prompt_tokens=10, max_steps=1000)
    running.produced(1)  # 999 steps of 1 s left
    late = admission.reserve()
    with pytest.raises(OverTimeTarget) as refused:
        await late.admit(20, 600, Targets(first_token_s=2.0), prompt_tokens=10, max_steps=10)
    late.release()
    assert admission.stats().predicted_first_token_s > 900
    assert refused.value.retry_after_s == 60 and refused.value.headers()["Retry-After"] == "60"


async def test_a_request_that_misses_its_target_even_alone_is_told_so_without_a_retry_after():
    admission = Admission(max_running=2, max_queued=4, token_budget=10_000, queue_timeout_s=30,
                          pace=_paced(step_s=1.0))
    running = admission.reserve()
    await running.admit(20, 30, prompt_tokens=10, max_steps=10)
    hopeless = admission.reserve()
    with pytest.raises(NeverInTime) as refused:  # 50 steps of 1 s can never end within 5 s
        await hopeless.admit(60, 30, Targets(finish_s=5.0), prompt_tokens=10, max_steps=50)
    hopeless.release()
    assert refused.value.retry_after_s is None and "Retry-After" not in refused.value.headers()
    assert "even with this replica to itself" in refused.value.message and refused.value.status == 429


async def test_a_request_that_can_meet_its_target_waits_for_its_slot_and_gets_it():
    admission = Admission(max_running=1, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=_paced())
    running = admission.reserve()
    await running.admit(110, 30, prompt_tokens=10, max_steps=100)
    running.produced(1)
    patient = admission.reserve()
    waiting = asyncio.create_task(patient.admit(20, 30, Targets(first_token_s=60.0), prompt_tokens=10, max_steps=10))
    await asyncio.sleep(0)
    assert admission.stats().waiting == 1
    running.release()
    await asyncio.wait_for(waiting, 5)
    assert admission.stats().running == 1
    patient.release()


async def test_the_decision_follows_a_change_of_engine_speed():
    pace = _paced(step_s=0.1)
    admission = Admission(max_running=1, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=pace)
    running = admission.reserve()
    await running.admit(110, 30, prompt_tokens=10, max_steps=100)
    running.produced(1)
    for _ in range(300):  # the engine is now ten times faster: 99 steps left take about 1 s
        pace.decoded(1, 1, 0.01)
    fits = admission.reserve()
    waiting = asyncio.create_task(fits.admit(20, 30, Targets(first_token_s=2.0), prompt_tokens=10, max_steps=10))
    await asyncio.sleep(0)
    assert admission.stats().refused_over_time_target == 0 and admission.stats().waiting == 1
    running.release()
    await asyncio.wait_for(waiting, 5)
    fits.release()


async def test_without_a_measured_pace_nothing_is_refused_by_time():
    admission = Admission(max_running=1, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=EnginePace())
    running = admission.reserve()
    await running.admit(110, 30, prompt_tokens=10, max_steps=100)
    queued = admission.reserve()
    waiting = asyncio.create_task(queued.admit(20, 30, Targets(first_token_s=0.001), prompt_tokens=10, max_steps=10))
    await asyncio.sleep(0)
    assert admission.stats().waiting == 1
    running.release()
    await asyncio.wait_for(waiting, 5)
    queued.release()


# -- through HTTP, with a fake engine that takes TOKEN_S a token ------------------------------------------


@pytest.fixture
async def stack():
    config = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 8, "ttft_target_s": 30,
                                     "queue_timeout_s": 60},
                         limits={"max_tokens": 200})
    s = Stack(config, FakeEngine(token_delay_s=TOKEN_S))
    try:
        for _ in range(6):  # measure the pace: a few requests, one at a time
            assert (await s.client.post("/v1/chat/completions", json=chat_body(max_tokens=4))).status_code == 200
        yield s
    finally:
        await s.aclose()


async def _occupy(stack: Stack) -> asyncio.Task:
    """A long request (200 tokens: some 4 s) holding the only slot."""
    task = asyncio.create_task(stack.client.post(
        "/v1/chat/completions", json=chat_body(max_tokens=200, ignore_eos=True), timeout=30))
    await stack.engine.wait_running(1)
    await asyncio.sleep(5 * TOKEN_S)  # a few tokens in: the pace has its first output
    return task


async def test_a_tight_target_by_header_is_refused_at_once_and_says_when_to_retry(stack):
    occupant = await _occupy(stack)
    r = await stack.client.post("/v1/chat/completions", json=chat_body(max_tokens=4),
                                headers={"X-TTFT-Target-S": "0.5"})
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "over_time_target"
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["x-should-retry"] == "false"  # the openai SDKs then leave the retry to the client's code
    assert stack.engine.running == {next(iter(stack.engine.running))}  # only the occupant ran
    assert (await occupant).status_code == 200


async def test_the_sdk_timeout_header_counts_as_the_clients_target(stack):
    occupant = await _occupy(stack)
    r = await stack.client.post("/v1/chat/completions", json=chat_body(max_tokens=4),
                                headers={"X-Stainless-Read-Timeout": "0.5"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "over_time_target", r.text
    assert (await occupant).status_code == 200


async def test_a_loose_target_waits_its_turn_and_is_served(stack):
    occupant = await _occupy(stack)
    r = await stack.client.post("/v1/chat/completions", json=chat_body(max_tokens=4),
                                headers={"X-TTFT-Target-S": "25"}, timeout=30)
    assert r.status_code == 200, r.text
    assert (await occupant).status_code == 200


@pytest.mark.parametrize("value", ["soon", "-1", "0", "nan", "inf"])
async def test_a_bad_target_header_is_a_400_naming_it(stack, value):
    r = await stack.client.post("/v1/chat/completions", json=chat_body(max_tokens=4),
                                headers={"X-TTFT-Target-S": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-ttft-target-s", r.text


async def test_stats_and_metrics_show_the_measured_pace_and_the_refusals(stack):
    occupant = await _occupy(stack)
    await stack.client.post("/v1/chat/completions", json=chat_body(max_tokens=4), headers={"X-TTFT-Target-S": "0.5"})
    await occupant
    metrics = (await stack.client.get("/metrics")).text
    assert 'app_refused_over_time_target_total{model_name="fake-model",replica="local"} 1.0' in metrics
    assert "app_decode_seconds_per_token" in metrics and "app_predicted_time_to_first_token_seconds" in metrics
    replica = (await stack.client.get("/stats")).json()["fake-model"]
    assert replica["admission"]["refused_over_time_target"] == 1
    assert replica["admission"]["predicted_first_token_s"] > 1  # the occupant's ~4 s of tokens were ahead
    assert replica["pace"]["decode_s_per_token"] >= TOKEN_S * 0.5  # the fake's own pace, or slower on a busy machine
    assert replica["pace"]["samples"] >= 6


async def test_a_request_that_would_wait_out_the_queue_timeout_is_refused_at_arrival():
    admission = Admission(max_running=1, max_queued=4, token_budget=10_000, queue_timeout_s=3, pace=_paced())
    running = admission.reserve()
    await running.admit(110, 30, prompt_tokens=10, max_steps=100)
    running.produced(1)  # ~9.9 s of tokens left: longer than the 3 s queue timeout
    late = admission.reserve()
    with pytest.raises(OverTimeTarget) as refused:
        await late.admit(20, 30, Targets(first_token_s=60), prompt_tokens=10, max_steps=10)  # a loose target
    late.release()
    assert "queue timeout" in refused.value.message and refused.value.retry_after_s >= 6
    without = admission.reserve()  # with no target at all, admission is by count alone: it queues
    waiting = asyncio.create_task(without.admit(20, 30, Targets(), prompt_tokens=10, max_steps=10))
    await asyncio.sleep(0)
    assert admission.stats().waiting == 1
    waiting.cancel()
    without.release()


async def test_a_request_cut_short_does_not_teach_the_pace_a_short_output():
    pace = _paced()
    admission = Admission(max_running=2, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=pace)
    for completed in (False, False, False, True):
        ticket = admission.reserve()
        await ticket.admit(110, 30, prompt_tokens=10, max_steps=100)
        ticket.produced(1)
        ticket.produced(9 if not completed else 99)  # the hung-up ones stopped at 10 of 100
        ticket.release(completed=completed)
    assert pace.stats(1, max_running=32).output_share == 1.0


async def test_a_full_queue_says_to_retry_when_the_pace_predicts_a_place_frees():
    """One estimator for both refusals: `queue_full`'s Retry-After is the predicted earliest end of what runs."""
    admission = Admission(max_running=1, max_queued=1, token_budget=10_000, queue_timeout_s=60, pace=_paced())
    running = admission.reserve()
    await running.admit(110, 60, prompt_tokens=10, max_steps=100)
    running.produced(1)  # 99 steps of 0.1 s left: about 9.9 s, times the measured lateness
    queued = admission.reserve()
    waiting = asyncio.create_task(queued.admit(20, 60, prompt_tokens=10, max_steps=10))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull) as refused:
        admission.reserve()
    assert 9 <= refused.value.retry_after_s <= 60  # not the count-based guess (1 s: no run measured yet)
    running.release()
    await asyncio.wait_for(waiting, 5)
    queued.release()


async def test_an_idle_engine_admits_whatever_its_model_predicts_so_the_model_can_learn():
    """A pace fitted on slow samples (a cold start, long continued prompts) predicts every request late; refused
    everything, it would never see the engine is fast again. Idle (nothing running or queued), it admits; busy,
    the same prediction refuses."""
    pessimist = EnginePace()
    for backlog in (10, 50, 100, 200):
        pessimist.first_token(backlog, 1, 20.0)
        pessimist.decoded(1, 1, 0.5)
    admission = Admission(max_running=2, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=pessimist)
    first = admission.reserve()
    await first.admit(20, 30, Targets(first_token_s=10.0), prompt_tokens=10, max_steps=10)  # idle: admitted
    assert admission.stats().predicted_first_token_s > 10.0
    second = admission.reserve()
    with pytest.raises(OverTimeTarget):
        await second.admit(20, 30, Targets(first_token_s=10.0), prompt_tokens=10, max_steps=10)
    second.release()
    first.release()


async def test_requests_queued_before_the_pace_was_measured_are_refused_once_it_is_if_they_would_be_late():
    """A fresh replica's first burst is admitted by count alone (nothing measured yet). The first token that makes
    the pace measured checks the queue again: a queued request now predicted past its target is refused then,
    with Retry-After the predicted excess, instead of waiting out the queue timeout; one that can still make its
    target keeps its place."""
    pace = EnginePace()
    for backlog in (10, 50, 100):  # three first tokens measured: one short of a prediction
        pace.first_token(backlog, 1, 0.01 + backlog * 0.001)
        pace.decoded(1, 1, 0.1)
    admission = Admission(max_running=1, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=pace)
    running = admission.reserve()
    await running.admit(110, 30, Targets(first_token_s=2.0), prompt_tokens=10, max_steps=100)
    hurried, patient = admission.reserve(), admission.reserve()
    late = asyncio.create_task(hurried.admit(20, 30, Targets(first_token_s=2.0), prompt_tokens=10, max_steps=10))
    fine = asyncio.create_task(patient.admit(20, 30, Targets(first_token_s=60.0), prompt_tokens=10, max_steps=10))
    await asyncio.sleep(0)
    assert admission.stats().waiting == 2 and admission.stats().refused_over_time_target == 0  # by count alone
    running.produced(1)  # the fourth first token: the pace is measured; 99 steps of 0.1 s are left ahead of both
    with pytest.raises(OverTimeTarget) as refused:
        await asyncio.wait_for(late, 5)
    assert "in the queue" in refused.value.message and 7 <= refused.value.retry_after_s <= 10
    hurried.release()
    assert admission.stats().waiting == 1 and admission.stats().in_system == 2
    running.release()
    await asyncio.wait_for(fine, 5)
    assert admission.stats().running == 1
    patient.release()
    assert admission.stats().in_system == 0


async def test_a_first_batch_is_judged_only_once_its_prefill_is_done():
    """The first batch's decode steps, taken while its other prompts prefill, are left out of the pace; the queue
    queued by count alone is judged at the first decode step taken with no prompt prefilling, on that step's pace
    (it was judged at the fourth first token, on 2.81 s a token, and every one said Retry-After: 60)."""
    admission = Admission(max_running=2, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=EnginePace())
    for backlog in (10, 20, 30):
        admission.pace.first_token(backlog, 2, 0.01)  # three first tokens measured: one short of a prediction
    first, second = admission.reserve(), admission.reserve()
    await first.admit(20, 30, prompt_tokens=10, max_steps=10)
    await second.admit(20, 30, prompt_tokens=10, max_steps=10)
    hurried = admission.reserve()
    late = asyncio.create_task(hurried.admit(20, 30, Targets(first_token_s=5.0), prompt_tokens=10, max_steps=10))
    await asyncio.sleep(0)
    first.produced(1)  # the fourth first token, while the second prompt still prefills
    await asyncio.sleep(0.5)
    first.produced(1)  # a decode step of 0.5 s beside that prefill: not learnt from, so nothing is judged yet
    assert not admission.pace.ready and admission.stats().waiting == 1
    second.produced(1)  # its first token: nothing prefills now
    await asyncio.sleep(0.02)
    first.produced(1)  # a clean step, about 0.02 s a token: the 7 steps ahead of `hurried` take well under 5 s
    assert admission.pace.ready
    await asyncio.sleep(0)
    assert not late.done() and admission.stats().refused_over_time_target == 0  # judged, and in time
    first.release()
    await asyncio.wait_for(late, 5)
    for ticket in (second, hurried):
        ticket.release()
    assert admission.stats().in_system == 0


async def test_a_queued_request_is_checked_again_only_against_the_queue_timeout(monkeypatch):
    """Once admitted to the queue by a measured pace, a request is not judged against its target again (a burst's
    own first tokens slow the decode samples for a moment), but it is refused as soon as it is predicted to wait
    out the queue timeout, not when the timeout ends."""
    monkeypatch.setattr("app.host.admission.SWEEP_EVERY_S", 0.0)
    pace = _paced(step_s=0.1)
    admission = Admission(max_running=3, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=pace)
    a, c, d = admission.reserve(), admission.reserve(), admission.reserve()
    for ticket in (a, c, d):
        await ticket.admit(110, 60, prompt_tokens=10, max_steps=100)
    a.produced(1)
    b = admission.reserve()
    queued = asyncio.create_task(b.admit(20, 60, Targets(first_token_s=12.0), prompt_tokens=10, max_steps=10))
    await asyncio.sleep(0)
    assert admission.stats().waiting == 1  # ~9.9 s ahead of it: in time at arrival
    for _ in range(300):
        pace.decoded(3, 1, 0.2)  # twice as slow: its first token now ~20 s away, past 12 s; its start within 30 s
    c.produced(1)  # a first token: the queue is checked again
    await asyncio.sleep(0)
    assert admission.stats().waiting == 1 and not queued.done()
    for _ in range(300):
        pace.decoded(3, 1, 0.5)  # five times as slow: its start ~50 s away, past the 30 s queue timeout
    d.produced(1)
    with pytest.raises(OverTimeTarget) as refused:
        await asyncio.wait_for(queued, 5)
    assert "queue timeout" in refused.value.message and refused.value.retry_after_s >= 10
    b.release()
    for ticket in (a, c, d):
        ticket.release()
    assert admission.stats().in_system == 0


# -- before rendering and tokenizing (issue 28's refusal storm: tokenizing was most of a refusal's cost) -----------


async def test_what_even_the_least_request_would_miss_is_refused_before_any_work():
    admission = Admission(max_running=1, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=_paced())
    running = admission.reserve()
    await running.admit(110, 30, prompt_tokens=10, max_steps=100)
    running.produced(1)  # 99 steps of 0.1 s left: even one prompt token and one output waits some 9.9 s
    with pytest.raises(OverTimeTarget) as refused:
        admission.refuse_if_full(Tenant("t"), Targets(first_token_s=2.0), max_steps=10)
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 7
    assert admission.stats().refused_over_time_target == 1 and admission.stats().in_system == 1  # it holds nothing
    admission.refuse_if_full(Tenant("t"), Targets(first_token_s=60.0))  # a target it can meet
    admission.refuse_if_full(Tenant("t"))  # no target: by count alone
    assert admission.stats().refused_over_time_target == 1


async def test_an_idle_replica_refuses_nothing_by_time_before_tokenizing():
    admission = Admission(max_running=1, max_queued=4, token_budget=10_000, queue_timeout_s=30,
                          pace=_paced(step_s=1.0))
    admission.refuse_if_full(Tenant("t"), Targets(first_token_s=0.001))  # nothing to wait behind: its model learns
    assert admission.stats().refused_over_time_target == 0


async def test_a_request_refused_by_time_is_never_rendered_or_tokenized(stack):
    occupant = await _occupy(stack)
    rendered = []
    render_chat = stack.engine.render_chat
    stack.engine.render_chat = lambda *a, **kw: rendered.append(1) or render_chat(*a, **kw)  # type: ignore[method-assign]
    r = await stack.client.post("/v1/chat/completions", json=chat_body(max_tokens=4),
                                headers={"X-TTFT-Target-S": "0.5"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "over_time_target", r.text
    assert int(r.headers["retry-after"]) >= 1
    assert rendered == []  # refused before the chat template and the tokenizer
    r = await stack.client.post("/v1/chat/completions", json=chat_body(max_tokens=4),
                                headers={"X-TTFT-Target-S": "25"}, timeout=30)
    assert r.status_code == 200 and rendered == [1], r.text  # one it can serve is rendered as ever
    assert (await occupant).status_code == 200


@pytest.mark.parametrize("by_class", [False, True])
async def test_an_interactive_arrival_is_not_predicted_behind_batch_prompts_the_engine_prefills_after_it(by_class):
    """At a batch flood's start its prompts are still prefilling. Under vLLM's priority scheduling (`by_class`) the
    engine takes an interactive prompt before them, so it is not predicted behind their prefill, nor is that prefill
    counted as its backlog when the pace learns from its first token; with first come, first served it is both."""
    admission = Admission(max_running=8, max_queued=8, token_budget=100_000, queue_timeout_s=30, pace=_paced(),
                          by_class=by_class)
    batch, interactive = Tenant("flood", batch=True), Tenant("chat")
    flood = [admission.reserve(batch) for _ in range(6)]
    for ticket in flood:
        await ticket.admit(2_010, 30, prompt_tokens=2_000, max_steps=10)  # no output yet: all prefilling
    chat = admission.reserve(interactive)
    if not by_class:  # behind 12,000 tokens of prefill at 1 ms each
        with pytest.raises(OverTimeTarget):
            await chat.admit(110, 30, Targets(first_token_s=5.0), prompt_tokens=100, max_steps=10)
        chat.release()
        return
    await chat.admit(110, 30, Targets(first_token_s=5.0), prompt_tokens=100, max_steps=10)
    predicted = admission.stats().predicted_first_token_s
    assert predicted is not None and predicted < 1.0  # its own 100 tokens and the batch it joins
    assert chat.backlog == 100  # what the pace learns its first token against
    late_batch = admission.reserve(batch)
    await late_batch.admit(2_010, 30, prompt_tokens=2_000, max_steps=10)
    assert late_batch.backlog == 7 * 2_000 + 100  # a batch prompt waits for every prompt before it
    for ticket in (*flood, chat, late_batch):
        ticket.release()


async def test_a_waiting_request_a_running_one_gives_way_to_is_not_refused_for_the_ends_the_sweep_predicts():
    """The queue's sweep predicts each waiting request's start at the running ones' ends. An interactive request behind
    a batch flood holding every slot was refused for a start predicted 143 s away, past the 30 s queue timeout (the
    Xeon's prio run of 2026-12-06 11:02, docs/tenants.md), though a batch request gives it its slot at its next output.
    """
    admission = Admission(max_running=2, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=_paced(1.0))
    flood = [admission.reserve(Tenant("flood", batch=True)) for _ in range(2)]
    for ticket in flood:
        ticket.pausable = True
        await ticket.admit(1_010, 30, prompt_tokens=10, max_steps=1_000)  # 1,000 tokens of 1 s: ends far past 30 s
        ticket.produced(1)
    chat = admission.reserve(Tenant("chat"))
    admitted = asyncio.create_task(chat.admit(20, 30, Targets(first_token_s=10.0), prompt_tokens=10, max_steps=10))
    await until(lambda: chat.state == "waiting", what="the chat queued behind the flood")
    admission._sweep(time.monotonic(), judged=True)  # as on the flood's next first token
    await asyncio.sleep(0)
    assert not admitted.done() and admission.stats().refused_over_time_target == 0
    victim = next(t for t in flood if t.yield_asked)
    paused = asyncio.create_task(victim.pause(30))
    await admitted  # in the slot the batch request gave back
    assert chat.state == "running"
    for ticket in (chat, *flood):
        ticket.release()
    await paused


@pytest.mark.parametrize("newcomer_first", [True, False])
async def test_a_decode_step_is_learnt_only_when_no_prompt_was_prefilled_in_it(newcomer_first, monkeypatch):
    """The outputs of one engine step reach admission one after another. A stream's step that also prefilled a
    newcomer's prompt is left out of the decode pace whichever output came first; the next step, with nothing to
    prefill, is learnt (a first output in the earlier half of a stream's interval ended the step before it). On the
    admission's own clock, stepped here: with real sleeps a pause of the test process between two outputs of one
    step longer than half a step flaked it once on a loaded machine."""
    learnt: list[float] = []
    pace = _paced()
    monkeypatch.setattr(pace, "decoded", lambda batch, tokens, seconds, max_running=0, prefilling=False:
                        None if prefilling else learnt.append(seconds))
    clock = [1_000.0]
    monkeypatch.setattr(admission_module, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    def step(*tickets: Ticket) -> None:  # one engine step of 50 ms; its outputs 1 ms apart
        clock[0] += 0.05
        for ticket in tickets:
            ticket.produced(1)
            clock[0] += 0.001

    admission = Admission(max_running=4, max_queued=4, token_budget=10_000, queue_timeout_s=30, pace=pace)
    running = admission.reserve()
    await running.admit(20, 30, prompt_tokens=10, max_steps=10)
    step(running)  # its first token
    step(running)  # a clean step
    assert len(learnt) == 1
    newcomer = admission.reserve()
    await newcomer.admit(20, 30, prompt_tokens=10, max_steps=10)
    step(*((newcomer, running) if newcomer_first else (running, newcomer)))  # the step that prefilled its prompt
    assert len(learnt) == 1
    step(running)  # the next step: decode alone
    assert len(learnt) == 2
    for ticket in (running, newcomer):
        ticket.release()


async def test_requests_of_n_4_filling_the_engine_s_sequences_make_a_newcomer_wait_for_their_ends():
    """8 requests of n 4 (1,000 tokens each) hold all 32 engine sequences: an arrival is predicted behind their ends
    and refused by time, not queued as if 24 places were free (the hostile run's non-readers, docs/tenants.md)."""
    admission = Admission(max_running=32, max_queued=64, token_budget=10**6, queue_timeout_s=30, pace=_paced(0.05))
    holders = [admission.reserve() for _ in range(8)]
    for ticket in holders:
        await ticket.admit(10 + 4 * 1_000, 30, Targets(first_token_s=10.0), prompt_tokens=10, max_steps=1_000)
        ticket.produced(1)
    assert admission.stats().running == 8
    newcomer = admission.reserve()
    with pytest.raises(OverTimeTarget):
        await newcomer.admit(10 + 16, 30, Targets(first_token_s=10.0), prompt_tokens=10, max_steps=16)
    newcomer.release()
    for ticket in holders:
        ticket.release()
    assert admission.stats().in_system == 0
