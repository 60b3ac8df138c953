"""Errors across the Ray handle, as the ingress's handle adapter (rayserve/handle_backend.py) sees them: a replica's
refusal sent back as a value (`Refused`), Ray's own failures turned into the service's errors (`translate`), and
which refusals are worth another replica (a stream lost after it answered is an `engine.resumed_stream.Lost`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError, TaskCancelledError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from app.errors import NeverInTime, QueueFull, ServiceError, ServiceUnavailable

_UNAVAILABLE = (ActorDiedError, ActorUnavailableError, RayActorError, DeploymentUnavailableError)


@dataclass(frozen=True)
class Refused:
    """A `ServiceError` sent back over the handle as a value. Raised across Ray, every refusal would
    cost a traceback logged at ERROR in the replica and the caller; under overload that is most requests.
    `replica`: the refusing replica's id, so a retry can avoid it. `in_flight`: the request was in the replica's
    engine when that engine broke (not refused on arrival), so it may wait for a replica to serve again."""

    error: ServiceError
    replica: str = ""
    in_flight: bool = False


def worth_another_replica(err: BaseException, refused_by: Collection[str] = (),
                          known: Collection[str] = ()) -> bool:
    """Refusals (already `translate`d: a dead replica is a ServiceUnavailable) that say something about the
    replica, not the request: another replica may take it. Not a capacity refusal (429) once every replica `known`
    here is among those that `refused_by` it: the next try would reach one of them again, render and tokenize the
    prompt again and be refused again (a lone replica was asked three times for each refusal, and counted each as
    demand for the autoscaling policy)."""
    if not isinstance(err, (QueueFull, ServiceUnavailable)) or isinstance(err, NeverInTime):
        return False
    return not (isinstance(err, QueueFull) and known and set(known) <= set(refused_by))


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


class RefusedBy(Exception):
    def __init__(self, refused: Refused):
        super().__init__(refused.error)
        self.refused = refused


def broke_under(err: BaseException) -> bool:
    """A call's failure (as raised, before `translate`) that was the replica's engine breaking with the request in
    it: what a request that breaks engines leaves behind. A replica process that died is not counted: that is most
    often a node lost or a process killed, under every request it held."""
    return isinstance(err, RefusedBy) and err.refused.in_flight
