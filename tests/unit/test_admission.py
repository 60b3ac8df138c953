"""Admission: a bounded FIFO with a token budget in front of the engine."""

from __future__ import annotations

import asyncio

import pytest

from app.errors import QueueFull, QueueFullUnavailable, QueueTimeout, ServiceUnavailable
from app.host.admission import Admission
from tests.support.waiting import until


def make(max_running=1, max_queued=4, token_budget=1000, queue_timeout_s=5.0, **kw) -> Admission:
    return Admission(max_running=max_running, max_queued=max_queued, token_budget=token_budget,
                     queue_timeout_s=queue_timeout_s, **kw)


async def queued(adm: Admission, waiting: int) -> None:
    """Until `waiting` tickets wait in the queue: their tasks have run into `admit` and block there."""
    await until(lambda: adm.stats().waiting == waiting, what=f"{waiting} ticket(s) waiting")


async def admitted(adm: Admission, tokens: int = 1):
    ticket = adm.reserve()
    await ticket.admit(tokens, timeout_s=5)
    return ticket


def waiter(adm: Admission, tokens: int, order: list, name: str, timeout_s: float = 5) -> tuple:
    ticket = adm.reserve()

    async def run():
        await ticket.admit(tokens, timeout_s)
        order.append(name)

    return ticket, asyncio.create_task(run())


async def test_fifo_order():
    adm = make(max_running=1, max_queued=5)
    first = await admitted(adm)
    order: list[str] = []
    waiters = [waiter(adm, 1, order, name) for name in "abcd"]
    await queued(adm, 4)
    assert order == []
    for expected, (ticket, task) in zip("abcd", waiters, strict=True):
        first.release()
        await task
        assert order[-1] == expected
        first = ticket
    first.release()
    assert order == list("abcd")
    assert adm.stats().in_system == 0


async def test_small_request_does_not_jump_the_queue():
    adm = make(max_running=4, token_budget=100)
    big_running = await admitted(adm, 60)
    order: list[str] = []
    big, big_task = waiter(adm, 50, order, "big")
    small, small_task = waiter(adm, 10, order, "small")  # would fit now, but "big" is ahead of it
    await queued(adm, 2)
    assert order == []
    big_running.release()
    await asyncio.gather(big_task, small_task)
    assert order == ["big", "small"]
    for t in (big, small):
        t.release()
    assert adm.stats().in_system == 0


@pytest.mark.parametrize("refusal, status", [(QueueFull, 429), (QueueFullUnavailable, 503)])
async def test_refusal_when_full(refusal, status):
    adm = make(max_running=1, max_queued=1, refusal=refusal)
    running = await admitted(adm)
    queued = adm.reserve()
    with pytest.raises(QueueFull) as info:
        adm.reserve()
    assert type(info.value) is refusal
    assert info.value.status == status
    assert info.value.retry_after_s is not None and 1 <= info.value.retry_after_s <= 60
    assert "Retry-After" in info.value.headers()
    assert adm.stats().refused_queue_full == 1
    assert adm.stats().in_system == 2  # the refused one took nothing
    queued.release()
    adm.reserve().release()  # room again
    running.release()
    assert adm.stats().in_system == 0


async def test_queue_timeout_frees_the_slot():
    adm = make(max_running=1, max_queued=1, queue_timeout_s=0.05)
    running = await admitted(adm)
    ticket = adm.reserve()
    with pytest.raises(QueueTimeout) as info:
        try:
            await ticket.admit(1, timeout_s=10)  # the replica's queue timeout (shorter) wins
        finally:
            ticket.release()
    assert info.value.retry_after_s is not None
    stats = adm.stats()
    assert (stats.in_system, stats.waiting, stats.running, stats.refused_queue_timeout) == (1, 0, 1, 1)
    again = adm.reserve()  # would be refused if the timed-out request still held its place
    running.release()
    await again.admit(1, timeout_s=1)
    assert adm.stats().running == 1
    again.release()
    assert adm.stats().in_system == 0


async def test_request_timeout_shorter_than_queue_timeout_wins():
    adm = make(max_running=1, queue_timeout_s=30)
    running = await admitted(adm)
    ticket = adm.reserve()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(QueueTimeout):
        await ticket.admit(1, timeout_s=0.05)
    assert loop.time() - started < 1
    ticket.release()
    running.release()
    assert adm.stats().in_system == 0


async def test_token_budget_waits_until_tokens_freed():
    adm = make(max_running=10, token_budget=100)
    a = await admitted(adm, 70)
    order: list[str] = []
    b, b_task = waiter(adm, 50, order, "b")
    await queued(adm, 1)
    assert order == [] and adm.stats().tokens_in_use == 70
    a.release()
    await b_task
    assert order == ["b"] and adm.stats().tokens_in_use == 50
    b.release()
    assert adm.stats().tokens_in_use == 0 and adm.stats().in_system == 0


async def test_request_larger_than_budget_runs_alone():
    adm = make(max_running=10, token_budget=100)
    huge_alone = await admitted(adm, 500)  # nothing running: it runs at once
    assert adm.stats().running == 1
    order: list[str] = []
    small, small_task = waiter(adm, 1, order, "small")
    await queued(adm, 1)
    assert order == []  # nothing joins a request that is over the budget
    huge_alone.release()
    await small_task
    assert order == ["small"]
    huge, huge_task = waiter(adm, 500, order, "huge")
    await queued(adm, 1)
    assert order == ["small"]  # waits until it can run alone
    small.release()
    await huge_task
    assert order == ["small", "huge"] and adm.stats().tokens_in_use == 500
    huge.release()
    assert adm.stats().in_system == 0


async def test_release_is_idempotent():
    adm = make(max_running=2)
    t = await admitted(adm, 10)
    t.release()
    t.release()
    s = adm.stats()
    assert (s.running, s.in_system, s.tokens_in_use) == (0, 0, 0)
    reserved = adm.reserve()  # released without ever being admitted
    reserved.release()
    reserved.release()
    assert adm.stats().in_system == 0


async def test_cancelled_waiter_leaks_nothing():
    adm = make(max_running=1, max_queued=4)
    running = await admitted(adm, 5)
    order: list[str] = []
    cancelled, cancelled_task = waiter(adm, 5, order, "cancelled")
    nxt, nxt_task = waiter(adm, 5, order, "next")
    await queued(adm, 2)
    cancelled_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled_task
    cancelled.release()
    assert adm.stats().waiting == 1
    running.release()
    await nxt_task
    assert order == ["next"]
    nxt.release()
    s = adm.stats()
    assert (s.in_system, s.running, s.waiting, s.tokens_in_use) == (0, 0, 0, 0)


async def test_cancel_after_admission_then_release():
    adm = make(max_running=1)
    running = await admitted(adm)
    ticket = adm.reserve()
    task = asyncio.create_task(ticket.admit(3, 5))
    await queued(adm, 1)
    running.release()  # admits the waiter; cancel it before it resumes
    assert adm.stats().running == 1
    task.cancel()
    try:  # either outcome is fine (the admission may win the race); what matters is what release() frees
        await task
    except asyncio.CancelledError:
        pass
    ticket.release()
    s = adm.stats()
    assert (s.in_system, s.running, s.tokens_in_use) == (0, 0, 0)


async def test_close_refuses_new_requests():
    adm = make(max_running=1)
    inside = await admitted(adm)
    adm.close("draining for shutdown")
    with pytest.raises(ServiceUnavailable, match="draining for shutdown") as info:
        adm.reserve()
    assert info.value.retry_after_s
    inside.release()  # those already in finish normally
    assert adm.stats().in_system == 0
    with pytest.raises(ServiceUnavailable):
        adm.reserve()


async def test_stats_peak_waiting():
    adm = make(max_running=1)
    running = await admitted(adm)
    order: list[str] = []
    ws = [waiter(adm, 1, order, str(i)) for i in range(3)]
    await queued(adm, 3)
    assert adm.stats().peak_waiting == 3
    for ticket, task in [(running, None), *ws]:
        if task is not None:
            await task
        ticket.release()
    assert adm.stats().peak_waiting == 3 and adm.stats().in_system == 0


async def test_stats_count_each_choice_as_an_engine_sequence():
    """vLLM's batch is in sequences (n of them per request): /stats's `sequences` is what the pace figures read."""
    adm = make(max_running=8, token_budget=10_000)
    four = adm.reserve()
    await four.admit(10 + 4 * 20, timeout_s=5, prompt_tokens=10, max_steps=20)  # n 4
    one = adm.reserve()
    await one.admit(10 + 20, timeout_s=5, prompt_tokens=10, max_steps=20)
    assert (adm.stats().running, adm.stats().sequences) == (2, 5)
    four.release()
    assert (adm.stats().running, adm.stats().sequences) == (1, 1)
    one.release()
    assert adm.stats().sequences == 0
