"""`Engine` implemented on vLLM's `AsyncLLM`. One instance per engine replica. `AsyncLLM` runs the model in an
`EngineCore` child process with a paged KV cache capped by configuration (`gpu_memory_utilization` on a GPU,
`engine.kv_cache_gib` on the CPU), so the engine's memory does not grow with the number of requests.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncGenerator, Callable
from typing import Any

import psutil
from vllm import PoolingParams
from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError
from vllm.v1.metrics.loggers import StatLoggerBase

from app.config.model import ModelConfig
from app.engine.cpu.affinity import keep_off_engine_cores
from app.engine.cpu.claims import CoreClaim, plan_own_cores
from app.engine.cpu.core_plan import CorePlan, describe
from app.engine.cpu.openmp import openmp_env, spawned_with
from app.engine.cpu.precision import PrecisionChoice, resolve_cpu_precision
from app.engine.engine_stats import EngineStats
from app.engine.interface import (
    EmbeddingFacts,
    EngineDead,
    EngineFailed,
    EngineRejected,
    GenerationDelta,
    GenerationParams,
)
from app.engine.vllm.beam_search import beam_search_outputs
from app.engine.vllm.from_vllm import prompt_token_logprobs, step_choices
from app.engine.vllm.grammar_backend import XgrammarPin
from app.engine.vllm.grammar_gate import GrammarGate
from app.engine.vllm.refusals import refusal, rejected
from app.engine.vllm.to_vllm import computes_in_process, engine_args, engine_prompt, sampling_params
from app.engine.vllm.tool_parsing import auto_tool_calls, parser_class
from app.errors import InvalidRequest

log = logging.getLogger(__name__)


class _StatsRecorder(StatLoggerBase):
    """Keeps the engine's latest scheduler figures and running totals for `stats()`."""

    def __init__(self, vllm_config: Any = None, engine_index: int = 0):
        self.running = self.waiting = self.preemptions_total = 0
        self.kv_cache_usage = 0.0
        self.prompt_tokens_total = self.generation_tokens_total = 0
        self.prefix_cache_queries_total = self.prefix_cache_hits_total = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
               ) -> None:
        if scheduler_stats is not None:
            self.running = scheduler_stats.num_running_reqs
            self.waiting = scheduler_stats.num_waiting_reqs
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            cache = getattr(scheduler_stats, "prefix_cache_stats", None)
            if cache is not None:
                self.prefix_cache_queries_total += cache.queries
                self.prefix_cache_hits_total += cache.hits
        if iteration_stats is not None:
            self.preemptions_total += iteration_stats.num_preempted_reqs
            self.prompt_tokens_total += iteration_stats.num_prompt_tokens
            self.generation_tokens_total += iteration_stats.num_generation_tokens

    def log_engine_initialized(self) -> None:
        pass


def _kill_started_since(before: set[int]) -> None:
    """Kills this process's descendants that were not there before (vLLM's EngineCore and any workers)."""
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for process in started:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(started, timeout=10)


class VLLMEngine:
    def __init__(self, model: ModelConfig):
        self._model = model
        self._llm: AsyncLLM | None = None
        self._tokenizer: Any = None
        self._stats = _StatsRecorder()  # replaced by the one vLLM builds through the factory below
        self._precision: PrecisionChoice | None = None
        self._max_token_chars = 1
        self._cores: CorePlan | None = None
        self._core_claim: CoreClaim | None = None
        self._grammars: GrammarGate | None = None
        name = model.engine.tool_call_parser
        self._tool_parser = parser_class(name) if name else None  # an unknown name fails the replica's start

    def start(self) -> None:
        model = self._model
        self._precision = resolve_cpu_precision(model.engine.dtype, on_gpu=model.on_gpu)
        if self._precision.warning:
            log.warning("%s", self._precision.warning)
        if not model.on_gpu:
            if model.engine.kv_cache_gib:  # vLLM's CPU platform would let this legacy variable override the size
                os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
            if model.engine.enforce_eager:  # eager means nothing compiled later either: vLLM's sampler compiles a
                os.environ["TORCHDYNAMO_DISABLE"] = "1"  # logprobs helper on the first request asking (3.6 s, EPYC)
            # Planned before keep_off_engine_cores narrows this process's affinity: the EngineCore inherits it.
            # Cores another engine of this host computes on are left to it (engine/cpu/claims.py).
            self._cores, self._core_claim = plan_own_cores(world_size=model.engine.tensor_parallel_size)
            for warning in self._cores.warnings:
                log.warning("%s", warning)

        def recorder(vllm_config: Any, engine_index: int = 0) -> _StatsRecorder:
            self._stats = _StatsRecorder(vllm_config, engine_index)
            return self._stats

        before = {p.pid for p in psutil.Process().children(recursive=True)}
        omp = openmp_env(self._cores) if self._cores and computes_in_process(model) else {}
        args = engine_args(model, self._precision.dtype)
        try:  # only the processes spawned here see the plan: a restart in place must not read it as the operator's
            with spawned_with({**(self._cores.env if self._cores else {}), **omp}):
                self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[recorder])
        except BaseException:
            _kill_started_since(before)  # an EngineCore that began loading must not outlive a failed start
            raise
        if self._cores:
            keep_off_engine_cores(set(self._cores.compute_cores) if omp else None)
        self._tokenizer = self._llm.get_tokenizer()
        config = self._llm.model_config  # started after the affinity above: its compiles keep to the front end's cores
        self._grammars = GrammarGate(config.tokenizer, config.get_vocab_size(), model.engine.trust_remote_code,
                                     model.limits.max_grammar_compile_s, XgrammarPin(self._llm, self.encode("{")))
        # Vocabulary strings are at least as long as the text they decode to (byte-level BPE spells each byte as
        # a character; SentencePiece's byte tokens are longer still), added and special tokens included.
        self._max_token_chars = max(1, max(map(len, self._tokenizer.get_vocab()), default=1))
        gib = model.engine.kv_cache_gib if not model.on_gpu else None
        log.info("engine for %s ready: %s", model.id, describe(self._precision, self._cores, gib, self.kv_cache_tokens))

    @property
    def llm(self) -> AsyncLLM:
        if self._llm is None:
            raise EngineDead("engine not started")
        return self._llm

    @property
    def kv_cache_tokens(self) -> int:
        cache = self.llm.vllm_config.cache_config
        return int(cache.num_gpu_blocks or 0) * int(cache.block_size)

    cache_block_tokens = property(lambda self: int(self.llm.vllm_config.cache_config.block_size))

    @property
    def max_token_chars(self) -> int:
        return self._max_token_chars

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    **template: Any) -> list[int]:
        template.setdefault("add_generation_prompt", True)
        text = self._tokenizer.apply_chat_template(list(messages), tools=tools or None, tokenize=False, **template)
        return self._tokenizer.encode(text, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text)

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(list(token_ids))

    def _token_text(self, token_id: int, as_id: bool) -> str:
        """One token as vLLM's server names a prompt token that has no logprob: `tokenizer.decode` of it alone."""
        return f"token_id:{token_id}" if as_id else self._tokenizer.decode([token_id])

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: GenerationParams
    ) -> AsyncGenerator[GenerationDelta, None]:
        parsers, params = auto_tool_calls(self._tool_parser, self._tokenizer, params)
        try:
            sampling = None if params.beam_search else sampling_params(params)  # beams: vLLM's own steps' sampling
        except (VLLMValidationError, ValueError) as err:
            raise refusal(err, params) from None
        try:
            if sampling is not None and self._grammars is not None and (why := await self._grammars.check(
                    sampling.structured_outputs, params.sender)):
                raise EngineRejected(why)  # the host names the constraint's parameter
            prompt_ids = tuple(prompt_token_ids) if params.return_token_ids else None  # on the first delta only
            first = True
            outputs = (beam_search_outputs(self.llm, prompt_token_ids, request_id, params) if sampling is None
                       else self.llm.generate(engine_prompt(prompt_token_ids, params),
                                              sampling, request_id, priority=params.priority))
            async for out in outputs:
                choices = step_choices(out, params, parsers)
                if out.outputs and not choices:  # only a choice that ended on a stop string here went on
                    continue
                cached = getattr(out, "num_cached_tokens", None) if first else None
                created = getattr(out, "num_cache_creation_tokens", None) if first else None
                scored = first and params.prompt_logprobs is not None
                prompt_logprobs = prompt_token_logprobs(out, params.tokens_as_ids) if scored else None
                yield GenerationDelta(choices=choices, prompt_token_ids=prompt_ids, cached_tokens=cached,
                                      created_cache_tokens=created,
                                      prompt_logprobs=prompt_logprobs,
                                      prompt_first_token=self._token_text(prompt_token_ids[0], params.tokens_as_ids)
                                      if scored and prompt_token_ids else None)
                prompt_ids, first = None, False
                if parsers and not out.finished and all(p.ended for p in parsers):
                    await outputs.aclose()  # every choice ended on a stop string here: vLLM aborts the request
                    return
        except VLLMValidationError as err:
            raise refusal(err, params) from None
        except (EngineDeadError, EngineGenerateError) as err:
            raise await self._request_failure(err, request_id, lambda message: rejected(message, params)) from None

    async def _request_failure(
        self, err: EngineDeadError | EngineGenerateError, request_id: str, rejected: Callable[[str], Exception]
    ) -> Exception:
        """vLLM's failure of one request (generate or encode) as the seam's error; `rejected` makes the refusal of a
        request the engine could not take."""
        if isinstance(err, EngineDeadError):
            return EngineDead(f"the engine failed: {err}")
        # vLLM's per-request failure ("possibly recoverable"; the request is already aborted). Only an engine that
        # says it has errored is dead: one odd request must not get the replica replaced.
        cause = err.__cause__
        if self._llm is None or self._llm.errored:
            return EngineDead(f"the engine failed: {cause!r}")
        # Failing to hand the request to the engine core, vLLM has already registered it and never aborts it: it
        # would count as running forever. Abort it by our id (a no-op when vLLM did abort it).
        await self.abort(request_id)
        if isinstance(cause, (ValueError, TypeError)):  # e.g. a lone surrogate in a stop string: not msgpack-encodable
            return rejected(f"the engine could not take this request: {cause}")
        return RuntimeError(f"the engine failed on this request: {cause!r}")

    @property
    def embedding_facts(self) -> EmbeddingFacts | None:
        if self._model.runner != "embed":
            return None
        config = self.llm.model_config
        sizes = config.matryoshka_dimensions
        return EmbeddingFacts(size=int(config.embedding_size), matryoshka=bool(config.is_matryoshka),
                              dimensions=tuple(sizes) if sizes else None)

    async def embed(self, request_id: str, prompt_token_ids: list[int], dimensions: int | None) -> tuple[float, ...]:
        params = PoolingParams(task="embed", dimensions=dimensions)
        try:
            params.verify(self.llm.model_config)  # what vLLM's server does before encode (dimensions' range)
        except (VLLMValidationError, ValueError) as err:
            raise InvalidRequest(str(err), param="dimensions") from None
        result = None
        try:
            async for out in self.llm.encode(TokensPrompt(prompt_token_ids=list(prompt_token_ids)), params,
                                             request_id):
                result = out
        except VLLMValidationError as err:  # e.g. "Token id 99999 is out of vocabulary", as the request is added
            raise EngineRejected(str(err)) from None
        except (EngineDeadError, EngineGenerateError) as err:
            raise await self._request_failure(err, request_id, EngineRejected) from None
        failure = getattr(result, "error", None)
        if failure is not None:  # vLLM's server answers it with a 503 or a 500
            raise EngineFailed(f"the engine failed this embedding: {failure.message}")
        if result is None or not result.finished:
            raise EngineFailed("the engine ended the embedding request without a result")
        # float32, as vLLM's server writes the vector (its base64 is float32): the float and base64 answers agree.
        data = result.outputs.data
        return tuple(data.float().flatten().tolist())

    async def abort(self, request_id: str) -> None:
        if self._llm is not None and not self._llm.errored:
            await self._llm.abort(request_id)

    async def check_health(self) -> None:
        try:
            await self.llm.check_health()
        except EngineDeadError as err:
            raise EngineDead(str(err)) from None

    def stats(self) -> EngineStats:
        s = self._stats
        unfinished = self._llm.get_num_unfinished_requests() if self._llm is not None else 0
        return EngineStats(
            running=unfinished, waiting=s.waiting,
            kv_cache_usage=s.kv_cache_usage, preemptions_total=s.preemptions_total,
            prompt_tokens_total=s.prompt_tokens_total, generation_tokens_total=s.generation_tokens_total,
            prefix_cache_queries_total=s.prefix_cache_queries_total,
            prefix_cache_hits_total=s.prefix_cache_hits_total,
            extra={"scheduler_running": float(s.running)},
            dtype=self._precision.dtype if self._precision else "",
            dtype_reason=self._precision.reason if self._precision else "",
            compute_cores=self._cores.compute_cores if self._cores else (),
            front_end_cores=self._cores.front_end_cores if self._cores else (),
        )

    def shutdown(self) -> None:
        if self._grammars is not None:
            self._grammars.close()
            self._grammars = None
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        if self._core_claim is not None:
            self._core_claim.release()
            self._core_claim = None
