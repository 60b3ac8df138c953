"""Requests held back after engines broke with them inside, the last time before any output of theirs there.

An engine that dies or wedges under a request that has had no answer yet looks like the engine's failure, so the
request is sent again: to another replica (rayserve/handle_backend.py) or to the engine restarted in place
(host/resuming_host.py). When it is the request that breaks engines (an input some kernel or library crashes on),
that fails every engine it reaches: unchecked, three per request and three more for each of the openai SDK's two
retries of the 503, and on the default one-replica config the third break within ten minutes leaves the replica to
Serve to replace (host/restart_budget.py), cutting every connection it holds. So a request its engine broke under
before its first output `BREAKS_TO_HOLD` times is sent nowhere again: it ends with a 503 `request_quarantined`, and
the same request (prompt and parameters, whoever sends it) is refused at once for `HOLD_S`. Another request that
happened to wait beside it through both breaks is held too: two breaks in a row under one request are rare enough
that holding it costs less than a third break.

A request that breaks engines only after its first output (a kernel that fails at some length of context) counts
too: the engine broke under it once, and its continuation (engine/resumed_stream.py, which carries the count in
`GenerateRequest.breaks`) then breaks one before its first output there, as a continuation of it does when the
failure is at the same place. The client's answer then ends with the 503 (a stream's error event after what it had),
and the whole request is held as well as the continuation.

Counted per request, not per prompt: a load of identical requests (a benchmark's one prompt) lives through engine
kills as before, each of its requests having seen at most one break before its first output; only the request that
itself saw two is held (it and any copy of it: the SDK's retries of its 503 are refused at once).

Usage contract: a sender calls `refuse_if_held(request)` before it sends a request, and `breaks = broke(request,
breaks, where)` (starting from `request.breaks`, 0 but for a continuation) each time an engine broke with the request
inside before any answer: it raises the request's `RequestQuarantined` at the `BREAKS_TO_HOLD`th; `hold(request)`
holds another form of it (the whole request a continuation came from). Nothing is computed per request while nothing
is held.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict

from app.engine.interface import EmbedRequest, GenerateRequest
from app.errors import RequestQuarantined

log = logging.getLogger(__name__)
BREAKS_TO_HOLD = 2
HOLD_S = 600.0  # the restart budget's window (host/restart_budget.py): a held request cannot spend its third break
MAX_HELD = 1024  # fingerprints remembered (the oldest go first); a flood of distinct ones is not a crash loop


def fingerprint(request: GenerateRequest | EmbedRequest) -> str:
    """The request's prompt (or inputs) and parameters: what an engine sees of it, not who sent it or when."""
    seen = ((request.prompt, request.params) if isinstance(request, GenerateRequest)
            else (request.inputs, request.dimensions))
    return hashlib.sha256(repr(seen).encode("utf-8", "surrogatepass")).hexdigest()


class Quarantine:
    """The requests held back in this process, by fingerprint, until when (module docstring)."""

    def __init__(self) -> None:
        self._until: OrderedDict[str, float] = OrderedDict()  # the oldest hold first

    def refuse_if_held(self, request: GenerateRequest | EmbedRequest) -> None:
        if not self._until:
            return
        now = time.monotonic()
        while self._until and next(iter(self._until.values())) <= now:
            self._until.popitem(last=False)
        until = self._until.get(fingerprint(request))
        if until is not None:
            raise RequestQuarantined(
                f"this request (the same prompt and parameters) was in the engine each time it failed, "
                f"{BREAKS_TO_HOLD} times, before its first output; it is held back for {until - now:.0f} s more, in "
                "case it is what makes engines fail. Send it changed, or after Retry-After",
                retry_after_s=max(1, round(until - now)))

    def hold(self, request: GenerateRequest | EmbedRequest) -> str:
        """Refuses the same request for HOLD_S from now; its fingerprint."""
        key = fingerprint(request)
        self._until.pop(key, None)
        self._until[key] = time.monotonic() + HOLD_S
        while len(self._until) > MAX_HELD:
            self._until.popitem(last=False)
        return key

    def broke(self, request: GenerateRequest | EmbedRequest, breaks: int, where: str) -> int:
        """`request`'s breaks with this one (`where`: said in the log and the message); at BREAKS_TO_HOLD, raises the
        error that ends it, and the same request is refused at once for HOLD_S."""
        breaks += 1
        if breaks < BREAKS_TO_HOLD:
            return breaks
        key = self.hold(request)
        log.warning("request %s held back for %.0f s (fingerprint %s): %d engines broke with it inside, the last %s "
                    "before its first output there; the same request is refused until then",
                    request.trace_id or request.request_id, HOLD_S, key[:12], breaks, where)
        raise RequestQuarantined(
            f"the engine failed {breaks} times with this request in it, the last {where} before its first output "
            f"there; it is not sent again, in case it is what makes engines fail, and the same request is refused "
            f"for {HOLD_S:.0f} s", retry_after_s=HOLD_S) from None
