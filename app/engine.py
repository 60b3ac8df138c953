"""The Engine interface: the one seam between serving logic and an inference engine.

`EngineHost` (server.py) talks to an engine only through `Engine`; `VLLMEngine`
(vllm_engine.py) and `FakeEngine` (fake_engine.py) both implement it, so the same
deployment, admission and HTTP code runs against either. The neutral types below
are what crosses that seam and the Ray handle: no vLLM or FastAPI types leak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Protocol

if TYPE_CHECKING:
    from app.config import ModelConfig


@dataclass(frozen=True)
class GenerationParams:
    """Sampling settings after validation against the model's limits."""

    max_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # None: none; k: the chosen token plus k alternatives
    ignore_eos: bool = False
    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    max_tokens_is_default: bool = False  # the client did not ask; may shrink to fit the context


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ChoiceDelta:
    """New output of one choice since the previous delta."""

    index: int
    text: str
    num_tokens: int
    finish_reason: str | None = None  # "stop" | "length" | None while running
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True)
class GenerationDelta:
    choices: tuple[ChoiceDelta, ...]


@dataclass(frozen=True)
class EngineStats:
    """What the engine is doing now, as it reports it."""

    running: int = 0  # requests inside the engine (vLLM: unfinished requests)
    waiting: int = 0  # requests the engine's scheduler holds waiting
    kv_cache_usage: float = 0.0  # fraction of KV cache blocks in use
    preemptions_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class EngineDead(Exception):
    """The engine cannot serve any more; the replica must be replaced."""


class EngineRejected(Exception):
    """The engine refused a request as invalid (e.g. a schema it cannot compile)."""


class Engine(Protocol):
    """A text-generation engine owned by one replica.

    Lifecycle: `start()` once (blocking, loads the model), then any number of
    concurrent `generate` calls, then `shutdown()` once. A `generate` iterator
    that is closed early must be followed by `abort(request_id)`; the host does
    that in a `finally`.
    """

    def start(self) -> None: ...

    @property
    def kv_cache_tokens(self) -> int:
        """How many tokens the KV cache holds; known after `start()`."""
        ...

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Apply the chat template (with the generation prompt) and tokenize."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def generate(self, request_id: str, prompt_token_ids: list[int], params: GenerationParams) -> AsyncIterator[GenerationDelta]: ...

    async def abort(self, request_id: str) -> None: ...

    async def check_health(self) -> None:
        """Cheap liveness check; raises `EngineDead` if the engine cannot serve."""
        ...

    def stats(self) -> EngineStats: ...

    def shutdown(self) -> None:
        """Stop the engine and every process it started."""
        ...


def make_engine(model: "ModelConfig") -> Engine:
    """Build the engine a model's config asks for; imports vLLM only when it is used."""
    if model.engine_kind == "fake":
        from app.fake_engine import FakeEngine

        return FakeEngine(max_model_len=model.engine.max_model_len)
    from app.vllm_engine import VLLMEngine

    return VLLMEngine(model)
