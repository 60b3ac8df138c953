"""Several streams read as one: the items of each as they come; the first failure ends all of them.

The choices of a request continued on other replicas (app/rayserve/handle_backend.py) or on an engine restarted in
place (app/host/resuming_host.py) each come from a stream of their own; the client's stream is their merge.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any


async def merged(streams: list[AsyncGenerator[Any, None]]) -> AsyncGenerator[Any, None]:
    """The items of several streams as they come; the first failure ends all of them."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:
            async for item in only:
                yield item
        return
    queue: asyncio.Queue[Any] = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncGenerator[Any, None]) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    await queue.put(item)
            await queue.put(done)
        except Exception as err:
            await queue.put(_Raised(err))

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, _Raised):
                raise item.error
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()  # each pump's stream closes, cancelling its remote call
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class _Raised:
    error: Exception
