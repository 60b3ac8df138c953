"""tool_choice "auto": vLLM's tool-call parser (the one the model's config names) over one choice's stream.

A model that calls tools on its own writes them in its own format (Hermes' `<tool_call>{...}</tool_call>`, ...),
which only that model's parser reads, and the parser needs the tokenizer: so it runs here, beside the engine,
and what leaves the engine is neutral (`ChoiceDelta.text` for the content, `ToolCallDelta`s for the calls).
Imports vLLM, never FastAPI. Forced calls ("required", a named function) do not come here: app/openai/tool_calls.py.

A choice continued on another replica (app/engine/continuation.py) brings the pieces its parser read there
(`GenerationParams.parser_replay`): the new parser reads the same pieces first, its answers dropped (the client has
them), and so holds what the first one held (a call half written, the calls' ids so far) when the new tokens come.
Parsers are deterministic in what they read: the same pieces leave the same state.
"""

from __future__ import annotations

from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers import ToolParser, ToolParserManager

from app.engine.interface import GenerationParams, ToolCallDelta, new_call_id


def parser_class(name: str) -> type[ToolParser]:
    """vLLM's parser registered as `name`; a ValueError listing the names otherwise (checked at engine start)."""
    try:
        return ToolParserManager.get_tool_parser(name)
    except KeyError:
        names = ", ".join(ToolParserManager.list_registered())
        raise ValueError(f"engine.tool_call_parser '{name}' is not one of vLLM's tool-call parsers: {names}") from None


def auto_tool_calls(parser: type[ToolParser] | None, tokenizer: Any,
                    params: GenerationParams) -> tuple[list[AutoToolCalls], bool]:
    """One parser per choice for tool_choice "auto" (none without it), each where a continuation's first replica
    left it, and whether special tokens may be skipped in the text they read."""
    if params.auto_tools is None or parser is None:
        return [], params.skip_special_tokens
    parsers = [AutoToolCalls(parser, tokenizer, params.auto_tools) for _ in range(params.n)]
    skip = [p.adjust(params.skip_special_tokens) for p in parsers][0]
    for p in parsers:  # a continuation is one choice
        for text, token_ids in params.parser_replay:
            p.feed(text, list(token_ids))
    return parsers, skip


class AutoToolCalls:
    """One choice: feed it each piece of text as the engine produces it; it answers the content and the tool-call
    pieces in that text."""

    def __init__(self, parser: type[ToolParser], tokenizer: Any, tools: tuple[dict[str, Any], ...]):
        # The parser reads tools (and a few flags) off a request object of vLLM's own: one is built for it.
        self._request = ChatCompletionRequest(model="", messages=[], tools=list(tools), tool_choice="auto")
        self._parser = parser(tokenizer, list(self._request.tools or ()))
        self._text = ""
        self._token_ids: list[int] = []
        self._ids: dict[int, str] = {}  # the parser's call index -> this service's call id

    def adjust(self, skip_special_tokens: bool) -> bool:
        """Whether special tokens may be skipped in the text: some parsers need them (Hermes' `<tool_call>` is a
        special token in some models), and say so by clearing the request's flag, as vLLM lets them."""
        self._request.skip_special_tokens = skip_special_tokens
        self._request = self._parser.adjust_request(self._request)
        return bool(self._request.skip_special_tokens)

    def feed(self, text: str, token_ids: list[int]) -> tuple[str, tuple[ToolCallDelta, ...]]:
        previous, previous_ids = self._text, self._token_ids
        self._text, self._token_ids = previous + text, previous_ids + list(token_ids)
        delta = self._parser.extract_tool_calls_streaming(
            previous, self._text, text, previous_ids, self._token_ids, list(token_ids), self._request
        )
        if delta is None:
            return "", ()
        calls = []
        for call in delta.tool_calls:
            function = call.function
            if isinstance(function, dict):  # some parsers put the function in as a dict
                name, arguments = function.get("name"), function.get("arguments")
            else:
                name, arguments = (function.name, function.arguments) if function is not None else (None, None)
            call_id = None
            if call.index not in self._ids and (call.id is not None or name is not None):
                call_id = self._ids[call.index] = new_call_id()
            calls.append(ToolCallDelta(index=call.index, arguments=arguments or "", id=call_id,
                                       name=name if call_id is not None else None))
        return delta.content or "", tuple(calls)
