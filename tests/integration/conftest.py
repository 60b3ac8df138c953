"""The integration tests' shared stack and its clients: one `python -m app serve` for every module marked
`pytest.mark.stack("shared")`, started by the first test that asks for it and stopped after the last of them
(tests/conftest.py orders the modules by their mark)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from tests.conftest import STOP_SHARED_STACK
from tests.support.service import API_KEY, Service, base_config, free_port, running_stack


@pytest.fixture(scope="session")
def service(tmp_path_factory, request) -> Iterator[Service]:
    """The session's shared stack; stopped after the last test that uses it (tests/conftest.py orders them)."""
    with ExitStack() as stack:
        svc = stack.enter_context(running_stack(tmp_path_factory.mktemp("stack"), base_config(free_port())))
        request.config.stash[STOP_SHARED_STACK] = stack.close  # a second close is a no-op
        yield svc


@pytest.fixture(scope="session")
def base_url(service: Service) -> str:
    return service.base_url


@pytest.fixture(scope="session")
def client(service: Service):
    import openai

    with openai.OpenAI(base_url=f"{service.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture
async def async_client(service: Service):
    import openai

    async with openai.AsyncOpenAI(base_url=f"{service.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def http(service: Service):
    with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=120) as c:
        yield c
