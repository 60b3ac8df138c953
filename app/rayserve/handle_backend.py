"""The handle adapter: `EngineHost`'s interface reached through a Ray Serve `DeploymentHandle`.

`HandleBackend` is what the ingress calls when the engine runs in another replica. Every call, streaming or not, goes
with a Serve request id of its own (rayserve/call_ids.py) and takes one error path (`translate`): a `ServiceError` the
replica raised or sent back as a `Refused` value becomes itself again, and Ray's own failures (back-pressure, a dead
or unavailable replica, a cancelled call) become the service's 429/503 with the OpenAI shape.

A request that nothing has come back for yet is retried on another replica when the one it reached refuses it for a
reason another replica may not have (full, over its time target, engine dead, starting, wedged or draining) or dies
under it: up to `ATTEMPTS` replicas, each told which replicas to avoid (`rayserve/request_router.py` reads that),
within the request's remaining time, and a full one only while some replica known has not refused it. The client
hears the last refusal only when every attempt was refused. One whose engine broke with it inside, with no other
replica serving (a lone replica restarting that engine in place), waits for a replica to serve again and is sent
again there (a second break holds it back: app/engine/quarantine.py).

With fleet routing (`routing`: app/routing/), each attempt is ranked over the replicas first: the replica predicted
to give the first token soonest (its queue, and the prefill of what its prefix cache does not hold) is offered first,
and a request that even the soonest would serve later than its first-token target is refused here at once.

A request whose replica fails after answering (its engine died or wedged, the replica died or stopped) continues on
another replica: each unfinished choice resumes from the tokens it had (app/engine/resumed_stream.py), up to three
times each, and the client's stream goes on unbroken; when no replica serves (a lone one restarting its engine in
place), it waits for one within its time. One that cannot continue (a tool-call parser's state it was not told)
ends with the retryable 503. Counted in `migrated` (/metrics), with streams taken out of the engine while their client
did not read (rayserve/client_pauses.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any, cast

from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from app.engine.client import ClientReading
from app.engine.interface import (
    Admitted,
    Embeddings,
    EmbedRequest,
    GenerateRequest,
    GenerationDelta,
    PromptInput,
)
from app.engine.quarantine import Quarantine
from app.engine.resumed_stream import Lost, resumed_stream
from app.errors import EngineWedged, RequestTimeout, ServiceError, ServiceUnavailable
from app.host.pauses import pausable
from app.host.replica_load import ReplicaLoad
from app.host.stats import ReplicaStats
from app.rayserve.call_ids import remote
from app.rayserve.client_pauses import paused_while_unread
from app.rayserve.handle_errors import Refused, RefusedBy, broke_under, translate, worth_another_replica
from app.rayserve.request_router import ROUTING_STATS_PERIOD_S, Addressed, replica_ids, replica_loads
from app.rayserve.scaling_view import ScalingView
from app.rayserve.unmet_demand import UnmetDemand, unmet_refusal
from app.routing.decision import Decision
from app.routing.model_routing import ModelRouting

log = logging.getLogger(__name__)
# Replicas one request may try before it is refused: with two, both and a replacement that may have come up.
ATTEMPTS = 3
STATS_TIMEOUT_S = 5.0
REFUSED_PAUSE_S = 4 * ROUTING_STATS_PERIOD_S  # after every replica refused a continuation: fresh figures first
WAIT_POLL_S = 0.25  # how often a continuation with no replica serving looks again


def _name(request: GenerateRequest) -> str:
    return request.trace_id or request.request_id


class HandleBackend:
    """`EngineHost`'s interface, reached through a Ray Serve handle to an `EngineReplica`."""

    def __init__(self, handle: DeploymentHandle, routing: ModelRouting | None = None):
        self._handle, self._stream = handle, handle.options(stream=True)
        self.routing = routing  # None: Serve's router draws two replicas (request_router.py)
        self.retried: Counter[str] = Counter()  # attempts on another replica, by the refusal's reason (/metrics)
        self.migrated: Counter[str] = Counter()  # choices resumed elsewhere, and those that could not (/metrics)
        self.quarantine = Quarantine()  # requests that broke engines before their first output (engine/quarantine.py)
        # An autoscaled model's ingress tells the policy of the requests it refuses at once, and reads back its last
        # decision (/stats, /metrics, the Retry-After while a replica starts); a fixed fleet needs neither.
        self.unmet: UnmetDemand | None = None
        self.scaling: ScalingView | None = None
        if routing is not None and routing.model.deployment.autoscaling is not None:
            self.unmet, self.scaling = UnmetDemand(handle), ScalingView(handle)

    def generate(self, request: GenerateRequest, client: ClientReading | None = None) -> AsyncGenerator[Any, None]:
        """The engine's stream for `request`, continued on another replica when the one serving it fails after
        answering (app/engine/continuation.py), and taken out of the engine while `client` (the connection, when
        this process holds it) does not read (rayserve/client_pauses.py)."""
        if client is not None and pausable(request.params):
            return paused_while_unread(self._generate, request, client, self.migrated)
        return self._generate(request)

    def _generate(self, request: GenerateRequest) -> AsyncGenerator[Any, None]:
        return resumed_stream(request, self._attempts, self._until_a_replica_serves, self.migrated,
                              "on another replica", self.quarantine)

    async def _until_a_replica_serves(self, failure: ServiceUnavailable, deadline: float, timeout_s: float,
                                      refused: bool) -> None:
        """Returns once some replica reports that it serves (at once when one does, or none is known yet); a
        continuation every replica refused waits a routing-stats round first, so the next try sees fresh figures:
        a lone replica restarting its engine in place reports `serving: False` until the new engine serves."""
        if refused:
            await asyncio.sleep(max(0.0, min(REFUSED_PAUSE_S, deadline - time.monotonic())))
        while (loads := self._loads()) and not any(load.serving for load in loads.values()):
            if time.monotonic() >= deadline:
                raise RequestTimeout(f"The request ran past its time limit ({timeout_s:g} s) while no replica "
                                     f"served, after: {failure}")
            await asyncio.sleep(WAIT_POLL_S)

    async def _waited_for_a_replica(self, error: BaseException, avoid: tuple[str, ...], deadline: float,
                                    timeout_s: float) -> bool:
        """After an engine broke with a request in it: when no replica but those `avoid`ed serves (a lone replica
        restarting that engine in place), waits for one to serve again, as the replica that serves HTTP itself waits
        for its own (host/resuming_host.py), and says so; the request is then sent again, its breaks counted."""
        if not isinstance(error, ServiceUnavailable) or any(
                load.serving for r, load in self._loads().items() if r not in avoid):
            return False
        log.info("no other replica serves: waiting for one to serve again (%s)", error)
        await self._until_a_replica_serves(error, deadline, timeout_s, True)
        return True

    async def _route(self, request: GenerateRequest, prompt_ids: list[int] | None,
                     avoid: tuple[str, ...]) -> Decision | None:
        """The fleet router's ranking for this attempt (None: no routing, or no replica known yet); raises its
        refusal when even the soonest replica would miss the first-token target."""
        if self.routing is None:
            return None
        decision = self.routing.decide(self._loads(), prompt_ids, request, frozenset(avoid), request.session_id)
        if decision is not None and decision.refusal is not None:  # counted as demand for the autoscaling policy
            raise unmet_refusal(decision.refusal, request, self.unmet, self.scaling)
        return decision

    def loads(self) -> list[ReplicaLoad]:  # each replica's load as it last reported it here (none yet: none)
        return list(self._loads().values())

    def _loads(self) -> dict[str, ReplicaLoad]:
        """What each replica last reported to this process's Serve router (request_router.py)."""
        return replica_loads(getattr(self._handle, "deployment_id", None))

    async def _prompt_ids(self, request: GenerateRequest) -> list[int] | None:
        """The prompt's token ids for the fleet router; not worked out when there is no choice to make."""
        if self.routing is None or len(self._loads()) < 2:
            return None
        return await self.routing.prompt_ids(request.prompt)

    async def _attempts(self, request: GenerateRequest, avoid_first: str = "") -> AsyncGenerator[Any, None]:
        """One engine stream, tried on up to `ATTEMPTS` replicas until one answers (module docstring). A stream
        that fails retryably after answering raises `Lost`."""
        started = time.monotonic()
        self.quarantine.refuse_if_held(request)
        sent_as, breaks = request, request.breaks  # as sent (held back so: a wedge's retry changes it); engines broken
        avoid: tuple[str, ...] = (avoid_first,) if avoid_first else ()
        replica, prompt_tokens = "", 0
        request = replace(request, demand_at_sender=True) if self.unmet is not None else request  # counted here
        prompt_ids = await self._prompt_ids(request)
        for attempt in range(1, ATTEMPTS + 1):
            remaining_s = request.timeout_s - (time.monotonic() - started)
            attempt_request = request if attempt == 1 else replace(request, timeout_s=remaining_s)
            decision = await self._route(attempt_request, prompt_ids, avoid)
            sent = time.monotonic()
            # A handle with stream=True answers with a generator; Ray's annotation is the union of both kinds.
            ranking = (decision.ranks,) if decision is not None else ()  # `prefer`, for the router only
            call = remote(self._stream.generate_remote, attempt_request, avoid, *ranking)
            response = cast(DeploymentResponseGenerator[Any], call)
            answered, first_output = False, decision is None
            try:
                async for item in response:
                    if isinstance(item, Refused):
                        raise RefusedBy(item)
                    if isinstance(item, Admitted):
                        replica, prompt_tokens = item.replica, item.prompt_tokens
                    elif not first_output and isinstance(item, GenerationDelta) and self.routing is not None:
                        first_output = True
                        self.routing.router.answered(cast(Decision, decision), replica, item.cached_tokens,
                                                     time.monotonic() - sent, prompt_tokens)
                    answered = True
                    yield item
                return
            except Exception as err:
                refused_by = err.refused.replica if isinstance(err, RefusedBy) else ""
                error = translate(err.refused.error if isinstance(err, RefusedBy) else err)
                broke = broke_under(err)  # its engine broke with it inside (a dead replica process is no break)
                if answered and isinstance(error, ServiceUnavailable):
                    raise Lost(error, refused_by or replica, breaks + broke) from None
                if not answered and broke:
                    breaks = self.quarantine.broke(sent_as, breaks, f"on replica {refused_by}")
                last = attempt == ATTEMPTS or time.monotonic() - started >= request.timeout_s
                avoid += (refused_by,) if refused_by else ()
                if answered or last or not worth_another_replica(error, avoid, self._loads()):
                    raise (error if answered else unmet_refusal(error, request, self.unmet, self.scaling)) from None
                if isinstance(error, EngineWedged):  # not sent on unchanged: it may be what was slow
                    request = replace(request, after_wedge=True)
                self.retried[cast(ServiceError, error).code or type(error).__name__] += 1
                log.info("request %s refused by replica %s (%s); trying another replica (attempt %d of %d)",
                         _name(request), refused_by or "?", error, attempt + 1, ATTEMPTS)
                if broke and await self._waited_for_a_replica(error, avoid, started + request.timeout_s,
                                                              request.timeout_s):
                    avoid = ()  # the replica serving again may be the one it broke on
            finally:
                if self.routing is not None and decision is not None:  # the router hears how it ended, once
                    (self.routing.router.finished if first_output else self.routing.router.ended)(decision)
                try:
                    response.cancel()  # no-op when finished; otherwise the replica sees CancelledError and aborts
                except Exception:  # cancel() re-raises a failed assignment (BackPressureError), answered above
                    pass

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await remote(getattr(self._handle, method), *args)
        except Exception as err:
            raise translate(err) from None

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """`EngineHost.embed` on a replica; a refusal another replica may not have (full, over its target, engine
        dead or starting) is tried on another, as a generation that nothing came back for yet is (`_attempts`). One
        whose engine broke under it, with no other replica serving (a lone replica restarting its engine in place),
        waits for a replica to serve again within its time, as a continued generation does: nothing of an embedding
        has reached the client, so the next try is the whole answer."""
        deadline = time.monotonic() + request.timeout_s
        self.quarantine.refuse_if_held(request)
        avoid: tuple[str, ...] = ()
        breaks = 0  # engines that broke with it inside (engine/quarantine.py)
        for attempt in range(1, ATTEMPTS + 1):
            attempt_request = request if attempt == 1 else replace(request, timeout_s=deadline - time.monotonic())
            try:
                answer = await remote(self._handle.embed_remote, attempt_request, avoid)
            except Exception as err:
                if not isinstance(translated := translate(err), ServiceError):
                    raise translated from None
                answer = Refused(translated)
            if isinstance(answer, Embeddings):
                return answer
            error = cast(Refused, answer).error
            if answer.in_flight:
                breaks = self.quarantine.broke(request, breaks, f"on replica {answer.replica}")
            last = attempt == ATTEMPTS or time.monotonic() >= deadline
            avoid += (answer.replica,) if answer.replica else ()
            if last or not worth_another_replica(error, avoid, self._loads()):
                raise error
            self.retried[error.code or type(error).__name__] += 1
            log.info("request %s refused by replica %s (%s); trying again (attempt %d of %d)", request.trace_id or
                     request.request_id, answer.replica or "?", error, attempt + 1, ATTEMPTS)
            if answer.in_flight and await self._waited_for_a_replica(error, avoid, deadline, request.timeout_s):
                avoid = ()  # the replica serving again may be the one it broke on
        raise AssertionError("unreachable: the last attempt raises")

    async def tokenize(self, prompt: PromptInput) -> list[int]:
        return cast(list[int], await self._call("tokenize", prompt))

    async def detokenize(self, token_ids: list[int]) -> str:
        return cast(str, await self._call("detokenize", token_ids))

    async def check_health(self) -> None:
        await self._call("check_health")

    async def check_ready(self) -> None:
        await self._call("check_ready")

    async def stats(self) -> ReplicaStats:
        return cast(ReplicaStats, await self._call("stats"))

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
                return cast(tuple[str, ReplicaStats], await asyncio.wait_for(
                    remote(self._handle.stats_of, Addressed(replica)), STATS_TIMEOUT_S))
            except Exception:
                return replica, None

        return dict(await asyncio.gather(*(one(r) for r in ids)))
