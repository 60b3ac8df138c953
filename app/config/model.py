"""One served model's configuration: its engine's arguments, its deployment (replicas, admission and time
targets), and the limits every request to it is held to."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from app.config.autoscaling import AutoscalingSettings
from app.config.common import DEFAULT_MODEL_SOURCE, StrictModel


class EngineConfig(StrictModel):
    """Arguments for the vLLM engine of one model replica."""

    max_model_len: int = Field(2048, ge=16, description="Context window in tokens (prompt + completion).")
    max_num_seqs: int = Field(32, ge=1, description="Most sequences the engine schedules in one step.")
    max_num_batched_tokens: int | None = Field(
        None,
        ge=16,
        description="Most tokens one engine step processes (prefill chunks and decodes together; vLLM's chunked "
        "prefill splits a longer prompt over several steps, so a huge prompt delays the running streams' next "
        "token by at most one such step). Default: vLLM's (2048 on a CPU).",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto",
        description="Weight and activation dtype. `auto`: on a CPU the fastest this CPU computes in correctly "
        "(bfloat16 where native: AVX-512 BF16, AMX, ARM BF16; float32 otherwise; see docs/precision.md), "
        "on a GPU vLLM's own choice. An explicit dtype is honoured, with a warning where it is known to be slow.",
    )
    enforce_eager: bool = Field(
        True,
        description="Skip torch.compile/CUDA graphs. Keep true on CPU: the compiled CPU path was seen "
        "producing wrong text. On the CPU it also turns off the compile vLLM's sampler does on the first request "
        "asking for logprobs (seconds).",
    )
    kv_cache_gib: float | None = Field(
        2, gt=0, description="CPU only: KV cache size in GiB, fractions allowed (vLLM's kv_cache_memory_bytes; "
        "0.25 holds about 11k tokens of SmolLM2-135M), for small machines and tests; at least one request of "
        "max_model_len (check-config says); null: vLLM sizes it.",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="GPU only: fraction of GPU memory vLLM may use, KV cache included."
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one replica shards the model over.")
    scheduling_policy: Literal["fcfs", "priority"] | None = Field(
        None,
        description="vLLM's scheduling policy inside the engine (`--scheduling-policy`): `priority` serves every "
        "interactive tenant's request before a `batch` one's (and preempts batch first when the KV cache runs "
        "short), a client's own `priority` ordering only within its class. Default: `priority` when a tenant is of "
        "the batch class, else vLLM's `fcfs`.",
    )
    seed: int = Field(0, description="Engine-wide random seed.")
    trust_remote_code: bool = Field(
        False, description="Allow model code from the model folder. Only for models you trust."
    )
    tool_call_parser: str | None = Field(
        None,
        min_length=1,
        description="vLLM's tool-call parser for this model's own tool-call format (e.g. `hermes`; vLLM's "
        "`--tool-call-parser`), checked when the engine starts: it lets requests with tools use tool_choice "
        '"auto". Without one, "auto" is a 400 (`required` and a named function work with any model).',
    )
    fake_token_delay_s: float = Field(
        0.0, ge=0, le=10,
        description="`engine_kind: fake` only: seconds the test engine takes per output token (0: at once), so "
        "that streams are still under way when a test breaks something.",
    )
    fake_prefill_s_per_token: float = Field(
        0.0, ge=0, le=1,
        description="`engine_kind: fake` only: seconds the test engine takes per prompt token its prefix cache does "
        "not hold, one prompt at a time (its cost model for routing and scaling tests).",
    )
    fake_block_tokens: int = Field(
        16, ge=1, le=4096, description="`engine_kind: fake` only: the test engine's prefix-cache block size."
    )


class DeploymentConfig(StrictModel):
    """How Ray Serve places and bounds the replicas of one model."""

    num_replicas: int = Field(1, ge=1, description="Engine replicas (each owns its own accelerator).")
    num_cpus: float = Field(1.0, ge=0, description="CPUs Ray reserves per replica.")
    max_replicas_per_node: int | None = Field(
        None,
        ge=1,
        description="Most replicas of this model Ray Serve places on one node (1: losing a node loses one "
        "replica; replicas beyond the nodes then stay pending). Default: no limit (Serve spreads them anyway).",
    )
    num_gpus: float = Field(0.0, ge=0, description="GPUs Ray reserves per replica; 0 runs on the CPU.")
    max_ongoing_requests: int = Field(
        16, ge=1, description="Engine sequences one replica runs at once: a request of `n` choices takes `n` of "
        "them (vLLM runs each choice as a sequence), so keep it at most `engine.max_num_seqs`.")
    max_queued_requests: int = Field(
        32, ge=0, description="Requests one replica holds waiting for a slot; beyond this it refuses at once."
    )
    queue_timeout_s: float = Field(
        30.0, gt=0, description="A request waiting longer than this for a slot is refused with 503."
    )
    token_budget: int | None = Field(
        None,
        ge=1,
        description="Most prompt+max_tokens admitted at once per replica; default: the KV cache's size as "
        "the engine reports it.",
    )
    ttft_target_s: float | None = Field(
        10.0,
        gt=0,
        description="First-token target: a request predicted (from the engine's measured pace) to get its "
        "first token later than this is refused at arrival with 429 and Retry-After, instead of waiting. "
        "A client may tighten it (header X-TTFT-Target-S); null: no time target.",
    )
    request_target_s: float | None = Field(
        None,
        gt=0,
        description="Whole-request target, the same way (header X-Request-Target-S, or the openai SDK's "
        "timeout, may tighten it); null: none beyond the client's.",
    )
    routing: Literal["earliest_first_token", "power_of_two"] = Field(
        "earliest_first_token",
        description="How the ingress picks one of several replicas: `earliest_first_token` sends each request to "
        "the replica predicted to give its first token soonest (its queue, and the prefill of what its prefix "
        "cache does not hold; docs/routing.md), and refuses at once one that no replica can serve within "
        "`ttft_target_s`; `power_of_two`: the less loaded of two random replicas (Ray Serve's default).",
    )
    autoscaling: AutoscalingSettings | None = Field(
        None,
        description="Replicas that follow the demand, between `min_replicas` and `max_replicas` (in place of "
        "`num_replicas`; docs/autoscaling.md); null: `num_replicas`, fixed.",
    )
    health_check_period_s: float = Field(5.0, gt=0, description="How often Ray Serve checks that the engine is alive.")
    health_check_timeout_s: float = Field(10.0, gt=0, description="A health check slower than this fails.")

    @model_validator(mode="after")
    def _replicas_one_way(self) -> DeploymentConfig:
        if self.autoscaling is not None and "num_replicas" in self.model_fields_set:
            raise ValueError("set either num_replicas or autoscaling (its min_replicas and max_replicas), not both")
        return self

    @property
    def most_replicas(self) -> int:
        """The most replicas this model may run: `autoscaling.max_replicas`, else `num_replicas`."""
        return self.autoscaling.max_replicas if self.autoscaling is not None else self.num_replicas


class LimitsConfig(StrictModel):
    """The per-request contract; everything beyond it is a 400 naming the parameter."""

    max_prompt_tokens: int | None = Field(
        None, ge=1, description="Largest prompt in tokens; default: max_model_len - 1."
    )
    max_tokens: int = Field(1024, ge=1, description="Largest max_tokens a request may ask for.")
    default_max_tokens: int = Field(256, ge=1, description="max_tokens for a request that does not say.")
    max_n: int = Field(8, ge=1, description="Largest n (choices per request).")
    max_stop_sequences: int = Field(8, ge=0, description="Most stop sequences per request.")
    max_stop_sequence_chars: int = Field(256, ge=1, description="Longest single stop sequence.")
    max_logprobs: int = Field(5, ge=0, description="Largest logprobs / top_logprobs.")
    max_messages: int = Field(512, ge=1, description="Most chat messages per request.")
    max_grammar_compile_s: float = Field(
        5.0,
        gt=0,
        le=300,
        description="Longest a structured output's grammar (a JSON schema, regex, choice list or grammar) may take "
        "to compile, checked in a process of its own before the engine gets it; past it the request is a 400 "
        "naming the constraint. vLLM's engine would compile it on a thread nothing stops (vLLM bounds only a "
        "regex, at 5 s).",
    )
    max_embedding_inputs: int = Field(
        256,
        ge=1,
        description="Most inputs (strings or token-id lists) in one /v1/embeddings request (a model with "
        "`runner: embed`); each is an engine request of its own, and the request is admitted whole.",
    )

    @model_validator(mode="after")
    def _default_within_cap(self) -> LimitsConfig:
        if self.default_max_tokens > self.max_tokens:
            raise ValueError(
                f"default_max_tokens ({self.default_max_tokens}) is above max_tokens ({self.max_tokens}); "
                "lower it or raise max_tokens"
            )
        return self


class ModelConfig(StrictModel):
    """One served model: what clients call it, where it comes from, how it runs."""

    id: str = Field(
        ..., min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$", description="Name clients send as `model`."
    )
    source: str = Field(
        DEFAULT_MODEL_SOURCE,
        description="'default' (SmolLM2-135M-Instruct, prepared offline), a local model folder, "
        "or a Hugging Face hub id.",
    )
    engine_kind: Literal["vllm", "fake"] = Field(
        "vllm", description="'fake' serves a deterministic test engine without loading a model."
    )
    runner: Literal["generate", "embed"] = Field(
        "generate",
        description="'generate' serves chat, completions and responses; 'embed' serves /v1/embeddings only, "
        "the model run by vLLM's pooling runner (`--runner pooling --convert embed`: a causal LM's last hidden "
        "state, L2-normalized). The other routes answer a model of the other kind with a 400 naming `model`.",
    )
    engine: EngineConfig = EngineConfig()
    deployment: DeploymentConfig = DeploymentConfig()
    limits: LimitsConfig = LimitsConfig()

    @model_validator(mode="after")
    def _limits_fit_context(self) -> ModelConfig:
        n_ctx = self.engine.max_model_len
        if self.limits.default_max_tokens >= n_ctx:
            raise ValueError(
                f"limits.default_max_tokens ({self.limits.default_max_tokens}) must be below "
                f"engine.max_model_len ({n_ctx})"
            )
        if self.limits.max_prompt_tokens is not None and self.limits.max_prompt_tokens >= n_ctx:
            raise ValueError(
                f"limits.max_prompt_tokens ({self.limits.max_prompt_tokens}) must be below "
                f"engine.max_model_len ({n_ctx})"
            )
        if self.deployment.num_gpus == 0 and self.engine.tensor_parallel_size > 1:
            raise ValueError("engine.tensor_parallel_size > 1 needs deployment.num_gpus >= tensor_parallel_size")
        e = self.engine
        fake_only = [k for k, v in (("fake_token_delay_s", e.fake_token_delay_s),
                                    ("fake_prefill_s_per_token", e.fake_prefill_s_per_token),
                                    ("fake_block_tokens", e.fake_block_tokens - 16)) if v]
        if fake_only and self.engine_kind != "fake":
            raise ValueError(f"engine.{fake_only[0]} is for engine_kind: fake only; remove it")
        return self

    @property
    def max_prompt_tokens(self) -> int:
        return self.limits.max_prompt_tokens or self.engine.max_model_len - 1

    @property
    def on_gpu(self) -> bool:
        return self.deployment.num_gpus > 0
