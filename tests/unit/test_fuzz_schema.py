"""Property-based fuzzing of the HTTP API, in-process over the fake engine.

Two fuzzers:

* schemathesis reads the app's own OpenAPI document and generates requests for every
  operation, schema-valid ("positive") and schema-violating ("negative"). Each response is
  checked: never a 5xx (`not_a_server_error`), the documented content type
  (`content_type_conformance`), and every 4xx in exactly the OpenAI error shape.
* hypothesis builds chat-completion bodies field by field from arbitrary JSON values
  (NaN and the infinities, huge integers, lone surrogates, nested containers) and posts
  them as raw bytes; a 422 (FastAPI's own error shape) or a 5xx is a failure.

Both are derandomized, so CI sees the same cases every run; the counts are printed at the
end of the module (see docs/fuzzing.md for the numbers and how to run it).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import content_type_conformance

from app.config.app_config import parse_config
from app.engine.fake import FakeEngine
from app.host.engine_host import EngineHost
from app.http.ingress import create_app
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import MAX_MODEL_LEN, MODEL_ID, config_dict
from tests.support.fuzzing import declared_fields, say

# Examples per operation and generation mode: the whole module stays well under a minute.
BODY_EXAMPLES = 150  # the four POST operations, positive and negative each
LOOKUP_EXAMPLES = 50  # GET /v1/models/{model_id}
PLAIN_EXAMPLES = 5  # parameterless GETs: there is little to vary
CHAT_BODY_EXAMPLES = 400

FUZZ_SETTINGS = dict(derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck),
                     print_blob=True)

OPERATIONS = [
    ("POST", "/v1/chat/completions", BODY_EXAMPLES),
    ("POST", "/v1/completions", BODY_EXAMPLES),
    ("POST", "/v1/responses", BODY_EXAMPLES),
    ("POST", "/tokenize", BODY_EXAMPLES),
    ("POST", "/detokenize", BODY_EXAMPLES),
    ("POST", "/v1/embeddings", BODY_EXAMPLES),
    ("GET", "/v1/models/{model_id}", LOOKUP_EXAMPLES),
    ("GET", "/v1/models", PLAIN_EXAMPLES),
    ("GET", "/version", PLAIN_EXAMPLES),
    ("GET", "/livez", PLAIN_EXAMPLES),
    ("GET", "/health", PLAIN_EXAMPLES),
    ("GET", "/stats", PLAIN_EXAMPLES),
    ("GET", "/metrics", PLAIN_EXAMPLES),
]

EMBED_MODEL_ID = "fake-embed"

# What ran, for the summary: (label, mode) -> statuses seen.
TALLY: dict[tuple[str, str], Counter] = {}


class Fuzzed:
    """One app over one fake engine, driven through schemathesis' in-process ASGI client."""

    def __init__(self) -> None:
        # Two models: the generation routes' and /v1/embeddings' (an embedding model, Matryoshka, so `dimensions`
        # reaches the engine too).
        data = config_dict()
        data["models"].append({**config_dict(runner="embed")["models"][0], "id": EMBED_MODEL_ID})
        config = parse_config(data)
        self.engine = FakeEngine(max_model_len=MAX_MODEL_LEN)
        self.host = EngineHost(config.models[0], self.engine, config.service)
        self.embed_engine = FakeEngine(max_model_len=MAX_MODEL_LEN, matryoshka=True)
        self.embed_host = EngineHost(config.models[1], self.embed_engine, config.service)
        self.app = create_app(config, {MODEL_ID: self.host, EMBED_MODEL_ID: self.embed_host})
        self.schema = schemathesis.openapi.from_asgi("/openapi.json", self.app)
        self.declared = declared_fields(self.app.openapi())
        # One client, one event loop (schemathesis' shared portal) for every request of the module. It cuts
        # event streams after 20 events by default; read them whole (at most n * max_tokens = 512 here).
        self.client = asgi.get_client(self.app, max_stream_events=10_000)


@pytest.fixture(scope="module")
def fuzzed(request):
    started = time.monotonic()
    fuzzed = Fuzzed()  # EngineHost configures the app's logging, so quieten it afterwards
    quiet = logging.getLogger("app")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # thousands of access-log lines would only slow the run down
    yield fuzzed
    quiet.setLevel(level)
    _report(request, time.monotonic() - started)


def _report(request, elapsed: float) -> None:
    lines = ["", f"fuzz summary ({elapsed:.1f} s):"]
    total = 0
    for (label, mode), statuses in TALLY.items():
        n = sum(statuses.values())
        total += n
        lines.append(f"  {label:36s} {mode:10s} {n:5d} cases  statuses {dict(sorted(statuses.items()))}")
    lines.append(f"  total {total} generated cases")
    say(request, *lines)


# -- checks ------------------------------------------------------------------------------

def assert_still_healthy(fuzzed: Fuzzed) -> None:
    """After a run of cases: healthy, nothing left in the engine or the admission queue, and a normal
    request answers (each fuzz test ends with it, so it holds whatever order the tests run in)."""
    health = fuzzed.client.get("/health")
    assert health.status_code == 200, health.text
    for model_id in (MODEL_ID, EMBED_MODEL_ID):
        stats = fuzzed.client.get("/stats").json()[model_id]
        assert stats["engine"]["running"] == 0 and stats["admission"]["in_system"] == 0, stats
    assert not fuzzed.engine.running
    normal = fuzzed.client.post("/v1/chat/completions",
                                json={"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}]})
    assert normal.status_code == 200, normal.text
    assert normal.json()["choices"][0]["message"]["content"]


def openai_error_shape(ctx, response, case) -> None:
    """Every 4xx is {"error": {"message", "type", "param", "code"}} and nothing else; 422 never."""
    status = response.status_code
    if status == 422:
        raise AssertionError(f"422 (FastAPI's own validation shape) instead of a 400: {response.text[:300]}")
    if not 400 <= status < 500:
        return None
    assert_error_shape(status, response.headers.get("content-type", ""), response.content)
    return None


CHECKS = [not_a_server_error, content_type_conformance, openai_error_shape]


# Hypothesis leans towards the first choice (its "simplest"), so the deepest-reaching aim comes first.
AIMS = ("served model, declared fields only", "served model", "as generated")


def _aim(case, aim: str, declared: dict[str, set[str]]) -> None:
    """Most generated model names are random strings (a 404 at once), and most generated bodies carry
    unknown fields (a 400 naming the first): often send the served model, and sometimes only the fields
    the schema declares, so the rest of the body reaches validation, admission and the engine."""
    if aim == "as generated":
        return
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = EMBED_MODEL_ID if case.path == "/v1/embeddings" else MODEL_ID
        if aim == "served model, declared fields only":
            for name in [k for k in case.body if k not in declared.get(case.path, case.body.keys())]:
                del case.body[name]
    if case.path_parameters and "model_id" in case.path_parameters:
        case.path_parameters["model_id"] = MODEL_ID


# -- schemathesis: every operation, positive and negative --------------------------------

# Negative cases only where there is something to violate: a JSON body (a path segment is any string).
RUNS = [(m, p, n, GenerationMode.POSITIVE) for m, p, n in OPERATIONS] + \
       [(m, p, n, GenerationMode.NEGATIVE) for m, p, n in OPERATIONS if m == "POST"]


@pytest.mark.parametrize("method,path,examples,mode", RUNS, ids=[f"{mode.value}-{m} {p}" for m, p, _, mode in RUNS])
def test_schema_fuzz(fuzzed: Fuzzed, method: str, path: str, examples: int, mode: GenerationMode):
    operation = fuzzed.schema[path][method]
    tally = TALLY.setdefault((f"{method} {path}", mode.value), Counter())

    @settings(max_examples=examples, **FUZZ_SETTINGS)
    @given(case=operation.as_strategy(mode), aim=st.sampled_from(AIMS))
    def fuzz(case, aim):
        _aim(case, aim, fuzzed.declared)
        response = case.call(session=fuzzed.client)
        tally[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)

    fuzz()
    assert sum(tally.values()) >= 1
    assert_still_healthy(fuzzed)


# -- hypothesis: chat bodies from arbitrary JSON values ---------------------------------

# Any code point, lone surrogates (JSON carries them as escapes such as "\\ud800") and template-ish ones included.
_char = st.one_of(st.characters(), st.characters(categories=["Cs"]), st.sampled_from('\x00\n"\\<|>{}'))
_text = st.text(_char, max_size=40)
_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    _text,
)
_json = st.recursive(_scalars,
                     lambda inner: st.one_of(st.lists(inner, max_size=4),
                                             st.dictionaries(st.text(_char, max_size=12), inner, max_size=4)),
                     max_leaves=12)


_valid_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant"]),
     "content": st.one_of(_text,
                          st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), max_size=3))},
    optional={"name": st.text(max_size=10)},
)
_hostile_message = st.one_of(
    _json,
    st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["tool", "function", "", "USER"]), _json)},
                          optional={"content": _json, "name": _json, "tool_call_id": _json}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["image_url", "input_audio", "text"]), "image_url": _json}), min_size=1, max_size=2)}),
)

# Each field: values inside its contract, and hostile ones (out of range, wrong type, any JSON at all).
CHAT_FIELDS: dict[str, tuple[st.SearchStrategy, st.SearchStrategy]] = {
    "model": (st.just(MODEL_ID), st.one_of(st.sampled_from(["", "gpt-4o", MODEL_ID.upper(), MODEL_ID + " "]), _json)),
    "messages": (st.lists(_valid_message, min_size=1, max_size=4),
                 st.one_of(st.just([]), st.lists(_hostile_message, min_size=1, max_size=3), _json)),
    "temperature": (st.floats(0.1, 2),
                    st.one_of(st.floats(), st.floats(2.0001, 1e300), st.floats(-1e300, -0.0001), _json)),
    "top_p": (st.floats(0.01, 1), st.one_of(st.floats(), st.just(0), st.floats(1.0001, 10), _json)),
    "n": (st.integers(1, 4), st.one_of(st.integers(max_value=0), st.integers(min_value=5), _json)),
    "stop": (st.one_of(st.text(min_size=1, max_size=8), st.lists(st.text(min_size=1, max_size=8), max_size=2)),
             st.one_of(st.just(""), st.lists(st.text(max_size=300), min_size=3, max_size=6),
                       st.text(min_size=257, max_size=300), _json)),
    "seed": (st.integers(-(2**63), 2**63 - 1),  # vLLM's bounds: a torch int64
             st.one_of(st.integers(min_value=2**63), st.integers(max_value=-(2**63) - 1), _json)),
    "presence_penalty": (st.floats(-2, 2), st.one_of(st.floats(), _json)),
    "frequency_penalty": (st.floats(-2, 2), st.one_of(st.floats(), _json)),
    "stream": (st.booleans(), _json),
    "ignore_eos": (st.booleans(), _json),
    "max_tokens": (st.integers(1, 64), st.one_of(st.integers(max_value=0), st.integers(min_value=129), _json)),
    "logprobs": (st.booleans(), _json),
    "top_logprobs": (st.integers(0, 5), st.one_of(st.integers(max_value=-1), st.integers(min_value=6), _json)),
    "response_format": (
        st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
                  st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
                      {"name": st.text(min_size=1, max_size=8)}, optional={"schema": st.just({"type": "object"})})})),
        st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["json_schema", "xml", ""])}),
                  st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
                      {"name": st.text(max_size=70)}, optional={"schema": _json, "strict": _json})}),
                  _json)),
    "user": (st.text(max_size=10), _json),
    "stream_options": (st.fixed_dictionaries({"include_usage": st.booleans()}), _json),
    "max_completion_tokens": (st.integers(1, 64), _json),
    "tools": (st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["f", "g"])}, optional={"parameters": st.sampled_from([
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"type": "object", "properties": {"n": {"type": "integer", "minimum": 2}}}])})}), min_size=1, max_size=2),
              st.one_of(st.just([]), st.lists(st.fixed_dictionaries({"type": st.just("function")},
                                                                    optional={"function": _json}), max_size=2),
                        _json)),
    "tool_choice": (st.sampled_from(["none", "required", {"type": "function", "function": {"name": "f"}}]), _json),
    "parallel_tool_calls": (st.booleans(), _json),
    # vLLM's sampling extensions: in range (ids within the fake engine's 256-id vocabulary), and hostile
    "top_k": (st.integers(-1, 300), st.one_of(st.integers(max_value=-2), st.integers(min_value=2**31), _json)),
    "min_p": (st.floats(0, 1), st.one_of(st.floats(), st.floats(1.0001, 1e300), _json)),
    "min_tokens": (st.integers(0, 8), st.one_of(st.integers(max_value=-1), st.integers(min_value=33), _json)),
    "repetition_penalty": (st.floats(0.01, 2), st.one_of(st.floats(max_value=0), st.floats(), _json)),
    "stop_token_ids": (st.lists(st.integers(0, 255), max_size=4),
                       st.one_of(st.lists(st.integers(), min_size=1, max_size=70), _json)),
    "include_stop_str_in_output": (st.booleans(), _json),
    "skip_special_tokens": (st.booleans(), _json),
    "spaces_between_special_tokens": (st.booleans(), _json),
    "logit_bias": (st.dictionaries(st.integers(0, 255).map(str), st.floats(-100, 100), max_size=4),
                   st.one_of(st.dictionaries(st.one_of(_text, st.integers().map(str)), _json, min_size=1, max_size=4),
                             st.dictionaries(st.integers(0, 255).map(str), st.floats(), min_size=1, max_size=2),
                             _json)),
    "allowed_token_ids": (st.lists(st.integers(0, 255), min_size=1, max_size=4),
                          st.one_of(st.just([]), st.lists(st.integers(), min_size=1, max_size=4), _json)),
    "bad_words": (st.lists(st.text(min_size=1, max_size=8), max_size=3),
                  st.one_of(st.lists(_text, min_size=1, max_size=3), st.lists(st.text(min_size=257, max_size=260),
                                                                              min_size=1, max_size=1), _json)),
    "not_a_parameter": (st.nothing(), _json),
}
OPTIONAL_FIELDS = [k for k in CHAT_FIELDS if k not in ("model", "messages")]


@st.composite
def chat_bodies(draw) -> Any:
    """A body inside the contract, then 0 to 3 of its fields (present or not) made hostile; now and then
    any JSON value at all instead of an object."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_json)
    body = {"model": draw(CHAT_FIELDS["model"][0]), "messages": draw(CHAT_FIELDS["messages"][0])}
    for name in draw(st.lists(st.sampled_from(OPTIONAL_FIELDS), max_size=5, unique=True)):
        if name not in ("not_a_parameter", "stream_options", "max_completion_tokens"):  # valid only with others
            body[name] = draw(CHAT_FIELDS[name][0])
    for name in draw(st.lists(st.sampled_from(list(CHAT_FIELDS)), max_size=3, unique=True)):
        body[name] = draw(CHAT_FIELDS[name][1])
    return body


def _post_raw(fuzzed: Fuzzed, path: str, raw: bytes):
    return fuzzed.client.post(path, data=raw, headers={"content-type": "application/json"}, timeout=30)


def test_chat_bodies_from_arbitrary_json(fuzzed: Fuzzed):
    tally = TALLY.setdefault(("POST /v1/chat/completions (bodies)", "hypothesis"), Counter())

    @settings(max_examples=CHAT_BODY_EXAMPLES, **FUZZ_SETTINGS)
    @given(body=chat_bodies())
    def fuzz(body):
        raw = json.dumps(body, allow_nan=True).encode()  # NaN/Infinity as Python's json writes them
        response = _post_raw(fuzzed, "/v1/chat/completions", raw)
        tally[response.status_code] += 1
        status = response.status_code
        # never 422, never 5xx
        assert status in (200, 400, 404, 413), f"{status} for {raw[:300]!r}: {response.text[:300]}"
        if status != 200:
            assert_error_shape(status, response.headers.get("content-type", ""), response.content)
            return
        if response.headers["content-type"].startswith("text/event-stream"):
            assert response.text.endswith("data: [DONE]\n\n"), response.text[-300:]
            assert '"internal_error"' not in response.text, response.text[-300:]
        else:
            reply = response.json()
            assert reply["object"] == "chat.completion" and reply["choices"], reply

    fuzz()
    assert sum(tally.values()) >= CHAT_BODY_EXAMPLES // 2
    assert tally[200] > 0 and tally[400] > 0, tally  # both sides of validation were reached
    assert_still_healthy(fuzzed)
