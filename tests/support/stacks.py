"""A real stack the tests may break: the spare stack, for the tests that kill its engine, flood it with hostile
clients, or press Ctrl-C.

The session's shared stack (`service` in tests/integration/conftest.py) must stay healthy for every other test,
whatever order the tests run in; a test that breaks a stack takes `own_service` instead: the same `python -m app
serve` on the test config (tests/support/service.py's `running_stack`) with the connection clocks cut to a few
seconds and `max_logprobs` 20 (what the hostile driver's smoke test needs; the other tests read their streams at
once). Its modules are marked `pytest.mark.stack("spare")`, the Ctrl-C test's `stack("spare-stopped")`.

One stack serves such tests in turn: `own_service` hands over the running one while it is alive and healthy,
and starts a new one otherwise (after a test stopped it with Ctrl-C, or left it unhealthy). Starting a stack
costs 40 to 70 s on two cores. The suite runs the modules that use it one after another, the Ctrl-C test last
(tests/conftest.py), so it is started once and that test stops it. Its processes carry their own loadkit tag, so
a test can tell them from the shared stack's.

The suite's root conftest (tests/conftest.py) loads these fixtures as a plugin.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from tests.support.service import Service, base_config, free_port, running_stack

# The session's stack may be up beside this one, sharing the cores: a request takes longer than on a stack
# alone (measured: 150 tokens took over 10 s), so the drain waits longer than the shared stack's 10 s before
# it gives up on a request in flight.
OWN_DRAIN_GRACE_S = 60
# Short connection clocks, so that the hostile driver's never-reading, idle and slowloris clients are cut within
# seconds (test_hostile_smoke.py passes the same figures to the driver).
CLOCKS = {"header_timeout": 2.0, "body_timeout": 3.0, "keep_alive_timeout": 3.0, "write_stall_timeout": 3.0}


def spare_config(port: int) -> dict:
    config = base_config(port)
    config["service"]["drain_grace_s"] = OWN_DRAIN_GRACE_S
    config["service"].update({f"{k}_s": v for k, v in CLOCKS.items()})
    config["models"][0]["limits"]["max_logprobs"] = 20
    return config


def _usable(svc: Service) -> bool:
    if svc.proc.poll() is not None:
        return False
    try:
        return httpx.get(f"{svc.base_url}/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


class SpareStack:
    """The spare stack of the session: at most one running; a new one when the last is gone or unhealthy."""

    def __init__(self, tmp_factory: pytest.TempPathFactory):
        self._tmp_factory = tmp_factory
        self._current: Service | None = None
        self._stack: ExitStack | None = None

    def get(self) -> Service:
        if self._current is not None and _usable(self._current):
            return self._current
        self.close()
        self._stack = ExitStack()
        self._current = self._stack.enter_context(
            running_stack(self._tmp_factory.mktemp("spare-stack"), spare_config(free_port())))
        return self._current

    def close(self) -> None:
        """Stop the running one (a no-op for one already stopped by its test)."""
        stack, self._stack, self._current = self._stack, None, None
        if stack is not None:
            stack.close()


@pytest.fixture(scope="session")
def spare_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpareStack]:
    spare = SpareStack(tmp_path_factory)
    try:
        yield spare
    finally:
        spare.close()


@pytest.fixture
def own_service(spare_stack: SpareStack) -> Service:
    """The spare stack, healthy when the test begins; the test may break it."""
    return spare_stack.get()


@pytest.fixture
def own_http(own_service: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=own_service.base_url, headers=own_service.headers, timeout=120) as client:
        yield client
