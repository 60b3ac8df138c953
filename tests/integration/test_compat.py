"""The OpenAI API surface beyond plain chat, through the openai SDK against the real stack.

Each supported parameter has a test that would fail were the parameter ignored (a
control request without it gives a different answer); each unsupported one is a 400
that names it. The basics (plain chat, stop, max_tokens, echo, n with one seed, the
raw SSE framing, json_schema with a streamed bad schema) are in test_api.py.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs
from openai.types.completion_choice import Logprobs as CompletionLogprobs

from tests.support.service import API_KEY, MODEL

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
# The greedy answer to this is "apple" 40 times over: a generation that the penalties must change.
REPEAT = [{"role": "user", "content": "Repeat the word 'apple' twenty times, separated by spaces."}]
MAX_LOGPROBS = 5  # limits.max_logprobs, the default
EOS = "<|im_end|>"  # SmolLM2's end of a chat turn, as vLLM decodes it in logprobs


def bad_request(call, **kwargs) -> dict:
    """The error object of the 400 that `call(**kwargs)` must raise."""
    with pytest.raises(openai.BadRequestError) as err:
        call(**kwargs)
    assert err.value.status_code == 400
    return err.value.body


def chat_text(client, messages=QUESTION, **kwargs) -> str:
    kwargs.setdefault("max_tokens", 20)
    return client.chat.completions.create(model=MODEL, messages=messages, **kwargs).choices[0].message.content


# -- logprobs ------------------------------------------------------------------


def test_chat_logprobs_are_typed_and_spell_the_content(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20,
                                       logprobs=True, top_logprobs=3)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"  # ended at end-of-sequence: that token is not in the text
    assert isinstance(choice.logprobs, ChoiceLogprobs)
    entries = choice.logprobs.content
    assert entries and all(isinstance(e, ChatCompletionTokenLogprob) for e in entries)
    # The end-of-sequence token that ended it is listed last, as vLLM's server lists it; the rest spell the text.
    assert entries[-1].token == EOS and "".join(e.token for e in entries[:-1]) == choice.message.content
    for e in entries:
        assert e.logprob <= 0
        assert e.bytes == list(e.token.encode("utf-8"))
        assert len(e.top_logprobs) == 3
        ranked = [t.logprob for t in e.top_logprobs]
        assert ranked == sorted(ranked, reverse=True) and all(v <= 0 for v in ranked)
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob)  # greedy

    # Without the parameter there are none; logprobs without top_logprobs has no alternatives.
    without = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=5)
    assert without.choices[0].logprobs is None
    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=5,
                                           logprobs=True).choices[0]
    assert [e.token for e in plain.logprobs.content] == [e.token for e in entries[:5]]
    assert all(e.top_logprobs == [] for e in plain.logprobs.content)


def test_chat_logprobs_stream_with_each_chunk(client):
    full = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20,
                                          logprobs=True, top_logprobs=2).choices[0]
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20,
                                                 logprobs=True, top_logprobs=2, stream=True))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    streamed = []
    for c in chunks:
        for choice in c.choices:
            assert isinstance(choice.logprobs, ChunkLogprobs)
            assert "".join(e.token for e in choice.logprobs.content if e.token != EOS) == (choice.delta.content or "")
            assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in choice.logprobs.content)
            streamed.extend(choice.logprobs.content)
    assert "".join(e.token for e in streamed[:-1]) == full.message.content and streamed[-1].token == EOS
    assert [e.token for e in streamed] == [e.token for e in full.logprobs.content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in full.logprobs.content], abs=1e-3)


def test_top_logprobs_over_the_cap_is_a_400_naming_it(client):
    err = bad_request(client.chat.completions.create, model=MODEL, messages=QUESTION, max_tokens=2,
                      logprobs=True, top_logprobs=MAX_LOGPROBS + 1)
    assert err["param"] == "top_logprobs" and "top_logprobs" in err["message"] and str(MAX_LOGPROBS) in err["message"]
    at_cap = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, logprobs=True,
                                            top_logprobs=MAX_LOGPROBS)
    assert all(len(e.top_logprobs) == MAX_LOGPROBS for e in at_cap.choices[0].logprobs.content)


def test_completion_logprobs_cover_every_token(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=6, logprobs=2)
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    lp = choice.logprobs
    assert isinstance(lp, CompletionLogprobs)
    n = r.usage.completion_tokens
    assert n == 6
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert "".join(lp.tokens) == choice.text
    for token, logprob, top, offset in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset, strict=True):
        assert logprob <= 0
        assert choice.text[offset:offset + len(token)] == token
        assert 1 <= len(top) <= 2 and top[token] == pytest.approx(logprob)  # greedy: the chosen token is the top one
    without = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=2)
    assert without.choices[0].logprobs is None

    err = bad_request(client.completions.create, model=MODEL, prompt=PROMPT, max_tokens=2, logprobs=MAX_LOGPROBS + 1)
    assert err["param"] == "logprobs" and "logprobs" in err["message"]


def test_completion_logprob_offsets_index_the_returned_text(client):
    """text_offset points into the text the client gets: with `echo` the prompt's tokens come first (vLLM's: the
    first without a logprob) and the offsets count from the echoed prompt's start; across stream chunks too."""
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=4, logprobs=1,
                                       echo=True).choices[0]
    assert echoed.text.startswith(PROMPT) and echoed.finish_reason == "length"
    for token, offset in zip(echoed.logprobs.tokens, echoed.logprobs.text_offset, strict=True):
        assert echoed.text[offset:offset + len(token)] == token
    assert echoed.logprobs.text_offset[0] == 0 and echoed.logprobs.token_logprobs[0] is None
    assert "".join(echoed.logprobs.tokens) == echoed.text

    text, tokens, offsets = "", [], []
    stream = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=6, logprobs=1, stream=True)
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.text
            tokens += choice.logprobs.tokens
            offsets += choice.logprobs.text_offset
    assert len(tokens) == 6
    assert [text[o:o + len(t)] for t, o in zip(tokens, offsets, strict=True)] == tokens
    assert offsets == sorted(offsets) and offsets[0] == 0


# -- sampling parameters -----------------------------------------------------------


def test_n_choices_are_distinct_samples_in_both_forms(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=1.0, max_tokens=12, n=3)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1
    assert 3 <= r.usage.completion_tokens <= 3 * 12  # usage counts the tokens of every choice

    texts: dict[int, str] = {}
    finished: dict[int, str] = {}
    for chunk in client.completions.create(model=MODEL, prompt=PROMPT, temperature=1.0, max_tokens=8, n=2, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert sorted(texts) == [0, 1] and sorted(finished) == [0, 1]
    assert texts[0] != texts[1]


def test_seed_repeats_a_sample_and_another_seed_changes_it(client):
    first = chat_text(client, temperature=1.0, max_tokens=12, seed=7)
    assert chat_text(client, temperature=1.0, max_tokens=12, seed=7) == first
    others = {chat_text(client, temperature=1.0, max_tokens=12, seed=s) for s in (8, 9)}
    assert others - {first}, "a different seed gave the same sample"


def test_temperature_zero_is_deterministic_whatever_the_seed(client):
    greedy = chat_text(client, temperature=0)
    assert "Paris" in greedy
    assert chat_text(client, temperature=0, seed=1) == greedy
    assert chat_text(client, temperature=0, seed=2) == greedy
    # The control: sampling with the same seeds does not give the greedy answer every time.
    assert {chat_text(client, temperature=1.5, seed=s) for s in (1, 2)} != {greedy}


def test_small_top_p_samples_the_greedy_answer(client):
    greedy = chat_text(client, temperature=0, max_tokens=16)
    assert chat_text(client, temperature=1.0, max_tokens=16, seed=7) != greedy  # this seed samples something else...
    # ...unless only the top token is left
    assert chat_text(client, temperature=1.0, max_tokens=16, seed=7, top_p=0.01) == greedy


@pytest.mark.parametrize("penalty", ["presence_penalty", "frequency_penalty"])
def test_penalties_change_a_repetitive_generation(client, penalty):
    base = chat_text(client, REPEAT, temperature=0, max_tokens=40)
    assert base.lower().count("apple") >= 10  # the prompt does repeat itself
    penalised = chat_text(client, REPEAT, temperature=0, max_tokens=40, **{penalty: 1.5})
    assert penalised != base
    assert penalised.lower().count("apple") < base.lower().count("apple")


# -- completions-only parameters ---------------------------------------------------


def test_suffix_and_best_of_are_refused_by_name(client):
    err = bad_request(client.completions.create, model=MODEL, prompt=PROMPT, max_tokens=2, suffix=" end.")
    assert err["param"] == "suffix" and "suffix" in err["message"] and err["code"] == "unsupported_parameter"
    err = bad_request(client.completions.create, model=MODEL, prompt=PROMPT, max_tokens=2, best_of=2)
    assert err["param"] == "best_of" and "best_of" in err["message"] and err["code"] == "unsupported_parameter"
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, best_of=1).usage.completion_tokens == 1


# -- structured output ---------------------------------------------------------------


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def test_json_object_makes_the_answer_json(client):
    ask = [{"role": "user", "content": "What is the capital of France? Reply with JSON."}]
    assert not _parses(chat_text(client, ask, temperature=0, max_tokens=40))  # unconstrained, it writes prose
    r = client.chat.completions.create(model=MODEL, messages=ask, temperature=0, max_tokens=40,
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_json_schema_answer_validates_against_the_schema(client):
    schema = {"type": "object",
              "properties": {"capital": {"type": "string", "enum": ["Paris", "London", "Berlin"]},
                             "is_large": {"type": "boolean"}},
              "required": ["capital", "is_large"], "additionalProperties": False}
    assert not _parses(chat_text(client, temperature=0, max_tokens=40))
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=40,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "facts", "schema": schema}})
    data = json.loads(r.choices[0].message.content)
    jsonschema.validate(data, schema)
    assert data["capital"] == "Paris"


def test_uncompilable_schema_is_a_400_and_the_service_goes_on(client):
    bad = {"type": "object", "properties": {"a": {"type": "nonsense"}}}
    err = bad_request(client.chat.completions.create, model=MODEL, messages=QUESTION, max_tokens=5,
                      response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}})
    assert err["param"] == "response_format"
    assert "Paris" in chat_text(client, temperature=0)


# -- tokenizer and model endpoints ---------------------------------------------------------


def test_tokenize_and_detokenize_round_trip_in_vllm_shapes(client, http):
    text = "Hello world, the capital of France is Paris."
    t = http.post("/tokenize", json={"model": MODEL, "prompt": text})
    assert t.status_code == 200
    body = t.json()
    assert set(body) == {"count", "max_model_len", "tokens"}
    assert body["count"] == len(body["tokens"]) > 0 and all(isinstance(i, int) for i in body["tokens"])
    assert body["max_model_len"] == client.models.retrieve(MODEL).max_model_len == 2048
    d = http.post("/detokenize", json={"model": MODEL, "tokens": body["tokens"]})
    assert d.status_code == 200 and d.json() == {"prompt": text}
    # The same ids are a prompt the completions endpoint reads as that text.
    echoed = client.completions.create(model=MODEL, prompt=body["tokens"], temperature=0, max_tokens=1, echo=True)
    assert echoed.choices[0].text.startswith(text) and echoed.usage.prompt_tokens == body["count"]

    chat = http.post("/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": text}]}).json()
    assert set(chat) == {"count", "max_model_len", "tokens"} and chat["count"] == len(chat["tokens"])
    assert chat["count"] > body["count"]  # the chat template wraps the text
    assert text in http.post("/detokenize", json={"model": MODEL, "tokens": chat["tokens"]}).json()["prompt"]

    r = http.post("/tokenize", json={"model": MODEL, "prompt": text, "messages": QUESTION})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_models_retrieve_and_unknown_id(client):
    model = client.models.retrieve(MODEL)
    assert isinstance(model, Model) and model.id == MODEL and model.object == "model" and model.owned_by
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.status_code == 404 and err.value.body["code"] == "model_not_found"


# -- parameters refused or ignored ---------------------------------------------------------


TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.mark.parametrize("name, kwargs", [
    ("functions", {"functions": [TOOL["function"]]}),  # OpenAI's deprecated form of tools
    ("prediction", {"prediction": {"type": "content", "content": "Paris"}}),
    ("foo", {"extra_body": {"foo": 1}}),
])
def test_unsupported_parameters_are_a_400_naming_them(client, name, kwargs):
    err = bad_request(client.chat.completions.create, model=MODEL, messages=QUESTION, max_tokens=2, **kwargs)
    assert err["param"] == name and name in err["message"]
    if name != "foo":
        assert err["code"] == "unsupported_parameter" and "not supported" in err["message"]
    else:
        assert "Unrecognized request argument" in err["message"]


def test_user_and_metadata_are_accepted_and_ignored(client):
    greedy = chat_text(client, temperature=0, max_tokens=8)
    assert chat_text(client, temperature=0, max_tokens=8, user="user-1234") == greedy
    assert chat_text(client, temperature=0, max_tokens=8, metadata={"team": "search"}) == greedy


# -- SDK modes ----------------------------------------------------------------------


def test_raw_response_has_headers_and_parses_to_typed_objects(client):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=5)
    assert raw.status_code == 200 and raw.headers.get("x-request-id")
    parsed = raw.parse()
    assert isinstance(parsed, ChatCompletion) and parsed.object == "chat.completion"
    traced = client.completions.with_raw_response.create(model=MODEL, prompt=PROMPT, max_tokens=2,
                                                         extra_headers={"X-Request-Id": "compat-trace-1"})
    assert traced.headers["x-request-id"] == "compat-trace-1"
    completion = traced.parse()
    assert isinstance(completion, Completion) and completion.object == "text_completion"


def test_with_streaming_response_yields_sse_lines(client):
    greedy = chat_text(client, temperature=0, max_tokens=10)
    with client.chat.completions.with_streaming_response.create(model=MODEL, messages=QUESTION, temperature=0,
                                                                max_tokens=10, stream=True) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers.get("x-request-id")
        lines = [line for line in resp.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [ChatCompletionChunk.model_validate(json.loads(line[len("data: "):])) for line in lines[:-1]]
    assert len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == greedy


def test_completions_stream_include_usage(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=5)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}))
    assert all(isinstance(c, Completion) for c in chunks)
    assert "".join(ch.text for c in chunks for ch in c.choices) == full.choices[0].text
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens == full.usage.prompt_tokens
    assert last.usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    # Without the option no chunk carries usage.
    plain = list(client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=5, stream=True))
    assert all(c.usage is None and c.choices for c in plain)


async def test_async_client_completions_raw_and_streaming(async_client, client):
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=6).choices[0].text
    r = await async_client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=6)
    assert isinstance(r, Completion) and r.choices[0].text == greedy
    raw = await async_client.chat.completions.with_raw_response.create(model=MODEL, messages=QUESTION, temperature=0,
                                                                       max_tokens=3)
    assert raw.headers.get("x-request-id") and isinstance(raw.parse(), ChatCompletion)
    stream = await async_client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=6, stream=True)
    assert "".join([c.choices[0].text async for c in stream if c.choices]) == greedy
    async with async_client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=QUESTION, temperature=0, max_tokens=4, stream=True) as resp:
        lines = [line async for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and len(lines) >= 2
    with pytest.raises(openai.BadRequestError):
        await async_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2,
                                                   logit_bias={"-1": 1})  # not a token id


# -- third-party clients ----------------------------------------------------------------


def test_langchain_chat_openai_invoke_and_stream(base_url):
    langchain_openai = pytest.importorskip(
        "langchain_openai",
        reason="langchain-openai is not installed (it is in the `dev` extra: pip install -e '.[dev]')")
    llm = langchain_openai.ChatOpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, model=MODEL, temperature=0,
                                      max_tokens=20, max_retries=0, timeout=120)
    answer = llm.invoke("What is the capital of France?")
    assert "Paris" in answer.content
    assert answer.response_metadata["finish_reason"] == "stop"
    streamed = list(llm.stream("What is the capital of France?"))
    assert len(streamed) > 1
    assert "".join(chunk.content for chunk in streamed) == answer.content
