"""`POST /v1/chat/completions` on the wire: the request, converted into the engine's prompt (the chat template's
inputs) and `GenerationParams`, with `response_format` and the tool choice."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from app.config.model import LimitsConfig
from app.engine.interface import GenerationParams, PromptInput
from app.errors import InvalidRequest
from app.openai.chat_messages import (
    MAX_TOOLS,
    ChatMessage,
    ChatTool,
    NamedToolChoice,
    check_tool_schemas,
)
from app.openai.sampling import (
    SamplingRequest,
)
from app.openai.structured_outputs import ResponseFormat, response_format_params
from app.openai.tool_calls import forced_schema

# vLLM's values of OpenAI's `reasoning_effort`.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
# chat_template_kwargs (vLLM: unbounded): variables for the template, not a second prompt.
MAX_TEMPLATE_KWARGS_CHARS = 8_192
# What the template is called with already; a kwarg of the same name would replace the request's own.
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "conversation", "tools", "documents", "add_generation_prompt",
                                         "continue_final_message", "tokenize", "return_dict", "chat_template",
                                         "tokenizer", "return_tensors", "padding", "truncation", "max_length",
                                         "return_assistant_tokens_mask", "tokenizer_kwargs"})


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    LOGPROBS_NEEDED: ClassVar[str] = "`logprobs` must be set to true."
    SPECIAL_TOKENS: ClassVar[bool] = False  # vLLM's chat default: the chat template adds what the model needs
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
    # As vLLM passes it: to the chat template as `reasoning_effort`, with `enable_thinking` (unless the request's
    # chat_template_kwargs set it), for templates of reasoning models; a template without them ignores both.
    reasoning_effort: ReasoningEffort | None = None

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
    def top_logprobs_shown(self) -> int | None:
        """Each token's alternatives the answer lists: `top_logprobs` of them, or with `logprob_token_ids` all the
        engine gives (the chosen token's and theirs), as vLLM lists them; None without logprobs too."""
        return (self.top_logprobs or 0) if self.logprobs and not self.logprob_token_ids else None

    @property
    def response_role(self) -> str:
        """The answer's role, as vLLM's server sets it: the assistant's, or, with no generation prompt added, the
        last message's (the answer continues that turn)."""
        return "assistant" if self.add_generation_prompt else self.messages[-1].role

    @property
    def echo_text(self) -> str | None:
        """With `echo`: the final message's content when its role is the answer's (vLLM's rule: the assistant's, or
        any with no generation prompt added), else None."""
        last = self.messages[-1]
        return last.text() if self.echo and last.role == self.response_role else None

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
            check_tool_schemas(self.tools)
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
        for i, message in enumerate(self.messages):
            message.check_parts(i)
        # The template gets the tools whatever the choice ("none" too), as vLLM gives them by default.
        tools = tuple(t.model_dump(exclude_none=True) for t in self.tools) if self.tools else None
        return self._truncating(PromptInput(messages=tuple(m.for_template() for m in self.messages), tools=tools,
                                            add_generation_prompt=self.add_generation_prompt,
                                            continue_final_message=self.continue_final_message,
                                            template_kwargs=tuple(sorted(self._template_kwargs().items()))))

    def _template_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
            kwargs.setdefault("enable_thinking", self.reasoning_effort != "none")
        return kwargs

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
        structured = response_format_params(self.response_format, self.structured_outputs)
        if self.structured_outputs is not None and self.forced_tool_choice is not None:
            raise InvalidRequest("You can only either use structured outputs or tools, not both.",  # vLLM's
                                 param="structured_outputs")
        params = self._params(
            limits,
            max_tokens,
            name,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            logprobs_name="top_logprobs",
            **{**structured, **self._tool_params(tool_call_parser)},
        )
        if self.echo and self.prompt_logprobs is None and not self.stream:
            # vLLM's: `echo` scores the prompt too, with `top_logprobs` alternatives (its stream leaves them out).
            params = replace(params, prompt_logprobs=self.top_logprobs or 0)
        return params


ChatCompletionRequest.model_rebuild()
