"""Waiting for a condition, with a deadline: what tests do instead of sleeping a fixed time.

Where the thing waited for can signal (the fake engine: `FakeEngine.wait_running`, `wait_aborted`,
`wait_started`), wait on that. These two poll a condition for state that cannot signal: the
admission queue, the ingress' counters, the real stack over HTTP. They return as soon as the
condition holds and fail, naming what was awaited, once the deadline has passed; the poll interval
only bounds how late they notice, never what a test asserts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from loadkit import waiting
from loadkit.waiting import wait_until as wait_until  # re-exported: the tests' import of it stays

T = TypeVar("T")


async def until(condition: Callable[[], T | Awaitable[T]], timeout_s: float = 5.0, what: str = "",
                interval_s: float = 0.002) -> T:
    """Await until `condition()` (a plain or an async function) is truthy; return its value. loadkit's `until`
    with the in-process tests' bounds: a short deadline, and a poll that lets the awaited tasks run at once."""
    return await waiting.until(condition, timeout_s=timeout_s, what=what, interval_s=interval_s)
