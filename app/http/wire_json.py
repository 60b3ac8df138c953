"""JSON on the wire: the one encoder for every body the service writes (responses, errors, SSE events).

Compact, and it survives a client's lone surrogates ("\\ud800" is legal JSON but not UTF-8): they go
back as the same JSON escape instead of a UnicodeEncodeError (a 500, or a broken stream) when a prompt
or a parameter is echoed. NaN and infinities are refused (strict JSON parsers reject them); the
engine clamps logprobs before they get here.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.responses import JSONResponse

from app.errors import ServiceError

_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def dumps(payload: Any) -> bytes:
    return _encode(payload).encode("utf-8", "backslashreplace")


_SLOT = "\x00items\x00"
YIELD_EVERY_BYTES = 256 * 1024  # about 5 ms of encoding: a stream on this loop waits no longer than that


async def dumps_yielding(payload: dict[str, Any], key: str) -> bytes:
    """`dumps(payload)`, its `key` list encoded item by item with the event loop given back between pieces: 256
    embeddings of 4,096 dimensions are 20 MB of JSON, 0.64 s of encoding that would stall every stream here."""
    pieces, pending = [], 0
    for item in payload[key]:
        pieces.append(dumps(item))
        pending += len(pieces[-1])
        if pending >= YIELD_EVERY_BYTES:
            pending = 0
            await asyncio.sleep(0)
    head = dumps({**payload, key: _SLOT})
    before, _, after = head.partition(dumps(_SLOT))
    return b"".join((before, b"[", b",".join(pieces), b"]", after))


class JSONBody(JSONResponse):
    """A JSON response written with `dumps`."""

    def render(self, content: Any) -> bytes:
        return dumps(content)


def error_response(err: ServiceError) -> JSONBody:
    """A `ServiceError` as its OpenAI error body, status and headers (Retry-After)."""
    return JSONBody(err.body(), status_code=err.status, headers=err.headers())
