"""The Engine interface and the neutral types that cross it: the one seam between serving and inference.

`EngineHost` (host/engine_host.py) talks to an engine only through `Engine`, given by its constructor (`VLLMEngine`,
`FakeEngine`; `rayserve.replicas.make_engine` picks one). The request and output types here are all that crosses
this seam and the Ray handle: no vLLM, FastAPI or OpenAI wire types.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol

from app.engine.engine_stats import EngineStats
from app.tenancy import Tenant


@dataclass(frozen=True)
class GenerationParams:
    """Sampling settings after validation against the model's limits."""

    max_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # None: none; k: the chosen token plus k alternatives
    ignore_eos: bool = False
    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    # vLLM's other structured-output constraints (app/openai/structured_outputs.py); at most one of all five is set.
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    max_tokens_is_default: bool = False  # the client did not ask; may shrink to fit the context
    # vLLM's sampling and decoding extensions (docs/api.md), each at vLLM's no-op default.
    top_k: int = 0  # 0 (or -1): every token
    min_p: float = 0.0
    min_tokens: int = 0  # end-of-sequence and stop token ids are masked until this many tokens
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    allowed_token_ids: tuple[int, ...] | None = None  # None: any token; never empty
    bad_words: tuple[str, ...] = ()
    # What a refusal of the constraint names: "tools" (forced calls), "structured_outputs" or "response_format".
    json_schema_param: str = "response_format"
    # tool_choice "auto": the request's tools (OpenAI's JSON objects, plain data), for the model's tool-call
    # parser to find the calls the model writes in its own format; None: no parsing.
    auto_tools: tuple[dict[str, Any], ...] | None = None
    return_token_ids: bool = False  # vLLM's: the deltas carry the token ids (and the first one the prompt's)
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>"
    prompt_logprobs: int | None = None  # vLLM's: the prompt tokens' logprobs, with this many alternatives
    # vLLM's logprob_token_ids: each step's logprobs are the chosen token's and these (`logprobs` is their count).
    logprob_token_ids: tuple[int, ...] | None = None
    beam_search: bool = False  # vLLM's: `n` beams, answered whole at the end; `length_penalty` ranks them
    length_penalty: float = 1.0
    priority: int = 0  # vLLM's scheduling priority (lower first); its default fcfs scheduler ignores it
    sender: str = ""  # its tenant (app/tenancy.py): its turn in the engine's own queue (vllm/grammar_gate.py)
    generator_draws: int = 0  # a seeded choice resumed: its generator's draws so far (engine/vllm/generator_resume)
    # A choice resumed: the prompt's last this many ids are its output so far, which penalties, bad words and the
    # grammar count as output (engine/vllm/output_resume).
    resumed_output: int = 0
    # A choice with auto_tools resumed: its steps before (text, token ids), in order, which the new replica's stop
    # strings and tool-call parser read again to be where the first ones were (engine/vllm/tool_parsing).
    parser_replay: tuple[tuple[str, tuple[int, ...]], ...] = ()
    cache_salt: str | None = None  # vLLM's: only requests with the same salt share prefix-cache blocks


@dataclass(frozen=True)
class PromptInput:
    """Exactly one of: chat messages (templated by the engine host), text, or token ids. A message is a plain dict
    as chat templates take it (`role`, `content`, and where present `name`, `tool_calls` with arguments as a dict,
    `tool_call_id`); `tools` (OpenAI's tool objects) go to the chat template as its `tools`."""

    messages: tuple[dict[str, Any], ...] | None = None
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    # How the chat template renders `messages` (vLLM's chat extensions): the assistant's turn opened at the end,
    # or the final (assistant) message left open to be continued; `template_kwargs`: extra template variables.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    # vLLM's truncate_prompt_tokens: keep this many of the prompt's ids (-1: the context less one), the last
    # ("left") or the first ("right"); None: all.
    truncate_to: int | None = None
    truncation_side: str = "left"
    # The request parameter the prompt came in, which a 400 about it names; "": `messages` or `prompt`.
    param: str = ""


@dataclass(frozen=True)
class GenerateRequest:
    """What the ingress sends an engine replica: the neutral form of one API request."""

    request_id: str
    prompt: PromptInput
    params: GenerationParams
    # Seconds the whole request may still take, counted from when the replica receives it. A duration,
    # not a wall-clock moment: the ingress and the replica may sit on nodes whose clocks disagree.
    timeout_s: float
    want_prompt_text: bool = False  # completions with echo of a token-id prompt
    trace_id: str = ""  # the client-facing X-Request-Id, carried into the engine replica's logs
    # The client's own latency targets (seconds from arrival; http/client_targets.py): only tighter than the model's.
    ttft_target_s: float | None = None
    finish_target_s: float | None = None
    # A continuation (app/engine/continuation.py): its prompt's last `resumed_tokens` ids are output being resumed
    # (counted against the context, not the prompt limit; no first-token target). `breaks`: the engines that broke
    # with its request inside so far (engine/quarantine.py).
    continuation: bool = False
    resumed_tokens: int = 0
    breaks: int = 0
    after_wedge: bool = False  # it waited on an engine declared wedged: more time here (app/host/progress_watch.py)
    session_id: str = ""  # the client's X-Session-Id: a hint to the fleet router (app/routing/), never a pin
    tenant: Tenant = Tenant()  # who sent it (app/tenancy.py): its share of the replica's admission
    # Counted as demand by its sender if refused by time (rayserve/unmet_demand.py); the replica then does not.
    demand_at_sender: bool = False


@dataclass(frozen=True)
class EmbedRequest:
    """What the ingress sends an engine replica for /v1/embeddings: one or more inputs, admitted together (their
    tokens summed), each an engine request of its own."""

    request_id: str
    inputs: tuple[PromptInput, ...]
    timeout_s: float  # a duration, as GenerateRequest's
    dimensions: int | None = None  # Matryoshka: the vectors' first `dimensions` values, renormalized
    trace_id: str = ""
    ttft_target_s: float | None = None  # the client's own target for the answer (an embedding is one output)
    tenant: Tenant = Tenant()


@dataclass(frozen=True)
class Embeddings:
    """The answer to an `EmbedRequest`: one vector per input, in input order, and the prompt tokens it cost."""

    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: int


@dataclass(frozen=True)
class EmbeddingFacts:
    """What an embedding engine's model allows: its vectors' size, and which `dimensions` may shorten them."""

    size: int
    matryoshka: bool = False
    dimensions: tuple[int, ...] | None = None  # the sizes allowed; None: any from 1 to `size`


@dataclass(frozen=True)
class Admitted:
    """First item of every engine stream: the request passed validation and admission."""

    prompt_tokens: int
    prompt_text: str | None = None
    replica: str = ""  # the engine replica's id, across the Ray handle (logged when a request moves)


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()
    text: str | None = None  # the token's own text where `token` names it by id (chat's `bytes` are the text's)


def new_call_id() -> str:
    """A tool call's id, as vLLM makes them."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of one tool call in OpenAI's stream: the first piece of call `index` has its id and name."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class PromptTokenLogprob:
    token_id: int
    logprob: float
    rank: int | None
    text: str  # its decoded text (vLLM's `decoded_token`)
    name: str = ""  # how logprobs name it where not by its text: "token_id:<id>" (return_tokens_as_token_ids)


@dataclass(frozen=True)
class ChoiceDelta:
    """New output of one choice since the previous delta."""

    index: int
    text: str
    num_tokens: int
    # "stop" | "length" | None while running; a choice cut short raises instead (EngineDead / EngineFailed).
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    # Tool calls the engine's tool-call parser found in this piece (tool_choice "auto"); `text` is the rest.
    tool_calls: tuple[ToolCallDelta, ...] = ()
    token_ids: tuple[int, ...] | None = None  # with return_token_ids: this piece's token ids
    # vLLM's: what ended a "stop" choice, the stop token id or the stop string (None: end-of-sequence, or running)
    stop_reason: int | str | None = None
    # With auto_tools: the step's text as the engine made it, before stop strings and the tool-call parser read it
    # (a continuation replays it).
    parsed_text: str | None = None


@dataclass(frozen=True)
class GenerationDelta:
    choices: tuple[ChoiceDelta, ...]
    prompt_token_ids: tuple[int, ...] | None = None  # with return_token_ids, on the first delta
    # On the first delta only: the prompt's tokens found in the prefix cache, and those it wrote there (vLLM's).
    cached_tokens: int | None = None
    created_cache_tokens: int | None = None
    # With prompt_logprobs, on the first delta: per prompt token (None for the first) its alternatives, its own first.
    prompt_logprobs: tuple[tuple[PromptTokenLogprob, ...] | None, ...] | None = None
    # With prompt_logprobs, on the first delta: the first prompt token's text (echo with logprobs lists it first).
    prompt_first_token: str | None = None


class EngineDead(Exception):
    """The engine cannot serve any more; the replica must be replaced."""


class EngineRejected(Exception):
    """The engine refused a request as invalid (e.g. a schema it cannot compile)."""


class EngineFailed(Exception):
    """The engine ended one request without finishing it (vLLM's `abort` or `error`); the engine stays usable."""


class Engine(Protocol):
    """A text-generation (or embedding) engine owned by one replica. Lifecycle: `start()` once (blocking, loads the
    model), then any number of concurrent `generate` calls, then `shutdown()` once. A `generate` iterator that is
    closed early must be followed by `abort(request_id)`; the host does that in a `finally`."""

    def start(self) -> None: ...
    @property
    def kv_cache_tokens(self) -> int:
        """How many tokens the KV cache holds; known after `start()`."""
        ...

    @property
    def cache_block_tokens(self) -> int:
        """Tokens per block of the prefix cache (known after `start()`): it hits whole blocks only."""
        ...

    @property
    def max_token_chars(self) -> int:
        """The longest token of the vocabulary in characters (known after `start()`): any text has at least
        len(text) / max_token_chars tokens, so a prompt certainly over a limit is refused without tokenizing."""
        ...

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    **template: Any) -> list[int]:
        """The chat template applied (with `tools` if any), tokenized. `template`: `add_generation_prompt` (default
        true), `continue_final_message` (default false), extra template variables."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: GenerationParams
    ) -> AsyncGenerator[GenerationDelta, None]: ...

    @property
    def embedding_facts(self) -> EmbeddingFacts | None:
        """The model's embedding size and Matryoshka sizes (known after `start()`); None for a generating engine."""
        ...

    async def embed(self, request_id: str, prompt_token_ids: list[int], dimensions: int | None) -> tuple[float, ...]:
        """The prompt's embedding (an engine started for embeddings); aborted by `abort(request_id)` like `generate`.
        `EngineRejected` for a prompt the engine refuses (e.g. out-of-vocabulary ids)."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def check_health(self) -> None:
        """Cheap liveness check; raises `EngineDead` if the engine cannot serve."""
        ...

    def stats(self) -> EngineStats: ...

    def shutdown(self) -> None:
        """Stop the engine and every process it started."""
        ...
