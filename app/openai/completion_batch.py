"""A completions batch: the engine streams of a request with several prompts, read together, answered as one.

Every prompt is its own engine request (admitted, counted and aborted as one). All of them are read from the
start, so a prompt that is admitted generates (and finishes, freeing its slot) while a later one still waits for
a slot: waiting for every admission before reading any would deadlock a batch larger than the free slots. What
arrives before the last admission is kept (at most every prompt's `max_tokens`). The batch is answered only once
every prompt is admitted (`admitted`), or refused whole with the first refusal. Each choice is renumbered as
OpenAI numbers a batch's choices: prompt i's choice j is choice i * n + j. Closing the batch (the client left,
the request failed) cancels the readers and closes every stream, which aborts its engine request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

from app.engine.interface import Admitted, GenerationDelta

_END = object()


class Batch:
    def __init__(self, streams: list[AsyncGenerator[Any, None]], n: int):
        self._streams = streams
        self._n = n
        self._admitted: list[Admitted | None] = [None] * len(streams)
        self._all_admitted = asyncio.get_running_loop().create_future()  # or failed with the first refusal
        self._queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._readers = [asyncio.ensure_future(self._read(i, s)) for i, s in enumerate(streams)]

    async def _read(self, prompt: int, stream: AsyncGenerator[Any, None]) -> None:
        try:
            first = True
            async for item in stream:
                if first:
                    first = False
                    self._admitted[prompt] = item
                    if all(a is not None for a in self._admitted) and not self._all_admitted.done():
                        self._all_admitted.set_result([a for a in self._admitted if a is not None])
                    continue
                await self._queue.put((prompt, item))
            await self._queue.put((prompt, _END))
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            if not self._all_admitted.done():
                self._all_admitted.set_exception(err)
            await self._queue.put((prompt, err))

    async def admitted(self) -> list[Admitted]:
        """Every prompt's admission, in order; the first refusal (the batch is then closed) otherwise."""
        try:
            return list(await asyncio.shield(self._all_admitted))
        except BaseException:
            await self.aclose()
            raise

    async def deltas(self) -> AsyncGenerator[GenerationDelta, None]:
        """Every prompt's deltas as they come, renumbered; closed, it closes the batch."""
        try:
            running = len(self._streams)
            while running:
                prompt, item = await self._queue.get()
                if item is _END:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield replace(item, choices=tuple(replace(c, index=prompt * self._n + c.index)
                                                      for c in item.choices))
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        for stream in self._streams:
            await stream.aclose()
        if not self._all_admitted.done():
            self._all_admitted.cancel()
        elif not self._all_admitted.cancelled():
            self._all_admitted.exception()  # retrieved: no "exception was never retrieved" warning
