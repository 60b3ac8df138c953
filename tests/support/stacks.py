"""The session's real stack: one `python -m app serve` on the test config (tests/support/service.py's
`running_stack` on `base_config`, with a long drain grace), started by the first test that asks for it, shared by
every module marked `pytest.mark.stack("shared")` (`service`), then handed to the tests that may break it: kill its
engine, flood it with hostile clients (`stack("spare")`, `own_service`), and last press Ctrl-C
(`stack("spare-stopped")`). The suite runs those groups in that order (tests/conftest.py), so one stack start
serves all of them (a start costs 30 to 70 s on two cores).

`own_service` hands over the running stack while it is alive and healthy, and starts a new one otherwise (after a
test stopped it, or left it unhealthy). The stack is stopped after the last test of those groups (the Ctrl-C test
stops it itself) or at the end of the session, leaving no process.

The suite's root conftest (tests/conftest.py) loads these fixtures as a plugin.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from tests.conftest import STOP_SESSION_STACK
from tests.support.service import Service, base_config, free_port, running_stack

# The Ctrl-C test drains a 150-token stream (about 11 s alone on two cores) within the grace.
DRAIN_GRACE_S = 60


def session_config(port: int) -> dict:
    config = base_config(port)
    config["service"]["drain_grace_s"] = DRAIN_GRACE_S
    return config


def _usable(svc: Service) -> bool:
    if svc.proc.poll() is not None:
        return False
    try:
        return httpx.get(f"{svc.base_url}/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


class SessionStack:
    """The session's stack: at most one running; a new one when the last is gone or unhealthy."""

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
            running_stack(self._tmp_factory.mktemp("stack"), session_config(free_port())))
        return self._current

    def close(self) -> None:
        """Stop the running one (a no-op for one already stopped by its test)."""
        stack, self._stack, self._current = self._stack, None, None
        if stack is not None:
            stack.close()


@pytest.fixture(scope="session")
def session_stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[SessionStack]:
    stack = SessionStack(tmp_path_factory)
    request.config.stash[STOP_SESSION_STACK] = stack.close
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture(scope="session")
def service(session_stack: SessionStack) -> Service:
    """The session's stack, for the tests that leave it healthy (`stack("shared")`)."""
    return session_stack.get()


@pytest.fixture
def own_service(session_stack: SessionStack) -> Service:
    """The session's stack, healthy when the test begins; the test may break it (`stack("spare")`, after every
    shared test)."""
    return session_stack.get()


@pytest.fixture
def own_http(own_service: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=own_service.base_url, headers=own_service.headers, timeout=120) as client:
        yield client
