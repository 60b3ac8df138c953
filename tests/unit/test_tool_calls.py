"""Tools and function calling on chat: the forcing schema (against vLLM's own builder), reading forced calls back
out of the text whole and streamed (against vLLM's own streaming extractor), the request checks, the prompt the
template gets, and the answers through the in-process stack (`required`, a named function, `auto` with a
configured parser, `none`), streamed and not, with the arguments validated against the tool's schema."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from types import SimpleNamespace

import jsonschema
import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChatRequest
from vllm.tool_parsers.streaming import extract_required_tool_call_streaming
from vllm.tool_parsers.utils import get_json_schema_from_tools

from app.config.model import LimitsConfig
from app.engine.interface import ChoiceDelta, GenerationDelta, GenerationParams, ToolCallDelta
from app.engine.vllm import from_vllm, refusals
from app.errors import InvalidRequest
from app.openai.answers import Responder
from app.openai.chat_messages import MAX_TOOLS, MAX_TOOLS_SCHEMA_CHARS
from app.openai.choice_shapes import ChatShape
from app.openai.tool_calls import ForcedCalls, forced_schema
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import MODEL_ID, chat_body, make_config
from tests.support.request_models import chat
from tests.support.responder import chunk_of
from tests.support.sse import parse

LIMITS = LimitsConfig(max_tokens=100, default_max_tokens=20)
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
           "required": ["city", "days"]}
TOOLS = [
    {"type": "function",
     "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "ping"}},
]
SCHEMAS = {"get_weather": WEATHER, "ping": {"type": "object", "properties": {}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


class _Raises:
    """pytest.raises(InvalidRequest) that also checks the parameter it names."""

    def __init__(self, param: str):
        self.param = param

    def __enter__(self):
        self.ctx = pytest.raises(InvalidRequest)
        self.info = self.ctx.__enter__()
        return self.info

    def __exit__(self, *exc):
        handled = self.ctx.__exit__(*exc)
        assert self.info.value.param == self.param, (self.info.value.param, str(self.info.value))
        return handled


# -- the forcing schema: vLLM's own, field for field ----------------------------------------------------------


DEFS_TOOL = {"type": "function", "function": {"name": "put", "parameters": {
    "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}}, "$defs": {"Item": {"type": "string"}}}}}


@pytest.mark.parametrize("tools", [TOOLS, [DEFS_TOOL, *TOOLS]], ids=["plain", "defs"])
@pytest.mark.parametrize("parallel", [None, True, False])
@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_the_forcing_schema_is_vllms(tools, parallel, choice):
    ours = chat(tools=tools, tool_choice=choice, parallel_tool_calls=parallel).to_params(LIMITS)
    theirs = VllmChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=json.loads(
        json.dumps(tools)), tool_choice=choice, parallel_tool_calls=parallel)
    assert ours.json_schema == get_json_schema_from_tools(theirs.tool_choice, theirs.tools, parallel)
    assert ours.json_schema_param == "tools" and ours.auto_tools is None


def test_forcing_replaces_response_format_as_in_vllm():
    p = chat(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}).to_params(LIMITS)
    assert p.json_schema == forced_schema([t["function"] for t in TOOLS], "required", None) and not p.json_object


def test_none_and_auto_force_nothing():
    p = chat(tools=TOOLS, tool_choice="none").to_params(LIMITS)
    assert p.json_schema is None and p.auto_tools is None
    p = chat(tools=TOOLS).to_params(LIMITS, tool_call_parser="hermes")  # no choice with tools: "auto"
    assert p.json_schema is None and p.auto_tools == tuple(TOOLS)


# -- reading forced calls back ------------------------------------------------------------------------------------


def _required_text(calls: list[tuple[str, dict]], pretty: bool) -> str:
    items = [{"name": name, "parameters": args} for name, args in calls]
    return json.dumps(items, indent=2 if pretty else None)


CALLS = [("get_weather", {"city": 'Pa"ris {[', "days": 3}), ("ping", {}), ("get_weather", {"city": "\\", "days": 1})]


@pytest.mark.parametrize("pretty", [False, True])
def test_required_calls_whole(pretty):
    calls = ForcedCalls("required").calls(_required_text(CALLS, pretty))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLS
    assert len({c.id for c in calls}) == 3 and all(c.id.startswith("call_") for c in calls)


@pytest.mark.parametrize("text", ["", "[", '[{"name": "ping", "parameters": {', '{"name": "ping"}', "[1]", "nope"])
def test_required_text_that_is_no_array_of_calls_has_none(text):
    assert ForcedCalls("required").calls(text) == []


def _streamed(forced: ForcedCalls, pieces: list[str]) -> dict[int, dict]:
    calls: dict[int, dict] = {}
    for piece in pieces:
        for d in forced.feed(piece):
            if d.id is not None:
                assert d.index not in calls and d.name
                calls[d.index] = {"id": d.id, "name": d.name, "arguments": d.arguments}
            else:
                calls[d.index]["arguments"] += d.arguments
    return calls


def _pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 30))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@pytest.mark.parametrize("seed", range(40))
def test_required_calls_streamed_in_any_pieces_are_the_whole_ones_and_vllms(seed):
    rng = random.Random(seed)
    text = _required_text(CALLS[: rng.randint(1, 3)], pretty=rng.random() < 0.5)
    pieces = _pieces(text, rng)
    streamed = _streamed(ForcedCalls("required"), pieces)
    whole = ForcedCalls("required").calls(text)
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed.values()] == \
        [(c.name, json.loads(c.arguments)) for c in whole]
    # vLLM's own extractor, on the same pieces, sends the same names and argument text
    theirs: dict[int, dict] = {}
    previous = ""
    for piece in pieces:
        delta, _ = extract_required_tool_call_streaming(previous_text=previous, current_text=previous + piece,
                                                        tool_call_idx=None, tool_call_id_type="random")
        previous += piece
        for tc in delta.tool_calls if delta else ():
            entry = theirs.setdefault(tc.index, {"name": tc.function.name, "arguments": ""})
            entry["arguments"] += tc.function.arguments or ""
    assert {i: (c["name"], c["arguments"]) for i, c in streamed.items()} == \
        {i: (c["name"], c["arguments"]) for i, c in theirs.items()}


def test_named_call_streamed_and_whole():
    forced = ForcedCalls("get_weather")
    first, *rest = [d for piece in ['{"ci', 'ty": "x", ', '"days": 2}'] for d in forced.feed(piece)]
    assert first.id and first.id.startswith("call_") and first.name == "get_weather" and first.arguments == '{"ci'
    assert all(d.id is None and d.name is None for d in rest)
    assert json.loads(first.arguments + "".join(d.arguments for d in rest)) == {"city": "x", "days": 2}
    (call,) = ForcedCalls("get_weather").calls('{"city": "x", "days": 2}')
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "x", "days": 2}


def test_the_responder_gives_forced_calls_the_openai_shape():
    r = Responder("id", MODEL_ID, ChatShape("required"), 1)
    text = _required_text(CALLS[:2], pretty=False)
    chunks = [chunk_of(r, GenerationDelta(choices=(ChoiceDelta(index=0, text=text[i:i + 4], num_tokens=1),)))
              for i in range(0, len(text), 4)]
    last = chunk_of(r, GenerationDelta(choices=(ChoiceDelta(index=0, text="", num_tokens=1, finish_reason="stop"),)))
    assert last is not None and last["choices"][0]["finish_reason"] == "tool_calls"
    sent = [c for c in chunks if c is not None]
    assert len(sent) < len(chunks)  # pieces that reveal nothing send no chunk
    assert sent[0]["choices"][0]["delta"]["role"] == "assistant"
    full = r.full()["choices"][0]
    assert full["finish_reason"] == "tool_calls" and full["message"]["content"] == ""
    assert [c["function"]["name"] for c in full["message"]["tool_calls"]] == ["get_weather", "ping"]


def test_auto_calls_found_by_the_engine_are_merged_and_end_with_tool_calls():
    r = Responder("id", MODEL_ID, ChatShape(), 1)
    chunk_of(r, GenerationDelta(choices=(ChoiceDelta(index=0, text="", num_tokens=1, tool_calls=(
        ToolCallDelta(index=0, id="call_a", name="ping"),)),)))
    chunk = chunk_of(r, GenerationDelta(choices=(ChoiceDelta(index=0, text="", num_tokens=1, finish_reason="stop",
                                                         tool_calls=(ToolCallDelta(index=0, arguments="{}"),)),)))
    assert chunk is not None
    assert chunk["choices"][0]["delta"] == {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}
    assert chunk["choices"][0]["finish_reason"] == "tool_calls"
    message = r.full()["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [{"id": "call_a", "type": "function", "function": {"name": "ping",
                                                                                       "arguments": "{}"}}]


# -- the request's checks --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, param", [
    ({"tools": []}, "tools"),
    ({"tools": [TOOLS[0]] * (MAX_TOOLS + 1)}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": NAMED}, "tool_choice"),
    ({"tools": TOOLS[1:], "tool_choice": NAMED}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "("}}}}}], "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "description": "x" * MAX_TOOLS_SCHEMA_CHARS}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$defs": {"A": {"type": "string"}}}}},
                {"type": "function", "function": {"name": "g", "parameters": {"$defs": {"A": {"type": "integer"}}}}}],
      "tool_choice": "required"}, "tools"),
])
def test_bad_tool_requests_are_400s_naming_the_parameter(kwargs, param):
    with _Raises(param):
        chat(**kwargs).to_params(LIMITS, tool_call_parser="hermes")


def test_auto_needs_the_models_parser():
    with _Raises("tool_choice") as info:
        chat(tools=TOOLS).to_params(LIMITS)
    assert "tool_call_parser" in str(info.value)
    with _Raises("tool_choice"):
        chat(tools=TOOLS, tool_choice="auto").to_params(LIMITS)
    assert chat(tools=TOOLS, tool_choice="none").to_params(LIMITS).json_schema is None


def test_completions_still_refuse_tools():
    from tests.support.request_models import completion

    with _Raises("tools"):
        completion(tools=TOOLS)


ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris?", "name": "alice"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": "not json"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
    {"role": "tool", "tool_call_id": "call_2", "content": "pong", "some_extra": 1},
]


def test_the_template_gets_the_conversation_as_vllm_gives_it():
    prompt = chat(messages=ROUND_TRIP, tools=TOOLS, tool_choice="none").to_prompt(LIMITS)
    assert prompt.tools == tuple(TOOLS)
    user, assistant, tool1, tool2 = prompt.messages
    assert user == {"role": "user", "content": "Weather in Paris?", "name": "alice"}
    assert assistant["content"] == ""  # null content is empty text, as vLLM renders it
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == [{"city": "Paris"}, {}]
    assert tool1 == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert "some_extra" not in tool2  # extra fields are accepted and left out, as vLLM leaves them out


# -- through the in-process stack --------------------------------------------------------------------------


def _assembled(events: list) -> tuple[dict[int, dict], str | None]:
    calls: dict[int, dict] = {}
    finish = None
    for e in events:
        if e == "[DONE]" or not e["choices"]:
            continue
        choice = e["choices"][0]
        finish = choice["finish_reason"] or finish
        for tc in choice["delta"].get("tool_calls", ()):
            if "id" in tc:
                assert tc["type"] == "function" and tc["id"].startswith("call_")
                calls[tc["index"]] = {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
            else:
                calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
    return calls, finish


def _valid(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("choice, finish", [("required", "tool_calls"), (NAMED, "stop")], ids=["required", "named"])
async def test_forced_calls_through_the_stack(client, choice, finish):
    body = chat_body(tools=TOOLS, tool_choice=choice, max_tokens=100)
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    choice0 = resp.json()["choices"][0]
    assert choice0["finish_reason"] == finish
    calls = choice0["message"]["tool_calls"]
    assert calls and all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    for c in calls:
        _valid(c["function"]["name"], c["function"]["arguments"])

    resp = await client.post("/v1/chat/completions", json={**body, "stream": True})
    assert resp.status_code == 200
    streamed, streamed_finish = _assembled(parse(resp.text))
    assert streamed_finish == finish
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed.values()] == \
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


async def test_a_two_turn_round_trip(client):
    first = (await client.post("/v1/chat/completions", json=chat_body(
        "Weather in Paris?", tools=TOOLS, tool_choice=NAMED))).json()["choices"][0]["message"]
    call = first["tool_calls"][0]
    messages = [{"role": "user", "content": "Weather in Paris?"}, first,
                {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    resp = await client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": messages, "tools": TOOLS,
                                                           "tool_choice": "none"})
    assert resp.status_code == 200, resp.text
    answer = resp.json()["choices"][0]
    assert answer["finish_reason"] == "stop" and answer["message"]["content"] and "tool_calls" not in answer["message"]


async def test_auto_with_a_configured_parser(make_stack):
    stack = make_stack(config=make_config(engine={"tool_call_parser": "hermes"}))
    resp = await stack.client.post("/v1/chat/completions", json=chat_body(tools=TOOLS))
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    _valid(call["function"]["name"], call["function"]["arguments"])
    resp = await stack.client.post("/v1/chat/completions", json=chat_body(tools=TOOLS, stream=True))
    streamed, finish = _assembled(parse(resp.text))
    assert finish == "tool_calls" and [c["name"] for c in streamed.values()] == ["get_weather"]


@pytest.mark.parametrize("body, param", [
    (chat_body(tools=TOOLS), "tool_choice"),
    (chat_body(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
               tool_choice="required"), "tools"),
    (chat_body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (chat_body(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
    (chat_body(tools=[{"type": "function"}]), "tools"),
    (chat_body(messages=[{"role": "tool", "content": 5}]), "messages"),
])
async def test_bad_tool_bodies_are_openai_shaped_400s(client, body, param):
    for stream in (False, True):
        resp = await client.post("/v1/chat/completions", json={**body, "stream": stream})
        error = assert_error_shape(resp.status_code, resp.headers.get("content-type"), resp.content)
        assert resp.status_code == 400 and error["type"] == "invalid_request_error"
        assert error["param"] == param or (error["param"] or "").startswith(param), error


def test_an_engine_refusal_of_a_forcing_schema_names_tools():
    params = GenerationParams(max_tokens=4, json_schema={"type": "array"}, json_schema_param="tools")
    refusal = refusals.refusal(ValueError("grammar failed"), params)
    assert isinstance(refusal, InvalidRequest) and refusal.param == "tools"
    plain = refusals.refusal(ValueError("grammar failed"), GenerationParams(max_tokens=4, json_schema={}))
    assert not isinstance(plain, InvalidRequest)


class _Vocab:
    """What vLLM's Hermes and Llama 3 JSON parsers ask of a tokenizer."""

    def get_vocab(self) -> dict[str, int]:
        return {"<tool_call>": 5, "</tool_call>": 6, "<|python_tag|>": 7}


def test_auto_calls_through_vllms_hermes_parser():
    from app.engine.vllm.tool_parsing import AutoToolCalls, parser_class

    parser = AutoToolCalls(parser_class("hermes"), _Vocab(), tuple(TOOLS))
    assert parser.adjust(True) is False  # Hermes needs its special tokens in the text, as vLLM lets it say
    text = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>'
    pieces = [parser.feed(text[i:i + 7], [1]) for i in range(0, len(text), 7)]
    content = "".join(c for c, _ in pieces)
    calls = [d for _, ds in pieces for d in ds]
    assert content.strip() == "Sure."
    assert calls[0].id and calls[0].id.startswith("call_") and calls[0].name == "get_weather"
    assert all(d.id is None and d.name is None for d in calls[1:])
    _valid("get_weather", "".join(d.arguments for d in calls))


PARSED = {  # what a model writes for two calls, in the format of the parser that reads it
    "hermes": 'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
              '</tool_call>\n<tool_call>{"name": "get_weather", "arguments": {"city": "Lyon"}}</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
                   '{"name": "get_weather", "parameters": {"city": "Lyon"}}',
    "pythonic": "[get_weather(city='Paris', days=2), get_weather(city='Lyon')]",
}


@pytest.mark.parametrize("name", PARSED)
def test_a_parser_that_reads_again_what_the_failed_replica_s_read_goes_on_as_that_one_would(name):
    """A tool_choice "auto" answer continued on another replica (app/engine/continuation.py): after any piece, a
    new parser given the pieces read before (`parser_replay`) answers the rest as the first would have, call ids
    included (a call already named is not named again); a parser that did not read them does not."""
    from app.engine.vllm.tool_parsing import auto_tool_calls, parser_class

    def answers(parser, pieces):
        outs = [parser.feed(text, list(ids)) for text, ids in pieces]
        return [(content, [(d.index, d.name, d.arguments, d.id is not None) for d in calls]) for content, calls in outs]

    text, rng = PARSED[name], random.Random(name)
    cuts = sorted(rng.sample(range(1, len(text)), 24))
    pieces = [(text[a:b], (i,)) for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(text)], strict=True))]
    params = GenerationParams(max_tokens=64, auto_tools=tuple(TOOLS))
    (first,), _ = auto_tool_calls(parser_class(name), _Vocab(), params)
    whole = answers(first, pieces)
    assert sum(len(calls) for _, calls in whole) >= 2
    fresh_differs = 0
    for k in range(1, len(pieces)):
        (resumed,), _ = auto_tool_calls(parser_class(name), _Vocab(), replace(params, parser_replay=tuple(pieces[:k])))
        assert answers(resumed, pieces[k:]) == whole[k:], f"continued after piece {k}"
        (fresh,), _ = auto_tool_calls(parser_class(name), _Vocab(), params)
        fresh_differs += answers(fresh, pieces[k:]) != whole[k:]
    assert fresh_differs >= len(pieces) // 2


@pytest.mark.parametrize("include", [False, True], ids=["stop cut", "stop kept"])
def test_stop_strings_beside_a_parser_are_matched_before_it_and_go_on_across_a_cut(include):
    """With tool_choice "auto" the replica matches the stop strings before the parser, as vLLM's detokenizer does
    before its serving layer's parser (the text that may start one held back), and asks the engine for none. A
    continuation reads the steps before again: after any piece the rest is what one replica gives, and a stop
    string spanning the cut still ends the choice."""
    from app.engine.vllm.tool_parsing import auto_tool_calls, parser_class

    text = PARSED["hermes"]  # the stop string cuts its second call
    params = GenerationParams(max_tokens=64, auto_tools=tuple(TOOLS), stop=("Lyo", "nowhere"),
                              include_stop_str_in_output=include)
    pieces = [(text[i:i + 5], (i,)) for i in range(0, len(text), 5)]

    def answers(parser, pieces):
        out = []
        for piece, ids in pieces:
            if parser.ended:
                break
            d = parser.read(ChoiceDelta(index=0, text=piece, num_tokens=len(ids)), list(ids))
            out.append((d.text, [(c.index, c.name, c.arguments, c.id is not None) for c in d.tool_calls],
                        d.finish_reason, d.stop_reason, d.parsed_text))
        return out

    (first,), engine_params = auto_tool_calls(parser_class("hermes"), _Vocab(), params)
    assert engine_params.stop == () and engine_params.skip_special_tokens is False
    whole = answers(first, pieces)
    assert whole[-1][2:4] == ("stop", "Lyo") and len(whole) < len(pieces)
    assert "".join(a[0] for a in whole).strip() == "Let me check."
    arguments = "".join(c[2] or "" for a in whole for c in a[1])
    assert "Paris" in arguments and ("Lyo" in arguments) == include
    for k in range(1, len(whole)):
        resumed_params = replace(params, parser_replay=tuple(pieces[:k]))
        (resumed,), _ = auto_tool_calls(parser_class("hermes"), _Vocab(), resumed_params)
        assert answers(resumed, pieces[k:]) == whole[k:], f"continued after piece {k}"


def test_beam_search_beside_a_parser_ignores_stop_strings_as_vllm_does():
    from app.engine.vllm.tool_parsing import auto_tool_calls, parser_class

    params = GenerationParams(max_tokens=8, n=2, beam_search=True, auto_tools=tuple(TOOLS), stop=("Sure",))
    parsers, _ = auto_tool_calls(parser_class("hermes"), _Vocab(), params)
    d = parsers[0].read(ChoiceDelta(index=0, text="Sure. ", num_tokens=2, finish_reason="length"), [1, 2])
    assert (d.text, d.finish_reason, d.stop_reason) == ("Sure. ", "length", None)


def test_an_unknown_parser_name_fails_the_engine_start():
    from app.engine.vllm.tool_parsing import parser_class

    with pytest.raises(ValueError, match="hermes"):
        parser_class("no-such-parser")


def test_the_vllm_engine_turns_parsed_calls_into_neutral_deltas():
    from vllm.outputs import CompletionOutput

    from app.engine.vllm.tool_parsing import AutoToolCalls, parser_class

    parsers = [AutoToolCalls(parser_class("hermes"), _Vocab(), tuple(TOOLS))]
    text = '<tool_call>{"name": "ping", "arguments": {}}</tool_call>'
    calls = []
    for i in range(0, len(text), 9):
        out = CompletionOutput(index=0, text=text[i:i + 9], token_ids=[1], cumulative_logprob=None, logprobs=None,
                               finish_reason="stop" if i + 9 >= len(text) else None)
        (delta,) = from_vllm.step_choices(SimpleNamespace(outputs=[out]), GenerationParams(max_tokens=9), parsers)
        assert delta.text == "" and delta.num_tokens == 1
        calls += delta.tool_calls
    assert calls[0].name == "ping" and calls[0].id is not None
    assert json.loads("".join(c.arguments for c in calls)) == {}
    assert delta.finish_reason == "stop"


async def test_langchain_binds_tools(stack):
    """LangChain's OpenAI chat model with bound tools (as agent frameworks use it), in-process: a forced call
    comes back as an AIMessage tool call, and the tool's answer goes back for the reply."""
    import httpx
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=stack.app))
    llm = ChatOpenAI(base_url="http://test/v1", api_key="x", model=MODEL_ID, max_retries=0, http_async_client=http,
                     max_tokens=60)
    bound = llm.bind_tools(TOOLS, tool_choice="get_weather", parallel_tool_calls=False)
    question = HumanMessage("What is the weather in Paris?")
    reply = await bound.ainvoke([question])
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(call["args"], WEATHER)
    answer = await llm.ainvoke([question, reply, ToolMessage("sunny", tool_call_id=call["id"])])
    assert answer.content and not answer.tool_calls
    await http.aclose()
