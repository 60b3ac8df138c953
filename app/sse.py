"""Server-sent events framing: the only place that writes `data: ...\\n\\n`.

Events are encoded once, to bytes, with compact JSON: the stream is the hot
path, and every byte and call per token counts.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + _encode(payload).encode("utf-8", "backslashreplace") + b"\n\n"  # lone surrogates: JSON escapes


def error_event(body: dict[str, Any]) -> bytes:
    """An error after the 200 was sent: the OpenAI error object as one event; `DONE` follows."""
    return event(body)


def parse(raw: str) -> list[dict[str, Any] | str]:
    """Decode a whole SSE body into payloads ("[DONE]" stays a string). For tests and scripts."""
    out: list[dict[str, Any] | str] = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), f"not an SSE data event: {block!r}"
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out
