"""EngineHost: what one engine replica does with a request.

It is given an `Engine` (the fake one in tests, vLLM's in production: `replicas.make_engine`), owns
the replica's `Admission`, and for each request: refuses at once if the queue is full (before any
work), renders and counts the prompt, holds it to the length contract, waits for an engine slot,
streams neutral deltas back, and aborts the engine request if the caller goes away, the request
times out, or anything fails. No HTTP and no Ray here; `replicas.py` puts it in a Serve replica.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass
from typing import TypeVar

from app.admission import Admission, AdmissionStats, Targets, Ticket
from app.client_targets import tightest
from app.config import ModelConfig, ServiceConfig
from app.engine import (
    Admitted,
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
from app.errors import (
    InvalidRequest,
    RequestTimeout,
    ServiceError,
    ServiceUnavailable,
    queue_full_class,
)
from app.logs import configure_logging
from app.pace import EnginePace, PaceStats
from app.prompt_tokenizer import PromptTokenizer

# The logger of the one line per engine request; its name predates this module's and log queries rely on it.
log = logging.getLogger("app.server")
# An abort that has not completed by then is logged and left to run: the engine is wedged (issue of its own).
ABORT_TIMEOUT_S = 30.0
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


def _ms_since(start: float) -> float:
    return round((time.monotonic() - start) * 1000, 1)


class EngineHost:
    """Lifecycle: constructed → starting (the engine loads; requests get 503 "starting") → ready →
    possibly dead (the engine failed; requests get 503 and the liveness check fails, so Ray Serve
    replaces the replica). With `start_in_background` the constructor returns at once, so a replica
    is up, answering 503s and reporting "starting", while its engine loads."""

    def __init__(
        self,
        model: ModelConfig,
        engine: Engine,
        service: ServiceConfig | None = None,
        start_in_background: bool = False,
    ):
        service = service or ServiceConfig()
        configure_logging(service.log_level)
        self.model = model
        self.engine = engine
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
        self._ready = threading.Event()
        self._start_error: str | None = None
        self._dead: str | None = None
        if start_in_background:
            threading.Thread(target=self._start, name=f"start-{model.id}", daemon=True).start()
        else:
            self._start()
            if self._start_error:
                raise RuntimeError(self._start_error)

    def _start(self) -> None:
        started = time.monotonic()
        try:
            self.engine.start()
        except Exception as err:
            self._start_error = f"the engine for '{self.model.id}' failed to start: {err!r}"
            log.exception("engine for %s failed to start", self.model.id)
            self.engine.shutdown()  # whatever it had started goes with it
            return
        if not self.model.deployment.token_budget and self.engine.kv_cache_tokens:
            self.admission.token_budget = self.engine.kv_cache_tokens
        self._ready.set()
        log.info(
            "model %s ready in %.1f s; token budget %d",
            self.model.id,
            time.monotonic() - started,
            self.admission.token_budget,
        )

    def _require_ready(self) -> None:
        if self._dead:
            raise ServiceUnavailable(
                f"the engine for '{self.model.id}' has died and is being replaced; retry shortly", retry_after_s=5
            )
        if self._start_error:
            raise ServiceUnavailable(f"{self._start_error}; the replica is being replaced", retry_after_s=10)
        if not self._ready.is_set():
            raise ServiceUnavailable(f"the engine for '{self.model.id}' is starting; retry shortly", retry_after_s=5)

    # -- the request path -------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Admitted | GenerationDelta, None]:
        self._require_ready()
        # Cost before commitment: a prompt certainly too long, or a full replica, is refused before any
        # tokenizing; tokenizing holds no admission slot; the slot is taken for a prompt known to fit.
        self.prompts.refuse_certainly_too_long(request.prompt)
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
        first = tightest(dep.ttft_target_s, request.ttft_target_s)
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

    async def _run(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams, deadline: float
    ) -> AsyncGenerator[GenerationDelta, None]:
        """The engine's stream, ended by `deadline` (the event loop's clock)."""
        stream = self.engine.generate(request_id, prompt_ids, params)
        finished = False
        try:
            while True:
                async with asyncio.timeout_at(deadline):  # around the await only, never across the yield
                    try:
                        delta = await anext(stream)
                    except StopAsyncIteration:
                        finished = True
                        return
                yield delta
        except TimeoutError:
            raise RequestTimeout(
                "The request ran past its time limit and was stopped; ask for fewer tokens or retry later"
            ) from None
        except EngineRejected as err:
            finished = True
            raise InvalidRequest(str(err), param=self._rejected_param(params)) from None
        except EngineFailed as err:
            finished = True  # the engine has already ended it
            log.warning("engine for %s ended request %s unfinished: %s", self.model.id, request_id, err)
            raise ServiceUnavailable(
                f"the engine ended this request without finishing it ({err}); retry", retry_after_s=1
            ) from None
        except EngineDead as err:
            self._dead = str(err)
            log.error("engine for %s died: %s", self.model.id, err)
            raise ServiceUnavailable(
                f"the engine for '{self.model.id}' failed while serving this request; retry shortly", retry_after_s=5
            ) from None
        finally:
            if not finished:
                await _to_completion(self.engine.abort(request_id), ABORT_TIMEOUT_S)
            await stream.aclose()

    @staticmethod
    def _rejected_param(params: GenerationParams) -> str | None:
        if params.json_schema is not None or params.json_object:
            return "response_format"
        return None

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
        """Ray Serve's liveness probe: cheap, never fails because the engine is busy or still loading;
        fails for an engine that died or could not start, so Serve replaces the replica."""
        if self._dead or self._start_error:
            raise RuntimeError(f"engine unusable: {self._dead or self._start_error}")
        if not self._ready.is_set():
            return
        try:
            await self.engine.check_health()
        except EngineDead as err:
            self._dead = str(err)
            raise RuntimeError(f"engine dead: {err}") from None

    async def check_ready(self) -> None:
        """Readiness (GET /health): raises `ServiceUnavailable` unless the engine is loaded and alive."""
        self._require_ready()
        await self.check_health()

    def routing_stats(self) -> dict[str, int | bool]:
        """What Serve's router is told of this replica (serving_router.py): whether it can serve now,
        and how many more requests its admission would hold before refusing."""
        a = self.admission.stats()
        room = self.admission.max_running + self.admission.max_queued - a.in_system
        return {"serving": self._ready.is_set() and not self._dead and not self._start_error, "room": room}

    async def stats(self) -> ReplicaStats:
        ready = self._ready.is_set()
        return ReplicaStats(
            model=self.model.id,
            ready=ready,
            healthy=self._dead is None and self._start_error is None,
            admission=self.admission.stats(),
            engine=self.engine.stats(),
            kv_cache_tokens=self.engine.kv_cache_tokens if ready else 0,
            pace=self.admission.pace.stats(self.admission.stats().running) if self.admission.pace else PaceStats(),
        )

    def close_admission(self) -> None:
        self.admission.close("the service is shutting down; retry on another instance")

    def shutdown(self) -> None:
        """Stops the engine and every process it started (the replica calls this when Serve stops it)."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
