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


@pytest.fixture
def own_service(tmp_path: Path) -> Iterator[Service]:
    """A stack started for this test alone (about 40 s on two cores), healthy when the test begins."""
    with running_stack(tmp_path, base_config(free_port())) as svc:
        yield svc


@pytest.fixture
def own_http(own_service: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=own_service.base_url, headers=own_service.headers, timeout=120) as client:
        yield client
