"""The handle adapter: `EngineHost`'s interface reached through a Ray Serve `DeploymentHandle`.

`HandleBackend` is what the ingress calls when the engine runs in another replica. Every call,
streaming or not, takes one error path (`translate`): a `ServiceError` the replica raised or sent
back as a `Refused` value becomes itself again, and Ray's own failures (back-pressure, a dead or
unavailable replica, a cancelled call) become the service's 429/503 with the OpenAI shape.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, cast

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError, TaskCancelledError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from app.engine import GenerateRequest, PromptInput
from app.errors import QueueFull, ServiceError, ServiceUnavailable
from app.host import ReplicaStats

_UNAVAILABLE = (ActorDiedError, ActorUnavailableError, RayActorError, DeploymentUnavailableError)


@dataclass(frozen=True)
class Refused:
    """A `ServiceError` sent back over the handle as a value. Raised across Ray, every refusal would
    cost a traceback logged at ERROR in the replica and the caller; under overload that is most requests."""

    error: ServiceError


def translate(err: BaseException) -> BaseException:
    """Ray wraps what a replica raised; give the ingress the service's own error back."""
    if isinstance(err, RayTaskError) and isinstance(err.cause, ServiceError):
        return err.cause
    if isinstance(err, ServiceError):
        return err
    if isinstance(err, BackPressureError):
        return QueueFull("Server is at capacity; retry after the Retry-After delay, with backoff", retry_after_s=1)
    if isinstance(err, TaskCancelledError):  # the call was cancelled under us (replica stopping); not a server bug
        return ServiceUnavailable("The request was cancelled by the serving layer; retry", retry_after_s=1)
    if isinstance(err, _UNAVAILABLE):
        return ServiceUnavailable(
            "No engine replica is available for this model right now; retry shortly", retry_after_s=5
        )
    return err


class HandleBackend:
    """`EngineHost`'s interface, reached through a Ray Serve handle to an `EngineReplica`."""

    def __init__(self, handle: DeploymentHandle):
        self._handle = handle
        self._stream = handle.options(stream=True)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Any, None]:
        # A handle with stream=True answers with a generator; Ray's annotation is the union of both kinds.
        response = cast(DeploymentResponseGenerator[Any], self._stream.generate_remote.remote(request))
        try:
            async for item in response:
                if isinstance(item, Refused):
                    raise item.error
                yield item
        except Exception as err:
            raise translate(err) from None
        finally:
            try:
                response.cancel()  # no-op when finished; otherwise the replica sees CancelledError and aborts
            except Exception:  # cancel() re-raises a failed assignment (BackPressureError), already answered above
                pass

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self._handle, method).remote(*args)
        except Exception as err:
            raise translate(err) from None

    async def tokenize(self, prompt: PromptInput) -> list[int]:
        tokens: list[int] = await self._call("tokenize", prompt)
        return tokens

    async def detokenize(self, token_ids: list[int]) -> str:
        text: str = await self._call("detokenize", token_ids)
        return text

    async def check_health(self) -> None:
        await self._call("check_health")

    async def check_ready(self) -> None:
        await self._call("check_ready")

    async def stats(self) -> ReplicaStats:
        stats: ReplicaStats = await self._call("stats")
        return stats
