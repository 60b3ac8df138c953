"""ResumingHost: the `EngineHost` of a replica that serves HTTP itself, whose requests outlive a broken engine.

Such a replica (`rayserve.replicas.ModelServer`: one model on one replica, the default) has no other replica to
give a request to when its engine dies or wedges; its supervisor restarts the engine in place (tens of seconds
on a CPU: docs/operations.md). A request that engine had in flight waits for the restart
instead of ending with a 503, then goes on on the new engine as the ingress tier continues one on another replica
(`engine.resumed_stream`): sent again when nothing had come back yet (a second break before its first output
holds it back instead: `engine.quarantine`); each unfinished choice continued
from its own tokens when the client already had part of the answer, so it sees one unbroken answer. It waits
within its own `timeout_s`, and not at all when the engine is not coming back (no restart under way: Serve
replaces the replica). An embeddings request under way is sent again whole on the restarted engine. A request
that arrives during the restart is still refused at once with a 503 and its `Retry-After` (it has nothing
invested, and the SDKs retry after that delay).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from app.engine.client import ClientReading
from app.engine.interface import Admitted, Embeddings, EmbedRequest, Engine, GenerateRequest, GenerationDelta
from app.engine.quarantine import Quarantine
from app.engine.resumed_stream import Lost, resumed_stream
from app.errors import EngineWedged, RequestTimeout, ServiceUnavailable
from app.host.engine_host import EngineHost
from app.host.supervisor import EngineState

POLL_S = 0.25  # how often a waiting request looks whether the restarted engine serves


class ResumingHost(EngineHost):
    """`EngineHost` whose `generate` continues a request on the engine restarted in place (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # /metrics (app_requests_migrated_total), as the ingress tier counts its continuations on other replicas.
        self.migrated: Counter[str] = Counter()
        self.quarantine = Quarantine()

    def generate(self, request: GenerateRequest, client: ClientReading | None = None
                 ) -> AsyncGenerator[Admitted | GenerationDelta, None]:
        return resumed_stream(request, lambda attempt, _failed_on: self._attempts(attempt, client),
                              self._serving_again, self.migrated, "on its restarted engine", self.quarantine)

    async def _attempts(self, request: GenerateRequest, client: ClientReading | None) -> AsyncGenerator[Any, None]:
        """The request on this host's engine, sent again once the engine serves again when it broke before any
        answer, until it has been in `BREAKS_TO_HOLD` breaks (then held back: engine/quarantine.py); one that breaks
        after answering raises `Lost`. A request that found no engine serving (it arrived during a restart) is
        refused as `EngineHost` refuses it."""
        deadline = time.monotonic() + request.timeout_s
        self.quarantine.refuse_if_held(request)
        attempt_request, breaks = request, request.breaks
        while True:
            engine, answered = self.supervisor.serving_engine(), False
            try:
                # Closed with this stream: its slot is given back (and the engine request aborted) at once.
                async with aclosing(super().generate(attempt_request, client)) as stream:
                    async for item in stream:
                        answered = True
                        yield item
                return
            except ServiceUnavailable as err:
                broke = self._broke(engine)
                if answered and broke:
                    raise Lost(err, breaks=breaks + 1) from None
                if answered or not broke:
                    raise
                breaks = self.quarantine.broke(request, breaks, "on this replica's restarted engine")
                await self._serving_again(err, deadline, request.timeout_s)
                attempt_request = replace(request, timeout_s=deadline - time.monotonic(),
                                          after_wedge=attempt_request.after_wedge or isinstance(err, EngineWedged))

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """/v1/embeddings, sent again on the restarted engine when its engine broke under it (nothing of an
        embedding reaches the client before its end, so a second try is the whole answer), until it has been in
        `BREAKS_TO_HOLD` breaks (then held back, as a generation is). A refusal of the request itself, or of one
        that arrived during a restart, is raised as it is."""
        deadline = time.monotonic() + request.timeout_s
        self.quarantine.refuse_if_held(request)
        attempt_request, breaks = request, 0
        while True:
            engine = self.supervisor.serving_engine()
            try:
                return await super().embed(attempt_request)
            except ServiceUnavailable as err:
                if not self._broke(engine):
                    raise
                breaks = self.quarantine.broke(request, breaks, "on this replica's restarted engine")
                await self._serving_again(err, deadline, request.timeout_s)
            attempt_request = replace(request, timeout_s=deadline - time.monotonic())

    def _broke(self, engine: Engine | None) -> bool:
        """Whether `engine` (the one serving when a request was sent) broke since: its restart under way or done."""
        return engine is not None and self.supervisor.left(engine)

    async def _serving_again(self, failure: ServiceUnavailable, deadline: float, timeout_s: float,
                             _refused: bool = False) -> None:
        """Returns once the restarted engine serves; raises `failure` when no restart is under way (the replica is
        to be replaced), and a `RequestTimeout` when the request's deadline comes first."""
        while True:
            if time.monotonic() >= deadline:
                raise RequestTimeout(f"The request ran past its time limit ({timeout_s:g} s) while its engine "
                                     f"restarted after: {failure}")
            if self.supervisor.serving_engine() is not None:
                return
            if self.supervisor.state is not EngineState.RESTARTING:
                raise failure
            await asyncio.sleep(POLL_S)
