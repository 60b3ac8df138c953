"""Each call the ingress makes to an engine deployment goes with a Serve request id of its own.

Serve gives a handle call the internal request id of the request being handled (its context), so the calls one
request makes at once (the /metrics scrape's calls addressed to every replica, the choices of a continued answer)
would share one. The engine deployments' request router (rayserve/request_router.py) has Serve match the replica it
chose to its call by that id: calls sharing one would take each other's replicas, or one would never be routed.
`remote` makes the call with a fresh internal id; the request id that logs carry stays the client's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ray.serve import context as serve_context


@contextmanager
def own_internal_id() -> Iterator[None]:
    """Within: Serve's request context as it was, with an internal request id of its own."""
    variable = getattr(serve_context, "_serve_request_context", None)  # private to Serve: without it, as it was
    if variable is None:
        yield
        return
    current = serve_context._get_serve_request_context()
    token = variable.set(replace(current, _internal_request_id=uuid.uuid4().hex))
    try:
        yield
    finally:
        variable.reset(token)


def remote(method: Any, *args: Any) -> Any:
    """`method.remote(*args)` for a handle's method, with an internal request id of its own (Serve reads the
    context when the call is made, not when it is awaited)."""
    with own_internal_id():
        return method.remote(*args)
