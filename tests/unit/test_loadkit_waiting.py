"""loadkit.waiting: one way to wait for a condition, blocking or in an event loop: the condition's value once it
holds, a TimeoutError naming what was awaited once the deadline passes or the wait gives up."""

from __future__ import annotations

import asyncio
import time

import pytest

from loadkit.waiting import NotReached, every, until, wait_until


def test_the_conditions_value_is_returned_once_it_holds():
    calls = iter([0, None, "", 7])
    assert wait_until(lambda: next(calls), timeout_s=5, interval_s=0.01) == 7


def test_the_deadline_and_giving_up_name_what_was_awaited():
    with pytest.raises(TimeoutError, match=r"^not the sky falling within 0.05 s$"):
        wait_until(lambda: False, timeout_s=0.05, what="the sky falling", interval_s=0.01)
    started = time.monotonic()
    with pytest.raises(NotReached, match="gave up"):
        wait_until(lambda: False, timeout_s=30, gave_up=lambda: True)
    assert time.monotonic() - started < 5


def test_until_awaits_an_async_condition():
    async def go() -> str:
        seen = []

        async def ready() -> str | None:
            seen.append(1)
            return "done" if len(seen) >= 3 else None

        return await until(ready, timeout_s=5, interval_s=0.01)

    assert asyncio.run(go()) == "done"
    with pytest.raises(NotReached):
        asyncio.run(until(lambda: False, timeout_s=0.05, interval_s=0.01))


def test_every_repeats_its_action_at_a_pace_until_stopped():
    async def go() -> list[float]:
        stop, times = asyncio.Event(), []

        async def act() -> None:
            times.append(time.monotonic())
            if len(times) == 3:
                stop.set()

        await asyncio.wait_for(every(0.02, stop, act), timeout=5)
        return times

    times = asyncio.run(go())
    assert len(times) == 3 and all(b - a >= 0.015 for a, b in zip(times, times[1:], strict=False))
