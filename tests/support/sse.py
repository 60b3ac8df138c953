"""Decoding SSE bodies in tests: the service only writes them (app/http/sse.py)."""

from __future__ import annotations

import json
from typing import Any


def parse(raw: str) -> list[dict[str, Any] | str]:
    """Decode a whole SSE body into payloads ("[DONE]" stays a string)."""
    out: list[dict[str, Any] | str] = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), f"not an SSE data event: {block!r}"
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out
