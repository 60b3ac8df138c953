"""The front door's pure-ASGI middleware (`Gate`).

`Gate` runs before any route, for every request: request id, API key, header and body size, drain
and capacity refusals (capacity.py), retries held to their Retry-After (retry_pacing.py), one access-log line and one
metric sample per request. Pure ASGI (not BaseHTTPMiddleware) so streams and client disconnects pass through
untouched and the token path pays for no extra task.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import (
    HeadersTooLarge,
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    ServiceUnavailable,
    TenantRateLimited,
    Unauthorized,
    UnsupportedMediaType,
)
from app.http.capacity import Capacity
from app.http.lifecycle import Lifecycle
from app.http.loop_lag import LoopLagProbe
from app.http.metrics import Metrics
from app.http.retry_pacing import RetryPacing
from app.http.wire_json import error_response
from app.tenancy import Tenant, Tenants

OPEN_PATHS = frozenset({"/health", "/livez", "/metrics"})  # probes and scrapes need no key
# Refused before the body is read when every model is at capacity: generation, and tokenizing (which costs
# the same tokenizer thread).
CAPACITY_ENDPOINTS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/tokenize", "/detokenize"}
)
# Past the request's own time limit (the host's 504 or error event comes first), a request whose client stopped
# reading is ended here, wherever it is blocked, and its engine request aborted.
DEADLINE_MARGIN_S = 2.0
QUIET_ENDPOINTS = frozenset({"/health", "/livez", "/metrics"})  # probes and scrapes would drown the access log
access_log = logging.getLogger("app.access")


def _capped(receive: Receive, max_body_bytes: int, too_large: Callable[[], PayloadTooLarge]) -> Receive:
    """`receive` that raises `too_large()` once the body read so far passes `max_body_bytes` (a body sent without
    its length, or longer than it said)."""
    received = 0

    async def capped_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > max_body_bytes:
                raise too_large()
        return message

    return capped_receive


def _not_json(headers: dict[bytes, bytes]) -> UnsupportedMediaType | None:
    """A body declared as anything but JSON (`application/json`, or `application/<x>+json` as FastAPI reads it)."""
    declared = headers.get(b"content-type", b"").decode("latin-1")
    media = declared.split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return None
    return UnsupportedMediaType(
        f"Unsupported Media Type: only 'application/json' is allowed, and this request's body is "
        f"{repr(declared) if declared else 'untyped'}; send the header 'Content-Type: application/json' (curl -d "
        f"sends 'application/x-www-form-urlencoded' without it)")


class Gate:
    """Pure ASGI middleware in front of every route: request id, API key, sizes, drain, capacity."""

    def __init__(
        self,
        app: ASGIApp,
        tenants: Tenants,
        max_body_bytes: int,
        request_timeout_s: float,
        watch_event_loop: bool,
        max_header_bytes: int,
        lifecycle: Lifecycle,
        echo_request_id: bool,
        metrics: Metrics,
        capacity: Capacity,
        known_endpoints: frozenset[str],
        json_endpoints: frozenset[str],
        room: Callable[[], bool] | None = None,
    ):
        self.app = app
        self.room = room  # whether a model's replicas would take a request now: ends a hold early
        self.capacity = capacity
        self.known_endpoints = known_endpoints  # the routes' own paths: anything else is 'other' in metrics and logs
        self.json_endpoints = json_endpoints  # the routes that take a JSON body by POST
        self.max_header_bytes, self.max_body_bytes = max_header_bytes, max_body_bytes
        self.metrics, self.echo_request_id, self.tenants = metrics, echo_request_id, tenants
        self.request_timeout_s = request_timeout_s
        self.loop_lag = LoopLagProbe(metrics.loop_lag) if watch_event_loop else None
        self.lifecycle = lifecycle
        self.pacing = RetryPacing()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.loop_lag is not None:
            self.loop_lag.start()  # on the loop that serves requests, once
        headers = dict(scope.get("headers", ()))
        path = route_path(scope)
        request_id = headers.get(b"x-request-id", b"").decode("latin-1")[:128] or uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["arrived"] = started = time.perf_counter()
        id_header = (b"x-request-id", request_id.encode("latin-1"))
        status = 0
        client = scope.get("client")
        state["tenant"] = tenant = self.tenants.of(headers.get(b"authorization", b""), client[0] if client else None)
        # A refusal's Retry-After is kept for this connection and tenant (retry_pacing.py), generation routes only.
        paced = (str(client[0]), int(client[1]), tenant.name) if client and tenant and path in CAPACITY_ENDPOINTS \
            else None

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self.pacing.answered(paced, status, message.get("headers", ()))
                if self.echo_request_id:
                    message = {**message, "headers": [*message.get("headers", []), id_header]}
            await send(message)

        async def refuse(err: ServiceError) -> None:
            self.metrics.refusals.labels("-", err.code or err.type).inc()
            self.capacity.accounts.refused(tenant, err.code or err.type)
            await error_response(err)(scope, receive, send_with_id)
            self._record(scope, status, started)

        if (err := self._refusal_at_door(scope, tenant, path)) is not None:
            return await refuse(err)
        if await self.pacing.hold(paced, self.room):  # back on this connection before its Retry-After
            self.metrics.retries_held.inc()
        if (err := self._refusal_before_body(tenant, path, headers.get(b"content-length", b""))):
            return await refuse(err)  # under overload most requests end here, before their body is read
        if scope["method"] == "POST" and path in self.json_endpoints and (err := _not_json(headers)):
            return await refuse(err)  # said before the body is read; a POST to a GET route stays a 405
        limited = tenant if path in CAPACITY_ENDPOINTS and tenant and self.capacity.limits.limited(tenant) else None
        if limited is not None:
            try:
                self.capacity.limits.admit_request(limited)  # its concurrency and request rate, before the body
            except TenantRateLimited as err:
                return await refuse(err)
        self.lifecycle.enter()
        try:
            await self._within_time_limit(scope, _capped(receive, self.max_body_bytes, self._too_large),
                                          send_with_id, lambda: status, request_id)
        finally:
            self.lifecycle.leave()
            if limited is not None:
                self.capacity.limits.done(limited)
            self._record(scope, status, started)

    def _refusal_at_door(self, scope: Scope, tenant: Tenant | None, path: str) -> ServiceError | None:
        """Who asks, how large its headers are, and whether the service still takes requests."""
        if tenant is None and path not in OPEN_PATHS:
            return Unauthorized("Missing or invalid API key; send 'Authorization: Bearer <key>'")
        header_bytes = sum(len(k) + len(v) for k, v in scope.get("headers", ()))
        if header_bytes > self.max_header_bytes:
            return HeadersTooLarge(f"Request headers total {header_bytes} bytes; the limit is {self.max_header_bytes}")
        if self.lifecycle.draining and path != "/livez":
            return ServiceUnavailable("The service is shutting down; retry on another instance", retry_after_s=5)
        return None

    def _refusal_before_body(self, tenant: Tenant | None, path: str, length: bytes) -> ServiceError | None:
        """Every model full for this tenant, or a body declared too large: refused without reading it."""
        if path in CAPACITY_ENDPOINTS and tenant and (full := self.capacity.refusal_if_all_full(tenant)):
            return full
        if length.isdigit() and int(length) > self.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"Request body is larger than the {self.max_body_bytes}-byte limit; send a smaller "
                               "request")

    async def _within_time_limit(self, scope: Scope, receive: Receive, send: Send, status: Callable[[], int],
                                 request_id: str) -> None:
        """The route, stopped a margin past the request's own time limit (the host's 504 or error event comes
        first): wherever it is blocked, typically writing to a client that does not read."""
        try:
            async with asyncio.timeout(self.request_timeout_s + DEADLINE_MARGIN_S):
                await self.app(scope, receive, send)
        except TimeoutError:
            if status() == 0:  # nothing sent yet: the client still gets an answer
                await error_response(RequestTimeout("The request ran past its time limit and was stopped"))(
                    scope, receive, send)
            else:  # blocked writing to a client that does not read; the connection is closed after this
                access_log.warning("request %s cut off past its time limit while writing its response", request_id)

    def _record(self, scope: Scope, status: int, started: float) -> None:
        """One metric sample and one access-log line per request, when it ends."""
        path = route_path(scope)
        endpoint = path if path in self.known_endpoints else "other"
        model = scope["state"].get("model", "-")
        self.metrics.requests.labels(model, endpoint, str(status)).inc()
        tenant = scope["state"].get("tenant")
        if endpoint not in QUIET_ENDPOINTS:
            if tenant is not None:
                self.metrics.tenant_requests.labels(tenant.metrics_label, str(status)).inc()
            access_log.info(
                "request",
                extra={
                    "request_id": scope["state"]["request_id"],
                    "method": scope["method"],
                    "path": endpoint,
                    "status": status,
                    "model": model,
                    "tenant": tenant.name if tenant is not None else "-",
                    "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                },
            )


def route_path(scope: Scope) -> str:
    """The path the app routes on: behind a Serve `route_prefix` (or any root path) `scope["path"]` still
    carries the prefix, and `/llm/health` must be matched as `/health`."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root):
        return str(path[len(root) :]) or "/"
    return str(path)
