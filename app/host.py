"""EngineHost: what one engine replica does with a request.

It is given an `Engine` (the fake one in tests, vLLM's in production: `replicas.make_engine`), owns
the replica's `Admission`, and for each request: refuses at once if the queue is full (before any
work), renders and counts the prompt, holds it to the length contract, waits for an engine slot,
streams neutral deltas back, and aborts the engine request if the caller goes away, the request
times out, or anything fails. No HTTP and no Ray here; `replicas.py` puts it in a Serve replica.

An engine that stops serving is found two ways: it says so (`EngineDead`, from a request or its
health check), or it stops making progress while requests are in it (`progress_watch.ProgressWatch`:
vLLM's own health check passes an `EngineCore` stopped with SIGSTOP for ever). Either way the engine is
broken: requests in flight on it end with a retryable 503, new ones get 503 + Retry-After, and
`routing_stats` reports `serving: False` so Serve's router sends nothing more.

What follows depends on `engine_factory`. Without one, the replica fails Serve's health check and Serve
replaces it (about 33-65 s here for a SIGKILLed EngineCore: health-check period, a new replica process,
the engine's load). With one, the host restarts its engine in place: it SIGKILLs what a wedged engine
started (`engine_processes.EngineProcesses`), shuts it down, builds a new engine from the factory and
starts it on a thread, so the event loop keeps answering (`/livez`, 503s with Retry-After) meanwhile.

Decided, and why: while an in-place restart progresses, the health check passes, so Serve does not kill
a replica that is about to serve again; in-place is preferred with several replicas too, because it skips
Serve's detection delay (health_check_period_s x failures) and a new replica process, the router already
steers traffic away within a second, and it is the host that can SIGKILL a stopped EngineCore (a replica
that Serve kills leaves its stopped child behind). Serve's replacement stays the fallback: the health
check fails when the restart fails, when it runs past `restart_deadline_s`, or when the engine broke
`RESTART_LIMIT` times within `RESTART_WINDOW_S` (a crash loop that a new process may cure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import psutil

from app.admission import Admission, AdmissionStats, Targets, Ticket
from app.client_targets import tightest
from app.config import ModelConfig, ServiceConfig
from app.cpu_affinity import pin
from app.embeddings import wrong_runner
from app.engine import (
    Admitted,
    Embeddings,
    EmbedRequest,
    Engine,
    EngineDead,
    EngineFailed,
    EngineRejected,
    EngineStats,
    GenerateRequest,
    GenerationDelta,
    GenerationParams,
    PromptInput,
)
from app.engine_processes import EngineProcesses
from app.errors import (
    InvalidRequest,
    RequestTimeout,
    ServiceError,
    ServiceUnavailable,
    queue_full_class,
)
from app.logs import configure_logging
from app.pace import EnginePace, PaceStats
from app.progress_watch import ProgressWatch, Stall
from app.prompt_tokenizer import PromptTokenizer

# The logger of the one line per engine request; its name predates this module's and log queries rely on it.
log = logging.getLogger("app.server")
# An abort that has not completed by then is logged and left to run: the engine is wedged (issue of its own).
ABORT_TIMEOUT_S = 30.0
# In-place restarts: at most RESTART_LIMIT within RESTART_WINDOW_S, after which the health check fails and
# Serve replaces the replica (a new process may cure what a new engine in this one did not).
RESTART_LIMIT = 3
RESTART_WINDOW_S = 600.0
# A restart not done within max(RESTART_MIN_DEADLINE_S, RESTART_DEADLINE_STARTS x the engine's last start)
# is not progressing: the health check fails. The engine's start took ~25 s here (NOTES.md), ~110 s compiled.
RESTART_MIN_DEADLINE_S = 180.0
RESTART_DEADLINE_STARTS = 4.0
# How long the old engine's shutdown may take before the restart goes on without it (its processes are
# SIGKILLed either way).
SHUTDOWN_TIMEOUT_S = 30.0
_T = TypeVar("_T")


async def _to_completion(work: Awaitable[None], timeout_s: float) -> None:
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


@dataclass(frozen=True)
class ReplicaStats:
    """One replica's figures for /stats and /metrics; crosses the Ray handle as this dataclass."""

    model: str
    ready: bool
    healthy: bool
    admission: AdmissionStats
    engine: EngineStats
    kv_cache_tokens: int
    pace: PaceStats = PaceStats()
    wedged_total: int = 0  # engines this replica declared wedged (no progress past the bound)
    restarts_total: int = 0  # in-place engine restarts completed
    restarting: bool = False


def _ms_since(start: float) -> float:
    return round((time.monotonic() - start) * 1000, 1)


class EngineHost:
    """Lifecycle: constructed → starting (the engine loads; requests get 503 "starting") → ready →
    possibly broken (the engine died or wedged; requests get 503) → with an `engine_factory`, restarting
    (503 "restarting"; the health check passes while the restart progresses) → ready on a new engine; without
    one, the health check fails and Ray Serve replaces the replica. With `start_in_background` the constructor
    returns at once, so a replica is up, answering 503s and reporting "starting", while its engine loads."""

    def __init__(
        self,
        model: ModelConfig,
        engine: Engine,
        service: ServiceConfig | None = None,
        start_in_background: bool = False,
        engine_factory: Callable[[], Engine] | None = None,
        progress_watch: ProgressWatch | None = None,
    ):
        service = service or ServiceConfig()
        configure_logging(service.log_level)
        self.model = model
        self.engine = engine
        self._engine_factory = engine_factory
        dep = model.deployment
        self.admission = Admission(
            max_running=dep.max_ongoing_requests,
            max_queued=dep.max_queued_requests,
            token_budget=dep.token_budget or 2**62,  # the KV cache's size once the engine reports it
            queue_timeout_s=dep.queue_timeout_s,
            refusal=queue_full_class(service.refusal_status),
            pace=EnginePace(),
        )
        self.prompts = PromptTokenizer(model, engine, queue_full_class(service.refusal_status))
        self.watch = progress_watch or ProgressWatch()
        self._ready = threading.Event()
        self._start_error: str | None = None
        self._broken: str | None = None  # why the current engine cannot serve (died, wedged); None while it can
        self._processes = EngineProcesses()
        self._start_s = 0.0  # how long the engine's last start took, for Retry-After during a restart
        # The cores this process may use before any engine narrowed them (cpu_affinity.keep_off_engine_cores):
        # a new engine in this process must plan its cores from these, not from the front end's share.
        self._affinity = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
        self._clocks: dict[str, asyncio.Timeout] = {}  # each request's deadline around its current engine await
        self._watching: asyncio.Task[None] | None = None
        self._restart: asyncio.Task[None] | None = None
        self._restarting_since: float | None = None
        self._restart_failed: str | None = None
        self._breaks: deque[float] = deque(maxlen=RESTART_LIMIT)  # when the engines broke, for the limit
        self._closed = False
        self.wedged_total = 0
        self.restarts_total = 0
        self.last_stall: Stall | None = None  # the latest wedge, as it was seen
        if start_in_background:
            threading.Thread(target=self._start, name=f"start-{model.id}", daemon=True).start()
        else:
            self._start()
            if self._start_error:
                raise RuntimeError(self._start_error)

    def _start(self) -> None:
        started = time.monotonic()
        try:
            self._processes = EngineProcesses.started_by(self.engine.start)
        except Exception as err:
            self._start_error = f"the engine for '{self.model.id}' failed to start: {err!r}"
            log.exception("engine for %s failed to start", self.model.id)
            self.engine.shutdown()  # whatever it had started goes with it
            return
        self._start_s = time.monotonic() - started
        if not self.model.deployment.token_budget and self.engine.kv_cache_tokens:
            self.admission.token_budget = self.engine.kv_cache_tokens
        self._ready.set()
        log.info(
            "model %s ready in %.1f s; token budget %d",
            self.model.id,
            self._start_s,
            self.admission.token_budget,
        )

    def _require_ready(self) -> None:
        if self._restarting_since is not None:
            raise ServiceUnavailable(
                f"the engine for '{self.model.id}' is restarting ({self._broken}); retry shortly",
                retry_after_s=self._restart_retry_after_s(),
            )
        if self._broken:
            raise ServiceUnavailable(
                f"the engine for '{self.model.id}' has {self._broken} and is being replaced; retry shortly",
                retry_after_s=5,
            )
        if self._start_error:
            raise ServiceUnavailable(f"{self._start_error}; the replica is being replaced", retry_after_s=10)
        if not self._ready.is_set():
            raise ServiceUnavailable(f"the engine for '{self.model.id}' is starting; retry shortly", retry_after_s=5)

    # -- the request path -------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Admitted | GenerationDelta, None]:
        self._require_ready()
        if self.model.runner != "generate":
            raise wrong_runner(self.model.id, self.model.runner, "generation")
        # Cost before commitment: a prompt certainly too long, or a full replica, is refused before any
        # tokenizing; tokenizing holds no admission slot; the slot is taken for a prompt known to fit.
        self.prompts.refuse_certainly_too_long(request.prompt, request.resumed_tokens)
        self.admission.refuse_if_full()
        arrived = time.monotonic()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.timeout_s  # this process's clock: no skew between nodes
        prompt_ids = await self.prompts.tokenize(request.prompt)
        rendered_ms = _ms_since(arrived)
        params = self.prompts.fit_to_context(len(prompt_ids), request)
        ticket = self.admission.reserve()
        outcome, prompt_tokens, generated = "client_gone", len(prompt_ids), 0
        timings: dict[str, float] = {"rendered_ms": rendered_ms}  # ms since arrival: where a slow first token went
        try:
            await ticket.admit(
                len(prompt_ids) + params.n * params.max_tokens,
                deadline - loop.time(),
                self._targets(request, arrived),
                prompt_tokens=len(prompt_ids),
                max_steps=params.max_tokens,
            )
            timings["admitted_ms"] = _ms_since(arrived)
            prompt_text = (
                self.prompts.decode_now(prompt_ids, "prompt")
                if request.prompt.token_ids is not None and request.want_prompt_text
                else None
            )
            deltas = self._run(request.request_id, prompt_ids, params, deadline)
            try:
                # Wait for the engine's first output before announcing admission, so that an engine-side
                # rejection (a schema it cannot compile) still reaches the client as a 400, not a 200 stream.
                first = await anext(deltas, None)
                timings["first_output_ms"] = _ms_since(arrived)
                yield Admitted(prompt_tokens=len(prompt_ids), prompt_text=prompt_text)
                if first is not None:
                    generated += self._produced(ticket, first)
                    yield first
                async for delta in deltas:
                    generated += self._produced(ticket, delta)
                    yield delta
                outcome = "finished"
            finally:
                await deltas.aclose()
        except ServiceError as err:
            outcome = err.code or err.type
            raise
        finally:
            ticket.release(completed=outcome == "finished")
            log.info(
                "engine request",
                extra={
                    "request_id": request.request_id,
                    "trace_id": request.trace_id,
                    "model": self.model.id,
                    "outcome": outcome,
                    "prompt_tokens": prompt_tokens,
                    "generated_tokens": generated,
                    **timings,
                },
            )

    def _targets(self, request: GenerateRequest, arrived: float) -> Targets:
        """The model's targets, tightened by the request's own, less the time already spent (tokenizing)."""
        dep, spent = self.model.deployment, time.monotonic() - arrived
        # A continuation's client has had its first token (app/continuation.py).
        first = None if request.continuation else tightest(dep.ttft_target_s, request.ttft_target_s)
        finish = tightest(dep.request_target_s, request.finish_target_s)
        return Targets(
            first_token_s=None if first is None else first - spent,
            finish_s=None if finish is None else finish - spent,
        )

    @staticmethod
    def _produced(ticket: Ticket, delta: GenerationDelta) -> int:
        """Tells the ticket (the pace) of an output; returns its tokens over all choices."""
        ticket.produced(max((c.num_tokens for c in delta.choices), default=0))
        return sum(c.num_tokens for c in delta.choices)

    def _stopped(self, engine: Engine) -> bool:
        """The request's engine broke, or has been replaced since it started: it must not wait on it."""
        return engine is not self.engine or self._broken is not None

    def _ended_by_broken_engine(self) -> ServiceUnavailable:
        return ServiceUnavailable(
            f"the engine for '{self.model.id}' stopped serving while this request was in it "
            f"({self._broken or 'replaced'}); retry",
            retry_after_s=self._restart_retry_after_s() if self._restarting_since is not None else 5,
        )

    def _engine_error(self, engine: Engine, request_id: str, err: EngineFailed | EngineDead) -> ServiceUnavailable:
        """A retryable 503 for a request the engine ended unfinished (EngineFailed), or died under (EngineDead: the
        engine is marked broken, which restarts or replaces it)."""
        if isinstance(err, EngineFailed):
            log.warning("engine for %s ended request %s unfinished: %s", self.model.id, request_id, err)
            return ServiceUnavailable(f"the engine ended this request without finishing it ({err}); retry",
                                      retry_after_s=1)
        self._engine_broken(engine, f"died ({err})")
        return ServiceUnavailable(
            f"the engine for '{self.model.id}' failed while serving this request; retry shortly", retry_after_s=5
        )

    async def _run(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams, deadline: float
    ) -> AsyncGenerator[GenerationDelta, None]:
        """The engine's stream, ended by `deadline` (the event loop's clock), or at once with a retryable
        `ServiceUnavailable` when the engine is found broken (`_engine_broken` expires the deadline)."""
        engine, watch = self.engine, self.watch
        if self._stopped(engine):  # admitted from the queue after its engine broke
            raise self._ended_by_broken_engine()
        stream = engine.generate(request_id, prompt_ids, params)
        watch.entered(request_id, len(prompt_ids))
        self._watch_progress()
        finished = False
        try:
            while True:
                if self._stopped(engine):
                    raise self._ended_by_broken_engine()
                async with asyncio.timeout_at(deadline) as clock:  # around the await only, never across the yield
                    self._clocks[request_id] = clock
                    try:
                        delta = await anext(stream)
                    except StopAsyncIteration:
                        finished = True
                        return
                watch.output(request_id)
                yield delta
        except TimeoutError:
            if self._stopped(engine):
                raise self._ended_by_broken_engine() from None
            raise RequestTimeout(
                "The request ran past its time limit and was stopped; ask for fewer tokens or retry later"
            ) from None
        except EngineRejected as err:
            finished = True
            raise InvalidRequest(str(err), param=self._rejected_param(params)) from None
        except EngineFailed as err:
            finished = True  # the engine has already ended it
            raise self._engine_error(engine, request_id, err) from None
        except EngineDead as err:
            raise self._engine_error(engine, request_id, err) from None
        finally:
            self._clocks.pop(request_id, None)
            watch.left(request_id)
            if not finished and not self._stopped(engine):  # a broken engine is killed, not asked
                await _to_completion(engine.abort(request_id), ABORT_TIMEOUT_S)
            await stream.aclose()

    @staticmethod
    def _rejected_param(params: GenerationParams) -> str | None:
        """The parameter an engine's refusal of a request names: its structured-output constraint's."""
        if params.regex is not None or params.choice is not None or params.grammar is not None:
            return "structured_outputs"
        if params.json_schema is not None or params.json_object:
            return params.json_schema_param
        return None

    # -- embeddings -------------------------------------------------------

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """/v1/embeddings: generation's path for a batch of inputs. Each input is held to the length contract
        (tokenized together, on the tokenizer thread) and is an engine request of its own; the request takes one
        admission slot and the sum of its inputs' tokens from the budget, so a batch is admitted whole or refused
        whole (one larger than the whole budget still runs, alone, as a long prompt does)."""
        self._require_ready()
        if self.model.runner != "embed":
            raise wrong_runner(self.model.id, self.model.runner, "embeddings")
        self._refuse_dimensions(request.dimensions)
        for prompt in request.inputs:
            self.prompts.refuse_certainly_too_long(prompt)
        self.admission.refuse_if_full()
        arrived = time.monotonic()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.timeout_s
        prompts_ids = await self.prompts.tokenize_all(request.inputs)
        for ids, prompt in zip(prompts_ids, request.inputs, strict=True):
            self.prompts.refuse_long_prompt(len(ids), prompt)
        tokens = sum(len(ids) for ids in prompts_ids)
        timings: dict[str, float] = {"rendered_ms": _ms_since(arrived)}
        ticket = self.admission.reserve()
        outcome = "client_gone"
        try:
            # One output per input and no decode: to the pace (app/pace.py) it is a prompt of `tokens` whose first
            # output is the answer, so the first-token target holds for it as for a generation's first token.
            first = tightest(self.model.deployment.ttft_target_s, request.ttft_target_s)
            spent = time.monotonic() - arrived
            await ticket.admit(tokens, deadline - loop.time(),
                               Targets(first_token_s=None if first is None else first - spent),
                               prompt_tokens=tokens, max_steps=1)
            timings["admitted_ms"] = _ms_since(arrived)
            vectors = await self._embed_all(request, prompts_ids, deadline)
            ticket.produced(1)
            timings["first_output_ms"] = _ms_since(arrived)
            outcome = "finished"
            return Embeddings(vectors=vectors, prompt_tokens=tokens)
        except ServiceError as err:
            outcome = err.code or err.type
            raise
        finally:
            # Not `completed`: its one output would teach the pace that requests use all of their max_tokens.
            ticket.release(completed=False)
            log.info("engine request", extra={
                "request_id": request.request_id, "trace_id": request.trace_id, "model": self.model.id,
                "outcome": outcome, "prompt_tokens": tokens, "generated_tokens": 0, "inputs": len(request.inputs),
                **timings,
            })

    def _refuse_dimensions(self, dimensions: int | None) -> None:
        """vLLM's checks of `dimensions` (PoolingParams.verify, with its messages), before any tokenizing."""
        facts = self.engine.embedding_facts
        if dimensions is None or facts is None:
            return
        name = self.model.id
        if not facts.matryoshka:
            raise InvalidRequest(f"Model {name!r} does not support Matryoshka embeddings; dimensions must be unset "
                                 f"(received dimensions={dimensions}).", param="dimensions")
        if not 1 <= dimensions <= facts.size:
            raise InvalidRequest(f"Model {name!r} only supports dimensions in range [1, {facts.size}], "
                                 f"got {dimensions}.", param="dimensions")
        if facts.dimensions is not None and dimensions not in facts.dimensions:
            raise InvalidRequest(f"Model {name!r} only supports Matryoshka dimensions {list(facts.dimensions)}, "
                                 f"got {dimensions}.", param="dimensions")

    async def _embed_all(self, request: EmbedRequest, prompts_ids: list[list[int]], deadline: float
                         ) -> tuple[tuple[float, ...], ...]:
        """Every input's vector, each input an engine request (`<id>-<i>`, as vLLM numbers a batch's prompts) run
        side by side, ended by `deadline` or a broken engine as `_run` is; on any failure or cancellation the
        unfinished ones are aborted."""
        engine, watch = self.engine, self.watch
        if self._stopped(engine):
            raise self._ended_by_broken_engine()
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
        self._watch_progress()
        try:
            async with asyncio.timeout_at(deadline) as clock:
                self._clocks[request.request_id] = clock
                return tuple(await asyncio.gather(*tasks))
        except TimeoutError:
            if self._stopped(engine):
                raise self._ended_by_broken_engine() from None
            raise RequestTimeout(
                "The request ran past its time limit and was stopped; send fewer or shorter inputs, or retry later"
            ) from None
        except EngineRejected as err:
            raise InvalidRequest(str(err), param="input") from None
        except (EngineFailed, EngineDead) as err:
            raise self._engine_error(engine, request.request_id, err) from None
        finally:
            self._clocks.pop(request.request_id, None)
            for task in tasks:
                task.cancel()

            async def settle_then_abort() -> None:
                await asyncio.gather(*tasks, return_exceptions=True)
                unfinished = [i for i in ids if i not in done]
                if unfinished and not self._stopped(engine):  # a broken engine is killed, not asked
                    for engine_id in unfinished:
                        await engine.abort(engine_id)

            await _to_completion(settle_then_abort(), ABORT_TIMEOUT_S)

    # -- forward progress and the broken engine ---------------------------

    def _watch_progress(self) -> None:
        """Looks at the engine's progress every tick while requests are in it (the task ends when none is)."""
        if self._watching is None or self._watching.done():
            self._watching = asyncio.get_running_loop().create_task(self._watch_while_in_flight())

    async def _watch_while_in_flight(self) -> None:
        while self.watch.in_flight and not self._closed:
            await asyncio.sleep(self.watch.tick_s())
            self._look_for_stall()

    def _prefill_tokens_per_s(self) -> float | None:
        pace = self.admission.pace
        if pace is None or not pace.ready:
            return None  # the watch's generous unmeasured rate
        return pace.stats(self.admission.stats().running).prefill_tokens_per_s

    def _look_for_stall(self) -> Stall | None:
        if self._broken or not self._ready.is_set() or self._restarting_since is not None:
            return None
        engine = self.engine
        stats = engine.stats()
        stall = self.watch.stalled(
            stats.prompt_tokens_total + stats.generation_tokens_total, stats.running > 0, self._prefill_tokens_per_s()
        )
        if stall is not None:
            self.last_stall = stall
            self.wedged_total += 1
            log.error(
                "engine for %s wedged: %s; ending requests %s",
                self.model.id,
                stall.describe(),
                ", ".join(stall.request_ids),
                extra={"model": self.model.id, "request_ids": list(stall.request_ids), "quiet_s": stall.quiet_s},
            )
            self._engine_broken(engine, f"wedged ({stall.describe()})", wedged=True)
        return stall

    def _engine_broken(self, engine: Engine, why: str, wedged: bool = False) -> None:
        """`engine` cannot serve any more: requests in flight on it end now (their deadlines expire, and
        `_run` turns that into a retryable 503), and with a factory an in-place restart begins."""
        if engine is not self.engine or self._broken is not None:
            return
        self._broken = why
        if not wedged:
            log.error("engine for %s %s", self.model.id, why)
        self._breaks.append(time.monotonic())
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            for clock in list(self._clocks.values()):
                with contextlib.suppress(RuntimeError):  # that request is at its yield; it checks before its next await
                    clock.reschedule(loop.time())
        if loop is not None and self._may_restart():
            self._restarting_since = time.monotonic()
            self._ready.clear()
            self._restart = loop.create_task(self._restart_engine(engine, wedged))

    def _may_restart(self) -> bool:
        if self._engine_factory is None or self._closed:
            return False
        window_full = len(self._breaks) == RESTART_LIMIT and time.monotonic() - self._breaks[0] < RESTART_WINDOW_S
        if window_full:
            log.error(
                "engine for %s broke %d times within %.0f s: no restart in place; the replica is to be replaced",
                self.model.id,
                RESTART_LIMIT,
                RESTART_WINDOW_S,
            )
        return not window_full

    def _restart_deadline_s(self) -> float:
        return max(RESTART_MIN_DEADLINE_S, RESTART_DEADLINE_STARTS * self._start_s)

    def _restart_retry_after_s(self) -> float:
        """The rest of the restart, if it takes as long as the last start did."""
        elapsed = time.monotonic() - (self._restarting_since or time.monotonic())
        return float(min(60, max(1, math.ceil(self._start_s + 5 - elapsed))))

    async def _restart_engine(self, old: Engine, wedged: bool) -> None:
        started = time.monotonic()
        log.warning("engine for %s: restarting in place (%s)", self.model.id, self._broken)
        try:
            await self._stop_engine(old, wedged)
            assert self._engine_factory is not None
            engine = self._engine_factory()
            processes = await asyncio.to_thread(self._start_new, engine)
        except Exception as err:
            self._restart_failed = f"the restart of the engine for '{self.model.id}' failed: {err!r}"
            log.exception("engine for %s: restart in place failed; the replica is to be replaced", self.model.id)
            self._restarting_since = None
            return
        if self._closed:  # the replica stopped meanwhile: the new engine goes with it
            engine.shutdown()
            processes.kill()
            return
        self.engine, self.prompts.engine, self._processes = engine, engine, processes
        self.watch = self.watch.renewed()
        if not self.model.deployment.token_budget and engine.kv_cache_tokens:
            self.admission.token_budget = engine.kv_cache_tokens
        self.restarts_total += 1
        self._broken = None
        self._restarting_since = None
        self._ready.set()
        log.warning("engine for %s: restarted in place in %.1f s", self.model.id, time.monotonic() - started)

    async def _stop_engine(self, engine: Engine, wedged: bool) -> None:
        """Every process the old engine started ends: a wedged engine's are SIGKILLed first (a stopped
        EngineCore would sit out vLLM's SIGTERM grace), then the engine shuts down (off the event loop, bounded),
        then whatever of its processes is still alive is SIGKILLed."""
        processes = self._processes
        if wedged:
            killed = await asyncio.to_thread(processes.kill)
            log.warning("engine for %s: SIGKILLed %d wedged engine process(es) %s", self.model.id, killed,
                        processes.pids)
        try:
            await asyncio.wait_for(asyncio.to_thread(engine.shutdown), SHUTDOWN_TIMEOUT_S)
        except TimeoutError:
            log.error("engine for %s: shutdown did not finish in %.0f s; going on", self.model.id, SHUTDOWN_TIMEOUT_S)
        except Exception:
            log.exception("engine for %s: shutdown failed; going on", self.model.id)
        await asyncio.to_thread(processes.kill)

    def _start_new(self, engine: Engine) -> EngineProcesses:
        """Starts `engine` (on a thread), with the process's cores as the first engine found them."""
        started = time.monotonic()
        if self._affinity:
            with contextlib.suppress(psutil.Error, OSError):
                pin(psutil.Process(), self._affinity)
        try:
            processes = EngineProcesses.started_by(engine.start)
        except BaseException:
            with contextlib.suppress(Exception):
                engine.shutdown()
            raise
        self._start_s = time.monotonic() - started
        return processes

    # -- control plane ----------------------------------------------------

    async def tokenize(self, prompt: PromptInput) -> list[int]:
        """/tokenize: the same size limits and capacity as generation, on the same tokenizer thread."""
        self._require_ready()
        self.prompts.refuse_certainly_too_long(prompt)
        self.admission.refuse_if_full()
        token_ids = await self.prompts.tokenize(prompt)
        self.prompts.refuse_long_prompt(len(token_ids), prompt)
        return token_ids

    async def detokenize(self, token_ids: list[int]) -> str:
        """/detokenize: at most a context's worth of ids, decoded on the tokenizer thread."""
        self._require_ready()
        if len(token_ids) > self.model.engine.max_model_len:
            raise InvalidRequest(
                f"'tokens' has {len(token_ids)} ids; at most max_model_len "
                f"({self.model.engine.max_model_len}) can be decoded at once",
                param="tokens",
            )
        self.admission.refuse_if_full()
        return await self.prompts.decode(token_ids, "tokens")

    async def check_health(self) -> None:
        """Ray Serve's liveness probe: cheap, never fails because the engine is busy, still loading, or
        restarting in place within its deadline; fails for an engine that died, wedged or could not start
        and is not being restarted here, so Serve replaces the replica."""
        if self._start_error or self._restart_failed:
            raise RuntimeError(f"engine unusable: {self._start_error or self._restart_failed}")
        if self._restarting_since is not None:
            elapsed = time.monotonic() - self._restarting_since
            if elapsed > self._restart_deadline_s():
                raise RuntimeError(f"the engine's restart in place is not done after {elapsed:.0f} s")
            return
        if self._broken:
            raise RuntimeError(f"engine unusable: {self._broken}")
        if not self._ready.is_set():
            return
        if self._look_for_stall() is None:
            try:
                await self.engine.check_health()
            except EngineDead as err:
                self._engine_broken(self.engine, f"died ({err})")
        if self._broken and self._restarting_since is None:
            raise RuntimeError(f"engine unusable: {self._broken}")

    async def check_ready(self) -> None:
        """Readiness (GET /health): raises `ServiceUnavailable` unless the engine is loaded and alive."""
        self._require_ready()
        await self.check_health()
        self._require_ready()

    def routing_stats(self) -> dict[str, int | bool]:
        """What Serve's router is told of this replica (serving_router.py): whether it can serve now (a wedge is
        looked for first, so a wedged engine stops getting traffic at once), and how many more requests its
        admission would hold before refusing."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # not on the event loop the requests run on: the watch's own task looks within a tick
        else:
            self._look_for_stall()
        a = self.admission.stats()
        room = self.admission.max_running + self.admission.max_queued - a.in_system
        serving = self._ready.is_set() and not self._broken and not self._start_error and not self._restart_failed
        return {"serving": serving, "room": room}

    async def stats(self) -> ReplicaStats:
        ready = self._ready.is_set()
        return ReplicaStats(
            model=self.model.id,
            ready=ready,
            healthy=self._broken is None and self._start_error is None and self._restart_failed is None,
            admission=self.admission.stats(),
            engine=self.engine.stats(),
            kv_cache_tokens=self.engine.kv_cache_tokens if ready else 0,
            pace=self.admission.pace.stats(self.admission.stats().running) if self.admission.pace else PaceStats(),
            wedged_total=self.wedged_total,
            restarts_total=self.restarts_total,
            restarting=self._restarting_since is not None,
        )

    def close_admission(self) -> None:
        self.admission.close("the service is shutting down; retry on another instance")

    def shutdown(self) -> None:
        """Stops the engine and every process it started (the replica calls this when Serve stops it); an
        in-place restart under way shuts its new engine down when its start returns."""
        self._closed = True
        processes = getattr(self, "_processes", None)
        if processes is not None and getattr(self, "_broken", None):
            processes.kill()  # broken (a stopped EngineCore would sit out vLLM's SIGTERM grace): no grace
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
        if processes is not None:
            processes.kill()
