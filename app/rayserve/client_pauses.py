"""Streams nobody reads cost no engine time behind a separate ingress too.

The colocated replica holds its client's connection and pauses a request whose client stopped reading itself
(app/host/pauses.py). Behind a separate ingress the engine replica cannot see the connection; the ingress can. There a
pausable request's stream is relayed through a queue, so that the pause is noticed even while the caller is blocked
writing to a client that does not read. Once the client has accepted none of the bytes waiting for it for
`NOT_READING_S`, the stream is closed, which cancels the remote call and aborts the engine request (its slot and KV
given back), and the token ids generated so far are kept (`Continuation`, as when a replica fails mid-answer). Once
the client has read what it was sent and reads on, each unfinished choice continues from them on whichever replica
the router picks. The client sees one stream with a pause in it; one that never reads again is cut by its
connection's write-stall clock, which closes this stream.

Pausable: as on the replica (`pauses.pausable`): nothing the engine keeps of the request besides its tokens.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from app.engine.client import ClientReading
from app.engine.continuation import Continuation
from app.engine.interface import ChoiceDelta, GenerateRequest, GenerationDelta
from app.errors import RequestTimeout
from app.host.pauses import LOOK_AGAIN_S, NOT_READING_S, side_by_side

Streamer = Callable[[GenerateRequest], AsyncGenerator[Any, None]]
_END = object()


async def paused_while_unread(stream_of: Streamer, request: GenerateRequest, client: ClientReading,
                              counts: Counter[str]) -> AsyncGenerator[Any, None]:
    """`stream_of(request)`'s items, taken out of the engine while `client` does not read (`counts["paused"]`
    counts each pause) and continued when it reads again."""
    relay = _Relay(stream_of, request, client, counts)
    task = asyncio.ensure_future(relay.run())
    try:
        while (item := await relay.out.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        task.cancel()  # a caller gone: the remote calls cancelled, their engine requests aborted
        await asyncio.gather(task, return_exceptions=True)


class _Relay:
    """One request's streams, from the first to the last continuation, into `out`."""

    def __init__(self, stream_of: Streamer, request: GenerateRequest, client: ClientReading, counts: Counter[str]):
        self.stream_of, self.request, self.client, self.counts = stream_of, request, client, counts
        self.progress = Continuation(request)
        self.out: asyncio.Queue[object] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self.deadline = self.loop.time() + request.timeout_s

    async def run(self) -> None:
        try:
            runs: list[tuple[GenerateRequest, int | None]] = [(self.progress.for_engine(), None)]
            while runs and await self._paused(runs):
                self.counts["paused"] += 1
                await self._reading_again()
                remaining_s = self.deadline - self.loop.time()
                if remaining_s <= 0:
                    raise RequestTimeout(f"The request ran past its time limit ({self.request.timeout_s:g} s) while "
                                         "its client was not reading")
                runs = [(self.progress.resume(i, remaining_s), i) for i in self.progress.unfinished()
                        if not self._ended_at_max(i)]
            self.out.put_nowait(_END)
        except Exception as err:
            self.out.put_nowait(err)

    async def _paused(self, runs: list[tuple[GenerateRequest, int | None]]) -> bool:
        """Runs `runs` (the first request, or one continuation per unfinished choice) side by side until they end
        (False) or their client stops reading (True: all of them closed)."""
        stop = asyncio.Event()
        await side_by_side([self._one(run, index, stop) for run, index in runs], stop)
        return stop.is_set()

    async def _one(self, run: GenerateRequest, index: int | None, stop: asyncio.Event) -> None:
        async with aclosing(self.stream_of(run)) as items:
            async for item in items:
                passed = self.progress.observe(item, index=index)
                if passed is not None:
                    self.out.put_nowait(passed)
                if self.progress.all_finished():
                    continue  # read to the end: an abort now would save nothing
                if self.client.stalled_s() >= NOT_READING_S:
                    stop.set()
                    return

    async def _reading_again(self) -> None:
        """Until the client has read what it was sent and reads on, or the request's time is up."""
        while (self.out.qsize() or self.client.stalled_s() >= NOT_READING_S) and self.loop.time() < self.deadline:
            await asyncio.sleep(LOOK_AGAIN_S)

    def _ended_at_max(self, index: int) -> bool:
        """Choice `index` generated all of its max_tokens before the pause without its end: ended here."""
        if len(self.progress.choices[index].token_ids) < self.request.params.max_tokens:
            return False
        passed = self.progress.observe(GenerationDelta(choices=(ChoiceDelta(0, "", 0, finish_reason="length"),)),
                                       index=index)
        if passed is not None:
            self.out.put_nowait(passed)
        return True
