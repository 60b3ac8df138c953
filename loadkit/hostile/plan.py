"""The hostile scenario as numbers: how many sockets of each kind, how they behave, how long, and the service's
clocks the run is judged against.

`Plan` is what the command line sets (defaults near the issue's: 110 non-reading streams, 600 idle connections,
100 connections sending one header byte every 5 s, plus giant prompts, a /tokenize flood and huge headers).
`Clocks` are the service's connection clocks and limits (docs/configuration.md): read from the config of a
service the driver starts, told by flags for a service given by URL.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# The kinds of hostile socket, in the order they are reported.
NON_READER = "non-reader"
IDLE = "idle"
SLOWLORIS = "slowloris"
HUGE_FAST = "huge headers, at once"
HUGE_SLOW = "huge headers, slowly"
SOCKET_KINDS = (NON_READER, IDLE, SLOWLORIS, HUGE_FAST, HUGE_SLOW)


@dataclass(frozen=True)
class Plan:
    duration_s: float = 180.0  # the attack, from the first hostile socket to the moment every one is closed
    baseline_s: float = 5.0  # the polite client alone before the attack
    settle_timeout_s: float = 90.0  # after the attack: the bound on reaching idle
    non_readers: int = 110
    non_reader_max_tokens: int = 1024
    non_reader_rcvbuf: int = 4096  # SO_RCVBUF set before connecting (the kernel doubles it)
    non_reader_n: int = 1  # choices per non-reading stream (more: more bytes per token)
    non_reader_logprobs: int = 0  # top_logprobs per token (0: none)
    idle: int = 600
    slowloris: int = 100
    slowloris_interval_s: float = 5.0  # one header byte every this long
    huge_headers: int = 4  # connections; half send their header block at once, half slowly
    huge_header_bytes: int = 4 * 2**20
    huge_slow_chunk: int = 4096  # the slow ones send this many header bytes ...
    huge_slow_interval_s: float = 0.5  # ... every this long
    giant_prompts: int = 12
    giant_prompt_bytes: int = 900_000
    tokenize_clients: int = 8
    tokenize_requests: int = 400  # in all, across the clients; each sends the next at once (a flood)
    tokenize_prompt_words: int = 400
    polite_interval_s: float = 1.0
    polite_timeout_s: float = 60.0
    serve_grace_s: float = 5.0  # "a few seconds" past the write-stall clock for the polite client's target

    @property
    def hostile_sockets(self) -> int:
        return self.non_readers + self.idle + self.slowloris + self.huge_headers

    def count(self, kind: str) -> int:
        return {NON_READER: self.non_readers, IDLE: self.idle, SLOWLORIS: self.slowloris,
                HUGE_FAST: self.huge_headers - self.huge_headers // 2, HUGE_SLOW: self.huge_headers // 2}[kind]

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Clocks:
    """The service's per-connection clocks and caps (the documented defaults unless said otherwise)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_timeout_s: float = 30.0
    write_stall_timeout_s: float = 30.0
    max_connections: int = 1000
    max_header_bytes: int = 16_384
    max_body_bytes: int = 1_000_000
    request_timeout_s: float = 600.0
    queue_timeout_s: float = 30.0
    source: str = "documented defaults"  # where these figures come from, for the report

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str) -> Clocks:
        """From a service config (its `service` section and its first model's `deployment`)."""
        service, deployment = config.get("service") or {}, (config["models"][0].get("deployment") or {})
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in service.items() if k in known}
        if "queue_timeout_s" in deployment:
            values["queue_timeout_s"] = deployment["queue_timeout_s"]
        return cls(**values, source=source)

    def text(self) -> str:
        return (f"header {self.header_timeout_s:g} s, body {self.body_timeout_s:g} s, keep-alive "
                f"{self.keep_alive_timeout_s:g} s, write stall {self.write_stall_timeout_s:g} s, max_connections "
                f"{self.max_connections}, max_header_bytes {self.max_header_bytes}, max_body_bytes "
                f"{self.max_body_bytes}, request_timeout_s {self.request_timeout_s:g}, queue_timeout_s "
                f"{self.queue_timeout_s:g} ({self.source})")


# What the driver's own service gets, lowered from the defaults to keep a run short (the report says so).
SHORT_CLOCKS = {"header_timeout_s": 5.0, "body_timeout_s": 10.0, "keep_alive_timeout_s": 10.0,
                "write_stall_timeout_s": 10.0}
