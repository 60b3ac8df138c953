"""The Responses API's `input` items (messages, function calls and their outputs, reasoning) and the chat
conversation they describe; a clear 400 for the item, part and tool types this service does not serve."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from app.errors import InvalidRequest


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputText(Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # output_text sent back as it came
    logprobs: list[Any] | None = None


class InputMessage(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(Strict):
    """A call the model made in an earlier response, sent back with the next input."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutput(Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningText(Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(Strict):
    """A model's reasoning from an earlier response (another service's: this one returns none), sent back as the
    Agents SDK sends every output item: given to the chat template as the assistant's `reasoning`, as vLLM does."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None

    def text(self) -> str:
        if self.encrypted_content is not None:
            raise InvalidRequest("Encrypted content is not supported.", param="input")  # vLLM's words
        parts = self.content or self.summary
        return parts[0].text if parts else ""


InputItem = InputMessage | FunctionCallItem | FunctionCallOutput | ReasoningItem
_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
_TEXT_PARTS = ("input_text", "output_text")


def refuse_what_is_not_served(body: dict[str, Any]) -> None:
    """A 400 that names an input item, a content part, a tool or a tool choice of a type this service does not
    serve, before pydantic would answer with its dump of every shape the value failed to match."""
    items = body.get("input")
    for i, item in enumerate(items if isinstance(items, list) else ()):
        kind = item.get("type", "message" if "role" in item else None) if isinstance(item, dict) else None
        if isinstance(kind, str) and kind not in _ITEM_TYPES:
            raise InvalidRequest(f"input[{i}] is an item of type '{kind}'; this service takes items of type "
                                 f"{', '.join(repr(t) for t in _ITEM_TYPES)} (docs/api.md)", param="input")
        parts = item.get("content") if kind == "message" else None
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            if isinstance(part, dict) and isinstance(part.get("type"), str) and part["type"] not in _TEXT_PARTS:
                raise InvalidRequest(
                    f"input[{i}].content[{j}] is a content part of type '{part['type']}'; this service serves "
                    "text-only models: send the content as a string or as parts of type 'input_text'", param="input")
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        if isinstance(tool, dict) and isinstance(tool.get("type"), str) and tool["type"] != "function":
            raise InvalidRequest(f"tools[{i}] is a tool of type '{tool['type']}'; this service runs function tools "
                                 "only (type 'function'), which the client executes", param="tools")
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("type"), str) and choice["type"] != "function":
        raise InvalidRequest(f"a tool_choice of type '{choice['type']}' is not supported; send 'none', 'auto', "
                             "'required' or {'type': 'function', 'name': ...}", param="tool_choice")


def chat_messages(instructions: str | None, input_: str | list[InputItem]) -> list[dict[str, Any]]:
    """The chat conversation that `instructions` and `input` describe."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    items = [InputMessage(role="user", content=input_)] if isinstance(input_, str) else input_
    for item in items:
        last = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
        # One turn's reasoning, text and calls come as items in turn: one assistant message, as vLLM joins them.
        thought = last is not None and not last["content"] and "reasoning" in last
        if isinstance(item, InputMessage):
            if item.role == "assistant" and thought and last is not None and not last.get("tool_calls"):
                last["content"] = item.text()
            else:
                messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if last is not None and not last["content"] and (last.get("tool_calls") or thought):
                last.setdefault("tool_calls", []).append(call)  # parallel calls of one turn: one message
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, ReasoningItem):
            if last is not None and "reasoning" not in last:
                last["reasoning"] = item.text()
            else:
                messages.append({"role": "assistant", "content": None, "reasoning": item.text()})
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
    return messages
