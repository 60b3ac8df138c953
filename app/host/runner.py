"""EngineRunner: one admitted request on the engine, from its first await to its abort.

Each engine await runs under the request's deadline (the event loop's clock), registered with the supervisor so
that an engine found broken ends it at once with a retryable 503; the progress watch sees the request enter, emit
and leave; and on any exit before the engine finished it (the client left, the deadline passed, an error) the
engine request is aborted, to its end even if the caller is cancelled meanwhile. A broken engine is killed, not
asked to abort.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable

from app.engine.interface import (
    EmbedRequest,
    EngineDead,
    EngineFailed,
    EngineRejected,
    GenerationDelta,
    GenerationParams,
)
from app.errors import InvalidRequest, RequestTimeout
from app.host.supervisor import EngineSupervisor

log = logging.getLogger("app.server")
# An abort that has not completed by then is logged and left to run: the engine is wedged (issue of its own).
ABORT_TIMEOUT_S = 30.0


async def to_completion(work: Awaitable[object], timeout_s: float) -> None:
    """Awaits `work` to its end even if the caller is cancelled meanwhile, then re-raises the cancellation.

    An engine abort runs in `finally` blocks that a client's disconnect reaches as a cancellation, and
    Starlette's (anyio's) cancel scopes cancel again at every await until the task exits: a plain
    `await engine.abort(...)` there can itself be cancelled half-way, leaving the request running in the
    engine, holding its KV cache, with no one to read it."""
    task = asyncio.ensure_future(asyncio.wait_for(work, timeout_s))
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True  # keep waiting: the abort must finish
        except TimeoutError:
            log.error("an engine abort did not complete within %.0f s", timeout_s)
        except Exception:
            log.exception("an engine abort failed")
    if cancelled:
        raise asyncio.CancelledError


def rejected_param(params: GenerationParams) -> str | None:
    """The parameter an engine's refusal of a request names: its structured-output constraint's."""
    if params.regex is not None or params.choice is not None or params.grammar is not None:
        return "structured_outputs"
    if params.json_schema is not None or params.json_object:
        return params.json_schema_param
    return None


class EngineRunner:
    def __init__(self, supervisor: EngineSupervisor):
        self.supervisor = supervisor

    async def stream(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams, deadline: float,
        after_wedge: bool = False,
    ) -> AsyncGenerator[GenerationDelta, None]:
        """The engine's stream, ended by `deadline`, or at once with a retryable `ServiceUnavailable` when the
        engine is found broken (the supervisor expires the deadline). `after_wedge`: the progress watch is
        patient with its prefill (app/host/progress_watch.py)."""
        sup = self.supervisor
        engine, watch = sup.engine, sup.watch
        if sup.left(engine):  # admitted from the queue after its engine broke
            raise sup.ended_by_broken_engine()
        stream = engine.generate(request_id, prompt_ids, params)
        watch.entered(request_id, len(prompt_ids), patient=after_wedge)
        sup.watch_progress()
        finished = False
        try:
            while True:
                if sup.left(engine):
                    raise sup.ended_by_broken_engine(request_id)
                async with asyncio.timeout_at(deadline) as clock:  # around the await only, never across the yield
                    sup.clock_started(request_id, clock)
                    try:
                        delta = await anext(stream)
                    except StopAsyncIteration:
                        finished = True
                        return
                watch.output(request_id)
                yield delta
        except TimeoutError:
            if sup.left(engine):
                raise sup.ended_by_broken_engine(request_id) from None
            raise RequestTimeout(
                "The request ran past its time limit and was stopped; ask for fewer tokens or retry later"
            ) from None
        except EngineRejected as err:
            finished = True
            raise InvalidRequest(str(err), param=rejected_param(params)) from None
        except EngineFailed as err:
            finished = True  # the engine has already ended it
            raise sup.engine_error(engine, request_id, err) from None
        except EngineDead as err:
            raise sup.engine_error(engine, request_id, err) from None
        finally:
            sup.clock_ended(request_id)
            watch.left(request_id)
            if not finished and not sup.left(engine):  # a broken engine is killed, not asked
                await to_completion(engine.abort(request_id), ABORT_TIMEOUT_S)
            await stream.aclose()

    async def embed_all(self, request: EmbedRequest, prompts_ids: list[list[int]], deadline: float
                        ) -> tuple[tuple[float, ...], ...]:
        """Every input's vector, each input an engine request (`<id>-<i>`, as vLLM numbers a batch's prompts) run
        side by side, ended by `deadline` or a broken engine as `stream` is; on any failure or cancellation the
        unfinished ones are aborted."""
        sup = self.supervisor
        engine, watch = sup.engine, sup.watch
        if sup.left(engine):
            raise sup.ended_by_broken_engine()
        ids = [f"{request.request_id}-{i}" for i in range(len(prompts_ids))]
        done: set[str] = set()

        async def one(engine_id: str, prompt_ids: list[int]) -> tuple[float, ...]:
            watch.entered(engine_id, len(prompt_ids))
            try:
                vector = await engine.embed(engine_id, prompt_ids, request.dimensions)
                done.add(engine_id)
                watch.output(engine_id)
                return vector
            finally:
                watch.left(engine_id)

        tasks = [asyncio.ensure_future(one(i, p)) for i, p in zip(ids, prompts_ids, strict=True)]
        sup.watch_progress()
        try:
            async with asyncio.timeout_at(deadline) as clock:
                sup.clock_started(request.request_id, clock)
                return tuple(await asyncio.gather(*tasks))
        except TimeoutError:
            if sup.left(engine):
                raise sup.ended_by_broken_engine() from None
            raise RequestTimeout(
                "The request ran past its time limit and was stopped; send fewer or shorter inputs, or retry later"
            ) from None
        except EngineRejected as err:
            raise InvalidRequest(str(err), param="input") from None
        except (EngineFailed, EngineDead) as err:
            raise sup.engine_error(engine, request.request_id, err) from None
        finally:
            sup.clock_ended(request.request_id)
            for task in tasks:
                task.cancel()

            async def settle_then_abort() -> None:
                await asyncio.gather(*tasks, return_exceptions=True)
                unfinished = [i for i in ids if i not in done]
                if unfinished and not sup.left(engine):  # a broken engine is killed, not asked
                    for engine_id in unfinished:
                        await engine.abort(engine_id)

            await to_completion(settle_then_abort(), ABORT_TIMEOUT_S)
