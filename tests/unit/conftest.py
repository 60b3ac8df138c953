"""Shared fixtures for the unit tests; the helpers behind them live in tests/support/fake_stack.py."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from app.config.app_config import AppConfig
from app.config.model import ModelConfig
from app.config.service import ServiceConfig
from app.engine.fake import FakeEngine
from app.host.engine_host import EngineHost
from tests.support.fake_stack import MAX_MODEL_LEN, Stack, make_config


@pytest.fixture
def config() -> AppConfig:
    return make_config()


@pytest.fixture
def model_config(config: AppConfig) -> ModelConfig:
    return config.models[0]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=MAX_MODEL_LEN)


@pytest.fixture
def host(model_config: ModelConfig, engine: FakeEngine) -> EngineHost:
    return EngineHost(model_config, engine, ServiceConfig())


@pytest.fixture
async def make_stack():
    """Factory: `make_stack(config=..., engine=...)` -> Stack; its client is closed afterwards."""
    made: list[Stack] = []

    def _make(config: AppConfig | None = None, engine: FakeEngine | None = None) -> Stack:
        config = config or make_config()
        stack = Stack(config, engine or FakeEngine(max_model_len=config.models[0].engine.max_model_len))
        made.append(stack)
        return stack

    yield _make
    for stack in made:
        await stack.aclose()


@pytest.fixture
def stack(make_stack: Callable[..., Stack]) -> Stack:
    return make_stack()


@pytest.fixture
def client(stack: Stack) -> httpx.AsyncClient:
    return stack.client
