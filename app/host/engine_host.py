"""EngineHost: what one engine replica does with a neutral request.

It is given an `Engine` (the fake one in tests, vLLM's in production: `rayserve.replicas.make_engine`), owns the
replica's `Admission`, and for each request: refuses at once if the queue is full (before any work), renders and
counts the prompt, holds it to the length contract, waits for an engine slot, streams neutral deltas back (the
`EngineRunner`; paused and resumed in place by host/pauses.py), and aborts the engine request if the caller goes away,
the request times out, or anything fails. Generation and embeddings share one admission path and one log line; the
engine's lifecycle is the supervisor's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from app.config.common import tightest
from app.config.model import ModelConfig
from app.config.service import ServiceConfig
from app.engine.client import ClientReading
from app.engine.interface import (
    Admitted,
    ChoiceDelta,
    Embeddings,
    EmbedRequest,
    Engine,
    GenerateRequest,
    GenerationDelta,
    PromptInput,
)
from app.errors import InvalidRequest, ServiceError, queue_full_class, wrong_runner
from app.host.admission import Admission, Targets, Ticket
from app.host.pace import EnginePace, PaceStats
from app.host.pauses import engine_stream
from app.host.progress_watch import ProgressWatch
from app.host.prompt_tokenizer import PromptTokenizer
from app.host.replica_load import ReplicaLoad, scaling_figures
from app.host.runner import EngineRunner
from app.host.stats import ReplicaStats
from app.host.supervisor import EngineState, EngineSupervisor
from app.logs import configure_logging
from app.tenancy import engine_priority

# The logger of the one line per engine request; its name predates this module's and log queries rely on it.
log = logging.getLogger("app.server")


@dataclass
class _Visit:
    """One admitted request's stay on this replica, as its log line tells it."""

    ticket: Ticket
    arrived: float
    timings: dict[str, float] = field(default_factory=dict)  # ms since arrival: where a slow first token went
    outcome: str = "client_gone"
    generated: int = 0

    def mark(self, name: str) -> None:
        self.timings[name] = round((time.monotonic() - self.arrived) * 1000, 1)


class EngineHost:
    """With `start_in_background` the constructor returns at once, so a replica is up, answering 503s and
    reporting "starting", while its engine loads; with an `engine_factory` a broken engine is restarted in place
    (app/host/supervisor.py)."""

    def __init__(self, model: ModelConfig, engine: Engine, service: ServiceConfig | None = None,
                 start_in_background: bool = False, engine_factory: Callable[[], Engine] | None = None,
                 progress_watch: ProgressWatch | None = None):
        service = service or ServiceConfig()
        configure_logging(service.log_level)
        self.model = model
        dep = model.deployment
        self.admission = Admission(
            max_running=dep.max_ongoing_requests,
            max_queued=dep.max_queued_requests,
            token_budget=dep.token_budget or 2**62,  # the KV cache's size once the engine reports it
            queue_timeout_s=dep.queue_timeout_s,
            refusal=queue_full_class(service.refusal_status),
            pace=EnginePace(),
            by_class=model.engine.scheduling_policy == "priority",
        )
        self.prompts = PromptTokenizer(model, engine, queue_full_class(service.refusal_status))
        self.supervisor = EngineSupervisor(model, engine, self._adopt, engine_factory, progress_watch,
                                           self._prefill_tokens_per_s)
        self.runner = EngineRunner(self.supervisor)
        if start_in_background:
            threading.Thread(target=self.supervisor.start, name=f"start-{model.id}", daemon=True).start()
        else:
            self.supervisor.start()
            if self.supervisor.failure:
                raise RuntimeError(self.supervisor.failure)

    @property
    def engine(self) -> Engine:  # the one serving now (the supervisor's: a restart replaces it)
        return self.supervisor.engine

    def _adopt(self, engine: Engine) -> int:
        """A newly started engine serves this host's prompts; its KV cache is the token budget unless one is set."""
        self.prompts.engine = engine
        if not self.model.deployment.token_budget and engine.kv_cache_tokens:
            self.admission.token_budget = engine.kv_cache_tokens
        return self.admission.token_budget

    def _prefill_tokens_per_s(self) -> float | None:  # not measured yet: None, the watch's slow unmeasured rate
        pace = self.admission.pace
        return pace.prefill_tokens_per_s() if pace and pace.ready else None

    # -- the request path -------------------------------------------------

    async def generate(self, request: GenerateRequest, client: ClientReading | None = None
                       ) -> AsyncGenerator[Admitted | GenerationDelta, None]:
        self.supervisor.require_serving()
        if self.model.runner != "generate":
            raise wrong_runner(self.model.id, self.model.runner, "generation")
        # A continuation's client has had its first token (app/engine/continuation.py).
        first = None if request.continuation else tightest(self.model.deployment.ttft_target_s, request.ttft_target_s)
        finish = tightest(self.model.deployment.request_target_s, request.finish_target_s)
        # Cost before commitment: a prompt certainly too long, a full replica, or one where even the least request
        # would miss its targets, is refused before tokenizing (a storm's refusals then cost no tokenizer time).
        self.prompts.refuse_certainly_too_long(request.prompt, request.resumed_tokens)
        targets = Targets(first, finish, counts_demand=not request.demand_at_sender)
        self.admission.refuse_if_full(request.tenant, targets, request.params.max_tokens)
        arrived = time.monotonic()
        deadline = asyncio.get_running_loop().time() + request.timeout_s  # this process's clock: no skew
        prompt_ids = await self.prompts.tokenize(request.prompt)
        params = self.prompts.fit_to_context(len(prompt_ids), request)
        params = replace(params, priority=engine_priority(request.tenant, params.priority), sender=request.tenant.name)
        if params.max_tokens <= 0:  # a continuation whose default max_tokens used the whole context: it is done
            for item in (Admitted(len(prompt_ids)), GenerationDelta((ChoiceDelta(0, "", 0, finish_reason="length"),))):
                yield item
            return
        async with self._admitted(request, arrived, deadline, len(prompt_ids), params.n * params.max_tokens,
                                  params.max_tokens, first, finish, learn_from_end=True) as visit:
            visit.ticket.resuming = params.beam_search  # its one output is its whole answer: no first token to learn
            echo_ids = request.prompt.token_ids is not None and request.want_prompt_text  # their text, echoed
            prompt_text = self.prompts.decode_now(prompt_ids, "prompt") if echo_ids else None
            deltas = engine_stream(self.runner, visit.ticket, request, prompt_ids, params, deadline, client)
            try:
                # Wait for the engine's first output before announcing admission, so that an engine-side
                # rejection (a schema it cannot compile) still reaches the client as a 400, not a 200 stream.
                first_delta = await anext(deltas, None)
                visit.mark("first_output_ms")
                yield Admitted(prompt_tokens=len(prompt_ids), prompt_text=prompt_text)
                if first_delta is not None:
                    visit.generated += self._produced(visit.ticket, first_delta)
                    yield first_delta
                async for delta in deltas:
                    visit.generated += self._produced(visit.ticket, delta)
                    yield delta
                visit.outcome = "finished"
            finally:
                await deltas.aclose()

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """/v1/embeddings: generation's path for a batch of inputs. Each input is held to the length contract
        (tokenized together, on the tokenizer thread) and is an engine request of its own; the request takes one
        admission slot and the sum of its inputs' tokens from the budget, so a batch is admitted whole or refused
        whole (one larger than the whole budget still runs, alone, as a long prompt does)."""
        self.supervisor.require_serving()
        if self.model.runner != "embed":
            raise wrong_runner(self.model.id, self.model.runner, "embeddings")
        self.prompts.refuse_dimensions(request.dimensions)
        for prompt in request.inputs:
            self.prompts.refuse_certainly_too_long(prompt)
        first = tightest(self.model.deployment.ttft_target_s, request.ttft_target_s)
        self.admission.refuse_if_full(request.tenant, Targets(first))
        arrived = time.monotonic()
        deadline = asyncio.get_running_loop().time() + request.timeout_s
        prompts_ids = await self.prompts.tokenize_all(request.inputs)
        for ids, prompt in zip(prompts_ids, request.inputs, strict=True):
            self.prompts.refuse_long_prompt(len(ids), prompt)
        tokens = sum(len(ids) for ids in prompts_ids)
        # One output per input and no decode: to the pace (app/host/pace.py) it is a prompt of `tokens` whose first
        # output is the answer, so the first-token target holds for it as for a generation's first token. Not
        # learnt from at its end: its one output would teach the pace that requests use all of their max_tokens.
        async with self._admitted(request, arrived, deadline, tokens, 0, 1, first, None, learn_from_end=False,
                                  inputs=len(request.inputs)) as visit:
            vectors = await self.runner.embed_all(request, prompts_ids, deadline)
            visit.ticket.produced(1)
            visit.mark("first_output_ms")
            visit.outcome = "finished"
            return Embeddings(vectors=vectors, prompt_tokens=tokens)

    @contextlib.asynccontextmanager
    async def _admitted(self, request: GenerateRequest | EmbedRequest, arrived: float, deadline: float,
                        prompt_tokens: int, output_tokens: int, max_steps: int, first_s: float | None,
                        finish_s: float | None, learn_from_end: bool, **logged: Any) -> AsyncIterator[_Visit]:
        """A slot in the admission for the request's prompt and outputs, within its targets less the time already
        spent (tokenizing); released at the end, whatever the end, with the request's one log line."""
        visit = _Visit(self.admission.reserve(request.tenant), arrived)
        visit.mark("rendered_ms")
        spent = time.monotonic() - arrived
        targets = Targets(None if first_s is None else first_s - spent, None if finish_s is None else finish_s - spent,
                          counts_demand=not (isinstance(request, GenerateRequest) and request.demand_at_sender))
        try:
            await visit.ticket.admit(prompt_tokens + output_tokens, deadline - asyncio.get_running_loop().time(),
                                     targets, prompt_tokens=prompt_tokens, max_steps=max_steps)
            visit.mark("admitted_ms")
            yield visit
        except ServiceError as err:
            visit.outcome = err.code or err.type
            err.prompt_tokens = prompt_tokens  # refused after tokenizing: its tenant's refused tokens count them
            raise
        finally:
            visit.ticket.release(completed=learn_from_end and visit.outcome == "finished")
            log.info("engine request", extra={
                "request_id": request.request_id, "trace_id": request.trace_id, "model": self.model.id, "tenant":
                request.tenant.name, "outcome": visit.outcome, "prompt_tokens": prompt_tokens, "generated_tokens":
                visit.generated, "pauses": visit.ticket.pauses, **logged, **visit.timings,
            })

    @staticmethod
    def _produced(ticket: Ticket, delta: GenerationDelta) -> int:
        """Tells the ticket (the pace) of an output; returns its tokens over all choices."""
        ticket.produced(max((c.num_tokens for c in delta.choices), default=0))
        return sum(c.num_tokens for c in delta.choices)

    # -- control plane ----------------------------------------------------

    async def tokenize(self, prompt: PromptInput) -> list[int]:
        """/tokenize: the same size limits and capacity as generation, on the same tokenizer thread."""
        self.supervisor.require_serving()
        self.prompts.refuse_certainly_too_long(prompt)
        self.admission.refuse_if_full()
        token_ids = await self.prompts.tokenize(prompt)
        self.prompts.refuse_long_prompt(len(token_ids), prompt)
        return token_ids

    async def detokenize(self, token_ids: list[int]) -> str:
        """/detokenize: at most a context's worth of ids, decoded on the tokenizer thread."""
        self.supervisor.require_serving()
        if len(token_ids) > self.model.engine.max_model_len:
            raise InvalidRequest(f"'tokens' has {len(token_ids)} ids; at most max_model_len "
                                 f"({self.model.engine.max_model_len}) can be decoded at once", param="tokens")
        self.admission.refuse_if_full()
        return await self.prompts.decode(token_ids, "tokens")

    async def check_health(self) -> None:
        await self.supervisor.check_health()

    async def check_ready(self) -> None:
        """Readiness (GET /health): raises `ServiceUnavailable` unless the engine is loaded and alive."""
        self.supervisor.require_serving()
        await self.supervisor.check_health()
        self.supervisor.require_serving()

    def routing_stats(self) -> dict[str, Any]:
        """What Serve's router is told of this replica (`ReplicaLoad`; rayserve/request_router.py): whether it can
        serve now (a wedge is looked for first, so a wedged engine stops getting traffic at once; a draining replica
        takes nothing new), how many more requests its admission would hold, and its predicted first token."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # not on the event loop the requests run on: the watch's own task looks within a tick
        else:
            self.supervisor.look_for_stall()
        return ReplicaLoad.of_replica(self.supervisor, self.admission).as_stats()

    def loads(self) -> list[ReplicaLoad]:
        """This replica's load as it stands: the host is its own backend's one replica."""
        return [ReplicaLoad.of_replica(self.supervisor, self.admission)]

    def autoscaling_stats(self) -> dict[str, float]:
        """What this replica tells Serve's autoscaling policy (scaling/serve_policy.py)."""
        return scaling_figures(self.admission)

    async def replica_stats(self) -> dict[str, ReplicaStats | None]:  # every replica of an in-process backend
        return {"local": await self.stats()}

    async def stats(self) -> ReplicaStats:
        sup, a, admission = self.supervisor, self.admission, self.admission.stats()
        return ReplicaStats(
            model=self.model.id,
            ready=sup.ready,
            healthy=sup.healthy,
            admission=admission,
            engine=sup.engine.stats(),
            kv_cache_tokens=sup.engine.kv_cache_tokens if sup.ready else 0,
            pace=a.pace.stats(admission.sequences, a.max_running) if a.pace else PaceStats(),
            wedged_total=sup.wedged_total,
            restarts_total=sup.restarts_total,
            restarting=sup.state is EngineState.RESTARTING,
        )

    def close_admission(self) -> None:
        self.supervisor.drain()
        self.admission.close("the service is shutting down; retry on another instance")

    def shutdown(self) -> None:
        """Stops the engine and every process it started (the replica calls this when Serve stops it)."""
        supervisor = getattr(self, "supervisor", None)  # None if the constructor failed before it
        if supervisor is not None:
            supervisor.shutdown()

