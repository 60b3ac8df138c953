"""The handle adapter: `EngineHost`'s interface reached through a Ray Serve `DeploymentHandle`.

`HandleBackend` is what the ingress calls when the engine runs in another replica. Every call,
streaming or not, takes one error path (`translate`): a `ServiceError` the replica raised or sent
back as a `Refused` value becomes itself again, and Ray's own failures (back-pressure, a dead or
unavailable replica, a cancelled call) become the service's 429/503 with the OpenAI shape.

A request that nothing has come back for yet is retried on another replica when the one it reached
refuses it for a reason another replica may not have (full, over its time target, engine dead, starting,
wedged or draining) or dies under it: up to `ATTEMPTS` replicas, each told which replicas to avoid
(`rayserve/request_router.py` reads that), within the request's remaining time. The client hears the last
refusal only when every attempt was refused.

A request whose replica fails after answering (its engine died or wedged, the replica died or was stopped)
continues on another replica: each unfinished choice resumes from the tokens it already had
(app/rayserve/migration.py), up to `ATTEMPTS` times each, and the client's stream goes on unbroken. One that cannot
(structured output, tool-call parsing) ends with the retryable 503. Counted in `migrated` (/metrics).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any, cast

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError, TaskCancelledError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from app.engine.interface import (
    Admitted,
    ChoiceDelta,
    Embeddings,
    EmbedRequest,
    GenerateRequest,
    GenerationDelta,
    PromptInput,
)
from app.errors import EngineWedged, NeverInTime, QueueFull, RequestTimeout, ServiceError, ServiceUnavailable
from app.host.stats import ReplicaStats
from app.rayserve.merged_streams import merged
from app.rayserve.migration import Continuation
from app.rayserve.request_router import Addressed, replica_ids

log = logging.getLogger(__name__)
_UNAVAILABLE = (ActorDiedError, ActorUnavailableError, RayActorError, DeploymentUnavailableError)
# Replicas one request may try before the client is told no. Three: with two replicas, both and one more
# draw (a replacement may have come up); beyond that a refusal is the whole deployment's answer.
ATTEMPTS = 3
STATS_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Refused:
    """A `ServiceError` sent back over the handle as a value. Raised across Ray, every refusal would
    cost a traceback logged at ERROR in the replica and the caller; under overload that is most requests.
    `replica`: the refusing replica's id, so a retry can avoid it."""

    error: ServiceError
    replica: str = ""


def _name(request: GenerateRequest) -> str:
    return request.trace_id or request.request_id


def _worth_another_replica(err: BaseException) -> bool:
    """Refusals (already `translate`d: a dead replica is a ServiceUnavailable) that say something about the
    replica, not the request: another replica may take it."""
    return isinstance(err, (QueueFull, ServiceUnavailable)) and not isinstance(err, NeverInTime)


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


class _Lost(Exception):
    """A stream that had answered ended with a retryable `ServiceUnavailable`: its replica or engine died,
    wedged or was stopped under it. `replica`: that replica's id where known."""

    def __init__(self, error: ServiceUnavailable, replica: str):
        super().__init__(error)
        self.error, self.replica = error, replica


class HandleBackend:
    """`EngineHost`'s interface, reached through a Ray Serve handle to an `EngineReplica`."""

    def __init__(self, handle: DeploymentHandle):
        self._handle = handle
        self._stream = handle.options(stream=True)
        self.retried: Counter[str] = Counter()  # attempts on another replica, by the refusal's reason (/metrics)
        self.migrated: Counter[str] = Counter()  # choices resumed elsewhere mid-answer, and requests that could not be

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Any, None]:
        """The engine's stream for `request`, continued on another replica when the one serving it fails after
        answering (app/rayserve/migration.py)."""
        started = time.monotonic()
        progress = Continuation(request)
        try:
            # aclosing: a caller that stops reading closes the inner stream too, which cancels the remote call.
            async with aclosing(self._attempts(progress.for_engine())) as stream:
                async for item in stream:
                    passed = progress.observe(item)
                    if passed is not None:
                        yield passed
                    if progress.all_finished():  # a stop string matched here: the engine may still be going
                        return
            return
        except _Lost as lost:
            failure = lost
        why_not = progress.unresumable()
        if why_not is not None:
            self.migrated["unresumable"] += 1
            log.warning("request %s lost on replica %s (%s); it cannot continue elsewhere: %s",
                        _name(request), failure.replica or "?", failure.error, why_not)
            raise ServiceUnavailable(f"{failure.error} (this request cannot continue on another replica: {why_not})",
                                     retry_after_s=failure.error.retry_after_s) from None
        streams = [self._resumed(progress, i, started, failure) for i in progress.unfinished()]
        async with aclosing(merged(streams)) as choices:
            async for item in choices:
                yield item

    async def _resumed(self, progress: Continuation, index: int, started: float,
                       failure: _Lost) -> AsyncGenerator[Any, None]:
        """Choice `index` of `progress`'s request, continued on other replicas until it finishes (at most
        `ATTEMPTS` continuations, within the request's time)."""
        request = progress.request
        for _ in range(ATTEMPTS):
            remaining_s = request.timeout_s - (time.monotonic() - started)
            done = len(progress.choices[index].token_ids)
            if remaining_s <= 0:
                raise RequestTimeout(f"The request ran past its time limit ({request.timeout_s:g} s) while it was "
                                     f"moving to another replica after: {failure.error}")
            if done >= request.params.max_tokens:  # lost between its last token and the finish
                end = ChoiceDelta(index=0, text="", num_tokens=0, finish_reason="length")
                yield progress.observe(GenerationDelta(choices=(end,)), index=index)  # with any text held back
                return
            self.migrated["resumed"] += 1
            try:
                async with aclosing(self._attempts(progress.resume(index, remaining_s), failure.replica)) as stream:
                    async for item in stream:
                        if isinstance(item, Admitted):
                            log.info("request %s choice %d: replica %s failed after %d token(s) (%s); resumed on "
                                     "replica %s", _name(request), index, failure.replica or "?", done,
                                     failure.error, item.replica or "?")
                        passed = progress.observe(item, index=index)
                        if passed is not None:
                            yield passed
                        if progress.finished(index):
                            return
                return
            except _Lost as lost:
                failure = lost
        raise failure.error

    async def _attempts(self, request: GenerateRequest, avoid_first: str = "") -> AsyncGenerator[Any, None]:
        """One engine stream, tried on up to `ATTEMPTS` replicas until one answers (module docstring). A stream
        that fails retryably after answering raises `_Lost`."""
        started = time.monotonic()
        avoid: tuple[str, ...] = (avoid_first,) if avoid_first else ()
        replica = ""
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
                    if isinstance(item, Admitted):
                        replica = item.replica
                    answered = True
                    yield item
                return
            except Exception as err:
                refused_by = err.refused.replica if isinstance(err, _RefusedBy) else ""
                error = translate(err.refused.error if isinstance(err, _RefusedBy) else err)
                if answered and isinstance(error, ServiceUnavailable):
                    raise _Lost(error, refused_by or replica) from None
                last = attempt == ATTEMPTS or time.monotonic() - started >= request.timeout_s
                if answered or last or not _worth_another_replica(error):
                    raise error from None
                avoid += (refused_by,) if refused_by else ()
                if isinstance(error, EngineWedged):  # not sent on unchanged: it may be what was slow
                    request = replace(request, after_wedge=True)
                self.retried[cast(ServiceError, error).code or type(error).__name__] += 1
                log.info("request %s refused by replica %s (%s); trying another replica (attempt %d of %d)",
                         _name(request), refused_by or "?", error, attempt + 1, ATTEMPTS)
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

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """`EngineHost.embed` on a replica; a refusal another replica may not have (full, over its target, engine
        dead or starting) is tried on another, as a generation that nothing came back for yet is (`_attempts`)."""
        started = time.monotonic()
        avoid: tuple[str, ...] = ()
        for attempt in range(1, ATTEMPTS + 1):
            remaining_s = request.timeout_s - (time.monotonic() - started)
            attempt_request = request if attempt == 1 else replace(request, timeout_s=remaining_s)
            try:
                answer = await self._handle.embed_remote.remote(attempt_request, avoid)
            except Exception as err:
                answer = Refused(cast(ServiceError, translate(err))) if isinstance(translate(err), ServiceError) \
                    else None
                if answer is None:
                    raise translate(err) from None
            if isinstance(answer, Embeddings):
                return answer
            error = cast(Refused, answer).error
            last = attempt == ATTEMPTS or time.monotonic() - started >= request.timeout_s
            if last or not _worth_another_replica(error):
                raise error
            avoid += (answer.replica,) if answer.replica else ()
            self.retried[error.code or type(error).__name__] += 1
            log.info("request %s refused by replica %s (%s); trying another replica (attempt %d of %d)",
                     request.trace_id or request.request_id, answer.replica or "?", error, attempt + 1, ATTEMPTS)
        raise AssertionError("unreachable: the last attempt raises")

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

    async def replica_stats(self) -> dict[str, ReplicaStats | None]:
        """Every replica's figures, by Serve's replica id; None for one that did not answer within
        `STATS_TIMEOUT_S` (stopped, or its loop blocked). Each call is addressed to its replica
        (`request_router.Addressed`)."""
        deployment = getattr(self._handle, "deployment_id", None)
        ids = replica_ids(deployment)
        if not ids:  # no call has made this process's router yet: one does, and it learns the replicas
            await self.stats()
            ids = replica_ids(deployment)

        async def one(replica: str) -> tuple[str, ReplicaStats | None]:
            try:
                answered: tuple[str, ReplicaStats] = await asyncio.wait_for(
                    self._handle.stats_of.remote(Addressed(replica)), STATS_TIMEOUT_S)
                return answered
            except Exception:
                return replica, None

        return dict(await asyncio.gather(*(one(r) for r in ids)))
