"""The clients of the session's stack (`service`, tests/support/stacks.py) for the modules marked
`pytest.mark.stack("shared")`: the openai SDK (sync and async) and httpx, with the test key."""

from __future__ import annotations

import httpx
import pytest

from tests.support.service import API_KEY, Service


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
