"""A request's engine stream that steps out of the engine and resumes in place: for another tenant, or for a client
that has stopped reading.

Two reasons to pause a running request. Another tenant's request waits and this tenant holds more slots per weight
(or this one is batch and that one interactive): the admission asks it to yield (app/host/slots.py), and it waits at
the head of its tenant's queue for its next turn. Or its client has stopped reading (the connection's delivery clock,
app/http/clocks.py, sees no byte acknowledged for `NOT_READING_S` with bytes waiting): it gives back its slot at once,
keeps its place in the system (counted against its tenant's share), and queues again only once the client reads
again; a client that never does is cut by the write-stall clock. Either way the engine request is aborted with its
generated token ids kept (`Continuation`, the record that moves a request to another replica when its replica fails)
and each unfinished choice continues from them: the prompt's ids and the choice's own as the prompt (the prefix cache
still holds most of them), `max_tokens` less what was generated. The client sees one stream with a pause in it.

The engine's outputs are read by a task of their own into a queue the caller drains, so a request notices a pause
even while its caller is blocked writing to a client that does not read.

Pausable: what resumes from its tokens (and, with `tool_choice: "auto"`, the text its stop strings and tool-call
parser read, which the resumed ones read again). Stop strings are matched here over the whole choice (the engine,
asked to include them, holds back no text), except beside stop token ids or kept special tokens, where the engine
does not stop on them itself, and beside tool-call parsing (matched before the parser, beside the engine).
Penalties, bad words and a structured output's grammar resume over the output so far
(app/engine/vllm/output_resume.py). A greedy choice continues exactly as it would have, a seeded one too on the CPU
engine (its generator advanced by the draws made), an unseeded one as a fresh sample of the same distribution
(app/engine/continuation.py). Other requests run to their end as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Coroutine
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from app.engine.client import ClientReading
from app.engine.continuation import Continuation, stops_in_engine
from app.engine.interface import ChoiceDelta, GenerateRequest, GenerationDelta, GenerationParams
from app.host.runner import ABORT_TIMEOUT_S, EngineRunner, to_completion
from app.host.ticket import Ticket

# A client that accepted none of the bytes waiting for it for this long is not reading. TCP acknowledges within a
# round trip, so a reader never goes a second without; a pause is lossless, so a false one costs a resume. At 2 s the
# hostile run's polite client went 15.5 s without an answer while batches of non-readers took their turns.
NOT_READING_S = 1.0
LOOK_AGAIN_S = 0.5  # how often a request paused for its client looks whether it reads again
_END = object()


def pausable(p: GenerationParams) -> bool:
    # Stop strings the engine does not stop on itself would leave it generating, unread, after the match here;
    # beside auto tools they are matched with the parser, which stops the engine (engine/vllm/tool_parsing).
    return not p.stop or stops_in_engine(p) or p.auto_tools is not None


def engine_stream(runner: EngineRunner, ticket: Ticket, request: GenerateRequest, prompt_ids: list[int],
                  params: GenerationParams, deadline: float, client: ClientReading | None = None
                  ) -> AsyncGenerator[GenerationDelta, None]:
    """The engine's deltas for `request` (its prompt's ids, its params fitted to the context), paused and resumed in
    place when its ticket is asked to yield or `client` stops reading; `EngineRunner.stream` itself for one that is
    not `pausable`."""
    if not pausable(params):
        return runner.stream(request.request_id, prompt_ids, params, deadline, request.after_wedge)
    ticket.pausable = True
    return _relayed(_Relay(runner, ticket, request, prompt_ids, params, deadline, client, asyncio.Queue()))


async def _relayed(relay: _Relay) -> AsyncGenerator[GenerationDelta, None]:
    """What `relay` puts in its queue, until its end or its error; a caller gone cancels it."""
    task = asyncio.ensure_future(relay.run())
    try:
        while (item := await relay.out.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, GenerationDelta)
            yield item
    finally:
        task.cancel()  # a caller gone: its engine requests aborted, to their end
        await to_completion(asyncio.gather(task, return_exceptions=True), ABORT_TIMEOUT_S)


async def side_by_side(runs: list[Coroutine[Any, Any, None]], stop: asyncio.Event) -> None:
    """Runs `runs` together until they all end or `stop` is set, then cancels what is left (closing an engine stream
    aborts its request) and waits for it; an error in one (an engine error) ends them all and is raised."""
    tasks = [asyncio.ensure_future(run) for run in runs]
    waiter = asyncio.ensure_future(stop.wait())
    try:
        pending: set[asyncio.Future[Any]] = {*tasks, waiter}
        while pending - {waiter} and not stop.is_set():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
    finally:
        waiter.cancel()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Relay:
    """One pausable request's engine streams, from its first to its last, into `out`."""

    def __init__(self, runner: EngineRunner, ticket: Ticket, request: GenerateRequest, prompt_ids: list[int],
                 params: GenerationParams, deadline: float, client: ClientReading | None, out: asyncio.Queue[object]):
        self.runner, self.ticket, self.request, self.client, self.out = runner, ticket, request, client, out
        self.prompt_ids, self.params, self.deadline = prompt_ids, params, deadline
        self.progress = Continuation(replace(request, params=params))
        self.progress.prompt_ids = tuple(prompt_ids)
        self.loop = asyncio.get_running_loop()

    async def run(self) -> None:
        try:
            runs: list[tuple[GenerateRequest, int | None]] = [(self.progress.for_engine(), None)]
            while runs:
                reason = await self._run_until_paused(runs)
                if reason is None:
                    break
                self.ticket.pauses += 1
                if reason == "not reading":
                    self.ticket.step_aside()
                    await self._reading_again()
                await self.ticket.pause(self.deadline - self.loop.time())
                runs = [(self.progress.resume(i, self.deadline - self.loop.time()), i)
                        for i in self.progress.unfinished() if not self._ended_at_max(i)]
            self.out.put_nowait(_END)
        except Exception as err:
            self.out.put_nowait(err)

    async def _run_until_paused(self, runs: list[tuple[GenerateRequest, int | None]]) -> str | None:
        """Runs `runs` (the first request, or one continuation per unfinished choice) side by side; returns why they
        were paused, or None when they ended."""
        why: list[str] = []
        paused = asyncio.Event()
        await side_by_side([self._one(r, index, why, paused) for r, index in runs], paused)
        return why[0] if why else None

    async def _one(self, run: GenerateRequest, index: int | None, why: list[str], paused: asyncio.Event) -> None:
        ids = list(run.prompt.token_ids) if index is not None and run.prompt.token_ids else self.prompt_ids
        async with aclosing(self.runner.stream(run.request_id, ids, run.params, self.deadline,
                                               self.request.after_wedge and index is None)) as deltas:
            async for delta in deltas:
                passed = self.progress.observe(delta, index=index)
                if isinstance(passed, GenerationDelta):
                    self.out.put_nowait(passed)
                if self.progress.all_finished():
                    continue  # read to the engine's end: an abort now would count against nothing
                reason = self._pause_reason()
                if reason is not None:
                    why.append(reason)
                    paused.set()
                    return

    def _pause_reason(self) -> str | None:
        if self.client is not None and self.client.stalled_s() >= NOT_READING_S:
            return "not reading"
        return "another tenant" if self.ticket.yield_asked else None

    async def _reading_again(self) -> None:
        """Until the client has read what it was sent and reads on (a client that never does is cut by its
        connection's write-stall clock, which ends this request)."""
        assert self.client is not None
        while self.out.qsize() or self.client.stalled_s() >= NOT_READING_S:
            if self.loop.time() >= self.deadline:
                return  # the pause's wait ends it with its time-out
            await asyncio.sleep(LOOK_AGAIN_S)

    def _ended_at_max(self, index: int) -> bool:
        """Choice `index` generated all of its max_tokens before the pause without its end: ended here."""
        if len(self.progress.choices[index].token_ids) < self.params.max_tokens:
            return False
        end = GenerationDelta(choices=(ChoiceDelta(0, "", 0, finish_reason="length"),))
        passed = self.progress.observe(end, index=index)
        if isinstance(passed, GenerationDelta):
            self.out.put_nowait(passed)
        return True
