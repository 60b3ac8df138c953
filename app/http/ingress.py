"""The HTTP front door assembled: `create_app(config, backends)` returns the FastAPI app. No vLLM here.

The assembly, in order: the shared state (`IngressState`), the error handlers that give every
failure the OpenAI error shape with its real status, the routes (`http/routes.py`, `http/ops_routes.py`),
and `Gate` (http/gate.py) in front of them all. A backend is anything with `EngineHost`'s methods:
the host itself in the colocated replica and in tests, `rayserve.handle_backend.HandleBackend` otherwise.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.config.app_config import AppConfig
from app.errors import InternalError, InvalidRequest, MethodNotAllowed, NotFound, ServiceError
from app.http import model_routes, ops_routes, routes
from app.http.capacity import Capacity
from app.http.gate import OPEN_PATHS, Gate
from app.http.ingress_state import Backend, IngressState
from app.http.lifecycle import Lifecycle
from app.http.metrics import Metrics
from app.http.wire_json import error_response
from app.openai import validation_errors
from app.openai.json_depth import MAX_DEPTH, too_deep_text
from app.tenancy import Tenants

log = logging.getLogger(__name__)


def create_app(
    config: AppConfig, backends: Mapping[str, Backend], behind_serve_proxy: bool = False, watch_event_loop: bool = False
) -> FastAPI:
    """The OpenAI API over `backends` (model id -> backend). `behind_serve_proxy`: Serve's HTTP proxy
    answers the socket (see `IngressState.behind_serve_proxy`). `watch_event_loop`: run the event-loop lag
    probe (http/loop_lag.py) on the loop that serves the first request; the replicas do, tests need not."""
    api = FastAPI(title="LLM service (OpenAI-compatible)", version="0.1.0")
    # Resolved where the app was built (api_keys.py), never from this replica's own environment.
    tenants = Tenants(config)
    keys = tenants.keys
    if keys:
        log.info(
            "authentication on: %d API key(s); every route but %s needs one",
            len(keys.digests),
            ", ".join(sorted(OPEN_PATHS)),
        )
    else:
        log.warning("authentication OFF: no API key configured, every route is open to whoever can connect")
    state = IngressState(
        config=config,
        backends=backends,
        metrics=Metrics(),
        capacity=Capacity(config, retry_after=lambda model_id: state.retry_after_s(model_id)),
        lifecycle=Lifecycle(),
        behind_serve_proxy=behind_serve_proxy,
    )
    api.state.ingress = state
    api_routes = [r for r in (*routes.router.routes, *model_routes.router.routes, *ops_routes.router.routes)
                  if isinstance(r, APIRoute)]
    # Templated paths (/v1/models/{id}) count as 'other': the metrics' label set stays bounded.
    known_endpoints = frozenset(r.path for r in api_routes if "{" not in r.path)
    _add_error_handlers(api, state, known_endpoints)
    api.include_router(routes.router)
    api.include_router(model_routes.router)
    api.include_router(ops_routes.router)
    api.add_middleware(
        Gate,
        tenants=tenants,
        request_timeout_s=config.service.request_timeout_s,
        watch_event_loop=watch_event_loop,
        max_body_bytes=config.service.max_body_bytes,
        max_header_bytes=config.service.max_header_bytes,
        lifecycle=state.lifecycle,
        echo_request_id=not behind_serve_proxy,
        metrics=state.metrics,
        capacity=state.capacity,
        known_endpoints=known_endpoints,
        json_endpoints=frozenset(r.path for r in api_routes if "POST" in r.methods),  # each POST route takes JSON
        room=state.has_room,
    )
    if config.service.cors_allowed_origins:  # outermost: it answers a browser's preflight before the key check
        api.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.service.cors_allowed_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["*"],  # Authorization, Content-Type and the SDKs' x-stainless-* headers
            expose_headers=["x-request-id", "retry-after"],
        )
    return api


def _add_error_handlers(api: FastAPI, state: IngressState, known_endpoints: frozenset[str]) -> None:
    """Every error in the OpenAI shape, with its real status; never a bare 500 or FastAPI's own shape."""

    @api.exception_handler(ServiceError)
    async def _service_error(request: Request, err: ServiceError) -> Response:
        state.metrics.refusals.labels(getattr(request.state, "model", "-"), err.code or err.type).inc()
        state.capacity.accounts.refused(getattr(request.state, "tenant", None), err.code or err.type,
                                        getattr(request.state, "asked_tokens", 0) + (err.prompt_tokens or 0))
        return error_response(err)

    @api.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, err: RequestValidationError) -> Response:
        errors = list(err.errors())
        if errors and isinstance(errors[0], dict) and errors[0].get("type") == "json_invalid":
            return error_response(InvalidRequest("The request body is not valid JSON", param=None))
        # vLLM's wording (it names pydantic's constraint), this service's `param`
        return error_response(InvalidRequest(validation_errors.message(errors), param=validation_errors.param(errors)))

    @api.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> Response:
        if err.status_code == 404:
            return error_response(NotFound(_no_route(request.method, request.url.path, known_endpoints)))
        if err.status_code == 405:
            return error_response(MethodNotAllowed(f"Method {request.method} is not allowed on {request.url.path}"))
        if isinstance(err.__cause__, ServiceError):  # e.g. Gate's PayloadTooLarge, wrapped by FastAPI's body reader
            return error_response(err.__cause__)
        if isinstance(err.__cause__, RecursionError):  # nested too deep for the parser itself
            field = too_deep_text(getattr(request, "_body", b""))
            return error_response(InvalidRequest(
                f"'{field or 'body'}' is nested more than {MAX_DEPTH} levels deep; send a flatter structure",
                param=field))
        if isinstance(err.__cause__, UnicodeDecodeError):  # another charset, or a compressed body
            coding = request.headers.get("content-encoding")
            taken = f" (Content-Encoding '{coding}' is not taken)" if coding else ""
            return error_response(InvalidRequest(f"The request body is not UTF-8 text{taken}; send the JSON as UTF-8, "
                                                 "uncompressed"))
        if isinstance(err.__cause__, ValueError) and "digits" in str(err.__cause__):  # Python's int parsing bound
            return error_response(InvalidRequest(f"A number in the request body has more than "
                                                 f"{sys.get_int_max_str_digits()} digits; no parameter takes one"))
        fallback = InvalidRequest(str(err.detail)) if 400 <= err.status_code < 500 else ServiceError(str(err.detail))
        fallback.status = err.status_code  # keep the status; never turn a client error into a 500
        return error_response(fallback)

    @api.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return error_response(InternalError("The server hit an unexpected error; it has been logged"))


def _no_route(method: str, path: str, known: frozenset[str]) -> str:
    """The 404's message; where the path is a route's with `/v1` missing or doubled (a client's base URL without
    `/v1`, or with it twice), it names the route meant."""
    meant = next((p for p in (f"/v1{path}", path.removeprefix("/v1")) if p != path and p in known), None)
    if meant:
        base_url = " (a client's base URL ends in /v1: http://host:port/v1)" if meant.startswith("/v1/") else ""
        return f"No route {method} {path}; did you mean {meant}?{base_url}"
    return f"No route {method} {path}; see docs/api.md for the endpoints"
