"""The bytes the hostile sockets send, built by hand (no HTTP library would send most of them), and the one
thing read back: the status line of whatever the server answered before it closed.

Pure functions: a request for a stream that will never be read, a header block that never ends (one byte at
a time), a header block of megabytes, a chat body of a giant prompt, a /tokenize body.
"""

from __future__ import annotations

import json
import re
from typing import Any

_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3})")


def request_bytes(method: str, path: str, host: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    """A complete HTTP/1.1 request with a Content-Length (the connection is kept alive)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items())]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def non_reader_body(model: str, max_tokens: int, n: int = 1, logprobs: int = 0) -> dict[str, Any]:
    """A streaming chat that runs as long as it may: `ignore_eos`, a large `max_tokens`."""
    body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
                            "temperature": 1.0,
                            "messages": [{"role": "user", "content": "Tell me a very long story about a lighthouse."}]}
    if n > 1:
        body["n"] = n
    if logprobs > 0:
        body.update(logprobs=True, top_logprobs=logprobs)
    return body


def non_reader_request(host: str, model: str, api_key: str | None, max_tokens: int, n: int = 1,
                       logprobs: int = 0) -> bytes:
    body = json.dumps(non_reader_body(model, max_tokens, n, logprobs)).encode()
    return request_bytes("POST", "/v1/chat/completions", host,
                         {"Content-Type": "application/json", **auth(api_key)}, body)


class HeaderDrip:
    """A request whose header block never ends, handed out one byte at a time (slowloris)."""

    def __init__(self, host: str):
        self._head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nX-Drip: ".encode("latin-1")
        self.sent = 0

    _CYCLE = b"a" * 50 + b"\r\nX-Drip: "  # after the first lines: an endless run of header lines

    def next_byte(self) -> bytes:
        i, self.sent = self.sent, self.sent + 1
        if i < len(self._head):
            return self._head[i:i + 1]
        k = (i - len(self._head)) % len(self._CYCLE)
        return self._CYCLE[k:k + 1]


def huge_header_block(host: str, total_bytes: int, line_bytes: int = 1000) -> bytes:
    """A GET whose header lines add up to about `total_bytes` (each header `line_bytes` long), then its end."""
    head = f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\n".encode("latin-1")
    count = max(1, (total_bytes - len(head)) // (line_bytes + 2))
    value = b"x" * max(1, line_bytes - 14)
    lines = b"".join(b"X-Pad-%06d: " % i + value + b"\r\n" for i in range(count))
    return head + lines + b"\r\n"


def giant_prompt_body(model: str, prompt_bytes: int) -> dict[str, Any]:
    """A chat whose one message is `prompt_bytes` characters of words: far beyond any context window."""
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    text = (words * (prompt_bytes // len(words) + 1))[:prompt_bytes]
    return {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": text}]}


def tokenize_body(model: str, words: int) -> dict[str, Any]:
    """A /tokenize body of `words` words: real tokenizer work, well inside the prompt limit."""
    return {"model": model, "prompt": " ".join(f"word{i % 97}" for i in range(words))}


def status_of(data: bytes) -> int | None:
    """The status of the first response in `data` ('HTTP/1.1 408 ...'), None when there is none."""
    m = _STATUS_LINE.match(data)
    return int(m[1]) if m else None
