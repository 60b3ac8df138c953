"""A client's own latency targets, and its routing hint, read from its request headers.

- `X-TTFT-Target-S`: seconds the client will wait for its first token; `X-Request-Target-S`: for the
  whole request. Each may only tighten the model's targets (`deployment.ttft_target_s`,
  `deployment.request_target_s`), never loosen them.
- `X-Stainless-Read-Timeout`: the `openai` SDK sends its read timeout on every request. A client that
  gives up after that long is better refused at once than served too late: for a stream it bounds the
  wait for the first byte (the first token: the service sends the stream's head with it), for a plain
  request the whole answer.

A value that is not a positive number is a 400 naming the header; the SDK's own header is advisory and
a bad one is ignored.

`X-Session-Id` (`session_hint`): any string naming the client's conversation; the fleet router (app/routing/)
takes it as a hint of where the conversation's history is cached, never as a pin. Without the header, the body's
`session_id` (vLLM's) or `prompt_cache_key` (OpenAI's parameter for the same purpose, which the SDKs and agent
frameworks send) is the hint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from app.config.common import tightest
from app.errors import InvalidRequest

TTFT_HEADER = "x-ttft-target-s"
REQUEST_HEADER = "x-request-target-s"
SDK_TIMEOUT_HEADER = "x-stainless-read-timeout"
SESSION_HEADER = "x-session-id"
MAX_SESSION_CHARS = 128  # longer ids are cut: the router keeps up to 10,000 of them


@dataclass(frozen=True)
class ClientTargets:
    first_token_s: float | None = None
    finish_s: float | None = None


def _seconds(headers: Mapping[str, str], name: str, strict: bool) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value > 0:
        return value
    if strict:
        raise InvalidRequest(f"Header '{name}' must be a positive number of seconds, got {raw[:40]!r}", param=name)
    return None


def client_targets(headers: Mapping[str, str], stream: bool) -> ClientTargets:
    """`headers`: lower-case names (Starlette's `request.headers` matches any case)."""
    sdk = _seconds(headers, SDK_TIMEOUT_HEADER, strict=False)
    return ClientTargets(
        first_token_s=tightest(_seconds(headers, TTFT_HEADER, strict=True), sdk if stream else None),
        finish_s=tightest(_seconds(headers, REQUEST_HEADER, strict=True), None if stream else sdk),
    )


def session_hint(headers: Mapping[str, str], in_body: str | None = None) -> str:
    return (headers.get(SESSION_HEADER) or in_body or "")[:MAX_SESSION_CHARS]
