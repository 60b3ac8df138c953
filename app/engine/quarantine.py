"""Requests held back after engines broke with them inside, before their first output.

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

Usage contract: a sender calls `refuse_if_held(request)` before it sends a request, and `broke(request, where,
engine)` each time an engine broke with it inside before any answer (`engine`: that engine's identity, so that
identical requests in one break count it once); `broke` returns the error to end it with once that request (this
one, or the same one sent before: the SDK's retries count together) has been in `BREAKS_TO_HOLD` engines' breaks
within `HOLD_S`. Nothing is computed per request while nothing has broken.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Hashable

from app.engine.interface import GenerateRequest
from app.errors import RequestQuarantined

log = logging.getLogger(__name__)
BREAKS_TO_HOLD = 2
HOLD_S = 600.0  # breaks count, and a hold lasts, this long: the restart budget's window (host/restart_budget.py)
MAX_HELD = 1024  # fingerprints remembered (the oldest go first); a flood of distinct ones is not a crash loop


def fingerprint(request: GenerateRequest) -> str:
    """The request's prompt and parameters: what an engine sees of it, not who sent it or when."""
    return hashlib.sha256(repr((request.prompt, request.params)).encode("utf-8", "surrogatepass")).hexdigest()


class Quarantine:
    """The breaks each request fingerprint was in, and the requests held back, in this process (module docstring)."""

    def __init__(self) -> None:
        # fingerprint: (the engines that broke with it inside, until when they count), the oldest first
        self._breaks: OrderedDict[str, tuple[frozenset[Hashable], float]] = OrderedDict()

    def _forget_ended(self) -> None:
        now = time.monotonic()
        while self._breaks and next(iter(self._breaks.values()))[1] <= now:
            self._breaks.popitem(last=False)

    def refuse_if_held(self, request: GenerateRequest) -> None:
        if not self._breaks:
            return
        self._forget_ended()
        engines, until = self._breaks.get(fingerprint(request), (frozenset(), 0.0))
        if len(engines) >= BREAKS_TO_HOLD:
            left = until - time.monotonic()
            raise RequestQuarantined(
                f"this request (the same prompt and parameters) was in the engine each time it failed, {len(engines)} "
                f"times, before its first output; it is held back for {left:.0f} s more, in case it is what makes "
                "engines fail. Send it changed, or after Retry-After", retry_after_s=max(1, round(left)))

    def broke(self, request: GenerateRequest, where: str, engine: Hashable) -> RequestQuarantined | None:
        """Counts `engine` broken with `request` inside before any answer (`where`: said in the log and the
        message); the error to end it with once BREAKS_TO_HOLD engines have, after which the same request is
        refused at once for HOLD_S."""
        self._forget_ended()
        key = fingerprint(request)
        engines = self._breaks.pop(key, (frozenset(), 0.0))[0] | {engine}
        self._breaks[key] = (engines, time.monotonic() + HOLD_S)
        while len(self._breaks) > MAX_HELD:
            self._breaks.popitem(last=False)
        if len(engines) < BREAKS_TO_HOLD:
            return None
        log.warning("request %s held back for %.0f s (fingerprint %s): %d engines broke with it inside before its "
                    "first output, the last %s; the same request is refused until then",
                    request.trace_id or request.request_id, HOLD_S, key[:12], len(engines), where)
        return RequestQuarantined(
            f"the engine failed {len(engines)} times with this request in it, before its first output (the last "
            f"{where}); it is not sent again, in case it is what makes engines fail, and the same request is refused "
            f"for {HOLD_S:.0f} s", retry_after_s=HOLD_S)
