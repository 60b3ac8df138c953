"""An OpenAI-style stream as server-sent events, read raw over httpx: `data: {json}` lines, ended by `data: [DONE]`.

`ChatStream` yields each JSON event of a response as it arrives and remembers whether the stream ended properly,
so a stream cut off without the marker is told apart from one that finished; `read_events` reads a whole body.
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


def read_events(raw: str) -> tuple[list[dict], bool]:
    """A whole stream's `data:` events (JSON) and whether `[DONE]` ended it; `event:` lines carry nothing the data
    does not (the Responses API repeats the type in the data)."""
    events, done = [], False
    for line in raw.splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data == DONE:
                done = True
            elif data:
                events.append(json.loads(data))
    return events, done
