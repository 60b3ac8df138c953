"""Forced tool calls: the JSON schema that forces them, and reading them back out of the constrained text.

With `tool_choice: "required"` or a named function, decoding is constrained by a JSON schema built from the
tools' parameter schemas (as vLLM 0.32's own server builds it, `vllm.tool_parsers.utils.get_json_schema_from_tools`):
"required" makes the model write an array of `{"name", "parameters"}` objects, a named function makes it write
that function's arguments object. Either works with any model, since no model-specific format is involved.
`ForcedCalls` turns that text into OpenAI tool calls, whole (`calls`) or as stream deltas (`feed`); neither
imports vLLM, so the fake engine's answers go through the same code. Calls a model writes in its own format
(`tool_choice: "auto"`) are the engine's tool-call parser's to find (engine/vllm/engine.py), not this module's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.engine.interface import ToolCallDelta, new_call_id

REQUIRED = "required"


def _arguments_schema(parameters: dict[str, Any] | None) -> dict[str, Any]:
    # A function without parameters still takes an object (as vLLM constrains it).
    return parameters if parameters else {"type": "object", "properties": {}}


def forced_schema(
    functions: list[dict[str, Any]], choice: str, parallel_tool_calls: bool | None
) -> dict[str, Any]:
    """The schema decoding is held to. `functions` are the tools' `function` objects (name, parameters);
    `choice` is "required" or the name of the forced function. `$defs` of the tools' parameters are hoisted to the
    top (a `$ref` inside resolves there), as vLLM does; the caller has checked that they do not conflict."""
    if choice != REQUIRED:
        return _arguments_schema(next(f.get("parameters") for f in functions if f["name"] == choice))
    defs: dict[str, Any] = {}
    variants = []
    for function in functions:
        parameters = dict(function.get("parameters") or {})
        defs.update(parameters.pop("$defs", None) or {})
        variants.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [function["name"]]},
                    "parameters": _arguments_schema(parameters),
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": variants}}
    if parallel_tool_calls is False:  # only an explicit false allows a single call
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object as text


@dataclass
class _Span:
    """Where one element of the "required" array sits in the text: its name once the string is closed, and the
    character span of its `parameters` value (end None while it is still being written)."""

    name: str | None = None
    name_end: int = 0
    args_start: int | None = None
    args_end: int | None = None

    def ready_by(self, length: int) -> bool:
        """Whether the first `length` characters already had the name and the start of the arguments."""
        started = self.args_start is not None and self.args_start < length
        return self.name is not None and self.name_end <= length and started


def _scan(text: str) -> list[_Span]:
    """The elements of a (possibly unfinished) `[{"name": ..., "parameters": ...}, ...]` array in one pass that
    knows strings and nesting. The spans of a prefix of `text` are those of `text` cut to it, so what an earlier
    delta already revealed is read off the same scan. Only the element level is interpreted: braces and quotes
    inside values cannot confuse it."""
    return _Scanner(text).scan()


class _Scanner:
    """`_scan`'s one pass: where it is in the text (depth, inside a string) and in the element it reads."""

    def __init__(self, text: str):
        self.text = text
        self.spans: list[_Span] = []
        self.depth, self.in_string, self.escaped, self.string_start = 0, False, False, 0
        self.current: _Span | None = None
        self.key: str | None = None
        self.state = "key"  # key, colon, value, string, container, scalar, after
        self.value_start = 0

    def scan(self) -> list[_Span]:
        for i, ch in enumerate(self.text):
            if self.in_string:
                self._string_char(i, ch)
            elif ch == '"':
                self.in_string, self.string_start = True, i
                if self._in_element() and self.state == "value":
                    self._start_value(i, "string")
            elif ch in "{[":
                if not self._open(i, ch):
                    break
            elif ch in "}]":
                if not self._close(i):
                    break
            elif self._in_element():
                self._element_char(i, ch)
        return self.spans

    def _in_element(self) -> bool:
        return self.depth == 2 and self.current is not None

    def _string_char(self, i: int, ch: str) -> None:
        if self.escaped:
            self.escaped = False
        elif ch == "\\":
            self.escaped = True
        elif ch == '"':
            self.in_string = False
            if self._in_element():
                if self.state == "key":
                    self.key, self.state = self.text[self.string_start + 1 : i], "colon"
                elif self.state == "string":
                    self._end_value(i + 1)

    def _open(self, i: int, ch: str) -> bool:
        """False where the text is not the array of objects expected: the scan stops there."""
        if self.depth == 0 and ch != "[" or self.depth == 1 and ch != "{":
            return False
        if self.depth == 1:
            self.current, self.key, self.state = _Span(), None, "key"
            self.spans.append(self.current)
        elif self._in_element() and self.state == "value":
            self._start_value(i, "container")
        self.depth += 1
        return True

    def _close(self, i: int) -> bool:
        """False once the array has ended."""
        if self._in_element() and self.state == "scalar":
            self._end_value(i)
        self.depth -= 1
        if self._in_element() and self.state == "container":
            self._end_value(i + 1)
        elif self.depth == 1:
            self.current = None
        elif self.depth <= 0:
            return False
        return True

    def _element_char(self, i: int, ch: str) -> None:
        if ch == ":" and self.state == "colon":
            self.state = "value"
        elif ch == ",":
            if self.state == "scalar":
                self._end_value(i)
            self.key, self.state = None, "key"
        elif ch.isspace():
            if self.state == "scalar":
                self._end_value(i)
        elif self.state == "value":
            self._start_value(i, "scalar")

    def _start_value(self, at: int, kind: str) -> None:
        assert self.current is not None
        self.value_start = at
        if self.key == "parameters":
            self.current.args_start = at
        self.state = kind

    def _end_value(self, at: int) -> None:
        assert self.current is not None
        if self.key == "parameters":
            self.current.args_end = at
        elif self.key == "name" and self.state == "string":
            try:
                self.current.name, self.current.name_end = json.loads(self.text[self.value_start:at]), at
            except json.JSONDecodeError:
                self.current.name = None
        self.state = "after"


@dataclass
class ForcedCalls:
    """One choice's forced calls. `choice` is "required" or the forced function's name."""

    choice: str
    _text: str = ""
    _ids: list[str] = field(default_factory=list)  # the ids announced so far, by call index

    def _id(self, index: int) -> str:
        while len(self._ids) <= index:
            self._ids.append(new_call_id())
        return self._ids[index]

    def feed(self, text: str) -> list[ToolCallDelta]:
        """The stream deltas that `text` (the choice's next piece) adds: a call's first delta has its id and name
        and the arguments so far, later ones only new argument text (OpenAI's shape)."""
        before, self._text = self._text, self._text + text
        if self.choice != REQUIRED:
            if not text and before:
                return []
            first = not self._ids
            return [ToolCallDelta(index=0, id=self._id(0) if first else None,
                                  name=self.choice if first else None, arguments=text)]
        deltas = []
        for index, span in enumerate(_scan(self._text)):
            if span.name is None or span.args_start is None:
                break  # elements come in order: nothing later is ready either
            end = span.args_end if span.args_end is not None else len(self._text)
            if span.ready_by(len(before)):
                new = self._text[max(min(end, len(before)), span.args_start) : end]
                if new:
                    deltas.append(ToolCallDelta(index=index, arguments=new))
            else:
                deltas.append(ToolCallDelta(index=index, id=self._id(index), name=span.name,
                                            arguments=self._text[span.args_start : end]))
        return deltas

    def calls(self, text: str) -> list[ToolCall]:
        """The calls of the whole text: for "required", the array's elements (none if it is not such an array,
        e.g. cut short by max_tokens, as vLLM answers); for a named function, the text as its arguments."""
        if self.choice != REQUIRED:
            return [ToolCall(self._id(0), self.choice, text)] if text.strip() else []
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            return []
        if not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("name"), str) and isinstance(i.get("parameters"), dict)
            for i in items
        ):
            return []
        return [ToolCall(self._id(n), i["name"], json.dumps(i["parameters"], ensure_ascii=False))
                for n, i in enumerate(items)]
