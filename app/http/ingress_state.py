"""What the ingress's routes share: each model's backend, the config, the metrics and the counters.

A backend is anything with `EngineHost`'s request methods: the host itself (the colocated replica,
unit tests) or `rayserve.handle_backend.HandleBackend`, which reaches an engine replica through a Ray Serve
handle. Routes find this state on `request.app.state.ingress`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from app.config.app_config import AppConfig
from app.config.model import ModelConfig
from app.engine.client import ClientReading
from app.engine.interface import Embeddings, EmbedRequest, GenerateRequest, PromptInput
from app.errors import ModelNotFound
from app.http.gate import Capacity
from app.http.lifecycle import Lifecycle
from app.http.metrics import Metrics

if TYPE_CHECKING:
    from app.host.stats import ReplicaStats


class Backend(Protocol):
    def generate(self, request: GenerateRequest, client: ClientReading | None = None) -> AsyncGenerator[Any, None]: ...
    async def embed(self, request: EmbedRequest) -> Embeddings: ...
    async def tokenize(self, prompt: PromptInput) -> list[int]: ...
    async def detokenize(self, token_ids: list[int]) -> str: ...
    async def check_health(self) -> None: ...
    async def check_ready(self) -> None: ...
    async def replica_stats(self) -> dict[str, ReplicaStats | None]: ...  # None: did not answer in time
    def has_room(self) -> bool: ...  # a request arriving now would be let in, as far as this process can tell


@dataclass
class IngressState:
    config: AppConfig
    backends: Mapping[str, Backend]
    metrics: Metrics
    capacity: Capacity
    lifecycle: Lifecycle
    # Serve's HTTP proxy answers the socket: it returns X-Request-Id itself and cancels the request's
    # task when the client hangs up. Without it (the replica's own uvicorn, tests) the app does both.
    behind_serve_proxy: bool
    models: dict[str, ModelConfig] = field(init=False)

    def __post_init__(self) -> None:
        self.models = {m.id: m for m in self.config.models}

    def has_room(self) -> bool:
        """Some model's replicas would take a request now (a hint: a held retry comes in early; http/retry_pacing)."""
        return any(backend.has_room() for backend in self.backends.values())

    def backend_for(self, model_id: str) -> tuple[ModelConfig, Backend]:
        model = self.models.get(model_id)
        if model is None:
            raise ModelNotFound(
                f"The model '{model_id}' does not exist; GET /v1/models lists the served models", param="model"
            )
        return model, self.backends[model_id]


def state_of(request: Any) -> IngressState:
    """The ingress state a route's request carries (`request.app.state.ingress`)."""
    state: IngressState = request.app.state.ingress
    return state
