"""`Engine` implemented on vLLM's `AsyncLLM`. The only module that imports vLLM.

One instance per engine replica. `AsyncLLM` runs the model in an `EngineCore`
child process with a paged KV cache whose size is capped by configuration
(`gpu_memory_utilization` on a GPU, `VLLM_CPU_KVCACHE_SPACE` on the CPU), so the
engine's memory does not grow with the number of requests.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from typing import Any

import psutil
from vllm import PoolingParams, SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError
from vllm.v1.metrics.loggers import StatLoggerBase

from app.config import ModelConfig
from app.core_claims import CoreClaim, plan_own_cores
from app.core_plan import CorePlan, describe
from app.cpu_affinity import keep_off_engine_cores
from app.engine import (
    ChoiceDelta,
    EmbeddingFacts,
    EngineDead,
    EngineFailed,
    EngineRejected,
    EngineStats,
    GenerationDelta,
    GenerationParams,
    PromptTokenLogprob,
    TokenLogprob,
)
from app.errors import InvalidRequest
from app.model_store import resolve_source
from app.precision import Dtype, PrecisionChoice, resolve_cpu_precision
from app.vllm_tool_parsing import AutoToolCalls, parser_class

log = logging.getLogger(__name__)


class _StatsRecorder(StatLoggerBase):
    """Keeps the engine's latest scheduler figures and running totals for `stats()`."""

    def __init__(self, vllm_config: Any = None, engine_index: int = 0):
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.preemptions_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefix_cache_queries_total = 0
        self.prefix_cache_hits_total = 0

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
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


# vLLM's finish reasons that end a choice normally; "repetition" (a detected repetitive pattern) ends
# it as OpenAI's "stop" would. "abort" and "error" mean the answer was cut short: EngineFailed.
_NORMAL_FINISH = {None: None, "stop": "stop", "length": "length", "repetition": "stop"}


def _engine_args(model: ModelConfig, dtype: Dtype) -> AsyncEngineArgs:
    """vLLM's arguments for `model`; `dtype` is `engine.dtype` as resolved for this machine (precision.py)."""
    e = model.engine
    # An embedding model: vLLM's pooling runner, converting a causal LM into an embedding model (its pooler: the
    # last token's hidden state, L2-normalized), as `vllm serve --runner pooling --convert embed`.
    runner: dict[str, Any] = {"runner": "pooling", "convert": "embed"} if model.runner == "embed" else {}
    return AsyncEngineArgs(
        **runner,
        model=resolve_source(model.source),
        served_model_name=model.id,
        max_model_len=e.max_model_len,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        dtype=dtype,
        enforce_eager=e.enforce_eager,
        seed=e.seed,
        gpu_memory_utilization=e.gpu_memory_utilization,
        tensor_parallel_size=e.tensor_parallel_size,
        trust_remote_code=e.trust_remote_code,
        max_logprobs=max(model.limits.max_logprobs, 1),
    )


def _sampling_params(p: GenerationParams) -> SamplingParams:
    structured = None
    if p.json_schema is not None:
        structured = StructuredOutputsParams(json=p.json_schema)
    elif p.json_object:
        structured = StructuredOutputsParams(json_object=True)
    elif p.regex is not None:
        structured = StructuredOutputsParams(regex=p.regex)
    elif p.choice is not None:
        structured = StructuredOutputsParams(choice=list(p.choice))
    elif p.grammar is not None:
        structured = StructuredOutputsParams(grammar=p.grammar)
    return SamplingParams(
        n=p.n,
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        stop=list(p.stop) or None,
        seed=p.seed,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        logprobs=p.logprobs,
        ignore_eos=p.ignore_eos,
        structured_outputs=structured,
        output_kind=RequestOutputKind.DELTA,
        top_k=p.top_k,
        min_p=p.min_p,
        min_tokens=p.min_tokens,
        repetition_penalty=p.repetition_penalty,
        stop_token_ids=list(p.stop_token_ids),
        include_stop_str_in_output=p.include_stop_str_in_output,
        skip_special_tokens=p.skip_special_tokens,
        spaces_between_special_tokens=p.spaces_between_special_tokens,
        logit_bias=dict(p.logit_bias) or None,
        allowed_token_ids=list(p.allowed_token_ids) if p.allowed_token_ids is not None else None,
        bad_words=list(p.bad_words) or None,
        prompt_logprobs=p.prompt_logprobs,
    )


def _prompt_logprobs(out: Any, as_ids: bool) -> tuple[tuple[PromptTokenLogprob, ...] | None, ...] | None:
    """vLLM's prompt logprobs of a RequestOutput (with prompt_logprobs), each position's own token first, then
    its alternatives by rank; -inf clamped as vLLM's server clamps it (-9999.0)."""
    found = getattr(out, "prompt_logprobs", None)
    if found is None:
        return None
    positions: list[tuple[PromptTokenLogprob, ...] | None] = []
    for token_id, alternatives in zip(out.prompt_token_ids or (), found, strict=False):
        if alternatives is None:
            positions.append(None)
            continue
        ranked = sorted(alternatives.items(), key=lambda item: (item[0] != token_id, item[1].rank or 0))
        positions.append(tuple(
            PromptTokenLogprob(tid, max(lp.logprob, -9999.0), lp.rank, _token_name(tid, lp, as_ids))
            for tid, lp in ranked
        ))
    return tuple(positions)


# The request parameters vLLM may name in a VLLMValidationError (or begin its message with) that are this
# service's parameters by the same name: such a refusal is a 400 naming it. Others (a schema vLLM cannot
# compile, ...) stay EngineRejected, which the host attributes.
_NAMED_PARAMETERS = (
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "stop_token_ids",
    "min_tokens",
    "top_k",
    "min_p",
    "repetition_penalty",
    "temperature",
    "top_p",
    "max_tokens",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
)


def _refusal(err: Exception, params: GenerationParams | None = None) -> Exception:
    """vLLM's refusal of a request as an error for the client: `InvalidRequest` naming the parameter when vLLM
    names one of ours (`VLLMValidationError.parameter`, or the first word of its message, as in "min_tokens must
    be less than or equal to max_tokens=..."), `EngineRejected` otherwise."""
    message = str(err)
    param = getattr(err, "parameter", None)
    if param not in _NAMED_PARAMETERS:
        first = message.split(" ", 1)[0]
        param = first if first in _NAMED_PARAMETERS else None
    if param is None:
        return _rejected(message, params)
    return InvalidRequest(message, param=param)


def _constrained(p: GenerationParams) -> bool:
    return p.json_schema is not None or p.json_object or p.regex is not None or p.choice is not None or (
        p.grammar is not None)


def _rejected(message: str, params: GenerationParams | None) -> Exception:
    """A refusal vLLM did not attribute. A schema that forces tool calls is the `tools`' fault, which only the
    parameters know (the host would name `response_format`); anything else stays `EngineRejected`."""
    if params is not None and _constrained(params) and params.json_schema_param != "response_format":
        return InvalidRequest(f"the engine could not use this constraint: {message}", param=params.json_schema_param)
    return EngineRejected(message)


def _finite(logprob: float) -> float:
    """A masked token's logprob is -inf, which strict JSON cannot carry; vLLM's own server clamps it the same way.
    NaN (a broken step) is clamped too: the encoder refuses it, and one odd number must not fail the request."""
    return logprob if logprob >= -9999.0 else -9999.0  # NaN compares false: clamped


def _token_name(token_id: int, logprob: Any, as_id: bool) -> str:
    """How logprobs name a token: its text, or vLLM's "token_id:<id>" (return_tokens_as_token_ids)."""
    return f"token_id:{token_id}" if as_id else logprob.decoded_token or ""


def _logprobs(completion: Any, top_k: int, as_ids: bool = False) -> tuple[TokenLogprob, ...]:
    """Every generated token's logprob, the one that ended the choice (end-of-sequence, a stop token id) included,
    as vLLM's server lists it (with its own text, `<|im_end|>`, though the answer's text leaves it out).
    Alternatives in vLLM's own order (the chosen token first, then the top ones by rank), at most `top_k` + 1 of
    them: completions show them all (OpenAI's legacy shape: the chosen token and `logprobs` others), chat its first
    `top_logprobs` (responses.ChatShape), as vLLM's server does."""
    out = []
    for token_id, alternatives in zip(completion.token_ids, completion.logprobs or (), strict=False):
        chosen = alternatives[token_id]
        listed = list(alternatives.items())[: top_k + 1]
        out.append(
            TokenLogprob(
                token=_token_name(token_id, chosen, as_ids),
                logprob=_finite(chosen.logprob),
                top=tuple((_token_name(tid, lp, as_ids), _finite(lp.logprob)) for tid, lp in listed),
            )
        )
    return tuple(out)


def _kill_started_since(before: set[int]) -> None:
    """Kills this process's descendants that were not there before (vLLM's EngineCore and its workers)."""
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for process in started:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(started, timeout=10)


def _choice_delta(completion: Any, logprobs: int | None, as_ids: bool = False) -> ChoiceDelta:
    """One choice of a vLLM `RequestOutput` (a delta: `RequestOutputKind.DELTA`) in the neutral shape."""
    reason = completion.finish_reason
    if reason not in _NORMAL_FINISH:
        raise EngineFailed(f"the engine ended choice {completion.index} with finish reason '{reason}'")
    return ChoiceDelta(
        index=completion.index,
        text=completion.text,
        num_tokens=len(completion.token_ids),
        finish_reason=_NORMAL_FINISH[reason],
        logprobs=_logprobs(completion, logprobs, as_ids) if logprobs is not None else None,
        stop_reason=completion.stop_reason if reason == "stop" else None,
    )


def _with_tool_calls(delta: ChoiceDelta, completion: Any, parsers: list[AutoToolCalls]) -> ChoiceDelta:
    content, calls = parsers[completion.index].feed(completion.text, list(completion.token_ids))
    return replace(delta, text=content, tool_calls=calls)


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
        name = model.engine.tool_call_parser
        self._tool_parser = parser_class(name) if name else None  # an unknown name fails the replica's start

    def start(self) -> None:
        model = self._model
        self._precision = resolve_cpu_precision(model.engine.dtype, on_gpu=model.on_gpu)
        if self._precision.warning:
            log.warning("%s", self._precision.warning)
        if not model.on_gpu:
            if model.engine.kv_cache_gib:
                os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(model.engine.kv_cache_gib)
            # Planned before keep_off_engine_cores narrows this process's affinity: the EngineCore inherits it.
            # Cores another engine of this host computes on are left to it (core_claims.py).
            self._cores, self._core_claim = plan_own_cores(world_size=model.engine.tensor_parallel_size)
            os.environ.update(self._cores.env)
            for warning in self._cores.warnings:
                log.warning("%s", warning)

        def recorder(vllm_config: Any, engine_index: int = 0) -> _StatsRecorder:
            self._stats = _StatsRecorder(vllm_config, engine_index)
            return self._stats

        before = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            self._llm = AsyncLLM.from_engine_args(_engine_args(model, self._precision.dtype), stat_loggers=[recorder])
        except BaseException:
            _kill_started_since(before)  # an EngineCore that began loading must not outlive a failed start
            raise
        if not model.on_gpu:
            keep_off_engine_cores()
        self._tokenizer = self._llm.get_tokenizer()
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
        parsers = self._auto_tool_calls(params)
        if parsers:
            params = replace(params, skip_special_tokens=parsers[0].adjust(params.skip_special_tokens))
        try:
            sampling = _sampling_params(params)
        except (VLLMValidationError, ValueError) as err:
            raise _refusal(err, params) from None
        try:
            prompt = TokensPrompt(prompt_token_ids=list(prompt_token_ids))
            prompt_ids = tuple(prompt_token_ids) if params.return_token_ids else None  # on the first delta only
            first = True
            async for out in self.llm.generate(prompt, sampling, request_id, priority=params.priority):
                choices = tuple(_choice_delta(c, params.logprobs, params.tokens_as_ids) for c in out.outputs)
                if parsers:
                    choices = tuple(_with_tool_calls(d, c, parsers) for d, c in zip(choices, out.outputs, strict=True))
                if params.return_token_ids:
                    choices = tuple(replace(d, token_ids=tuple(c.token_ids)) for d, c in zip(choices, out.outputs,
                                                                                             strict=True))
                cached = getattr(out, "num_cached_tokens", None) if first else None
                scored = first and params.prompt_logprobs is not None
                prompt_logprobs = _prompt_logprobs(out, params.tokens_as_ids) if scored else None
                yield GenerationDelta(choices=choices, prompt_token_ids=prompt_ids, cached_tokens=cached,
                                      prompt_logprobs=prompt_logprobs,
                                      prompt_first_token=self._token_text(prompt_token_ids[0], params.tokens_as_ids)
                                      if scored and prompt_token_ids else None)
                prompt_ids, first = None, False
        except VLLMValidationError as err:
            raise _refusal(err, params) from None
        except (EngineDeadError, EngineGenerateError) as err:
            raise await self._request_failure(err, request_id, lambda message: _rejected(message, params)) from None

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

    def _auto_tool_calls(self, params: GenerationParams) -> list[AutoToolCalls]:
        """One parser per choice for tool_choice "auto" (the protocol refuses "auto" unless the config names a
        parser, so one is there)."""
        if params.auto_tools is None or self._tool_parser is None:
            return []
        return [AutoToolCalls(self._tool_parser, self._tokenizer, params.auto_tools) for _ in range(params.n)]

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
            running=unfinished,
            waiting=s.waiting,
            kv_cache_usage=s.kv_cache_usage,
            preemptions_total=s.preemptions_total,
            prompt_tokens_total=s.prompt_tokens_total,
            generation_tokens_total=s.generation_tokens_total,
            prefix_cache_queries_total=s.prefix_cache_queries_total,
            prefix_cache_hits_total=s.prefix_cache_hits_total,
            extra={"scheduler_running": float(s.running)},
            dtype=self._precision.dtype if self._precision else "",
            dtype_reason=self._precision.reason if self._precision else "",
            compute_cores=self._cores.compute_cores if self._cores else (),
            front_end_cores=self._cores.front_end_cores if self._cores else (),
        )

    def shutdown(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        if self._core_claim is not None:
            self._core_claim.release()
            self._core_claim = None
