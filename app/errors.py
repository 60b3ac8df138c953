"""Typed service errors and their OpenAI wire shape.

Errors are raised, never returned. Each class fixes its HTTP status and OpenAI
`type`; the instance carries the message and the offending parameter. They cross
the Ray handle intact (pickled by their args), so the ingress turns an error
raised in an engine replica into the same response as one raised locally.
"""

from __future__ import annotations

from typing import Any

# Why text holding one is refused, and what to send instead: JSON carries it ("\\ud800"), no UTF-8 encoder does.
LONE_SURROGATE = ("a lone UTF-16 surrogate (an escape such as \\ud800 without its pair), which is not Unicode text; "
                  "send the character's whole surrogate pair or the character itself")


class ServiceError(Exception):
    status: int = 500
    type: str = "internal_error"
    code: str | None = None
    # The refused prompt's tokens, where they were counted before the refusal (a replica's admission, the fleet
    # router): the tenant's refused tokens count them (app/http/tenant_accounts.py). Pickled with the instance.
    prompt_tokens: int | None = None

    def __init__(self, message: str, param: str | None = None, retry_after_s: float | None = None):
        super().__init__(message, param, retry_after_s)
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class InvalidRequest(ServiceError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class UnsupportedParameter(InvalidRequest):
    code = "unsupported_parameter"


class UnsupportedMediaType(InvalidRequest):  # a 400, as vLLM's server answers it
    code = "unsupported_media_type"


class Unauthorized(ServiceError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFound(ServiceError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class NotFound(ServiceError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(ServiceError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(ServiceError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class HeadersTooLarge(ServiceError):
    status = 431
    type = "invalid_request_error"
    code = "headers_too_large"


class ClientTimeout(ServiceError):
    """The client was too slow to send its request (headers or body)."""

    status = 408
    type = "invalid_request_error"
    code = "client_timeout"


class QueueFull(ServiceError):
    """Refused at once: the replica's queue is full. Status is 429 unless configured to 503."""

    status = 429
    type = "rate_limit_error"
    code = "queue_full"


class TenantOverShare(QueueFull):
    """Refused while waiting, or at arrival to a full replica: its tenant is the most served of those waiting, and a
    less served tenant's request took its place (app/host/fair_queue.py). Always 429."""

    status = 429
    type = "rate_limit_error"
    code = "tenant_over_share"


class TenantRateLimited(ServiceError):
    """Refused at the front door: the tenant is at its `max_concurrent`, `requests_per_minute` or `tokens_per_minute`
    (app/http/tenant_limits.py). Not tried on another replica: the limit is the tenant's, not a replica's."""

    status = 429
    type = "rate_limit_error"
    code = "tenant_rate_limited"


class QueueFullUnavailable(QueueFull):
    status = 503
    type = "service_unavailable"


class OverTimeTarget(QueueFull):
    """Refused at arrival: its predicted first token (or end) is later than its latency target. Always 429,
    with Retry-After the predicted time until it would fit: waiting could only end past the target.

    It also says `x-should-retry: false`, which the openai SDKs obey instead of retrying on their own: a retry
    after Retry-After cannot give that client its first token within the target (counted from its first attempt,
    the target is already past), and under sustained overload it is refused again. Measured in the goodput run
    of 2026-12-02 06:06 (the SDK's default retries, 4x the engine's rate): 415 of 646 requests refused three
    times, 39.8 % of all client-seconds spent waiting only to be refused, and the served ones that had retried
    pushed first tokens to p99 20 s. A client's own code still has the Retry-After to act on."""

    status = 429
    type = "rate_limit_error"
    code = "over_time_target"

    def headers(self) -> dict[str, str]:
        return {**super().headers(), "x-should-retry": "false"}


class NeverInTime(OverTimeTarget):
    """An `OverTimeTarget` for a request that would miss its target even alone on this replica: no Retry-After
    (waiting does not help), and no other busy replica is tried."""


def queue_full_class(status: int) -> type[QueueFull]:
    """The 'queue full' refusal for the configured status (429 or 503)."""
    return QueueFull if status == 429 else QueueFullUnavailable


class QueueTimeout(ServiceError):
    status = 503
    type = "service_unavailable"
    code = "queue_timeout"


class ServiceUnavailable(ServiceError):
    """No engine can serve now: it died, is starting, or the service is draining."""

    status = 503
    type = "service_unavailable"
    code = "engine_unavailable"


class EngineWedged(ServiceUnavailable):
    """The request was waiting for its first output on an engine declared wedged: another replica is given it
    with more time (`GenerateRequest.after_wedge`), in case the request was the slow one."""

    code = "engine_wedged"


class RequestQuarantined(ServiceError):
    """Engines broke with this request in them, before its first output, often enough that it is held back rather
    than sent again (app/engine/quarantine.py). A refusal of the request, not a `ServiceUnavailable`: no retry loop
    (another replica, the restarted engine, a continuation) takes it for a replica's state and tries again."""

    status = 503
    type = "service_unavailable"
    code = "request_quarantined"

    def headers(self) -> dict[str, str]:  # the openai SDKs' own retry would be refused at once
        return {**super().headers(), "x-should-retry": "false"}


class RequestTimeout(ServiceError):
    status = 504
    type = "timeout_error"
    code = "request_timeout"


class InternalError(ServiceError):
    status = 500
    type = "internal_error"
    code = "internal_error"


def wrong_runner(model_id: str, runner: str, asked: str) -> InvalidRequest:
    """The 400 for a route the model is not served for (`models[].runner`), naming the model. (`vllm serve` has one
    model, and registers only the routes it serves: its answer is a 404 for the route.)"""
    api = "Embeddings API" if asked == "embeddings" else "Chat Completions, Completions and Responses APIs"
    kind = "embeddings" if runner == "embed" else "generation"
    return InvalidRequest(f"The model '{model_id}' does not support the {api}: it is served for {kind} "
                          f"(runner: {runner})", param="model")
