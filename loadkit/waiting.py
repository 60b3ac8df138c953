"""Waiting for a condition with a deadline: what the load kit and the tests do instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float = 30.0, what: str = "", interval_s: float = 0.2) -> T:
    """Block until `condition()` is truthy; return its value. TimeoutError, naming `what`, once `timeout_s` has
    passed. Exceptions from `condition` propagate."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what or 'true'} within {timeout_s} s")
        time.sleep(interval_s)  # a poll interval, not a wait for something
