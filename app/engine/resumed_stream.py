"""A request's stream that outlives the engine answering it: the one loop that continues each unfinished choice
elsewhere, shared by the ingress tier (on another replica: rayserve/handle_backend.py) and by the replica that
serves HTTP itself (on its engine restarted in place: host/resuming_host.py).

Usage contract: `attempts(request, failed_on)` is one engine stream for `request`, tried wherever its caller tries
it (`failed_on`: the replica a choice was lost on, "" at first), which raises `Lost` when it fails after answering
and the error itself when nothing had come back. `resumed_stream` passes the stream through `Continuation` (the
engine is asked for the token ids a resume needs; stop strings are matched there). After a `Lost` each unfinished
choice continues on a stream of its own (`Continuation.resume`), once `wait` has returned: the caller's wait for
somewhere to go on (`refused`: the last try was refused before answering), which raises when there is none by the
request's deadline. A choice is continued at most `ATTEMPTS` times, refusals included, and the client's stream is
the merge of them: one unbroken answer. A continuation carries the engine breaks its request was in (`Lost.breaks`),
so one that breaks its next engine before answering there is held back (engine/quarantine.py), and so is its request.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from app.engine.continuation import Continuation
from app.engine.interface import Admitted, ChoiceDelta, GenerateRequest, GenerationDelta
from app.engine.merged_streams import merged
from app.engine.quarantine import Quarantine
from app.errors import RequestQuarantined, RequestTimeout, ServiceUnavailable

log = logging.getLogger(__name__)
ATTEMPTS = 3  # continuations of one choice, refused ones included

Attempts = Callable[[GenerateRequest, str], AsyncGenerator[Any, None]]
Wait = Callable[[ServiceUnavailable, float, float, bool], Awaitable[None]]  # (failure, deadline, timeout_s, refused)


class Lost(Exception):
    """A stream that had answered ended with a retryable `ServiceUnavailable`: its replica or engine died,
    wedged or was stopped under it. `replica`: that replica's id where known; `breaks`: the engines that broke with
    the request inside, this one included (engine/quarantine.py: its continuations carry the count)."""

    def __init__(self, error: ServiceUnavailable, replica: str = "", breaks: int = 0):
        super().__init__(error)
        self.error, self.replica, self.breaks = error, replica, breaks


async def resumed_stream(request: GenerateRequest, attempts: Attempts, wait: Wait, migrated: Counter[str],
                         where: str, quarantine: Quarantine) -> AsyncGenerator[Any, None]:
    """`request`'s stream, each choice continued `where` (said in logs and errors) when its engine fails after
    answering; `migrated` counts the continuations ("resumed") and the requests that cannot ("unresumable"); a
    continuation held back by `quarantine` holds `request` too."""
    deadline = time.monotonic() + request.timeout_s
    progress = Continuation(request)
    try:
        async with aclosing(attempts(progress.for_engine(), "")) as stream:
            async for item in stream:
                # Asked before the next item, so a stream that ends with its last one ends by itself; one that goes on
                # (past a stop string matched here) is closed, which aborts its engine request.
                if progress.all_finished():
                    return
                passed = progress.observe(item)
                if passed is not None:
                    yield passed
        return
    except Lost as lost:
        failure = lost
    why_not = progress.unresumable()
    if why_not is not None:
        migrated["unresumable"] += 1
        log.warning("request %s lost on replica %s (%s); it cannot continue %s: %s", _name(request),
                    failure.replica or "?", failure.error, where, why_not)
        raise ServiceUnavailable(f"{failure.error} (this request cannot continue {where}: {why_not})",
                                 retry_after_s=failure.error.retry_after_s) from None
    streams = [_choice(progress, i, deadline, failure, attempts, wait, migrated, where) for i in progress.unfinished()]
    try:
        async with aclosing(merged(streams)) as choices:
            async for item in choices:
                yield item
    except RequestQuarantined:
        quarantine.hold(progress.for_engine())  # the whole request as first sent: a retry of it is refused at once
        raise


async def _choice(progress: Continuation, index: int, deadline: float, failure: Lost, attempts: Attempts,
                  wait: Wait, migrated: Counter[str], where: str) -> AsyncGenerator[Any, None]:
    """Choice `index` of `progress`'s request, continued until it finishes (module docstring)."""
    request, refused = progress.request, False
    for _ in range(ATTEMPTS):
        done = len(progress.choices[index].token_ids)
        if time.monotonic() >= deadline:
            raise RequestTimeout(f"The request ran past its time limit ({request.timeout_s:g} s) while it was "
                                 f"moving {where} after: {failure.error}")
        if done >= request.params.max_tokens:  # lost between its last token and the finish
            end = ChoiceDelta(index=0, text="", num_tokens=0, finish_reason="length")
            yield progress.observe(GenerationDelta(choices=(end,)), index=index)  # with any text held back
            return
        await wait(failure.error, deadline, request.timeout_s, refused)
        try:
            resumed = replace(progress.resume(index, deadline - time.monotonic()), breaks=failure.breaks)
            async with aclosing(attempts(resumed, failure.replica)) as stream:
                async for item in stream:
                    if isinstance(item, Admitted):  # taken: counted once per engine that took the choice
                        migrated["resumed"] += 1
                        # In-process (a restart in place) no replica is named: the line says where it went on.
                        log.info("request %s choice %d: %s failed after %d token(s) (%s); resumed %s", _name(request),
                                 index, f"replica {failure.replica}" if failure.replica else "its engine", done,
                                 failure.error, f"on replica {item.replica}" if item.replica else where)
                    if progress.finished(index):  # as in `resumed_stream`
                        return
                    passed = progress.observe(item, index=index)
                    if passed is not None:
                        yield passed
            return
        except Lost as lost:
            failure, refused = lost, False
        except ServiceUnavailable as err:  # no engine took it (each restarting or starting): wait, and try again
            failure, refused = Lost(err, failure.replica, failure.breaks), True
    raise failure.error


def _name(request: GenerateRequest) -> str:
    return request.trace_id or request.request_id
