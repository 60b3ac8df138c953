"""The Responses API's request (`POST /v1/responses`), and its conversion into the chat request it amounts to.

A Responses request is served as the chat completion it describes: `instructions` become the system message,
`input` (text, or a list of messages, function calls, their outputs and reasoning: `responses_input`) the
conversation, function tools chat's tools, `max_output_tokens` chat's `max_tokens`, `text.format` chat's
`response_format`, `reasoning.effort` chat's `reasoning_effort`, and vLLM's sampling extensions pass as they are.
So admission, limits, the length contract, tool forcing and abort-on-disconnect are chat's, unchanged. Stateless:
nothing is stored (`store` is accepted and has no effect) and `previous_response_id` is refused.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from app.errors import InvalidRequest, UnsupportedParameter
from app.openai import validation_errors
from app.openai.chat import ChatCompletionRequest, ReasoningEffort
from app.openai.json_depth import BoundedBody
from app.openai.responses_input import InputItem, Strict, chat_messages, refuse_what_is_not_served
from app.openai.sampling_bounds import MAX_REQUEST_ID_CHARS
from app.openai.unserved_fields import IGNORED_PARAMETERS  # chat's: accepted and without effect (docs/api.md)

# OpenAI's Responses parameters this service does not implement: a 400 that says so, unless sent as a no-op.
UNSUPPORTED_PARAMETERS = (
    "background", "conversation", "include", "max_tool_calls", "prompt", "top_logprobs", "truncation",
    "stream_options", "context_management", "prompt_cache_retention",
    # vLLM's Responses extensions for what is not run here (as on chat: app/openai/unserved_fields.py)
    "kv_transfer_params", "ec_transfer_params", "vllm_xargs", "mm_processor_kwargs", "media_io_kwargs", "mm_payload",
    "return_mm_kwargs", "watermarking", "enable_response_messages", "previous_input_messages",
)
# vLLM's sampling and template extensions that its own Responses API takes: passed to the chat request, which checks
# them as chat does (a refusal names the same parameter).
CHAT_PARAMETERS = (
    "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop", "stop_token_ids",
    "logit_bias", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "chat_template_kwargs",
    "cache_salt", "priority", "session_id", "structured_outputs",
)
_NO_OP_VALUES: tuple[Any, ...] = (None, [], {}, False, "disabled")
_NO_OBFUSCATION = {"include_obfuscation": False}  # what this service does anyway: no padding fields in events


class FunctionTool(Strict):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(Strict):
    type: Literal["function"]
    name: str


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class Reasoning(Strict):
    """Chat's `reasoning_effort`, for the chat template. A summary is taken as vLLM takes it: this service returns no
    reasoning items (no reasoning parser), so there is nothing to summarize, as OpenAI answers a model that did not
    reason; LangChain's and the Agents SDK's reasoning settings send `summary: "auto"`."""
    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # OpenAI's deprecated name of `summary`


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint for OpenAI's models; no effect here


class ResponsesRequest(BoundedBody):
    model_config = ConfigDict(extra="allow")  # unknown fields are refused by name below

    model: str | None = None  # as vLLM: left out, the served model
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    stream: bool = False
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None  # a routing hint, passed on to the chat request
    # vLLM's: the response's id, as sent (its default `resp_<uuid>` is this service's form too)
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_CHARS)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unserved_types(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refuse_what_is_not_served(data)
        return data

    @model_validator(mode="after")
    def _refuse_unknown(self) -> ResponsesRequest:
        for name, value in (self.model_extra or {}).items():
            if name in IGNORED_PARAMETERS or name in CHAT_PARAMETERS:
                continue
            if name in UNSUPPORTED_PARAMETERS:
                if value in _NO_OP_VALUES or (name == "stream_options" and value == _NO_OBFUSCATION):
                    continue
                raise UnsupportedParameter(
                    f"'{name}' is not supported by this service's Responses API; remove it (see docs/api.md)",
                    param=name,
                )
            raise InvalidRequest(f"Unrecognized request argument supplied: {name}", param=name)
        if self.previous_response_id is not None:
            raise UnsupportedParameter(
                "'previous_response_id' is not supported: this service stores no responses. Send the whole "
                "conversation as 'input' (earlier output items included)",
                param="previous_response_id",
            )
        if isinstance(self.input, list) and not self.input:
            raise InvalidRequest("'input' must not be an empty list", param="input")
        return self

    def _response_format(self) -> dict[str, Any] | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return {"type": "json_object"}
        if not fmt.name:
            raise InvalidRequest("'text.format.name' is required with type 'json_schema'", param="text.format.name")
        spec = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict, "description": fmt.description}
        return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if v is not None}}

    def to_chat(self) -> ChatCompletionRequest:
        """The chat request this response is served as. A chat-side refusal names the Responses parameter."""
        choice = self.tool_choice
        if not self.tools and choice in ("auto", "none"):
            choice = None  # `tools: []` (as agent SDKs send, with tool_choice "auto"): a request without tools
        body: dict[str, Any] = {
            "model": self.model,
            "messages": chat_messages(self.instructions, self.input),
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "prompt_cache_key": self.prompt_cache_key,
            "reasoning_effort": self.reasoning.effort if self.reasoning else None,
            "response_format": self._response_format(),
            "parallel_tool_calls": self.parallel_tool_calls,
            "tool_choice": {"type": "function", "function": {"name": choice.name}}
            if isinstance(choice, FunctionChoice) else choice,
            "tools": [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                      for t in self.tools] if self.tools else None,
        }
        body.update((k, v) for k, v in (self.model_extra or {}).items() if k in CHAT_PARAMETERS)
        try:
            return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
        except ValidationError as err:
            raise validation_errors.refused_as_built(err.errors(), "input", responses_param) from None
        except InvalidRequest as err:
            raise type(err)(err.message, param=responses_param(err.param)) from None


def responses_param(param: str | None) -> str | None:
    """The Responses parameter that a refusal of the chat request it became is about."""
    return {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text"}.get(param or "", param)


def summary(body: ResponsesRequest) -> dict[str, Any]:
    """The request's own settings as a Response object echoes them."""
    choice, reasoning = body.tool_choice, body.reasoning or Reasoning()
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "tool_choice": choice.model_dump() if isinstance(choice, FunctionChoice) else choice or "auto",
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
        "text": {"format": body.text.format.model_dump(by_alias=True, exclude_none=True)}
        if body.text and body.text.format else {"format": {"type": "text"}},
        "previous_response_id": None,
        "reasoning": {"effort": reasoning.effort, "summary": reasoning.summary or reasoning.generate_summary},
        "store": False,
        "metadata": json.loads(json.dumps((body.model_extra or {}).get("metadata") or {})),
    }
