"""A request's engine stream that gives its slot to another tenant's request and resumes in place.

When a replica's slots are all taken and the next waiting request is another tenant's, holding fewer slots per weight
(or an interactive one while a batch request runs), one running request is asked to yield (app/host/slots.py). At its
next output its engine request is aborted with its generated token ids kept (`Continuation`, the record that moves a
request to another replica when its replica fails), its ticket goes back to the head of its tenant's queue, and when
its turn comes again it continues from those tokens: the prompt's ids and the choice's own as the prompt (the prefix
cache still holds most of them), `max_tokens` less what was generated. The client sees one stream with a pause in it.

Pausable: one choice, and nothing the engine keeps of the request besides its tokens: no structured output or
tool-call parsing (grammar state), no stop strings (the engine holds back text that may start one), no presence or
frequency penalty and no bad_words (counted over the output alone). A greedy choice continues exactly as it would
have, a seeded one too on the CPU engine (its generator advanced by the draws made), an unseeded one as a fresh sample
of the same distribution (app/engine/continuation.py). Other requests run to their end as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import replace

from app.engine.continuation import Continuation, state_on_replica
from app.engine.interface import ChoiceDelta, GenerateRequest, GenerationDelta, GenerationParams
from app.host.runner import EngineRunner
from app.host.ticket import Ticket


def pausable(p: GenerationParams) -> bool:
    return (p.n == 1 and not p.stop and not p.bad_words and not p.presence_penalty and not p.frequency_penalty
            and state_on_replica(p) is None)


async def engine_stream(runner: EngineRunner, ticket: Ticket, request: GenerateRequest, prompt_ids: list[int],
                        params: GenerationParams, deadline: float) -> AsyncGenerator[GenerationDelta, None]:
    """The engine's deltas for `request` (its prompt's ids, its params fitted to the context), paused and resumed in
    place whenever its ticket is asked to yield; as `EngineRunner.stream` for one that is not `pausable`."""
    if not pausable(params):
        async with aclosing(runner.stream(request.request_id, prompt_ids, params, deadline,
                                          request.after_wedge)) as deltas:
            async for delta in deltas:
                yield delta
        return
    ticket.pausable = True
    progress = Continuation(replace(request, params=params))
    progress.prompt_ids = tuple(prompt_ids)
    run = progress.for_engine()
    index: int | None = None  # None: the first run (its prompt's ids, cached tokens and logprobs go to the client)
    loop = asyncio.get_running_loop()
    while True:
        async with aclosing(runner.stream(run.request_id, list(run.prompt.token_ids or prompt_ids), run.params,
                                          deadline, request.after_wedge and index is None)) as deltas:
            async for delta in deltas:
                passed = progress.observe(delta, index=index)
                if isinstance(passed, GenerationDelta):
                    yield passed
                if ticket.yield_asked and not progress.all_finished():
                    break  # closing the stream aborts the engine request
            else:
                return  # the engine ended it
        await ticket.pause(deadline - loop.time())
        if len(progress.choices[0].token_ids) >= params.max_tokens:  # paused between its last token and its end
            end = progress.observe(GenerationDelta(choices=(ChoiceDelta(0, "", 0, finish_reason="length"),)), index=0)
            if isinstance(end, GenerationDelta):
                yield end
            return
        run, index = progress.resume(0, deadline - loop.time()), 0
