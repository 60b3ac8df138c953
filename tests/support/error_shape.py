"""The OpenAI error shape every 4xx and 5xx body of the service must have, and its check."""

from __future__ import annotations

import json
from typing import Any

ERROR_KEYS = {"message", "type", "param", "code"}


def assert_error_shape(status: int, content_type: Any, raw: bytes) -> dict[str, Any]:
    """`raw` is exactly {"error": {"message", "type", "param", "code"}} as JSON; return the error object."""
    if isinstance(content_type, list):  # schemathesis' Response keeps every header value
        content_type = content_type[0] if content_type else ""
    assert str(content_type).startswith("application/json"), f"{status} error is {content_type!r}, not JSON"
    body = json.loads(raw)
    assert isinstance(body, dict) and set(body) == {"error"}, f"{status} body is not OpenAI-shaped: {body!r:.300}"
    error = body["error"]
    assert isinstance(error, dict) and set(error) == ERROR_KEYS, f"{status} error has keys {sorted(error)}"
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str), error
    return error
