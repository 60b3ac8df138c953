"""Service errors: the OpenAI wire shape, Retry-After, and surviving a pickle round trip (the Ray handle)."""

from __future__ import annotations

import pickle

import pytest

from app import errors
from app.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    OverTimeTarget,
    QueueFull,
    QueueFullUnavailable,
    QueueTimeout,
    RequestQuarantined,
    RequestTimeout,
    ServiceError,
    ServiceUnavailable,
    Unauthorized,
    UnsupportedParameter,
)


def test_body_shape_exact():
    err = InvalidRequest("bad n", param="n")
    assert err.body() == {"error": {"message": "bad n", "type": "invalid_request_error", "param": "n", "code": None}}
    assert set(err.body()) == {"error"}
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("cls, status, type_, code", [
    (InvalidRequest, 400, "invalid_request_error", None),
    (ContextLengthExceeded, 400, "invalid_request_error", "context_length_exceeded"),
    (UnsupportedParameter, 400, "invalid_request_error", "unsupported_parameter"),
    (Unauthorized, 401, "authentication_error", "invalid_api_key"),
    (errors.ModelNotFound, 404, "invalid_request_error", "model_not_found"),
    (errors.PayloadTooLarge, 413, "invalid_request_error", "request_too_large"),
    (QueueFull, 429, "rate_limit_error", "queue_full"),
    (QueueFullUnavailable, 503, "service_unavailable", "queue_full"),
    (QueueTimeout, 503, "service_unavailable", "queue_timeout"),
    (ServiceUnavailable, 503, "service_unavailable", "engine_unavailable"),
    (RequestTimeout, 504, "timeout_error", "request_timeout"),
    (errors.InternalError, 500, "internal_error", "internal_error"),
])
def test_status_type_code(cls, status, type_, code):
    err = cls("msg")
    assert err.status == status
    assert err.body()["error"]["type"] == type_
    assert err.body()["error"]["code"] == code
    assert str(err) == "msg"


def test_queue_full_unavailable_is_still_a_queue_full():
    assert issubclass(QueueFullUnavailable, QueueFull)


@pytest.mark.parametrize("retry_after, header",
                         [(0.01, "1"), (0.4, "1"), (1.0, "1"), (2.6, "3"), (30, "30"), (59.7, "60")])
def test_retry_after_header(retry_after, header):
    assert QueueFull("full", retry_after_s=retry_after).headers() == {"Retry-After": header}


def test_a_refusal_by_time_or_of_a_held_request_tells_the_sdk_not_to_retry():
    """The SDK's own retry cannot meet a first-token target already predicted missed, and a held request's would be
    refused at once (engine/quarantine.py); a full queue is transient."""
    assert OverTimeTarget("late", retry_after_s=7).headers() == {"Retry-After": "7", "x-should-retry": "false"}
    assert RequestQuarantined("held", retry_after_s=600).headers() == {"Retry-After": "600", "x-should-retry": "false"}
    assert "x-should-retry" not in QueueFull("full", retry_after_s=7).headers()


def test_no_retry_after_no_headers():
    assert InvalidRequest("x").headers() == {}


@pytest.mark.parametrize("err", [
    QueueFull("queue is full", retry_after_s=2.5),
    InvalidRequest("bad stop", param="stop"),
    ContextLengthExceeded("too long", param="messages"),
    ServiceUnavailable("dead", retry_after_s=5),
])
def test_pickle_round_trip(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert (back.message, back.param, back.retry_after_s) == (err.message, err.param, err.retry_after_s)
    assert back.body() == err.body()
    assert back.headers() == err.headers()
    assert back.status == err.status


def test_the_refused_prompts_tokens_cross_the_handle_with_the_refusal():
    """A replica refused after tokenizing: the ingress counts the prompt's tokens against the tenant."""
    err = OverTimeTarget("late", retry_after_s=3)
    err.prompt_tokens = 1_200
    back = pickle.loads(pickle.dumps(err))
    assert back.prompt_tokens == 1_200 and back.retry_after_s == 3
    assert pickle.loads(pickle.dumps(QueueFull("full"))).prompt_tokens is None


def test_errors_are_exceptions():
    with pytest.raises(ServiceError):
        raise RequestTimeout("slow")
