"""A real stack of a test's own, for the tests that break or stop it.

The session's shared stack (`service` in tests/integration/conftest.py) must stay healthy for every
other test, whatever order the tests run in; a test that kills an engine or presses Ctrl-C takes
`own_service` instead: the same `python -m app serve` on the same test config (conftest's
`running_stack`), started for that test alone and stopped after it (a no-op if the test stopped it).
Its processes carry their own loadkit tag, so a test can tell them from the shared stack's.

A test module asks for it with `pytest_plugins = ["tests.support.stacks"]`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Service, base_config, free_port, running_stack

# The session's stack may be up beside this one, sharing the cores: a request takes longer than on a stack
# alone (measured: 150 tokens took over 10 s), so the drain waits longer than the shared stack's 10 s before
# it gives up on a request in flight.
OWN_DRAIN_GRACE_S = 60


@pytest.fixture
def own_service(tmp_path: Path) -> Iterator[Service]:
    """A stack started for this test alone (about 40 to 70 s on two cores), healthy when the test begins."""
    config = base_config(free_port())
    config["service"]["drain_grace_s"] = OWN_DRAIN_GRACE_S
    with running_stack(tmp_path, config) as svc:
        yield svc


@pytest.fixture
def own_http(own_service: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=own_service.base_url, headers=own_service.headers, timeout=120) as client:
        yield client
