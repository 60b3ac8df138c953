"""One request sent to one server and its answer as read: the status, and the JSON body or the stream's events.

Both servers get the request byte for byte the same (the body as JSON, the same path and method); only the
`Authorization` header differs (the service's key; bare vLLM runs without one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx

from loadkit.sse import read_events

TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Request:
    """What is sent: `body` None for a GET."""

    method: str
    path: str
    body: dict | None = None

    @property
    def stream(self) -> bool:
        return bool((self.body or {}).get("stream"))


@dataclass
class Answer:
    """What came back: `body` for a JSON answer (an error included), `events` for a stream (`done` once
    `data: [DONE]` was read; the Responses API sends none)."""

    status: int
    body: object = None
    events: list[dict] = field(default_factory=list)
    done: bool = False
    text: str = ""  # the raw body, for a report when it is not JSON

    @property
    def streamed(self) -> bool:
        return bool(self.events) or self.done


def send(client: httpx.Client, request: Request, headers: dict[str, str] | None = None) -> Answer:
    """Sends `request` on `client` (whose base URL is the server) and reads the whole answer."""
    r = client.request(request.method, request.path, json=request.body, headers=headers or {}, timeout=TIMEOUT_S)
    text = r.text
    if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
        events, done = read_events(text)
        return Answer(r.status_code, events=events, done=done, text=text[:2000])
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    return Answer(r.status_code, body=body, text=text[:2000])
