"""The in-process stack of the unit tests: configs, requests and an app over a `FakeEngine`.

No vLLM and no Ray here: `EngineHost` runs in-process around a `FakeEngine`, and
the FastAPI app is driven through httpx's ASGI transport. tests/unit/conftest.py builds
its fixtures from these; test modules import them as `from tests.support.fake_stack import ...`.
"""

from __future__ import annotations

import copy
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from app.config.app_config import AppConfig, parse_config
from app.engine.fake import FakeEngine
from app.engine.interface import GenerateRequest, GenerationParams, PromptInput
from app.host.resuming_host import ResumingHost
from app.http.ingress import create_app

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_ID = "fake-model"
MAX_MODEL_LEN = 256
DEFAULT_MAX_TOKENS = 32
MAX_TOKENS = 128


def config_dict(**model_overrides: Any) -> dict[str, Any]:
    """A valid config dict with one fake model; `model_overrides` merge section by section."""
    model: dict[str, Any] = {
        "id": MODEL_ID,
        "engine_kind": "fake",
        "engine": {"max_model_len": MAX_MODEL_LEN},
        "deployment": {"max_ongoing_requests": 4, "max_queued_requests": 8, "queue_timeout_s": 5},
        "limits": {"max_tokens": MAX_TOKENS, "default_max_tokens": DEFAULT_MAX_TOKENS, "max_n": 4,
                   "max_stop_sequences": 2},
    }
    for key, value in model_overrides.items():
        if isinstance(value, dict) and isinstance(model.get(key), dict):
            model[key] = {**model[key], **value}
        else:
            model[key] = value
    return {"models": [model]}


def make_config(service: dict[str, Any] | None = None, **model_overrides: Any) -> AppConfig:
    data = config_dict(**model_overrides)
    if service:
        data["service"] = copy.deepcopy(service)
    return parse_config(data)


def make_request(prompt: PromptInput | str | list[dict[str, str]], timeout_s: float = 30.0,
                 want_prompt_text: bool = False, **params: Any) -> GenerateRequest:
    """A `GenerateRequest` as the ingress would build it; `params` go to `GenerationParams`."""
    if isinstance(prompt, str):
        prompt = PromptInput(text=prompt)
    elif isinstance(prompt, list):
        prompt = PromptInput(messages=tuple(prompt))
    params.setdefault("max_tokens", 16)
    return GenerateRequest(
        request_id=f"test-{uuid.uuid4().hex}",
        prompt=prompt,
        params=GenerationParams(**params),
        timeout_s=timeout_s,
        want_prompt_text=want_prompt_text,
    )


def chat_body(content: str = "Hello", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": content}], **extra}


class Stack:
    """One app over one fake engine, and an httpx client that talks to it in-process."""

    def __init__(self, config: AppConfig, engine: FakeEngine):
        self.config = config
        self.engine = engine
        self.host = ResumingHost(config.models[0], engine, config.service)  # as the replica serving HTTP builds it
        # Keys resolved as the builder resolves them (the file's and this process's APP_API_KEYS, as digests).
        self.app = create_app(config.with_resolved_keys(), {config.models[0].id: self.host})
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://test", timeout=10)

    async def aclose(self) -> None:
        await self.client.aclose()


@asynccontextmanager
async def listening(stack: Stack) -> AsyncIterator[str]:
    """`stack`'s app on a real socket (the replica's own listener), so a client's hang-up is seen as on the real
    stack; yields the base URL, and stops the listener and the stack after."""
    from app.http.listener import HttpListener

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    listener = HttpListener(stack.app, "127.0.0.1", port)
    listener.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await listener.stop()
        await stack.aclose()


def usage_of(prompt: int, completion: int, cached: int | None = None, streamed: bool = False) -> dict:
    """The `usage` object of an answer with these token counts, as the service writes it (vLLM's shape):
    `prompt_tokens_details` with `cached` (service.enable_prompt_tokens_details on), else null, and left out of a
    stream's usage (`streamed`), where vLLM leaves nulls out."""
    usage: dict = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    elif not streamed:
        usage["prompt_tokens_details"] = None
    return usage
