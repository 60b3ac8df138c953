"""ResumingHost: the `EngineHost` of a replica that serves HTTP itself, whose requests outlive a broken engine.

Such a replica (`rayserve.replicas.ModelServer`: one model on one replica, the default) has no other replica to
give a request to when its engine dies or wedges; its supervisor restarts the engine in place (34-46 s after a
SIGKILL on the 2-core Xeon, docs/operations.md). A request that engine had in flight waits for the restart
instead of ending with a 503, then goes on on the new engine as the ingress tier continues one on another replica
(`engine.continuation.Continuation`): sent again when nothing had come back yet; each unfinished choice continued
from its own tokens when the client already had part of the answer, so it sees one unbroken answer. It waits
within its own `timeout_s`, and not at all when the engine is not coming back (no restart under way: Serve
replaces the replica). A request that arrives during the restart is still refused at once with a 503 and its
`Retry-After` (it has nothing invested, and the SDKs retry after that delay).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import replace
from typing import Any, cast

from app.engine.client import ClientReading
from app.engine.continuation import Continuation
from app.engine.interface import Admitted, ChoiceDelta, Engine, GenerateRequest, GenerationDelta
from app.engine.merged_streams import merged
from app.errors import EngineWedged, RequestTimeout, ServiceUnavailable
from app.host.engine_host import EngineHost
from app.host.supervisor import EngineState

log = logging.getLogger("app.server")
ATTEMPTS = 3  # engines one request may be sent to, the first included (then a crash loop is Serve's to end)
POLL_S = 0.25  # how often a waiting request looks whether the restarted engine serves


class _Lost(Exception):
    """The engine broke after the request had answered: its unfinished choices are to be continued."""

    def __init__(self, error: ServiceUnavailable):
        super().__init__(str(error))
        self.error = error


class ResumingHost(EngineHost):
    """`EngineHost` whose `generate` continues a request on the engine restarted in place (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # /metrics (app_requests_migrated_total), as the ingress tier counts its continuations on other replicas.
        self.migrated: Counter[str] = Counter()

    async def generate(self, request: GenerateRequest, client: ClientReading | None = None
                       ) -> AsyncGenerator[Admitted | GenerationDelta, None]:
        deadline = time.monotonic() + request.timeout_s
        progress = Continuation(request)
        try:
            async with aclosing(self._attempts(progress.for_engine(), client)) as stream:
                async for item in stream:
                    if progress.all_finished():  # the engine went on past a stop string matched here: abort it
                        return
                    passed = progress.observe(item)
                    if passed is not None:
                        yield cast(Admitted | GenerationDelta, passed)  # observe passes on what it was given
            return
        except _Lost as lost:
            failure = lost.error
        why_not = progress.unresumable()
        if why_not is not None:
            self.migrated["unresumable"] += 1
            raise failure
        streams = [self._resumed(progress, i, deadline, failure, client) for i in progress.unfinished()]
        async with aclosing(merged(streams)) as choices:
            async for item in choices:
                yield item

    async def _resumed(self, progress: Continuation, index: int, deadline: float, failure: ServiceUnavailable,
                       client: ClientReading | None) -> AsyncGenerator[Any, None]:
        """Choice `index` of `progress`'s request, continued on the restarted engine until it finishes (at most
        `ATTEMPTS` engines, by the request's deadline)."""
        request = progress.request
        for _ in range(ATTEMPTS):
            done = len(progress.choices[index].token_ids)
            if done >= request.params.max_tokens:  # lost between its last token and the finish
                end = ChoiceDelta(index=0, text="", num_tokens=0, finish_reason="length")
                yield progress.observe(GenerationDelta(choices=(end,)), index=index)
                return
            await self._serving_again(failure, deadline, request.timeout_s)
            self.migrated["resumed"] += 1
            log.info("request %s choice %d: the engine failed after %d token(s) (%s); resumed on its restarted "
                     "engine", request.trace_id or request.request_id, index, done, failure)
            try:
                resumed = progress.resume(index, deadline - time.monotonic())
                async with aclosing(self._attempts(resumed, client)) as stream:
                    async for item in stream:
                        if progress.finished(index):  # as in `generate`
                            return
                        passed = progress.observe(item, index=index)
                        if passed is not None:
                            yield passed
                return
            except _Lost as lost:
                failure = lost.error
        raise failure

    async def _attempts(self, request: GenerateRequest, client: ClientReading | None) -> AsyncGenerator[Any, None]:
        """The request on this host's engine, sent again once the engine serves again when it broke before any
        answer (up to `ATTEMPTS` engines); one that breaks after answering raises `_Lost`. A request that found no
        engine serving (it arrived during a restart) is refused as `EngineHost` refuses it."""
        deadline = time.monotonic() + request.timeout_s
        attempt_request = request
        for attempt in range(1, ATTEMPTS + 1):
            engine, answered = self._serving_engine(), False
            try:
                # Closed with this stream: its slot is given back (and the engine request aborted) at once.
                async with aclosing(super().generate(attempt_request, client)) as stream:
                    async for item in stream:
                        answered = True
                        yield item
                return
            except ServiceUnavailable as err:
                if answered and self._broke(engine):
                    raise _Lost(err) from None
                if answered or attempt == ATTEMPTS or not self._broke(engine):
                    raise
                await self._serving_again(err, deadline, request.timeout_s)
                attempt_request = replace(request, timeout_s=deadline - time.monotonic(),
                                          after_wedge=attempt_request.after_wedge or isinstance(err, EngineWedged))

    def _serving_engine(self) -> Engine | None:
        """The engine now serving, if one is."""
        sup = self.supervisor
        return sup.engine if sup.state is EngineState.SERVING and sup.reason is None else None

    def _broke(self, engine: Engine | None) -> bool:
        """Whether `engine` (the one serving when a request was sent) broke since: its restart under way or done."""
        sup = self.supervisor
        return engine is not None and (sup.engine is not engine or sup.reason is not None)

    async def _serving_again(self, failure: ServiceUnavailable, deadline: float, timeout_s: float) -> None:
        """Returns once the restarted engine serves; raises `failure` when no restart is under way (the replica is
        to be replaced), and a `RequestTimeout` when the request's deadline comes first."""
        while True:
            if time.monotonic() >= deadline:
                raise RequestTimeout(f"The request ran past its time limit ({timeout_s:g} s) while its engine "
                                     f"restarted after: {failure}")
            if self._serving_engine() is not None:
                return
            if self.supervisor.state is not EngineState.RESTARTING:
                raise failure
            await asyncio.sleep(POLL_S)
