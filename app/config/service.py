"""The service's own options: where it listens, API keys, request and connection clocks, draining, logs, and what
every answer's usage reports."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from app.api_keys import API_KEYS_ENV, check_entry
from app.config.common import StrictModel

_ORIGIN = re.compile(r"https?://[^/\s?#]+")  # what a browser sends in `Origin`: no path, no trailing slash


class ServiceConfig(StrictModel):
    """The HTTP front door and what it shares across models."""

    host: str = Field("127.0.0.1", description="Address the HTTP server binds. 0.0.0.0 exposes it to the network.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port.")
    api_keys: tuple[str, ...] = Field(
        (),
        description=f"Accepted bearer keys, each plain or as `sha256:<64 hex digits>` (the file then holds no "
        f"secret); more can come from ${API_KEYS_ENV} (comma-separated) where the app is built. Empty: no auth.",
    )
    without_api_keys: Literal["refuse", "warn"] = Field(
        "refuse",
        description="With no API key, and the service reachable beyond loopback (service.host, or a Ray node with "
        "a network address): 'refuse' to start, or 'warn' loudly and serve everyone.",
    )
    refusal_status: Literal[429, 503] = Field(429, description="Status for 'queue full' refusals.")
    request_timeout_s: float = Field(
        600.0, gt=0, description="A request running longer than this is ended (504, or an error event in a stream)."
    )
    max_body_bytes: int = Field(1_000_000, ge=1024, description="Largest request body; larger is a 413.")
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Time a request's headers may take to arrive, from its first byte (or from "
        "connect); slower is a 408 and the connection is closed. On the replica's own listener.",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Time a request's body may take to arrive after its headers; slower closes the "
        "connection. On the replica's own listener.",
    )
    keep_alive_timeout_s: float = Field(
        30.0,
        gt=0,
        description="An idle keep-alive connection is closed after this long (the replica's own "
        "listener and Serve's proxy).",
    )
    write_stall_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A client that accepts no bytes of its response for this long is cut off: its "
        "engine request is aborted and its slot and tokens freed. On the replica's own listener.",
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="Open connections per listening replica; beyond it a new connection is reset at "
        "once, before any parsing or buffering.",
    )
    max_connections_per_peer: int = Field(
        256,
        ge=1,
        description="Open connections one peer address may hold on a listening replica, so that one client "
        "cannot take the whole table; beyond it its new connection is reset at once. Behind a proxy that does "
        "not keep clients' addresses every client is one peer: raise it to max_connections there.",
    )
    max_header_bytes: int = Field(
        16_384,
        ge=1024,
        description="Largest total size of the request's headers; larger is a 431, refused as "
        "the bytes arrive (before the block is buffered whole) on the replica's own listener.",
    )
    drain_grace_s: float = Field(30.0, ge=0, description="On shutdown, how long requests in flight may take to finish.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Log level of the service's own loggers."
    )
    enable_prompt_tokens_details: bool = Field(
        False,
        description="Chat and completions usage reports `prompt_tokens_details.cached_tokens` (the prompt tokens "
        "the engine's prefix cache held), as `vllm serve --enable-prompt-tokens-details` does; off, "
        "`prompt_tokens_details` is null, as vLLM's default. The Responses API's usage always reports them.",
    )
    cors_allowed_origins: tuple[str, ...] = Field(
        (),
        description="Web origins whose pages may call the API from a browser (CORS), each `scheme://host[:port]`, "
        "or `*` for any. Empty: no CORS headers, so browsers keep other sites' pages from reading answers. "
        "`vllm serve` allows any origin by default; this service does not, because without API keys that would "
        "let any web page a user opens use a service on their network.",
    )
    colocate_ingress: bool = Field(
        True,
        description="With a single model on a single replica, serve HTTP from the engine replica itself: no Ray hop "
        "per token between ingress and engine. With several replicas or models (or false) a separate ingress "
        "deployment holds the connections, routes by `model`, and retries a request nothing was sent for yet on "
        "another replica when one is full, dead or starting.",
    )

    @field_validator("api_keys")
    @classmethod
    def _digests_well_formed(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(map(check_entry, keys))

    @field_validator("cors_allowed_origins")
    @classmethod
    def _origins_well_formed(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        for origin in origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(f"{origin!r} is not an origin: write scheme://host[:port] with no path "
                                 f"(https://chat.example.com), or '*' for any")
        return origins
