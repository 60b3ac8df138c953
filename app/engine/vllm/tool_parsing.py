"""tool_choice "auto": vLLM's tool-call parser (the one the model's config names) over one choice's stream.

A model that calls tools on its own writes them in its own format (Hermes' `<tool_call>{...}</tool_call>`, ...),
which only that model's parser reads, and the parser needs the tokenizer: so it runs here, beside the engine,
and what leaves the engine is neutral (`ChoiceDelta.text` for the content, `ToolCallDelta`s for the calls).
Imports vLLM, never FastAPI. Forced calls ("required", a named function) do not come here: app/openai/tool_calls.py.

The client's stop strings are matched here, before the parser, and not by the engine: vLLM matches them on the text
its parser then reads (holding back what may start one), and that text never leaves a replica whole. So the engine
is asked for no stop strings (`StopStrings` applies vLLM's rule, holding back as vLLM does), a choice that matches
one ends here, and the engine request is aborted once every choice has ended.

A choice continued on another replica (app/engine/continuation.py) brings the text of each step it made there
(`GenerationParams.parser_replay`): the new stop strings and parser read the same pieces first, their answers
dropped (the client has them), and so hold what the first ones held (text that may start a stop string, a call half
written, the calls' ids so far) when the new tokens come, and a stop string spanning the cut still matches. Both are
deterministic in what they read: the same pieces leave the same state.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers import ToolParser, ToolParserManager

from app.engine.interface import ChoiceDelta, GenerationParams, ToolCallDelta, new_call_id
from app.engine.stop_strings import StopStrings


def parser_class(name: str) -> type[ToolParser]:
    """vLLM's parser registered as `name`; a ValueError listing the names otherwise (checked at engine start)."""
    try:
        return ToolParserManager.get_tool_parser(name)
    except KeyError:
        names = ", ".join(ToolParserManager.list_registered())
        raise ValueError(f"engine.tool_call_parser '{name}' is not one of vLLM's tool-call parsers: {names}") from None


def auto_tool_calls(parser: type[ToolParser] | None, tokenizer: Any,
                    params: GenerationParams) -> tuple[list[AutoToolCalls], GenerationParams]:
    """One parser per choice for tool_choice "auto" (none without it), each where a continuation's first replica
    left it, and `params` as the engine is to be asked them: special tokens kept where the parser needs them, no
    stop strings (matched before the parser here: module docstring)."""
    if params.auto_tools is None or parser is None:
        return [], params
    # A continuation's min_tokens counts from its start; its stop strings also read the text before it.
    replayed = sum(len(ids) for _, ids in params.parser_replay)
    parsers = [AutoToolCalls(parser, tokenizer, params.auto_tools,
                             StopStrings(params.stop, params.include_stop_str_in_output, params.min_tokens + replayed)
                             if params.stop and not params.beam_search else None)  # beams: vLLM ignores them
               for _ in range(params.n)]
    skip = [p.adjust(params.skip_special_tokens) for p in parsers][0]
    for p in parsers:  # a continuation is one choice
        for text, token_ids in params.parser_replay:
            p.feed(p.cut(text, len(token_ids), finished=False)[0], list(token_ids))
    return parsers, replace(params, skip_special_tokens=skip, stop=())


class AutoToolCalls:
    """One choice: feed it each piece of text as the engine produces it; it answers the content and the tool-call
    pieces in that text."""

    def __init__(self, parser: type[ToolParser], tokenizer: Any, tools: tuple[dict[str, Any], ...],
                 stops: StopStrings | None = None):
        # The parser reads tools (and a few flags) off a request object of vLLM's own: one is built for it.
        self._request = ChatCompletionRequest(model="", messages=[], tools=list(tools), tool_choice="auto")
        self._parser = parser(tokenizer, list(self._request.tools or ()))
        self._text = ""
        self._token_ids: list[int] = []
        self._ids: dict[int, str] = {}  # the parser's call index -> this service's call id
        self._stops = stops
        self.ended = False  # the choice has finished (on a stop string matched here, or as the engine ended it)

    def adjust(self, skip_special_tokens: bool) -> bool:
        """Whether special tokens may be skipped in the text: some parsers need them (Hermes' `<tool_call>` is a
        special token in some models), and say so by clearing the request's flag, as vLLM lets them."""
        self._request.skip_special_tokens = skip_special_tokens
        self._request = self._parser.adjust_request(self._request)
        return bool(self._request.skip_special_tokens)

    def cut(self, text: str, tokens: int, finished: bool) -> tuple[str, str | None]:
        """A step's text through the client's stop strings: what may be read now, and the stop string it completed."""
        if self._stops is None:
            return text, None
        matched = self._stops.add(text, tokens)
        return self._stops.release(finished or matched is not None), matched

    def read(self, delta: ChoiceDelta, token_ids: list[int]) -> ChoiceDelta:
        """A step of this choice as the engine made it (`delta.text` its whole text): the delta the client is sent,
        its content and calls as the parser found them, ended by a stop string when one matched."""
        finish, stop_reason = delta.finish_reason, delta.stop_reason
        text, matched = self.cut(delta.text, len(token_ids), finish is not None)
        if matched is not None:
            finish, stop_reason = "stop", matched
        content, calls = self.feed(text, token_ids)
        self.ended = finish is not None
        return replace(delta, text=content, tool_calls=calls, parsed_text=delta.text, finish_reason=finish,
                       stop_reason=stop_reason)

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
