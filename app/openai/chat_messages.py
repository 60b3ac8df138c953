"""A chat request's messages and tools on the wire (OpenAI's shapes, with vLLM's extensions), each rendering itself
for the chat template; the tools' bounds and schema checks."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema  # a dependency of ray; checks tool schemas before the engine compiles them
from pydantic import BaseModel, ConfigDict, Field

from app.errors import InvalidRequest
from app.openai.structured_outputs import checked_schema

# Bounds on tools (vLLM has none): every tool's schema goes into the chat template, and with a forced choice into a
# grammar the engine compiles per request.
MAX_TOOLS = 128
MAX_TOOL_NAME_CHARS = 64  # OpenAI's limit
MAX_TOOLS_SCHEMA_CHARS = 65_536  # the tools' parameter schemas together, as compact JSON
MAX_ROLE_CHARS = 64  # a role is a word of the chat template's; vLLM has no bound


class ContentPart(BaseModel):
    """A part of a message's content. Only text is served (the models are text-only); a part of another type (an
    image, audio, a file) is refused by name when the prompt is rendered (`ChatMessage.check_parts`), rather than by
    pydantic's dump of every type the part failed to match."""

    model_config = ConfigDict(extra="allow")  # as vLLM, which reads `type` and `text` only
    type: str = Field(..., max_length=64)
    text: str | None = None


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
    # Extra fields are accepted and left out of the prompt (an assistant's `reasoning` aside), as vLLM does.
    model_config = ConfigDict(extra="allow")
    # Any role, as vLLM takes it (its custom message): the chat template decides what a role it does not know means.
    role: str = Field(..., min_length=1, max_length=MAX_ROLE_CHARS)
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool

    def check_parts(self, index: int) -> None:
        """Raises the 400 for a content part that is not text (the message's `index` names it)."""
        for j, part in enumerate(self.content if isinstance(self.content, list) else ()):
            if part.type != "text":
                raise InvalidRequest(
                    f"messages[{index}].content[{j}] is a content part of type '{part.type}'; this service serves "
                    "text-only models: send the content as a string or as parts of type 'text'", param="messages")
            if part.text is None:
                raise InvalidRequest(f"messages[{index}].content[{j}] is a text part without 'text'",
                                     param="messages")

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content)
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it: content as text (null is ""), and only the fields vLLM keeps."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.role == "assistant" and self.tool_calls:
            out["tool_calls"] = [c.for_template() for c in self.tool_calls]
        reasoning = (self.model_extra or {}).get("reasoning")
        if self.role == "assistant" and reasoning is not None:  # interleaved thinking, under both of vLLM's names
            out["reasoning"] = out["reasoning_content"] = reasoning
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


def check_tool_schemas(tools: list[ChatTool]) -> None:
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
            checked_schema(parameters)
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
