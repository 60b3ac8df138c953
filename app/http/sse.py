"""Server-sent events framing: the only place that writes `data: ...\\n\\n`.

Events are encoded once, to bytes, with compact JSON: the stream is the hot
path, and every byte and call per token counts.
"""

from __future__ import annotations

from typing import Any

from app.http.wire_json import dumps

DONE = b"data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"


def named_event(payload: dict[str, Any]) -> bytes:
    """An event that also names its type (`event: <payload's type>`), as the Responses API sends each."""
    return b"event: " + str(payload["type"]).encode() + b"\ndata: " + dumps(payload) + b"\n\n"


def error_event(body: dict[str, Any]) -> bytes:
    """An error after the 200 was sent: the OpenAI error object as one event; `DONE` follows."""
    return event(body)
