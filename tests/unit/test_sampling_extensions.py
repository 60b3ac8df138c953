"""vLLM's sampling and decoding extensions (`top_k`, `min_p`, `min_tokens`, `repetition_penalty`, `stop_token_ids`,
`include_stop_str_in_output`, `skip_special_tokens`, `spaces_between_special_tokens`, `logit_bias`,
`allowed_token_ids`, `bad_words`) and `stream_options.continuous_usage_stats`: the request models' conversion and
validation, the 400s through the in-process stack, the fake engine's vocabulary, and `VLLMEngine`'s mapping to
vLLM's `SamplingParams` and of vLLM's refusals, without starting an engine."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from vllm.exceptions import VLLMValidationError
from vllm.outputs import CompletionOutput

from app.config.model import LimitsConfig
from app.engine.fake_model import VOCAB_SIZE
from app.engine.interface import Admitted, ChoiceDelta, EngineRejected, GenerationDelta, GenerationParams
from app.engine.vllm import engine as vllm_engine
from app.engine.vllm.from_vllm import token_logprobs
from app.engine.vllm.refusals import refusal
from app.engine.vllm.to_vllm import sampling_params
from app.errors import InvalidRequest
from app.openai.answers import Responder
from app.openai.choice_shapes import ChatShape
from app.openai.sampling_bounds import (
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORD_CHARS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    MAX_STOP_TOKEN_IDS,
)
from tests.support import sse
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import DEFAULT_MAX_TOKENS, MAX_TOKENS, MODEL_ID, chat_body, usage_of
from tests.support.request_models import chat, completion
from tests.support.responder import chunk_of

LIMITS = LimitsConfig(max_tokens=100, default_max_tokens=20)

EXTENSIONS = {
    "top_k": 5,
    "min_p": 0.1,
    "min_tokens": 3,
    "repetition_penalty": 1.3,
    "stop_token_ids": [7, 9, 7],
    "include_stop_str_in_output": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "logit_bias": {"11": 5, "12": -250, " 13": 100.5},
    "allowed_token_ids": [1, 2, 3, 2],
    "bad_words": ["foo", "bar", "foo"],
}




# -- the request models ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [chat, completion], ids=["chat", "completion"])
def test_every_extension_reaches_the_engine_parameters(make):
    p = make(**EXTENSIONS).to_params(LIMITS)
    assert (p.top_k, p.min_p, p.min_tokens, p.repetition_penalty) == (5, 0.1, 3, 1.3)
    assert p.stop_token_ids == (7, 9)  # repeats dropped, as vLLM drops them
    assert (p.include_stop_str_in_output, p.skip_special_tokens, p.spaces_between_special_tokens) == (
        True, False, False)
    assert dict(p.logit_bias) == {11: 5.0, 12: -100.0, 13: 100.0}  # keys as vLLM converts them; clamped
    assert p.allowed_token_ids == (1, 2, 3, 2)  # as vLLM keeps them (a set of allowed tokens either way)
    assert p.bad_words == ("foo", "bar")


@pytest.mark.parametrize("make", [chat, completion], ids=["chat", "completion"])
def test_absent_extensions_are_vllms_no_op_defaults(make):
    p = make().to_params(LIMITS)
    defaults = GenerationParams(max_tokens=1)
    for name in ("top_k", "min_p", "min_tokens", "repetition_penalty", "stop_token_ids", "include_stop_str_in_output",
                 "skip_special_tokens", "spaces_between_special_tokens", "logit_bias", "allowed_token_ids",
                 "bad_words"):
        assert getattr(p, name) == getattr(defaults, name), name
    # null where vLLM takes null: the same defaults
    p = make(top_k=None, min_p=None, repetition_penalty=None, stop_token_ids=None, logit_bias=None,
             allowed_token_ids=None).to_params(LIMITS)
    assert (p.top_k, p.min_p, p.repetition_penalty, p.stop_token_ids, p.logit_bias, p.allowed_token_ids) == (
        0, 0.0, 1.0, (), (), None)
    assert make(top_k=-1).to_params(LIMITS).top_k == -1  # vLLM's other spelling of "every token"


def test_min_tokens_raises_the_default_max_tokens_but_not_an_explicit_one():
    p = chat(min_tokens=50).to_params(LIMITS)
    assert (p.max_tokens, p.min_tokens, p.max_tokens_is_default) == (50, 50, True)
    assert chat(min_tokens=5).to_params(LIMITS).max_tokens == 20  # below the default: the default
    with pytest.raises(InvalidRequest) as err:
        chat(min_tokens=8, max_tokens=7).to_params(LIMITS)
    assert err.value.param == "min_tokens" and "max_tokens=7" in str(err.value)
    with pytest.raises(InvalidRequest) as err:  # over the model's max_tokens: refused, not raised to it
        completion(min_tokens=101).to_params(LIMITS)
    assert err.value.param == "min_tokens"
    assert chat(min_tokens=7, max_completion_tokens=7).to_params(LIMITS).min_tokens == 7


@pytest.mark.parametrize("field, value, message", [
    ("logit_bias", {"a": 1}, "cannot be converted to integer token IDs"),
    ("logit_bias", {"-1": 1}, "out-of-vocab"),
    ("logit_bias", {str(2**40): 1}, "out-of-vocab"),
    ("logit_bias", {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)}, f"at most {MAX_LOGIT_BIAS}"),
    ("allowed_token_ids", [], "empty"),
    ("allowed_token_ids", list(range(MAX_ALLOWED_TOKEN_IDS + 1)), f"at most {MAX_ALLOWED_TOKEN_IDS}"),
    ("stop_token_ids", list(range(MAX_STOP_TOKEN_IDS + 1)), f"at most {MAX_STOP_TOKEN_IDS}"),
    ("bad_words", [""], "empty string"),
    ("bad_words", ["w"] * (MAX_BAD_WORDS + 1), f"at most {MAX_BAD_WORDS}"),
    ("bad_words", ["w" * (MAX_BAD_WORD_CHARS + 1)], f"at most {MAX_BAD_WORD_CHARS}"),
    ("bad_words", ["ok", "\ud800"], "valid Unicode"),  # vLLM's tokenizer raises a TypeError on it
    ("stop", ["ok", "\udfff"], "lone UTF-16 surrogate"),  # the engine's msgpack refused it, naming no parameter
    ("stop", "a\ud800", "lone UTF-16 surrogate"),
])
def test_refusals_name_the_parameter(field, value, message):
    for make in (chat, completion):
        with pytest.raises(InvalidRequest) as err:
            make(**{field: value}).to_params(LIMITS)
        assert err.value.param == field and message in str(err.value), str(err.value)
        assert err.value.status == 400


def test_limits_are_inclusive():
    p = chat(logit_bias={str(i): 1 for i in range(MAX_LOGIT_BIAS)}, stop_token_ids=list(range(MAX_STOP_TOKEN_IDS)),
             allowed_token_ids=list(range(MAX_ALLOWED_TOKEN_IDS)),
             bad_words=[f"w{i}" for i in range(MAX_BAD_WORDS)]).to_params(LIMITS)
    assert len(p.logit_bias) == MAX_LOGIT_BIAS and len(p.bad_words) == MAX_BAD_WORDS


def test_empty_logit_bias_is_no_bias():
    assert chat(logit_bias={}).to_params(LIMITS).logit_bias == ()


# -- through the in-process stack: the 400 in OpenAI's shape, naming the parameter ------------------------------


@pytest.mark.parametrize("field, value", [
    ("top_k", -2), ("top_k", 1.5), ("top_k", 2**31), ("top_k", "many"),
    ("min_p", -0.1), ("min_p", 1.01),
    ("repetition_penalty", 0), ("repetition_penalty", -1.0),
    ("min_tokens", -1), ("min_tokens", None), ("min_tokens", MAX_TOKENS + 1),
    ("stop_token_ids", [-1]), ("stop_token_ids", ["x"]), ("stop_token_ids", 5), ("stop_token_ids", [VOCAB_SIZE]),
    ("include_stop_str_in_output", None), ("skip_special_tokens", "maybe"), ("spaces_between_special_tokens", [1]),
    ("logit_bias", {"x": 1}), ("logit_bias", {"1": "high"}), ("logit_bias", [1, 2]), ("logit_bias", {"256": 1}),
    ("allowed_token_ids", []), ("allowed_token_ids", [-3]), ("allowed_token_ids", [0, VOCAB_SIZE]),
    ("bad_words", None), ("bad_words", [""]), ("bad_words", "word"),
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_bad_values_are_a_400_naming_the_parameter(client, path, field, value):
    body = chat_body() if "chat" in path else {"model": MODEL_ID, "prompt": "Hello"}
    r = await client.post(path, json={**body, field: value})
    assert r.status_code == 400, r.text
    assert_error_shape(r.status_code, r.headers.get("content-type", ""), r.content)
    assert r.json()["error"]["param"] == field, r.text


@pytest.mark.parametrize("field, raw", [("repetition_penalty", "NaN"), ("repetition_penalty", "Infinity"),
                                        ("min_p", "NaN"), ("logit_bias", '{"5": NaN}')])
async def test_non_finite_numbers_are_a_400(client, field, raw):
    body = json.dumps(chat_body())[:-1] + f', "{field}": {raw}}}'
    r = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


async def test_every_extension_is_accepted_end_to_end(client, stack):
    r = await client.post("/v1/chat/completions", json=chat_body(**EXTENSIONS, max_tokens=20, temperature=0))
    assert r.status_code == 200, r.text
    ok = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hi", **EXTENSIONS})
    assert ok.status_code == 200, ok.text


async def test_min_tokens_keeps_generating_past_the_end(client):
    plain = (await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hi"})).json()
    longer = (await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hi", "min_tokens": 20})).json()
    assert plain["usage"]["completion_tokens"] < 20 <= longer["usage"]["completion_tokens"]
    assert longer["choices"][0]["text"].startswith(plain["choices"][0]["text"])
    assert longer["usage"]["completion_tokens"] <= DEFAULT_MAX_TOKENS


async def test_include_stop_str_in_output(client):
    cut = (await client.post("/v1/chat/completions", json=chat_body(stop=["fake"]))).json()
    kept = (await client.post("/v1/chat/completions", json=chat_body(stop=["fake"],
                                                                     include_stop_str_in_output=True))).json()
    assert cut["choices"][0]["message"]["content"] == "This is a "
    assert kept["choices"][0]["message"]["content"] == "This is a fake"
    assert kept["choices"][0]["finish_reason"] == "stop"


async def test_min_tokens_beyond_what_the_context_leaves_is_a_400_naming_it(client):
    # the default max_tokens shrinks to what the context has left; a min_tokens above that cannot hold
    r = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "x" * 200, "min_tokens": 100})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens", r.text


# -- stream_options.continuous_usage_stats ---------------------------------------------------------------------


def test_continuous_usage_needs_include_usage_as_in_vllm():
    opts = {"include_usage": False, "continuous_usage_stats": True}
    assert chat(stream=True, stream_options=opts).continuous_usage is False
    assert chat(stream=True, stream_options={"continuous_usage_stats": False, "include_usage": True}
                ).continuous_usage is False
    assert chat(stream=True, stream_options={"include_usage": None}).include_usage is False  # vLLM takes null


async def test_continuous_usage_puts_the_usage_so_far_on_every_chunk_of_a_stream(client):
    opts = {"include_usage": True, "continuous_usage_stats": True}
    r = await client.post("/v1/chat/completions", json=chat_body(stream=True, max_tokens=4, stream_options=opts))
    assert r.status_code == 200, r.text
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    with_text = [c for c in chunks if c["choices"]]
    assert with_text and all(c["usage"]["completion_tokens"] >= 1 for c in with_text)
    totals = [c["usage"]["completion_tokens"] for c in with_text]
    assert totals == sorted(totals) and chunks[-1]["usage"]["completion_tokens"] == totals[-1]


def test_responder_puts_the_usage_so_far_on_every_chunk():
    r = Responder(request_id="c", model="m", shape=ChatShape(), n=1, include_usage=True, continuous_usage=True)
    r.admitted(Admitted(prompt_tokens=4))
    one = chunk_of(r, GenerationDelta(choices=(ChoiceDelta(index=0, text="Hi", num_tokens=1),)))
    two = chunk_of(r, GenerationDelta(choices=(ChoiceDelta(index=0, text="!", num_tokens=2, finish_reason="stop"),)))
    assert one["usage"] == usage_of(4, 1, streamed=True)  # vLLM's per-chunk usage: the bare counts
    assert two["usage"] == usage_of(4, 3, streamed=True)
    assert r.usage_chunk()["usage"] == two["usage"]  # the last chunk still comes, with the same figures


# -- VLLMEngine: to vLLM's SamplingParams, and vLLM's refusals ---------------------------------------------------


def test_sampling_params_carry_every_extension():
    params = chat(**EXTENSIONS, temperature=0.7).to_params(LIMITS)
    sp = sampling_params(params)
    assert (sp.top_k, sp.min_p, sp.min_tokens, sp.repetition_penalty) == (5, 0.1, 3, 1.3)
    assert sp.stop_token_ids == [7, 9]
    assert sp.include_stop_str_in_output is True
    assert sp.skip_special_tokens is False and sp.spaces_between_special_tokens is False
    assert sp.logit_bias == {11: 5.0, 12: -100.0, 13: 100.0}
    assert sp.allowed_token_ids == [1, 2, 3, 2]
    assert sp.bad_words == ["foo", "bar"]
    assert sp.output_text_buffer_length == 0  # include_stop_str_in_output: nothing held back


def test_sampling_params_of_the_defaults_are_vllms_defaults():
    sp = sampling_params(GenerationParams(max_tokens=4))
    assert (sp.top_k, sp.min_p, sp.min_tokens, sp.repetition_penalty) == (0, 0.0, 0, 1.0)
    assert sp.stop_token_ids == [] and sp.logit_bias is None and sp.allowed_token_ids is None
    assert sp.bad_words == [] and sp.skip_special_tokens and sp.spaces_between_special_tokens
    assert not sp.include_stop_str_in_output


@pytest.mark.parametrize("err, expected, param", [
    (VLLMValidationError("token_id(s) [99999] in logit_bias contain out-of-vocab token ids. Vocabulary size: 49152",
                         parameter="logit_bias"), InvalidRequest, "logit_bias"),
    (VLLMValidationError("allowed_token_ids contains out-of-vocab token id!", parameter="allowed_token_ids"),
     InvalidRequest, "allowed_token_ids"),
    (VLLMValidationError("bad_words entries must tokenize to at least one token.", parameter="bad_words"),
     InvalidRequest, "bad_words"),
    (VLLMValidationError("min_tokens must be less than or equal to max_tokens=3, got 5."), InvalidRequest,
     "min_tokens"),
    (VLLMValidationError("repetition_penalty must be greater than zero, got 0."), InvalidRequest,
     "repetition_penalty"),
    (VLLMValidationError("token_id(s) [49157] in logprob_token_ids contain out-of-vocab token ids. Vocabulary size: "
                         "49152", parameter="logprob_token_ids"), InvalidRequest, "logprob_token_ids"),
    (VLLMValidationError("Token id 10000000 is out of vocabulary"), InvalidRequest, "prompt"),  # completions' ids
    (VLLMValidationError("grammar is not valid", parameter="structured_outputs"), EngineRejected, None),
    (ValueError("something else entirely"), EngineRejected, None),
])
def test_vllm_refusals_name_our_parameter_when_vllm_names_it(err, expected, param):
    mapped = refusal(err)
    assert type(mapped) is expected and str(mapped) == str(err)
    assert getattr(mapped, "param", None) == param


@pytest.fixture
def vllm(model_config):
    engine = vllm_engine.VLLMEngine(model_config)
    yield engine
    engine._llm = None


class _RefusingLLM:
    """`AsyncLLM.generate` refusing the request as vLLM's input processor does (before any output)."""

    errored = False

    def __init__(self, err):
        self.err = err
        self.aborted: list[str] = []

    async def abort(self, request_id):
        self.aborted.append(request_id)

    async def generate(self, prompt, sampling, request_id, priority=0):
        raise self.err
        yield  # an async generator


async def test_an_out_of_vocabulary_id_refused_by_vllm_is_a_400_naming_it(vllm):
    vllm._llm = _RefusingLLM(VLLMValidationError("token_id(s) [60000] in stop_token_ids contain out-of-vocab token "
                                                 "ids. Vocabulary size: 49152", parameter="stop_token_ids"))
    with pytest.raises(InvalidRequest) as err:
        async for _ in vllm.generate("r1", [1, 2], GenerationParams(max_tokens=4, stop_token_ids=(60000,))):
            pass
    assert err.value.param == "stop_token_ids" and "49152" in str(err.value)


def _done(token_ids, finish_reason, stop_reason):
    from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs

    logprobs = create_sample_logprobs(False)
    for t in token_ids:
        append_logprobs_for_next_position(logprobs, [t], [-0.5], [f"<{t}>"], 1, 0)
    return CompletionOutput(index=0, text="".join(f"<{t}>" for t in token_ids), token_ids=token_ids,
                            cumulative_logprob=None, logprobs=logprobs, finish_reason=finish_reason,
                            stop_reason=stop_reason)


def test_logprobs_list_the_token_that_ended_the_choice_as_vllm_s_server_does():
    """vLLM's server lists every generated token's logprob, the end-of-sequence or stop token that ended the choice
    included, though the text leaves it out (the differential run: 8 entries for 7 tokens of text)."""
    by_stop_token = _done([5, 6, 42], "stop", 42)
    assert [lp.token for lp in token_logprobs(by_stop_token, 0)] == ["<5>", "<6>", "<42>"]


def test_null_sampling_values_are_the_defaults_as_in_vllm():
    p = chat(temperature=None, top_p=None, presence_penalty=None, frequency_penalty=None, n=None).to_params(LIMITS)
    assert (p.temperature, p.top_p, p.presence_penalty, p.frequency_penalty, p.n) == (1.0, 1.0, 0.0, 0.0, 1)
    with pytest.raises(ValidationError):  # vLLM's completions take no null n either
        completion(n=None)


def test_return_tokens_as_token_ids_names_each_logprob_by_its_id_as_vllm_does():
    from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs

    logprobs = create_sample_logprobs(False)
    append_logprobs_for_next_position(logprobs, [7, 9], [-0.1, -2.0], ["a", "b"], 1, 1)
    out = CompletionOutput(index=0, text="a", token_ids=[7], cumulative_logprob=None, logprobs=logprobs,
                           finish_reason="length", stop_reason=None)
    (by_text,) = token_logprobs(out, 2)
    (by_id,) = token_logprobs(out, 2, as_ids=True)
    assert by_text.token == "a" and [t for t, _ in by_text.top] == ["a", "b"]
    assert by_id.token == "token_id:7" and [t for t, _ in by_id.top] == ["token_id:7", "token_id:9"]
    assert (by_text.text, by_id.text) == (None, "a")
    assert chat(return_tokens_as_token_ids=True, logprobs=True).to_params(LIMITS).tokens_as_ids
    assert not chat(logprobs=True).to_params(LIMITS).tokens_as_ids


def test_prompt_logprobs_keep_the_decoded_text_while_echoed_logprobs_name_tokens_by_id_as_vllm_s():
    """vLLM's `prompt_logprobs` field shows each token's `decoded_token` whatever return_tokens_as_token_ids says;
    the completions logprobs that echo the prompt name them "token_id:<id>" (the differential run, seed 13)."""
    from types import SimpleNamespace

    from vllm.logprobs import Logprob

    from app.engine.vllm.from_vllm import prompt_token_logprobs
    from app.openai.choice_shapes import prompt_logprobs_json, prompt_scores

    out = SimpleNamespace(prompt_token_ids=[504, 3575], prompt_logprobs=[
        None, {3575: Logprob(-11.5, 2922, " capital"), 29: Logprob(-0.9, 1, "-")}])
    positions = prompt_token_logprobs(out, as_ids=True)
    assert prompt_logprobs_json(positions)[1] == {"3575": {"logprob": -11.5, "rank": 2922, "decoded_token": " capital"},
                                                   "29": {"logprob": -0.9, "rank": 1, "decoded_token": "-"}}
    score = prompt_scores("token_id:504", positions)[1]
    assert score.token == "token_id:3575" and set(score.top or {}) == {"token_id:3575", "token_id:29"}
    plain = prompt_scores("The", prompt_token_logprobs(out, as_ids=False))[1]
    assert plain.token == " capital" and set(plain.top or {}) == {" capital", "-"}


async def test_chat_bytes_by_token_id_are_the_token_s_own_text_s_as_vllm_s(client):
    """vLLM's chat `bytes` with return_tokens_as_token_ids: the chosen token's own text's bytes, while each
    alternative's are those of its `token_id:<id>` name (the differential run's `token_id_bytes`)."""
    body = chat_body(max_tokens=3, logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True)
    content = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]["logprobs"]["content"]
    assert content and all(c["token"].startswith("token_id:") for c in content)
    assert all(bytes(c["bytes"]).decode() != c["token"] for c in content)
    assert all(bytes(t["bytes"]).decode() == t["token"] for c in content for t in c["top_logprobs"])


async def test_echo_with_logprobs_scores_the_prompt_as_vllm_does(client):
    """vLLM's `echo` with `logprobs`: each choice's logprobs start with its prompt's tokens (the first without a
    logprob or alternatives), `text_offset` counts from the start of the echoed text, streamed too."""
    body = {"model": MODEL_ID, "prompt": ["abc", "xy"], "max_tokens": 2, "n": 2, "temperature": 1, "echo": True,
            "logprobs": 1}
    answer = (await client.post("/v1/completions", json=body)).json()
    for choice in answer["choices"]:
        prompt = ["abc", "xy"][choice["index"] // 2]
        lps = choice["logprobs"]
        assert lps["tokens"][: len(prompt)] == list(prompt) and "".join(lps["tokens"]) == choice["text"]
        assert lps["token_logprobs"][0] is None and lps["top_logprobs"][0] is None
        assert all(v == -0.25 for v in lps["token_logprobs"][1: len(prompt)])
        assert all(1 <= len(top) <= 2 and top[t] == -0.25
                   for t, top in zip(lps["tokens"][1: len(prompt)], lps["top_logprobs"][1: len(prompt)], strict=True))
        assert lps["text_offset"] == [sum(map(len, lps["tokens"][:i])) for i in range(len(lps["tokens"]))]
        assert len(lps["tokens"]) == len(prompt) + 2  # then the two generated tokens
    streamed_resp = await client.post("/v1/completions", json={**body, "prompt": "abc", "n": 1, "stream": True})
    assert streamed_resp.status_code == 200, streamed_resp.text
    chunks = sse.parse(streamed_resp.text)
    streamed = [c["choices"][0]["logprobs"] for c in chunks[:-1] if c["choices"]]
    assert streamed[0]["tokens"][:3] == ["a", "b", "c"] and streamed[0]["token_logprobs"][0] is None
    assert sum(len(lp["tokens"]) for lp in streamed) == 3 + 2  # the prompt once, in the first chunk
    without = (await client.post("/v1/completions", json={**body, "echo": False})).json()
    assert len(without["choices"][0]["logprobs"]["tokens"]) == 2


async def test_prompt_logprobs_as_vllm_shapes_them_and_refuses_them(client):
    """vLLM's shapes: chat's on the response, completions' on each choice; None for the first prompt token."""
    chat_answer = (await client.post("/v1/chat/completions", json={
        "model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
        "prompt_logprobs": 2})).json()
    positions = chat_answer["prompt_logprobs"]
    assert positions[0] is None and len(positions) == chat_answer["usage"]["prompt_tokens"]
    first = positions[1]
    assert len(first) == 3 and all(set(v) == {"logprob", "rank", "decoded_token"} for v in first.values())
    completion = (await client.post("/v1/completions", json={
        "model": MODEL_ID, "prompt": "abc", "max_tokens": 2, "n": 2, "temperature": 1,
        "prompt_logprobs": 0})).json()
    assert [c["prompt_logprobs"] for c in completion["choices"]] == [
        [None, {"98": {"logprob": -0.25, "rank": 1, "decoded_token": "b"}},
         {"99": {"logprob": -0.25, "rank": 1, "decoded_token": "c"}}]] * 2
    for extra, needle in (({"stream": True, "prompt_logprobs": 1}, "not available when `stream=True`"),
                          ({"prompt_logprobs": 10_000}, "at most"), ({"prompt_logprobs": -1}, "at most"),
                          ({"prompt_logprobs": -2}, "positive value or -1")):
        body = {"model": MODEL_ID, "prompt": "abc", "max_tokens": 2, **extra}
        refused = await client.post("/v1/completions", json=body)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "prompt_logprobs" and needle in error["message"], error
    plain = (await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "abc",
                                                         "max_tokens": 2})).json()
    assert plain["choices"][0]["prompt_logprobs"] is None  # present, null unless asked for, as vLLM shapes it
