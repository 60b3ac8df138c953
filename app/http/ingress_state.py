"""What the ingress's routes share: each model's backend, the config, the metrics and the counters.

A backend is anything with `EngineHost`'s request methods: the host itself (the colocated replica,
unit tests) or `rayserve.handle_backend.HandleBackend`, which reaches an engine replica through a Ray Serve
handle. Routes find this state on `request.app.state.ingress`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from app.config.app_config import AppConfig
from app.config.model import ModelConfig
from app.engine.client import ClientReading
from app.engine.interface import Embeddings, EmbedRequest, GenerateRequest, PromptInput
from app.errors import InvalidRequest, ModelNotFound
from app.http.capacity import Capacity
from app.http.lifecycle import Lifecycle
from app.http.metrics import Metrics

if TYPE_CHECKING:
    from app.host.stats import ReplicaStats


class ReplicaRoom(Protocol):
    """What a backend tells of one replica's room (host/replica_load.ReplicaLoad has it)."""

    @property
    def serving(self) -> bool: ...
    @property
    def free_in_s(self) -> float | None: ...  # when a place is expected to free once its slots are full
    def would_take(self, first_token_s: float | None) -> bool: ...


class Backend(Protocol):
    def generate(self, request: GenerateRequest, client: ClientReading | None = None) -> AsyncGenerator[Any, None]: ...
    async def embed(self, request: EmbedRequest) -> Embeddings: ...
    async def tokenize(self, prompt: PromptInput) -> list[int]: ...
    async def detokenize(self, token_ids: list[int]) -> str: ...
    async def check_health(self) -> None: ...
    async def check_ready(self) -> None: ...
    async def replica_stats(self) -> dict[str, ReplicaStats | None]: ...  # None: did not answer in time
    def loads(self) -> Sequence[ReplicaRoom]: ...  # each replica's load as this process last learned it


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
        return any(load.would_take(self.models[model_id].deployment.ttft_target_s)
                   for model_id, backend in self.backends.items() for load in backend.loads())

    def retry_after_s(self, model_id: str) -> float:
        """When a place is expected to free on `model_id`'s replicas: the soonest any predicts (1 s where none can)."""
        known = [load.free_in_s for load in self.backends[model_id].loads()
                 if load.serving and load.free_in_s is not None]
        return min(known, default=1.0)

    def backend_for(self, model_id: str | None) -> tuple[ModelConfig, Backend]:
        """The model a request names. Left out (or ""), the one served, as `vllm serve` does; with several served,
        a 400 that lists them (taking the first would answer from a model the client did not choose)."""
        if not model_id:
            if len(self.models) > 1:
                raise InvalidRequest(f"'model' is required: this service serves {len(self.models)} models "
                                     f"({', '.join(self.models)}); GET /v1/models lists them", param="model")
            model_id = next(iter(self.models))
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
