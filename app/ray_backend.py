"""The handle adapter: `EngineHost`'s interface reached through a Ray Serve `DeploymentHandle`.

`HandleBackend` is what the ingress calls when the engine runs in another replica. Every call,
streaming or not, takes one error path (`translate`): a `ServiceError` the replica raised or sent
back as a `Refused` value becomes itself again, and Ray's own failures (back-pressure, a dead or
unavailable replica, a cancelled call) become the service's 429/503 with the OpenAI shape.

A request that nothing has come back for yet is retried on another replica when the one it reached
refuses it for a reason another replica may not have (full, over its time target, engine dead, starting,
wedged or draining) or dies under it: up to `ATTEMPTS` replicas, each told which replicas to avoid
(`serving_router.py` reads that), within the request's remaining time. The client hears the last
refusal only when every attempt was refused. Once anything has come back (the engine admitted it),
the request stays where it is.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace
from typing import Any, cast

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError, TaskCancelledError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from app.engine import GenerateRequest, PromptInput
from app.errors import QueueFull, ServiceError, ServiceUnavailable
from app.host import ReplicaStats

log = logging.getLogger(__name__)
_UNAVAILABLE = (ActorDiedError, ActorUnavailableError, RayActorError, DeploymentUnavailableError)
# Replicas one request may try before the client is told no. Three: with two replicas, both and one more
# draw (a replacement may have come up); beyond that a refusal is the whole deployment's answer.
ATTEMPTS = 3


@dataclass(frozen=True)
class Refused:
    """A `ServiceError` sent back over the handle as a value. Raised across Ray, every refusal would
    cost a traceback logged at ERROR in the replica and the caller; under overload that is most requests.
    `replica`: the refusing replica's id, so a retry can avoid it."""

    error: ServiceError
    replica: str = ""


def _worth_another_replica(err: BaseException) -> bool:
    """Refusals (already `translate`d: a dead replica is a ServiceUnavailable) that say something about the
    replica, not the request: another replica may take it."""
    return isinstance(err, (QueueFull, ServiceUnavailable))


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


class _RefusedBy(Exception):
    def __init__(self, refused: Refused):
        super().__init__(refused.error)
        self.refused = refused


class HandleBackend:
    """`EngineHost`'s interface, reached through a Ray Serve handle to an `EngineReplica`."""

    def __init__(self, handle: DeploymentHandle):
        self._handle = handle
        self._stream = handle.options(stream=True)
        self.retried: Counter[str] = Counter()  # attempts on another replica, by the refusal's reason (/metrics)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Any, None]:
        started = time.monotonic()
        avoid: tuple[str, ...] = ()
        for attempt in range(1, ATTEMPTS + 1):
            remaining_s = request.timeout_s - (time.monotonic() - started)
            attempt_request = request if attempt == 1 else replace(request, timeout_s=remaining_s)
            # A handle with stream=True answers with a generator; Ray's annotation is the union of both kinds.
            call = self._stream.generate_remote.remote(attempt_request, avoid)
            response = cast(DeploymentResponseGenerator[Any], call)
            answered = False
            try:
                async for item in response:
                    if isinstance(item, Refused):
                        raise _RefusedBy(item)
                    answered = True
                    yield item
                return
            except Exception as err:
                refused_by = err.refused.replica if isinstance(err, _RefusedBy) else ""
                error = translate(err.refused.error if isinstance(err, _RefusedBy) else err)
                last = attempt == ATTEMPTS or time.monotonic() - started >= request.timeout_s
                if answered or last or not _worth_another_replica(error):
                    raise error from None
                avoid += (refused_by,) if refused_by else ()
                self.retried[cast(ServiceError, error).code or type(error).__name__] += 1
                log.info("request %s refused by replica %s (%s); trying another replica (attempt %d of %d)",
                         request.trace_id or request.request_id, refused_by or "?", error, attempt + 1, ATTEMPTS)
            finally:
                try:
                    response.cancel()  # no-op when finished; otherwise the replica sees CancelledError and aborts
                except Exception:  # cancel() re-raises a failed assignment (BackPressureError), answered above
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
