"""`POST /v1/chat/completions/batch` on the wire (vLLM 0.32's batched chat): several conversations in one request,
with the chat request's other fields shared; conversation i's answer is choice i of one chat completion.

As vLLM's: not streamed, no tools, n 1, no beam search. Each conversation is checked as a chat request of its own
(`conversations`, the same checks and messages as `/v1/chat/completions`), and the batch is admitted whole on its
summed tokens, as a completions batch is (app/openai/completion_batch.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from app.config.model import LimitsConfig
from app.engine.interface import GenerationParams
from app.errors import InvalidRequest
from app.openai.chat import ChatCompletionRequest
from app.openai.chat_messages import ChatMessage
from app.openai.choice_shapes import ChatShape
from app.openai.completions import MAX_BATCH_PROMPTS


class BatchChatCompletionRequest(ChatCompletionRequest):
    messages: list[Annotated[list[ChatMessage], Field(min_length=1)]] = Field(  # type: ignore[assignment]
        ..., min_length=1)
    _conversations: list[ChatCompletionRequest] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _template_options_consistent(self) -> BatchChatCompletionRequest:
        """The chat request's checks of the messages run per conversation (`conversations`)."""
        return self

    @model_validator(mode="after")
    def _as_vllm_batches(self) -> BatchChatCompletionRequest:
        for refused, field, what in ((self.stream, "stream", "streaming; set `stream` to false"),
                                     (self.tools is not None, "tools", "tools; omit `tools`"),
                                     (self.n != 1, "n", "`n > 1`. Please set `n` to 1."),
                                     (self.use_beam_search, "use_beam_search",
                                      "beam search. Please set `use_beam_search` to False.")):
            if refused:
                raise InvalidRequest(f"Batch chat completions do not support {what}", param=field)
        if len(self.messages) > MAX_BATCH_PROMPTS:
            raise InvalidRequest(f"'messages' has {len(self.messages)} conversations; at most {MAX_BATCH_PROMPTS} are "
                                 "allowed in one request", param="messages")
        return self

    def to_params(self, limits: LimitsConfig, tool_call_parser: str | None = None) -> GenerationParams:
        """The settings every conversation shares (checked as the first's); unlike a chat request, vLLM's batch
        does not score the prompts for `echo`."""
        params = self.conversations()[0].to_params(limits, tool_call_parser)
        return params if self.prompt_logprobs is not None else replace(params, prompt_logprobs=None)

    def conversations(self) -> list[ChatCompletionRequest]:
        """Each conversation as the chat request it would be alone (its checks run here, once)."""
        if self._conversations is not None:
            return self._conversations
        shared: dict[str, Any] = self.model_dump(exclude={"messages"}, exclude_unset=True, by_alias=True)
        out = []
        for i, conversation in enumerate(self.messages):
            try:
                out.append(ChatCompletionRequest.model_validate(
                    {**shared, "messages": [m.model_dump(exclude_unset=True) for m in conversation]}))
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise InvalidRequest(f"conversation {i}: {where}: {first['msg']}", param=f"messages.{i}") from None
        self._conversations = out
        return out


class BatchChatShape(ChatShape):
    """Choice i answers conversation i: its role and its `echo` are that conversation's, as vLLM's batched chat
    sets them (a conversation ending on an assistant's turn echoes it, one ending on the user's does not)."""

    def __init__(self, conversations: list[ChatCompletionRequest]):
        super().__init__(top_logprobs=conversations[0].top_logprobs_shown)
        self._each = [(c.response_role, c.echo_text) for c in conversations]

    def role_and_echo(self, index: int) -> tuple[str, str | None]:
        return self._each[index]


BatchChatCompletionRequest.model_rebuild()
