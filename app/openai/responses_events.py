"""The Responses API's output: the Response object and its stream events (`response.created`,
`response.output_text.delta`, `response.completed`, ...), in the shapes of the openai SDK's types.

A Responses request is served as a chat completion (app/openai/responses_api.py), so this builds on chat's
`Responder`: each chat chunk (text, or tool-call deltas, already read out of forced or parsed output) becomes the
Responses events it amounts to, and the whole chat completion becomes the Response. No HTTP in it; the route
frames the events (app/http/sse.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from app.engine.interface import Admitted, GenerationDelta
from app.openai.answers import Responder


@dataclass
class _Call:
    item_id: str
    call_id: str
    name: str
    output_index: int
    arguments: str = ""


@dataclass
class ResponsesWriter:
    """One response. `settings` are the request's own (echoed in the Response object, as OpenAI does)."""

    chat: Responder
    settings: dict[str, Any]
    given_id: str | None = None  # vLLM's `request_id`: the response's id as the client named it
    named_events = True  # each SSE event also names its type (`event: response.created`), as OpenAI sends it
    ends_with_done = False  # no `data: [DONE]` in the Responses API
    created_at: int = field(default_factory=lambda: int(time.time()))
    _sequence: int = 0
    _output: list[dict[str, Any]] = field(default_factory=list)  # the output items, as they stand
    _message: dict[str, Any] | None = None  # the open message item, while text arrives
    _calls: dict[int, _Call] = field(default_factory=dict)  # open function calls, by chat's call index
    _finish: str | None = None

    @property
    def request_id(self) -> str:
        return self.chat.request_id

    @property
    def _id(self) -> str:
        return "resp_" + self.chat.request_id.split("-", 1)[-1]

    def admitted(self, item: Admitted, *more: Admitted) -> None:
        self.chat.admitted(item, *more)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _response(self, status: str) -> dict[str, Any]:
        incomplete = status == "incomplete"
        out = {
            "id": self.given_id or self._id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.chat.model,
            "output": [dict(item) for item in self._output],
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            **self.settings,
            "usage": None,
        }
        if status != "in_progress":
            usage = self.chat.usage()
            out["usage"] = {
                "input_tokens": usage["prompt_tokens"],
                # always, as vLLM's Responses usage says it (chat's needs `prompt_tokens_details` on)
                "input_tokens_details": {"cached_tokens": self.chat.cached_tokens},
                "output_tokens": usage["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["total_tokens"],
            }
        return out

    @property
    def _status(self) -> str:
        return "incomplete" if self._finish == "length" else "completed"

    # -- a stream ---------------------------------------------------------------------------------------------

    def opening(self) -> list[dict[str, Any]]:
        response = self._response("in_progress")
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def events(self, delta: GenerationDelta) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for choice in (chunk["choices"][0] for chunk in self.chat.chunks(delta)):
            text = choice["delta"].get("content")
            if text:
                out += self._text(text)
            for call in choice["delta"].get("tool_calls", ()):
                out += self._call(call)
            if choice["finish_reason"] is not None:
                self._finish = choice["finish_reason"]
                out += self._close_all()
        return out

    def _text(self, text: str) -> list[dict[str, Any]]:
        out = []
        if self._message is None:
            self._message = {"type": "message", "id": "msg_" + self._id[5:], "status": "in_progress",
                             "role": "assistant", "content": []}
            self._output.append(self._message)
            out.append(self._event("response.output_item.added", output_index=len(self._output) - 1,
                                   item=dict(self._message, content=[])))
            self._message["content"].append({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            out.append(self._event("response.content_part.added", item_id=self._message["id"],
                                   output_index=len(self._output) - 1, content_index=0,
                                   part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        part = self._message["content"][0]
        part["text"] += text
        out.append(self._event("response.output_text.delta", item_id=self._message["id"],
                               output_index=self._output.index(self._message), content_index=0, delta=text,
                               logprobs=[]))
        return out

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        function = call.get("function") or {}
        if "id" in call:
            open_call = _Call(item_id="fc_" + call["id"].removeprefix("call_"), call_id=call["id"],
                              name=function.get("name") or "", output_index=len(self._output))
            self._calls[call["index"]] = open_call
            self._output.append(self._call_item(open_call, "in_progress"))
            out.append(self._event("response.output_item.added", output_index=open_call.output_index,
                                   item=self._call_item(open_call, "in_progress")))
        open_call = self._calls[call["index"]]
        arguments = function.get("arguments") or ""
        if arguments:
            open_call.arguments += arguments
            self._output[open_call.output_index] = self._call_item(open_call, "in_progress")
            out.append(self._event("response.function_call_arguments.delta", item_id=open_call.item_id,
                                   output_index=open_call.output_index, delta=arguments))
        return out

    @staticmethod
    def _call_item(call: _Call, status: str) -> dict[str, Any]:
        return {"type": "function_call", "id": call.item_id, "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments, "status": status}

    def _close_all(self) -> list[dict[str, Any]]:
        out = []
        status = self._status
        if self._message is not None:
            index = self._output.index(self._message)
            part = self._message["content"][0]
            out.append(self._event("response.output_text.done", item_id=self._message["id"], output_index=index,
                                   content_index=0, text=part["text"], logprobs=[]))
            out.append(self._event("response.content_part.done", item_id=self._message["id"], output_index=index,
                                   content_index=0, part=dict(part)))
            self._message["status"] = status
            out.append(self._event("response.output_item.done", output_index=index, item=dict(self._message)))
        for call in self._calls.values():
            out.append(self._event("response.function_call_arguments.done", item_id=call.item_id,
                                   output_index=call.output_index, arguments=call.arguments))
            self._output[call.output_index] = self._call_item(call, status)
            out.append(self._event("response.output_item.done", output_index=call.output_index,
                                   item=self._call_item(call, status)))
        return out

    def closing(self) -> list[dict[str, Any]]:
        status = self._status
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return [self._event(kind, response=self._response(status))]

    def error_events(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        error = body.get("error", {})
        return [self._event("error", code=error.get("code") or error.get("type"), message=error.get("message"),
                            param=error.get("param"))]

    # -- a body -------------------------------------------------------------------------------------------------

    async def collect(self, stream: AsyncGenerator[GenerationDelta, None]) -> dict[str, Any]:
        full = await self.chat.collect(stream)
        choice = full["choices"][0]
        message = choice["message"]
        self._finish = choice["finish_reason"]
        status = self._status
        if message.get("content"):
            self._output.append({"type": "message", "id": "msg_" + self._id[5:], "status": status,
                                 "role": "assistant", "content": [{"type": "output_text", "text": message["content"],
                                                                   "annotations": [], "logprobs": []}]})
        for call in message.get("tool_calls", ()):
            self._output.append({"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"),
                                 "call_id": call["id"], "name": call["function"]["name"],
                                 "arguments": call["function"]["arguments"], "status": status})
        return self._response(status)
