"""JSON on the wire: the one encoder for every body the service writes (responses, errors, SSE events).

Compact, and it survives a client's lone surrogates ("\\ud800" is legal JSON but not UTF-8): they go
back as the same JSON escape instead of a UnicodeEncodeError (a 500, or a broken stream) when a prompt
or a parameter is echoed. NaN and infinities are refused (strict JSON parsers reject them); the
engine clamps logprobs before they get here.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from app.errors import ServiceError

_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def dumps(payload: Any) -> bytes:
    return _encode(payload).encode("utf-8", "backslashreplace")


class JSONBody(JSONResponse):
    """A JSON response written with `dumps`."""

    def render(self, content: Any) -> bytes:
        return dumps(content)


def error_response(err: ServiceError) -> JSONBody:
    """A `ServiceError` as its OpenAI error body, status and headers (Retry-After)."""
    return JSONBody(err.body(), status_code=err.status, headers=err.headers())
