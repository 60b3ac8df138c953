"""Request models: validation against the model's limits, and refusal of unknown or unsupported fields."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.config.model import LimitsConfig
from app.engine.interface import PromptInput
from app.errors import InvalidRequest, UnsupportedParameter
from app.openai.chat import ChatCompletionRequest
from tests.support.request_models import MSGS, chat, completion

LIMITS = LimitsConfig(max_tokens=100, default_max_tokens=20, max_n=3, max_stop_sequences=2,
                      max_stop_sequence_chars=5, max_logprobs=4, max_messages=3)




def invalid(param, exc=InvalidRequest):
    """pytest.raises for a service error that must name `param`."""
    class _Check:
        def __enter__(self):
            self._ctx = pytest.raises(exc)
            self.info = self._ctx.__enter__()
            return self.info

        def __exit__(self, *exc_info):
            handled = self._ctx.__exit__(*exc_info)
            assert self.info.value.param == param, (self.info.value.param, str(self.info.value))
            return handled
    return _Check()


# -- max_tokens ------------------------------------------------------------------

def test_default_max_tokens_applied_and_flagged():
    for req in (chat(), completion()):
        params = req.to_params(LIMITS)
        assert params.max_tokens == 20
        assert params.max_tokens_is_default is True


def test_explicit_max_tokens_not_flagged():
    params = chat(max_tokens=7).to_params(LIMITS)
    assert (params.max_tokens, params.max_tokens_is_default) == (7, False)
    params = chat(max_completion_tokens=9).to_params(LIMITS)
    assert (params.max_tokens, params.max_tokens_is_default) == (9, False)
    params = completion(max_tokens=100).to_params(LIMITS)
    assert (params.max_tokens, params.max_tokens_is_default) == (100, False)


def test_max_tokens_over_cap():
    with invalid("max_tokens") as info:
        chat(max_tokens=101).to_params(LIMITS)
    assert "100" in str(info.value)
    with invalid("max_tokens"):
        completion(max_tokens=101).to_params(LIMITS)
    with invalid("max_completion_tokens"):
        chat(max_completion_tokens=101).to_params(LIMITS)


def test_max_tokens_and_max_completion_tokens_disagree():
    with invalid("max_completion_tokens"):
        chat(max_tokens=5, max_completion_tokens=6).to_params(LIMITS)
    assert chat(max_tokens=5, max_completion_tokens=5).to_params(LIMITS).max_tokens == 5


def test_max_tokens_zero_is_a_validation_error():
    with pytest.raises(ValidationError):
        chat(max_tokens=0)


# -- n, stop, logprobs -------------------------------------------------------------

def test_n_over_max():
    with invalid("n"):
        chat(n=4).to_params(LIMITS)
    assert chat(n=3).to_params(LIMITS).n == 3


def test_n_above_one_needs_sampling():
    with invalid("n") as info:
        chat(n=2, temperature=0).to_params(LIMITS)
    assert "temperature" in str(info.value)
    assert chat(n=1, temperature=0).to_params(LIMITS).temperature == 0


def test_stop_sequences():
    assert chat(stop="x").to_params(LIMITS).stop == ("x",)
    assert chat(stop=["a", "b"]).to_params(LIMITS).stop == ("a", "b")
    assert chat().to_params(LIMITS).stop == ()
    with invalid("stop") as info:
        chat(stop=["a", "b", "c"]).to_params(LIMITS)
    assert "at most 2" in str(info.value)
    with invalid("stop"):
        chat(stop="").to_params(LIMITS)
    with invalid("stop"):
        chat(stop=["a", ""]).to_params(LIMITS)
    with invalid("stop"):
        completion(stop=["toolong"]).to_params(LIMITS)


def test_top_logprobs_needs_logprobs():
    with invalid("top_logprobs"):
        chat(top_logprobs=2).to_params(LIMITS)
    assert chat(logprobs=True, top_logprobs=2).to_params(LIMITS).logprobs == 2
    assert chat(logprobs=True).to_params(LIMITS).logprobs == 0
    assert chat().to_params(LIMITS).logprobs is None
    with invalid("top_logprobs"):
        chat(logprobs=True, top_logprobs=5).to_params(LIMITS)
    with invalid("logprobs"):
        completion(logprobs=5).to_params(LIMITS)
    assert completion(logprobs=4).to_params(LIMITS).logprobs == 4


# -- unknown, unsupported and ignored fields ----------------------------------------

def test_unknown_field_refused_by_name():
    with invalid("foo") as info:
        chat(foo=1)
    assert str(info.value) == "Unrecognized request argument supplied: foo"
    assert info.value.status == 400
    with invalid("foo"):
        completion(foo="bar")


@pytest.mark.parametrize("name, value", [
    ("functions", [{"name": "f"}]),
    ("best_of", 2),
    ("suffix", "end"),
    ("modalities", ["text", "audio"]),
    ("verbosity", "low"),
])
def test_unsupported_parameters_refused(name, value):
    with invalid(name, UnsupportedParameter) as info:
        chat(**{name: value})
    assert info.value.code == "unsupported_parameter"
    assert info.value.status == 400


def test_no_op_tool_fields_accepted():
    # (tools themselves: tests/unit/test_tool_calls.py; `tools: []` is a 400 there, as in vLLM)
    req = chat(tool_choice="none", best_of=1, parallel_tool_calls=None, modalities=["text"])
    assert req.to_params(LIMITS).max_tokens == 20


def test_ignored_parameters_accepted():
    req = chat(user="alice", metadata={"k": "v"}, store=False, service_tier="auto", safety_identifier="h-1")
    assert req.to_params(LIMITS).max_tokens == 20
    assert completion(user="bob").to_prompt(LIMITS) == PromptInput(text="hi")


# -- prompts ------------------------------------------------------------------------

def test_chat_prompt_flattens_text_parts():
    req = chat(messages=[{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert req.to_prompt(LIMITS).messages == ({"role": "system", "content": "be brief"},
                                              {"role": "user", "content": "ab"})


def test_text_parts_with_extra_keys_are_text_and_other_parts_are_refused_by_name():
    """A text part may carry keys of other APIs (LangChain's `cache_control`): vLLM reads `type` and `text` only.
    An image (or any part that is not text) is a 400 that names the part, not pydantic's dump of every type."""
    req = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"x": 1}}]}])
    assert req.to_prompt(LIMITS).messages == ({"role": "user", "content": "a"},)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    for parts, words in (([{"type": "text", "text": "a"}, image], "messages[1].content[1] is a content part of type "
                                                                   "'image_url'; this service serves text-only"),
                         ([{"type": "text"}], "messages[1].content[0] is a text part without 'text'")):
        with invalid("messages") as err:
            chat(messages=[{"role": "system", "content": "x"}, {"role": "user", "content": parts}]).to_prompt(LIMITS)
        assert err.value.message.startswith(words), err.value.message


def test_too_many_messages():
    with invalid("messages"):
        chat(messages=MSGS * 4).to_prompt(LIMITS)


def test_an_empty_or_endless_role_and_empty_messages_are_validation_errors():
    for role in ("", "r" * 65, None):
        with pytest.raises(ValidationError):
            chat(messages=[{"role": role, "content": "x"}])
    with pytest.raises(ValidationError):
        chat(messages=[])


def test_a_custom_role_goes_to_the_chat_template_as_vllm_passes_it():
    """vLLM takes any role string (its custom message) and leaves it to the template; templates that know a role
    such as "user_custom" use it."""
    prompt = chat(messages=[{"role": "user_custom", "content": "x", "name": "n"}]).to_prompt(LIMITS)
    assert prompt.messages == ({"role": "user_custom", "content": "x", "name": "n"},)


def test_completion_prompt_forms():
    assert completion(prompt="abc").to_prompt(LIMITS) == PromptInput(text="abc")
    assert completion(prompt=["abc"]).to_prompt(LIMITS) == PromptInput(text="abc")
    assert completion(prompt=[1, 2, 3]).to_prompt(LIMITS) == PromptInput(token_ids=(1, 2, 3))
    with invalid("prompt"):
        completion(prompt=[1, -2]).to_prompt(LIMITS)


def test_batched_prompts_are_each_a_prompt():
    # (the batch through the stack: tests/unit/test_completion_batches.py)
    assert completion(prompt=["a", "b"]).to_prompts(LIMITS) == [PromptInput(text="a"), PromptInput(text="b")]
    assert completion(prompt=[[1], [2, 3]]).to_prompts(LIMITS) == [PromptInput(token_ids=(1,)),
                                                                    PromptInput(token_ids=(2, 3))]
    with invalid("prompt"):
        completion(prompt=["a", "b"]).to_prompt(LIMITS)  # one prompt wanted


# -- response_format, stream options, sampling --------------------------------------

def test_response_format_json_schema_in_params():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    request = chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    params = request.to_params(LIMITS)
    assert params.json_schema == schema
    assert params.json_object is False


def test_response_format_json_object_and_text():
    params = chat(response_format={"type": "json_object"}).to_params(LIMITS)
    assert (params.json_object, params.json_schema) == (True, None)
    params = chat(response_format={"type": "text"}).to_params(LIMITS)
    assert (params.json_object, params.json_schema) == (False, None)


def test_response_format_json_schema_needs_schema_object():
    with pytest.raises(ValidationError):
        chat(response_format={"type": "json_schema"})


def test_include_usage():
    assert chat(stream=True, stream_options={"include_usage": True}).include_usage is True
    assert chat(stream=True).include_usage is False
    with pytest.raises(ValidationError):
        chat(stream_options={"include_usage": True, "bogus": 1})
    # OpenAI's padding of stream chunks: none here, so `false` is accepted and `true` refused.
    assert chat(stream=True, stream_options={"include_usage": True, "include_obfuscation": False}).include_usage
    with pytest.raises(ValidationError):
        chat(stream=True, stream_options={"include_obfuscation": True})


def test_sampling_params_pass_through():
    params = completion(temperature=0.5, top_p=0.9, seed=7, presence_penalty=1, frequency_penalty=-1,
                        ignore_eos=True, n=2).to_params(LIMITS)
    assert (params.temperature, params.top_p, params.seed, params.presence_penalty, params.frequency_penalty,
            params.ignore_eos, params.n) == (0.5, 0.9, 7, 1, -1, True, 2)


@pytest.mark.parametrize("field, value", [("temperature", 2.5), ("top_p", 0), ("n", 0), ("presence_penalty", 3)])
def test_out_of_range_sampling_values(field, value):
    with pytest.raises(ValidationError):
        chat(**{field: value})


def test_stream_options_without_stream_is_refused():
    import pytest as _pytest

    from app.errors import InvalidRequest

    with _pytest.raises(InvalidRequest) as err:
        ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                              stream_options={"include_usage": True})
    assert err.value.param == "stream_options"
    assert ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
                                 stream_options={"include_usage": True}).include_usage
