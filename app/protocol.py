"""OpenAI wire models for requests, and their conversion into neutral engine inputs.

A request model validates its own fields (types, ranges) and then converts itself
against the model's `LimitsConfig` into a `PromptInput` and `GenerationParams`,
raising `InvalidRequest` that names the parameter. Parameters the service does
not implement are refused by name rather than silently ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Annotated, Any, Literal

import jsonschema  # a dependency of ray; checks tool schemas before the engine compiles them
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from app.config import LimitsConfig
from app.engine import GenerationParams, PromptInput
from app.errors import InvalidRequest, UnsupportedParameter
from app.structured_outputs import StructuredOutputs, not_too_deep
from app.tool_calls import forced_schema

# Accepted for compatibility and deliberately without effect (documented in docs/api.md).
IGNORED_PARAMETERS = ("user", "metadata", "store", "service_tier")
# Bounds on vLLM's sampling extensions (vLLM itself has none but VLLM_MAX_NUM_BAD_WORDS): each costs the engine
# work per request or per step, so each is bounded like `stop` (docs/api.md).
MAX_LOGIT_BIAS = 1024  # entries of a logit_bias map
MAX_ALLOWED_TOKEN_IDS = 4096
MAX_STOP_TOKEN_IDS = 64
MAX_BAD_WORDS = 128  # vLLM's VLLM_MAX_NUM_BAD_WORDS, which it counts after tokenizing (a word may count twice)
MAX_BAD_WORD_CHARS = 256
MAX_TOKEN_ID = 2**31 - 1  # above every vocabulary; the engine checks the model's own size
MAX_TOP_K = 2**31 - 1  # vLLM keeps top_k in int32 tensors; any k at or above the vocabulary means "every token"
LOGIT_BIAS_BOUND = 100.0  # biases are clamped to [-100, 100], as vLLM does
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
# Bounds on tools (vLLM has none): every tool's schema goes into the chat template, and with a forced choice into a
# grammar the engine compiles per request.
MAX_TOOLS = 128
# A completions batch (vLLM: unbounded): each prompt is an engine request of its own, admitted like any other.
MAX_BATCH_PROMPTS = 32
MAX_BATCH_CHOICES = 64  # prompts x n
MAX_TOOL_NAME_CHARS = 64  # OpenAI's limit
MAX_TOOLS_SCHEMA_CHARS = 65_536  # the tools' parameter schemas together, as compact JSON
# chat_template_kwargs (vLLM: unbounded): variables for the template, not a second prompt.
MAX_TEMPLATE_KWARGS_CHARS = 8_192
# What the template is called with already; a kwarg of the same name would replace the request's own.
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "conversation", "tools", "documents", "add_generation_prompt",
                                         "continue_final_message", "tokenize", "return_dict", "chat_template",
                                         "tokenizer", "return_tensors", "padding", "truncation", "max_length",
                                         "return_assistant_tokens_mask", "tokenizer_kwargs"})
# Known OpenAI parameters this service does not implement: a 400 that says so. (Chat takes tools; completions
# know them only as unsupported.)
UNSUPPORTED_PARAMETERS = (
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "audio",
    "modalities",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "best_of",
    "suffix",
)


class _Request(BaseModel):
    # Unknown fields are collected, then refused by name in `_refuse_unknown`.
    model_config = ConfigDict(extra="allow")

    model: str = Field(..., min_length=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="vLLM extension: keep generating past end-of-sequence (benchmarks).")
    # vLLM's sampling and decoding extensions (the openai SDK sends them through `extra_body`), with vLLM's types
    # and defaults; see docs/api.md.
    top_k: int | None = Field(None, ge=-1, le=MAX_TOP_K, description="vLLM extension: 0 or -1 for every token.")
    min_p: float | None = Field(None, ge=0, le=1, description="vLLM extension.")
    min_tokens: int = Field(0, ge=0, description="vLLM extension: no end-of-sequence or stop token id before this.")
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False, description="vLLM extension.")
    stop_token_ids: list[TokenId] | None = Field(None, description="vLLM extension.")
    include_stop_str_in_output: bool = Field(False, description="vLLM extension.")
    skip_special_tokens: bool = Field(True, description="vLLM extension.")
    spaces_between_special_tokens: bool = Field(True, description="vLLM extension.")
    logit_bias: dict[str, Annotated[float, Field(allow_inf_nan=False)]] | None = Field(
        None, description="Token id (as a string) to a bias added to its logit, clamped to [-100, 100]."
    )
    allowed_token_ids: list[TokenId] | None = Field(None, description="vLLM extension: sample only these tokens.")
    bad_words: list[str] = Field(default_factory=list, description="vLLM extension: words never generated.")
    return_token_ids: bool | None = Field(None, description="vLLM extension: the prompt's and the output's ids.")
    return_tokens_as_token_ids: bool | None = Field(
        None, description="vLLM extension: logprobs name each token 'token_id:<id>' instead of its text."
    )
    prompt_logprobs: int | None = Field(
        None, description="vLLM extension: the prompt's tokens' logprobs, with this many alternatives (not streamed)."
    )
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, le=2**63 - 1, description="vLLM extension: keep only this many prompt tokens (-1: the context)."
    )
    truncation_side: Literal["left", "right"] | None = Field(
        None, description="vLLM extension: 'left' (default) keeps the last tokens, 'right' the first."
    )
    priority: int = Field(0, ge=-(2**63), le=2**63 - 1, description="vLLM extension: the engine's scheduling "
                                                                    "priority (lower first); fcfs ignores it.")
    structured_outputs: StructuredOutputs | None = Field(
        None, description="vLLM extension: one constraint (json, regex, choice, grammar or json_object)."
    )

    @field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        # vLLM's server takes null for these as "the default" (its fields are Optional); so does this one.
        return cls.model_fields[str(info.field_name)].default if value is None else value

    @model_validator(mode="after")
    def _refuse_unknown(self) -> _Request:
        for name, value in (self.model_extra or {}).items():
            if name in IGNORED_PARAMETERS:
                continue
            if name in UNSUPPORTED_PARAMETERS:
                if (
                    value in (None, [], {}, False)
                    or (name == "tool_choice" and value == "none")
                    or (name == "best_of" and value == 1)
                ):
                    continue
                raise UnsupportedParameter(
                    f"'{name}' is not supported by this service; remove it from the request (see docs/api.md)",
                    param=name,
                )
            raise InvalidRequest(f"Unrecognized request argument supplied: {name}", param=name)
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("'stream_options' is only allowed when 'stream' is true", param="stream_options")
        return self

    def _truncating(self, prompt: PromptInput) -> PromptInput:
        """The prompt with vLLM's truncation asked for, which the replica applies once it has the token ids."""
        if self.truncate_prompt_tokens is None:
            return prompt
        return replace(prompt, truncate_to=self.truncate_prompt_tokens, truncation_side=self.truncation_side or "left")

    def _stop_sequences(self, limits: LimitsConfig) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > limits.max_stop_sequences:
            raise InvalidRequest(
                f"'stop' has {len(stops)} sequences; at most {limits.max_stop_sequences} are allowed", param="stop"
            )
        for s in stops:
            if not s:
                raise InvalidRequest("'stop' sequences must not be empty", param="stop")
            if len(s) > limits.max_stop_sequence_chars:
                raise InvalidRequest(
                    f"a 'stop' sequence is {len(s)} characters; at most {limits.max_stop_sequence_chars} are allowed",
                    param="stop",
                )
        return tuple(stops)

    def _token_ids(self, name: str, ids: list[int] | None, limit: int) -> tuple[int, ...] | None:
        if ids is None:
            return None
        if len(ids) > limit:
            raise InvalidRequest(f"'{name}' has {len(ids)} token ids; at most {limit} are allowed", param=name)
        return tuple(ids)

    def _logit_bias(self) -> tuple[tuple[int, float], ...]:
        bias = self.logit_bias or {}
        if len(bias) > MAX_LOGIT_BIAS:
            raise InvalidRequest(
                f"'logit_bias' has {len(bias)} entries; at most {MAX_LOGIT_BIAS} are allowed", param="logit_bias"
            )
        converted: dict[int, float] = {}
        invalid: list[str] = []
        for key, value in bias.items():
            try:
                token_id = int(key)  # as vLLM converts the keys
            except ValueError:
                invalid.append(key)
                continue
            converted[token_id] = min(LOGIT_BIAS_BOUND, max(-LOGIT_BIAS_BOUND, value))
        if invalid:
            raise InvalidRequest(
                f"logit_bias contains key(s) that cannot be converted to integer token IDs: {invalid[:8]!r}",
                param="logit_bias",
            )
        out_of_range = [t for t in converted if not 0 <= t <= MAX_TOKEN_ID]
        if out_of_range:
            raise InvalidRequest(
                f"token_id(s) {out_of_range[:8]} in logit_bias contain out-of-vocab token ids", param="logit_bias"
            )
        return tuple(converted.items())

    def _bad_words(self) -> tuple[str, ...]:
        words = self.bad_words
        if len(words) > MAX_BAD_WORDS:
            raise InvalidRequest(
                f"'bad_words' has {len(words)} entries; at most {MAX_BAD_WORDS} are allowed", param="bad_words"
            )
        for word in words:
            if not word:
                raise InvalidRequest("bad_words cannot contain an empty string", param="bad_words")
            if len(word) > MAX_BAD_WORD_CHARS:
                raise InvalidRequest(
                    f"a 'bad_words' entry is {len(word)} characters; at most {MAX_BAD_WORD_CHARS} are allowed",
                    param="bad_words",
                )
            try:
                word.encode("utf-8")  # the tokenizer fails on a lone surrogate (JSON can carry one: "\ud800")
            except UnicodeEncodeError:
                raise InvalidRequest("bad_words entries must be valid Unicode text", param="bad_words") from None
        return tuple(dict.fromkeys(words))

    def _extensions(self, max_tokens: int) -> dict[str, Any]:
        """vLLM's sampling extensions as `GenerationParams` fields, checked as vLLM checks them (`min_tokens`
        against the `max_tokens` in effect) and against this service's bounds; ids beyond the model's vocabulary
        are the engine's to refuse (it knows the vocabulary)."""
        if self.min_tokens > max_tokens:
            raise InvalidRequest(
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {self.min_tokens}",
                param="min_tokens",
            )
        allowed = self._token_ids("allowed_token_ids", self.allowed_token_ids, MAX_ALLOWED_TOKEN_IDS)
        if allowed is not None and not allowed:
            raise InvalidRequest("allowed_token_ids is not None and empty!", param="allowed_token_ids")
        repetition_penalty = 1.0 if self.repetition_penalty is None else self.repetition_penalty
        if not math.isfinite(repetition_penalty):  # pydantic refuses NaN and infinities; a model built in code too
            raise InvalidRequest("repetition_penalty must be a finite number", param="repetition_penalty")
        return {
            "top_k": self.top_k or 0,
            "min_p": self.min_p or 0.0,
            "min_tokens": self.min_tokens,
            "repetition_penalty": repetition_penalty,
            "stop_token_ids": tuple(  # repeats dropped, as vLLM's SamplingParams drops them
                dict.fromkeys(self._token_ids("stop_token_ids", self.stop_token_ids, MAX_STOP_TOKEN_IDS) or ())
            ),
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "logit_bias": self._logit_bias(),
            "allowed_token_ids": allowed,
            "bad_words": self._bad_words(),
            "return_token_ids": bool(self.return_token_ids),
            "tokens_as_ids": bool(self.return_tokens_as_token_ids),
            "prompt_logprobs": self.prompt_logprobs,
            "priority": self.priority,
        }

    def _params(
        self,
        limits: LimitsConfig,
        max_tokens: int | None,
        max_tokens_name: str,
        logprobs: int | None,
        logprobs_name: str,
        **extra: Any,
    ) -> GenerationParams:
        is_default = max_tokens is None
        if max_tokens is None:
            # vLLM's default is whatever the context has left, so a min_tokens above our default raises it
            # (up to limits.max_tokens; beyond that min_tokens itself is refused).
            max_tokens = max(limits.default_max_tokens, min(self.min_tokens, limits.max_tokens))
        elif max_tokens > limits.max_tokens:
            raise InvalidRequest(
                f"'{max_tokens_name}' is {max_tokens}; this model allows at most {limits.max_tokens}",
                param=max_tokens_name,
            )
        if self.n > limits.max_n:
            raise InvalidRequest(f"'n' is {self.n}; this model allows at most {limits.max_n}", param="n")
        if self.n > 1 and self.temperature == 0:
            raise InvalidRequest(
                "'n' > 1 needs sampling; with temperature 0 every choice would be the same. "
                "Raise 'temperature' or set n to 1",
                param="n",
            )
        if logprobs is not None and logprobs > limits.max_logprobs:
            raise InvalidRequest(
                f"'{logprobs_name}' is {logprobs}; this model allows at most {limits.max_logprobs}", param=logprobs_name
            )
        constraint = self.structured_outputs.params() if self.structured_outputs is not None else {}
        self._check_prompt_logprobs(limits)
        return GenerationParams(
            max_tokens=max_tokens,
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self._stop_sequences(limits),
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logprobs=logprobs,
            ignore_eos=self.ignore_eos,
            max_tokens_is_default=is_default,
            **self._extensions(max_tokens),
            **{**constraint, **extra},  # chat's response_format and forced tool calls replace the constraint
        )

    def _check_prompt_logprobs(self, limits: LimitsConfig) -> None:
        """vLLM's rules (its messages): not with a stream unless 0, at least 0 or -1 (the whole vocabulary, which
        no model here allows: the most is `limits.max_logprobs`, as for `logprobs`)."""
        k = self.prompt_logprobs
        if k is None:
            return
        if self.stream and (k > 0 or k == -1):
            raise InvalidRequest("`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
        if k < 0 and k != -1:
            raise InvalidRequest("`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs")
        if k == -1 or k > limits.max_logprobs:
            raise InvalidRequest(
                f"'prompt_logprobs' is {k}; this model allows at most {limits.max_logprobs}", param="prompt_logprobs"
            )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's `continuous_usage_stats`: usage on every chunk; only together with `include_usage`, as in vLLM."""
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # vLLM extension


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class MessageFunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")  # as vLLM, which reads only these two
    name: str
    arguments: str | dict[str, Any] | None = None


class MessageToolCall(BaseModel):
    """A call in an earlier assistant turn, as the client got it back."""

    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: MessageFunctionCall

    def for_template(self) -> dict[str, Any]:
        # Chat templates take the arguments as an object (vLLM parses them the same way); arguments that are not
        # a JSON object become {} rather than failing every later turn of the conversation, as in vLLM.
        args = self.function.arguments
        if isinstance(args, str):
            try:
                args = json.loads(args) if args else {}
            except ValueError:
                args = {}
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.function.name, "arguments": args if isinstance(args, dict) else {}},
        }


class ChatMessage(BaseModel):
    # Extra fields are accepted and left out of the prompt, as vLLM accepts and drops them.
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it: content as text (null is ""), and only the fields vLLM keeps."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.role == "assistant" and self.tool_calls:
            out["tool_calls"] = [c.for_template() for c in self.tool_calls]
        if self.role == "tool" and self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=MAX_TOOL_NAME_CHARS)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1)


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"] = "function"
    function: NamedFunction


def _check_tool_schemas(tools: list[ChatTool]) -> None:
    """Refuses tool schemas that could not be compiled or are too large, naming `tools`, before any engine work:
    a schema is checked against its JSON Schema metaschema (jsonschema, as the engine's grammar compiler would
    refuse it later), nesting and size are bounded, and `$defs` (hoisted to one place for a forced choice, as in
    vLLM) must not conflict."""
    size = 0
    defs: dict[str, Any] = {}
    for tool in tools:
        parameters = tool.function.parameters
        if not parameters:
            continue
        name = tool.function.name
        try:
            not_too_deep(parameters)
            size += len(json.dumps(parameters, separators=(",", ":"), allow_nan=False))
            jsonschema.validators.validator_for(parameters).check_schema(parameters)
        except (ValueError, TypeError) as err:
            raise InvalidRequest(f"the parameters of tool '{name}' are not a usable JSON schema: {err}",
                                 param="tools") from None
        except jsonschema.SchemaError as err:
            raise InvalidRequest(
                f"the parameters of tool '{name}' are not a valid JSON schema: {err.message}", param="tools"
            ) from None
        own = parameters.get("$defs") or {}
        if not isinstance(own, dict):
            raise InvalidRequest(f"`$defs` in the parameters of tool '{name}' must be an object", param="tools")
        for key, value in own.items():
            if key in defs and defs[key] != value:
                raise InvalidRequest(
                    f"Tool definition '{key}' has multiple schemas, which is not supported.", param="tools"
                )
            defs[key] = value
    if size > MAX_TOOLS_SCHEMA_CHARS:
        raise InvalidRequest(
            f"the tools' parameter schemas are {size} characters of JSON; at most {MAX_TOOLS_SCHEMA_CHARS} are "
            "allowed",
            param="tools",
        )


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None

    @field_validator("schema_")
    @classmethod
    def _not_too_deep(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        return not_too_deep(schema)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object")
        return self


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    response_format: ResponseFormat | None = None
    tools: list[ChatTool] | None = None
    # None: "auto" with tools, "none" without (vLLM's and OpenAI's defaults)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # None: true
    # vLLM's chat-template extensions (docs/api.md, "Chat templates").
    add_generation_prompt: bool = Field(True, description="vLLM extension: end the prompt with the assistant's turn.")
    continue_final_message: bool = Field(
        False, description="vLLM extension: the answer continues the final (assistant) message instead of a new one."
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="vLLM extension: extra variables for the model's chat template."
    )
    echo: bool = Field(False, description="vLLM extension: the answer starts with the final message's content "
                                          "when that message is the assistant's.")

    @field_validator("n", mode="before")
    @classmethod
    def _null_n_is_one(cls, value: Any) -> Any:
        return 1 if value is None else value  # vLLM's chat request takes n: null (its completions do not)

    @model_validator(mode="after")
    def _template_options_consistent(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise InvalidRequest(  # vLLM's message
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                param="continue_final_message",
            )
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise InvalidRequest(
                "`continue_final_message` continues the final message, which must be the assistant's",
                param="continue_final_message",
            )
        kwargs = self.chat_template_kwargs or {}
        reserved = sorted(set(kwargs) & RESERVED_TEMPLATE_VARIABLES)
        if reserved:
            raise InvalidRequest(
                f"chat_template_kwargs may not set {reserved}: the service sets them (use the request's own fields)",
                param="chat_template_kwargs",
            )
        if len(json.dumps(kwargs, default=str)) > MAX_TEMPLATE_KWARGS_CHARS:
            raise InvalidRequest(
                f"chat_template_kwargs is over {MAX_TEMPLATE_KWARGS_CHARS} characters as JSON",
                param="chat_template_kwargs",
            )
        return self

    @property
    def response_role(self) -> str:
        """The answer's role, as vLLM's server sets it: the assistant's, or, with no generation prompt added, the
        last message's (the answer continues that turn)."""
        return "assistant" if self.add_generation_prompt else self.messages[-1].role

    @property
    def echo_text(self) -> str | None:
        """With `echo`: the final message's content when it is the assistant's (vLLM's rule), else None."""
        last = self.messages[-1]
        return last.text() if self.echo and last.role == "assistant" else None

    @model_validator(mode="after")
    def _tools_consistent(self) -> ChatCompletionRequest:
        """vLLM's checks of `tools` and `tool_choice` (check_tool_usage), with this service's bounds."""
        if self.tools is not None:
            if not self.tools:
                raise InvalidRequest(
                    "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
                    param="tools",
                )
            if len(self.tools) > MAX_TOOLS:
                raise InvalidRequest(f"'tools' has {len(self.tools)} tools; at most {MAX_TOOLS} are allowed",
                                     param="tools")
            _check_tool_schemas(self.tools)
        choice = self.tool_choice
        if choice is not None and choice != "none" and self.tools is None:
            raise InvalidRequest("When using `tool_choice`, `tools` must be set.", param="tool_choice")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in self.tool_names:
            raise InvalidRequest(
                "The tool specified in `tool_choice` does not match any of the specified `tools`", param="tool_choice"
            )
        return self

    @property
    def tool_names(self) -> list[str]:
        return [t.function.name for t in self.tools or ()]

    @property
    def effective_tool_choice(self) -> str:
        """"none", "auto", "required", or the name of the forced function."""
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            return choice.function.name
        return choice or ("auto" if self.tools else "none")

    @property
    def forced_tool_choice(self) -> str | None:
        """"required" or the forced function's name when decoding forces tool calls; None otherwise."""
        choice = self.effective_tool_choice
        return None if choice in ("none", "auto") else choice

    def to_prompt(self, limits: LimitsConfig) -> PromptInput:
        if len(self.messages) > limits.max_messages:
            raise InvalidRequest(
                f"'messages' has {len(self.messages)} entries; at most {limits.max_messages} are allowed",
                param="messages",
            )
        # The template gets the tools whatever the choice ("none" too), as vLLM gives them by default.
        tools = tuple(t.model_dump(exclude_none=True) for t in self.tools) if self.tools else None
        return self._truncating(PromptInput(messages=tuple(m.for_template() for m in self.messages), tools=tools,
                                            add_generation_prompt=self.add_generation_prompt,
                                            continue_final_message=self.continue_final_message,
                                            template_kwargs=tuple(sorted((self.chat_template_kwargs or {}).items()))))

    def _tool_params(self, tool_call_parser: str | None) -> dict[str, Any]:
        forced = self.forced_tool_choice
        if forced is not None:
            functions = [t.function.model_dump() for t in self.tools or ()]
            # As in vLLM, forcing tool calls replaces response_format's constraint.
            return {
                "json_schema": forced_schema(functions, forced, self.parallel_tool_calls),
                "json_object": False,
                "json_schema_param": "tools",
            }
        if self.effective_tool_choice == "auto":
            if tool_call_parser is None:
                raise InvalidRequest(
                    '"auto" tool choice needs a tool-call parser for this model, and none is configured '
                    "(models[].engine.tool_call_parser); send tool_choice \"required\", a named function, "
                    'or "none"',
                    param="tool_choice",
                )
            return {"auto_tools": tuple(t.model_dump(exclude_none=True) for t in self.tools or ())}
        return {}

    def to_params(self, limits: LimitsConfig, tool_call_parser: str | None = None) -> GenerationParams:
        """`tool_call_parser`: the model's (config), which tool_choice "auto" needs."""
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise InvalidRequest(
                "'max_tokens' and 'max_completion_tokens' disagree; send one of them", param="max_completion_tokens"
            )
        name, max_tokens = (
            ("max_completion_tokens", self.max_completion_tokens)
            if self.max_completion_tokens is not None
            else ("max_tokens", self.max_tokens)
        )
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("'top_logprobs' needs 'logprobs' set to true", param="top_logprobs")
        fmt = self.response_format
        structured: dict[str, Any] = {}
        if fmt is not None and fmt.type != "text":
            so = self.structured_outputs
            if so is not None and (so.regex is not None or so.choice is not None or so.grammar is not None):
                raise InvalidRequest(  # vLLM: response_format overrides, and two kinds of constraint are refused
                    "You can only use one kind of structured outputs constraint; 'response_format' and "
                    "'structured_outputs' ask for two",
                    param="structured_outputs",
                )
            structured = {
                "json_object": fmt.type == "json_object",
                "json_schema": (fmt.json_schema.schema_ or {}) if fmt.type == "json_schema" and fmt.json_schema
                else None,
                "json_schema_param": "response_format",
                "regex": None, "choice": None, "grammar": None,
            }
        if self.structured_outputs is not None and self.forced_tool_choice is not None:
            raise InvalidRequest("You can only either use structured outputs or tools, not both.",  # vLLM's
                                 param="structured_outputs")
        return self._params(
            limits,
            max_tokens,
            name,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            logprobs_name="top_logprobs",
            **{**structured, **self._tool_params(tool_call_parser)},
        )


class CompletionRequest(_Request):
    # One prompt (text, or token ids) or a batch of them (texts, or token-id lists), as vLLM takes them.
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[int], Field(min_length=1)]
        | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    )
    max_tokens: int | None = Field(None, ge=1)
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False

    @property
    def _batch(self) -> list[Any]:
        p = self.prompt
        if isinstance(p, str) or all(isinstance(x, int) for x in p):
            return [p]  # one prompt: text, or token ids
        return list(p)

    @property
    def prompt_count(self) -> int:
        return len(self._batch)

    def to_prompts(self, limits: LimitsConfig) -> list[PromptInput]:
        """Every prompt of the request (one, or a batch of up to MAX_BATCH_PROMPTS), in order."""
        batch = self._batch
        if len(batch) > MAX_BATCH_PROMPTS:
            raise InvalidRequest(
                f"'prompt' has {len(batch)} prompts; at most {MAX_BATCH_PROMPTS} are allowed in one request",
                param="prompt",
            )
        if len(batch) * self.n > MAX_BATCH_CHOICES:
            raise InvalidRequest(
                f"{len(batch)} prompts with n={self.n} make {len(batch) * self.n} choices; at most "
                f"{MAX_BATCH_CHOICES} are allowed in one request",
                param="n",
            )
        prompts = []
        for item in batch:
            if isinstance(item, str):
                prompts.append(self._truncating(PromptInput(text=item)))
                continue
            if any(t < 0 for t in item):
                raise InvalidRequest("'prompt' token ids must not be negative", param="prompt")
            prompts.append(self._truncating(PromptInput(token_ids=tuple(item))))
        return prompts

    def to_prompt(self, limits: LimitsConfig) -> PromptInput:
        """The one prompt of a request that has one."""
        prompts = self.to_prompts(limits)
        if len(prompts) != 1:
            raise InvalidRequest("this operation takes one prompt", param="prompt")
        return prompts[0]

    @property
    def echo_texts(self) -> list[str | None]:
        """With `echo`, each prompt's text as far as the request has it (a token-id prompt's comes back from the
        engine with its admission); without, none."""
        return [x if isinstance(x, str) else None for x in self._batch] if self.echo else []

    def to_params(self, limits: LimitsConfig) -> GenerationParams:
        params = self._params(limits, self.max_tokens, "max_tokens", logprobs=self.logprobs, logprobs_name="logprobs")
        if self.echo_logprobs and self.prompt_logprobs is None:
            # vLLM's: `echo` with `logprobs` scores the echoed prompt too, with as many alternatives (streamed too).
            params = replace(params, prompt_logprobs=self.logprobs)
        return params

    @property
    def echo_logprobs(self) -> bool:
        """The echoed prompt's tokens head each choice's logprobs (vLLM's `echo` with `logprobs`)."""
        return self.echo and self.logprobs is not None


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize body: exactly one of a prompt or chat messages."""

    model_config = ConfigDict(extra="forbid")
    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None


class DetokenizeRequest(BaseModel):
    """vLLM's /detokenize body."""

    model_config = ConfigDict(extra="forbid")
    model: str
    tokens: list[int] = Field(..., max_length=1_000_000)


_Request.model_rebuild()
ChatCompletionRequest.model_rebuild()
CompletionRequest.model_rebuild()
