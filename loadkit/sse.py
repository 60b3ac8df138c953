"""A streaming chat completion read as server-sent events, over httpx.

Owns the wire format of an OpenAI-style stream: `data: {json}` lines, ended by `data: [DONE]`. `ChatStream`
yields each JSON event and remembers whether the stream ended properly, so a stream cut off without the
marker is told apart from one that finished.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

DONE = "[DONE]"


@dataclass
class ChatStream:
    """The events of one 200 response; `done` once `[DONE]` was read."""

    response: httpx.Response
    done: bool = False

    async def events(self) -> AsyncIterator[dict]:
        async for line in self.response.aiter_lines():
            if not line.startswith("data:"):
                continue  # comments, keep-alives, blank separators
            data = line[5:].strip()
            if data == DONE:
                self.done = True
                return
            yield json.loads(data)


def delta_text(event: dict) -> str:
    """The content a chat completion chunk adds, over all its choices."""
    return "".join((c.get("delta") or {}).get("content") or "" for c in event.get("choices") or ())


def parse(raw: str) -> list[dict | str]:
    """Every event of a complete SSE body, `[DONE]` as the string; for bodies read in one piece."""
    out: list[dict | str] = []
    for line in raw.splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            out.append(data if data == DONE else json.loads(data))
    return out
