"""The attack phase: every hostile socket and request at once for `plan.duration_s`, watched all along, then
every hostile socket closed.

Giant prompts go out first (each sent once, ~900 KB of text, far over any context window, under the body limit)
and are answered (or `GIANT_FIRST_S` passes) before the non-readers' connects; then the idle, slowloris and
huge-header sockets and a /tokenize flood (closed-loop clients, each sending the next request as soon as the last
is answered, up to a total count or the end of the attack). Every answer is a Record: status, error code, latency;
'hung' with no answer within the timeout, 'unanswered' when cancelled at the end. Once a second the watcher looks
at the non-readers without reading (poll, SO_ERROR), at the listener's connection table (which client ports the
server still holds), at the replica's memory and descriptors, and at /stats; every `LAG_SCRAPE_S` at /metrics. At
the end, per non-reader, the bytes waiting unread (FIONREAD), the bytes the server's kernel holds for it
(/proc/net/tcp) and one non-blocking MSG_PEEK; then every socket is closed and every unfinished request cancelled.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from loadkit.hostile.plan import HUGE_FAST, HUGE_SLOW, IDLE, NON_READER, SLOWLORIS, Plan
from loadkit.hostile.server_view import Histogram, ServerView, lag_histogram, send_queues
from loadkit.hostile.sockets import (
    Fleet,
    SocketRecord,
    giant_prompt_body,
    hangup,
    peek,
    start,
    tokenize_body,
    unread,
)
from loadkit.record import Record
from loadkit.server_stats import Stats, get_stats
from loadkit.waiting import every

WATCH_S = 1.0
GIANT_FIRST_S = 10.0
LAG_SCRAPE_S = 10.0
GIANT = "giant prompt"
TOKENIZE = "/tokenize"


# -- the hostile requests ------------------------------------------------------------------------------------------

def counts(answers: list[Record]) -> dict[str, int]:
    return dict(Counter(a.label for a in answers).most_common())


async def _post(http: httpx.AsyncClient, kind: str, path: str, content: bytes, timeout_s: float,
                out: list[Record]) -> None:
    """Appended before it is sent: one still unanswered when the attack is cancelled stays as 'unanswered'."""
    answer = Record(time.monotonic(), kind=kind, outcome="unanswered")
    out.append(answer)
    try:
        r = await http.post(path, content=content, headers={"Content-Type": "application/json"},
                            timeout=httpx.Timeout(timeout_s, connect=10))
        answer.status = r.status_code
        answer.outcome = "ok" if r.status_code == 200 else "refused" if r.status_code in (429, 503) else "error"
        if r.status_code != 200:
            try:
                answer.code = (r.json().get("error") or {}).get("code")
            except (ValueError, AttributeError):
                answer.code = None
    except httpx.TimeoutException:
        answer.outcome = "hung"
    except httpx.TransportError as err:
        answer.outcome = type(err).__name__
    answer.end = time.monotonic()


async def giant_prompts(http: httpx.AsyncClient, model: str, plan: Plan, out: list[Record]) -> None:
    """`plan.giant_prompts` chats of `plan.giant_prompt_bytes` characters each, all at once."""
    content = json.dumps(giant_prompt_body(model, plan.giant_prompt_bytes)).encode()

    async def one() -> None:
        await _post(http, GIANT, "/v1/chat/completions", content, plan.polite_timeout_s, out)

    await asyncio.gather(*(one() for _ in range(plan.giant_prompts)))


async def tokenize_flood(http: httpx.AsyncClient, model: str, plan: Plan, out: list[Record]) -> None:
    """`plan.tokenize_clients` closed loops sharing `plan.tokenize_requests` requests (cancel to stop early)."""
    content = json.dumps(tokenize_body(model, plan.tokenize_prompt_words)).encode()
    left = [plan.tokenize_requests]

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            await _post(http, TOKENIZE, "/tokenize", content, plan.polite_timeout_s, out)

    await asyncio.gather(*(client() for _ in range(plan.tokenize_clients)))


# -- the attack --------------------------------------------------------------------------------------------------

@dataclass
class Attack:
    started: float = 0.0  # monotonic: the first hostile request
    ended: float = 0.0  # monotonic: the moment the driver began closing everything
    answers: list[Record] = field(default_factory=list)
    stats: list[Stats] = field(default_factory=list)
    lag: list[tuple[float, Histogram]] = field(default_factory=list)  # /metrics snapshots during the attack
    watch_errors: int = 0
    loadavg: tuple[tuple[float, float, float], ...] = ()  # at the start and at the end
    other_engines: tuple[int, ...] = ()  # vLLM engines on this machine outside the service, at the start and the end
    giant_first_s: float = 0.0  # from the start until the giant prompts were answered and the sockets opened
    closed_by_driver: int = 0  # sockets the server had not ended when the attack was over (this driver closed them)


def mark_released(records: list[SocketRecord], ports: set[int], sampled_at: float) -> None:
    """One look at the listener's connection table (`ports`: the client ports it holds, read at `sampled_at`):
    a socket it held before, or whose close its client saw, and that is not there now, was released by the
    server. Sockets opened after the look are left for the next one."""
    for r in records:
        if r.opened_at is None or r.released_at is not None or r.opened_at > sampled_at:
            continue
        if r.local_port in ports:
            r.seen_by_server = True
        elif r.seen_by_server or r.closed_at is not None:
            r.released_at = sampled_at


async def _look(fleet: Fleet, view: ServerView) -> None:
    now = time.monotonic()
    for rec, sock in fleet.open_non_readers():
        how = hangup(sock)
        if how:
            rec.saw_close(how, now)
            continue
        taken = unread(sock)  # bytes its kernel accepted: growing means the server still gets acknowledgements
        if taken is not None and taken > rec.accepted_bytes:
            rec.accepted_bytes, rec.last_accepted_at = taken, now
    ports = await asyncio.to_thread(view.remote_ports)
    if ports is not None:
        mark_released(fleet.records, ports, now)
    await asyncio.to_thread(view.sample, ports)


async def _watch(fleet: Fleet, view: ServerView, http: httpx.AsyncClient, model: str, out: Attack,
                 stop: asyncio.Event) -> None:
    last_scrape = [time.monotonic()]

    async def look() -> None:
        t0 = time.monotonic()
        try:
            await _look(fleet, view)
            out.stats.append(await get_stats(http, model))
            if t0 - last_scrape[0] >= LAG_SCRAPE_S:
                last_scrape[0] = t0
                h = await lag_histogram(http)
                if h is not None:
                    out.lag.append((time.monotonic(), h))
        except (httpx.HTTPError, KeyError, ValueError, OSError):
            out.watch_errors += 1

    await every(WATCH_S, stop, look)


async def attack(fleet: Fleet, view: ServerView, http: httpx.AsyncClient, hostile_http: httpx.AsyncClient,
                 model: str) -> Attack:
    """`http`: the watcher's own client; `hostile_http`: the giant prompts' and the flood's."""
    plan, out, stop = fleet.plan, Attack(), asyncio.Event()
    out.loadavg, out.other_engines = (os.getloadavg(),), (await asyncio.to_thread(view.other_engines),)
    out.started = time.monotonic()
    giant = asyncio.create_task(giant_prompts(hostile_http, model, plan, out.answers), name="giant prompts")
    # The giant prompts are answered (or GIANT_FIRST_S passes) before the non-readers fill every slot: once they
    # have, the gate refuses any request at capacity before reading its body, and no giant prompt gets further.
    await asyncio.wait([giant], timeout=GIANT_FIRST_S)
    out.giant_first_s = time.monotonic() - out.started
    tasks = [giant, *start(fleet, (NON_READER,))]
    tasks += start(fleet, (IDLE, SLOWLORIS, HUGE_FAST, HUGE_SLOW))
    tasks.append(asyncio.create_task(tokenize_flood(hostile_http, model, plan, out.answers), name="tokenize"))
    watcher = asyncio.create_task(_watch(fleet, view, http, model, out, stop))
    await asyncio.sleep(plan.duration_s)  # the attack's length IS the behaviour
    stop.set()
    await watcher
    try:
        await _look(fleet, view)  # a last look before the driver's own closes
    except OSError:
        out.watch_errors += 1
    queued = await asyncio.to_thread(send_queues, fleet.endpoint.port)
    for rec in fleet.of(NON_READER):
        sock = fleet.sock(rec)
        if sock is not None:
            rec.unread_bytes, rec.server_queued = unread(sock), queued.get(rec.local_port)
            if rec.closed_at is None:
                rec.end_state = peek(sock)
    for rec in fleet.of(NON_READER):
        if not rec.end_state and rec.closed_at is not None:
            rec.end_state = rec.how
    out.ended = time.monotonic()
    out.loadavg += (os.getloadavg(),)
    out.other_engines += (await asyncio.to_thread(view.other_engines),)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    out.closed_by_driver = sum(r.opened_at is not None and r.ended_at is None for r in fleet.records)
    fleet.close()  # every client socket, those the server ended included
    return out
