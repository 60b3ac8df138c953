"""Waiting for a condition with a deadline: what the kit and the tests do instead of sleeping a fixed time.

`wait_until` (blocking) and `until` (in an event loop; the condition may be a coroutine function) poll
`condition` until it is truthy and return its value, or raise `NotReached` (a TimeoutError) naming what was
awaited once the deadline passes or `gave_up()` holds. The poll interval only bounds how late they notice.
`every` is the other kind of poll: an action repeated at a pace until told to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class NotReached(TimeoutError):
    """The condition did not hold before the deadline, or the wait gave up on it."""


def _check(what: str, timeout_s: float, deadline: float, gave_up: Callable[[], bool] | None) -> None:
    if gave_up is not None and gave_up():
        raise NotReached(f"not {what or 'true'}: gave up")
    if time.monotonic() > deadline:
        raise NotReached(f"not {what or 'true'} within {timeout_s} s")


def wait_until(condition: Callable[[], T], timeout_s: float = 30.0, what: str = "", interval_s: float = 0.2,
               gave_up: Callable[[], bool] | None = None) -> T:
    """Block until `condition()` is truthy; return its value. Exceptions from `condition` propagate."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        _check(what, timeout_s, deadline, gave_up)
        time.sleep(interval_s)  # a poll interval, not a wait for something


async def until(condition: Callable[[], T | Awaitable[T]], timeout_s: float = 30.0, what: str = "",
                interval_s: float = 0.25, gave_up: Callable[[], bool] | None = None) -> T:
    """`wait_until` inside an event loop; `condition` may return an awaitable."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        _check(what, timeout_s, deadline, gave_up)
        await asyncio.sleep(interval_s)  # a poll interval, not a wait for something


async def every(interval_s: float, stop: asyncio.Event, action: Callable[[], Awaitable[object]]) -> None:
    """Runs `action` every `interval_s` (start to start; at once again when it took longer) until `stop` is set."""
    while not stop.is_set():
        t0 = time.monotonic()
        await action()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, interval_s - (time.monotonic() - t0)))
