"""The suites and systems of `python -m loadkit fairness`, the tenants they need in one service config, and the
open-loop arrival schedules.

A system is a tenant configuration selected by the keys the clients use, so one service holds them all:
`first-come` (every client of the suite on one tenant's keys: one tenant is the first-come queue), `fair` (a
tenant per client, the suite's weights), `fair+budgets` (the same with `tokens_per_minute` at the client's fair
share of the capacity) and `rate-limited` (the same with `requests_per_minute` at its fair share: a per-key rate
limiter, as LiteLLM users have, here sitting on the fair queue); then each client alone (`A alone`, ...: the same
arrivals with nobody beside it, its solo first tokens). Loads are multiples of the measured capacity in
VTC's own units (prompt + 2 x generated tokens per second), so a shape's "1x" costs the replica what 1x of the
128/64 requests does by that count.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass, field

FIRST_COME, FAIR, BUDGETS, RATE = "first-come", "fair", "fair+budgets", "rate-limited"
MAIN_SYSTEMS = (FIRST_COME, FAIR, BUDGETS, RATE)


@dataclass(frozen=True)
class Shape:
    """A request's prompt and output lengths in tokens (output exact: ignore_eos)."""

    prompt: int = 128
    output: int = 64

    @property
    def cost(self) -> int:
        """What the fair queue charges for it: prompt 1, each generated token 2."""
        return self.prompt + 2 * self.output

    @property
    def tokens(self) -> int:
        """What a token budget counts: prompt and generated tokens."""
        return self.prompt + self.output


DEFAULT = Shape()


@dataclass(frozen=True)
class Capacity:
    """The replica's saturated rate with the default shape (a closed loop at max_num_seqs)."""

    service_s: float  # VTC units (prompt + 2 x generated) per second
    output_tok_s: float
    tokens_s: float  # prompt + generated per second

    @property
    def req_s(self) -> float:
        return self.service_s / DEFAULT.cost


@dataclass(frozen=True)
class Client:
    """One client, one key: its load in multiples of the capacity, its tenant's weight, its requests' shape."""

    name: str
    load: float
    weight: float = 1.0
    shape: Shape = DEFAULT
    on_off_s: float | None = None  # sends only in the even periods of this length (on, off, on, ...)

    def rate(self, capacity: Capacity) -> float:
        """Requests per second while on."""
        return self.load * capacity.service_s / self.shape.cost


@dataclass(frozen=True)
class System:
    """A tenant configuration: `kind` one of MAIN_SYSTEMS; `silent` clients send nothing; `batch` clients' tenants
    are `priority: batch`; `alone` names the one client sending, whose figures are its solo figures."""

    name: str
    kind: str
    silent: tuple[str, ...] = ()
    batch: tuple[str, ...] = ()
    alone: str = ""


@dataclass(frozen=True)
class Suite:
    key: str
    title: str
    clients: tuple[Client, ...]
    systems: tuple[System, ...]
    seconds: float

    def senders(self, system: System) -> tuple[Client, ...]:
        return tuple(c for c in self.clients if c.name not in system.silent)


def solo(clients: tuple[Client, ...]) -> tuple[System, ...]:
    """A system per client in which it sends alone, at its own load: its solo figures."""
    return tuple(System(f"{c.name} alone", FAIR, silent=tuple(x.name for x in clients if x is not c), alone=c.name)
                 for c in clients)


def _suite(key: str, title: str, clients: tuple[Client, ...], seconds: float) -> Suite:
    return Suite(key, title, clients, tuple(System(s, s) for s in MAIN_SYSTEMS) + solo(clients), seconds)


def suites(duration: float) -> list[Suite]:
    """The four VTC suites (each under MAIN_SYSTEMS, then each client alone) and the priority check, each system
    `duration` long (the on/off suite twice that, bursts of a third of it: 30 s on, 30 s off, 30 s on at the
    default 45)."""
    onoff = 2 * duration / 3
    return [
        _suite("s1", "two tenants at 0.5x and 1.5x", (Client("A", 0.5), Client("B", 1.5)), duration),
        _suite("s2", "three tenants at 0.3x, 0.6x, 1.2x with weights 1, 2, 4",
               (Client("A", 0.3, 1), Client("B", 0.6, 2), Client("C", 1.2, 4)), duration),
        _suite("s3", f"A steady at 1.0x, B at 1.0x {onoff:.0f} s on / {onoff:.0f} s off",
               (Client("A", 1.0), Client("B", 1.0, on_off_s=onoff)), 2 * duration),
        _suite("s4", "short prompt, long output (16/256) against long prompt, short output (1024/16), 1x each",
               (Client("A", 1.0, shape=Shape(16, 256)), Client("B", 1.0, shape=Shape(1024, 16))), duration),
        Suite("prio", "interactive at 0.2x beside a flood at 2x", (Client("I", 0.2), Client("F", 2.0)),
              (System("alone", FAIR, silent=("F",), alone="I"), System("batch flood", FAIR, batch=("F",)),
               System("interactive flood", FAIR)), duration),
    ]


def arrivals(rate: float, duration: float, seed: int, on_off_s: float | None = None) -> list[float]:
    """Poisson arrival times (seconds from the start) at `rate` per second in [0, duration), kept only in the on
    periods when `on_off_s` is given (a Poisson process restricted to them)."""
    if rate <= 0 or duration <= 0:
        return []
    r, t = random.Random(seed), 0.0
    out: list[float] = []
    while True:
        t += r.expovariate(rate)
        if t >= duration:
            return out
        if on_off_s is None or int(t // on_off_s) % 2 == 0:
            out.append(t)


def share(suite: Suite, system: System, client: Client) -> float:
    """The client's fair share of the replica among the suite's clients that send in `system`."""
    senders = suite.senders(system)
    return client.weight / sum(c.weight for c in senders)


@dataclass
class Tenancy:
    """The `tenants:` entries of one service config, and the key each (suite, system, client) sends with."""

    entries: list[dict] = field(default_factory=list)
    keys: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def add(self, name: str, **settings: object) -> str:
        key = f"{name}-{secrets.token_hex(6)}"
        self.entries.append({"name": name, "api_keys": [key], **settings})
        return key


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text)


def tenancy(plan: list[Suite], capacity: Capacity, burst_budget: int) -> Tenancy:
    """Every tenant the plan uses, plus `capacity` (the measuring client) and `overrun` (tokens_per_minute
    `burst_budget`, for the 64-request burst)."""
    out = Tenancy()
    out.keys["capacity", "", ""] = out.add("capacity")
    out.keys["overrun", "", ""] = out.add("overrun", tokens_per_minute=burst_budget)
    for suite in plan:
        for system in suite.systems:
            base = f"{suite.key}-{_slug(system.name)}"
            if system.kind == FIRST_COME:
                key = out.add(base)
                out.keys.update({(suite.key, system.name, c.name): key for c in suite.clients})
                continue
            for c in suite.senders(system):
                settings: dict[str, object] = {"weight": c.weight}
                if c.name in system.batch:
                    settings["priority"] = "batch"
                rate_s = share(suite, system, c) * capacity.service_s / c.shape.cost  # its fair share, req/s
                if system.kind == BUDGETS:
                    settings["tokens_per_minute"] = max(1, round(rate_s * c.shape.tokens * 60))
                elif system.kind == RATE:
                    settings["requests_per_minute"] = max(1, round(rate_s * 60))
                out.keys[suite.key, system.name, c.name] = out.add(f"{base}-{c.name}", **settings)
    return out
