"""`POST /tokenize` and `POST /detokenize` on the wire, in vLLM's shapes."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from app.config.model import LimitsConfig
from app.engine.interface import PromptInput
from app.errors import InvalidRequest, UnsupportedParameter
from app.openai import validation_errors
from app.openai.chat import ChatCompletionRequest
from app.openai.json_depth import BoundedBody

# The chat template's options vLLM's /tokenize takes with `messages`, rendered as chat renders them.
_CHAT_OPTIONS = ("tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")


class TokenizeRequest(BoundedBody):
    """vLLM's /tokenize body: exactly one of a prompt or chat messages. With messages, the chat template's options
    that vLLM's /tokenize takes, so that the count is what the same chat request's prompt costs (tools included)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's options taken only at the values that are what this service does: special tokens added to a prompt and
    # not to rendered messages (vLLM's defaults), no token strings.
    add_special_tokens: bool | None = None
    return_token_strs: bool = False

    def to_prompt(self, limits: LimitsConfig) -> PromptInput:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("Send exactly one of 'prompt' or 'messages'", param="prompt")
        if self.return_token_strs:
            raise UnsupportedParameter("'return_token_strs' is not supported; /detokenize turns ids into text",
                                       param="return_token_strs")
        if self.add_special_tokens not in (None, self.messages is None):
            raise UnsupportedParameter(
                f"'add_special_tokens: {str(self.add_special_tokens).lower()}' is not supported with "
                f"'{'prompt' if self.messages is None else 'messages'}'; leave it out", param="add_special_tokens")
        if self.messages is None:
            for name in _CHAT_OPTIONS:
                if name in self.model_fields_set:
                    raise InvalidRequest(f"'{name}' goes with 'messages', not 'prompt'", param=name)
            return PromptInput(text=self.prompt)
        options = self.model_dump(include=set(_CHAT_OPTIONS), exclude_none=True)
        try:  # "none": the template gets the tools, and no tool-call parser is needed to count them
            chat = ChatCompletionRequest(model=self.model, messages=self.messages, **options,
                                         tool_choice="none" if self.tools else None)
        except ValidationError as err:  # a bad message is the client's 400, not a 500
            raise validation_errors.refused_as_built(err.errors(), "messages") from None
        return chat.to_prompt(limits)


class DetokenizeRequest(BoundedBody):
    """vLLM's /detokenize body."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[int] = Field(..., max_length=1_000_000)
