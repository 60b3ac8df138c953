"""vLLM's sampling and decoding extensions against the real stack, sent as a client written against `vllm serve`
sends them (the openai SDK's `extra_body`: top-level JSON fields). Each test compares with a control request
without the parameter, under greedy decoding, so a parameter that was accepted and dropped would fail it; each
bad value is a 400 naming the parameter. Behaviour only, never timing."""

from __future__ import annotations

import re

import openai
import pytest

from tests.support.service import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
REPEAT = [{"role": "user", "content": "Repeat the word 'apple' twenty times, separated by spaces."}]
VOCAB = 49152  # SmolLM2's vocabulary


def token_id(http, text: str) -> tuple[int, str]:
    """The last token id of `text` as the model tokenizes it, and that token's own text."""
    ids = http.post("/tokenize", json={"model": MODEL, "prompt": text}).json()["tokens"]
    word = http.post("/detokenize", json={"model": MODEL, "tokens": [ids[-1]]}).json()["prompt"]
    return ids[-1], word


def complete(client, prompt=PROMPT, **extra):
    params = {k: extra.pop(k) for k in ("max_tokens", "temperature", "seed", "stream") if k in extra}
    params.setdefault("max_tokens", 12)
    params.setdefault("temperature", 0)
    return client.completions.create(model=MODEL, prompt=prompt, extra_body=extra or None, **params)


def chat(client, messages=QUESTION, **extra):
    params = {k: extra.pop(k) for k in ("max_tokens", "temperature", "seed") if k in extra}
    params.setdefault("max_tokens", 24)
    params.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=messages, extra_body=extra or None, **params)


def refused(call, *args, **kwargs) -> dict:
    with pytest.raises(openai.BadRequestError) as err:
        call(*args, **kwargs)
    assert err.value.status_code == 400
    body = err.value.body
    assert set(body) == {"message", "type", "param", "code"} and body["type"] == "invalid_request_error", body
    return body


# -- token-level control ------------------------------------------------------------------------------------


def test_logit_bias_forces_a_token_and_bans_another(client, http):
    forced, word = token_id(http, " Berlin")
    r = complete(client, max_tokens=3, logit_bias={str(forced): 100})
    assert r.choices[0].text == word * 3, r.choices[0].text
    greedy = complete(client, max_tokens=3).choices[0].text
    last, _ = token_id(http, greedy)  # the greedy text's last token: with it banned, the text is another
    banned = complete(client, max_tokens=3, logit_bias={str(last): -100}).choices[0].text
    assert banned != greedy, (banned, greedy)


def test_allowed_token_ids_restrict_sampling(client, http):
    only, word = token_id(http, " yes")
    r = complete(client, max_tokens=4, temperature=1.0, seed=3, allowed_token_ids=[only])
    assert r.choices[0].text == word * 4


def test_stop_token_ids_end_the_output(client, http):
    greedy = complete(client, max_tokens=12)
    ids = http.post("/tokenize", json={"model": MODEL, "prompt": greedy.choices[0].text}).json()["tokens"]
    assert len(ids) >= 4, greedy.choices[0].text
    stop = ids[3]
    stopped = complete(client, max_tokens=12, stop_token_ids=[stop])
    text = stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"
    assert greedy.choices[0].text.startswith(text) and len(text) < len(greedy.choices[0].text)
    assert stopped.usage.completion_tokens < greedy.usage.completion_tokens
    # with include_stop_str_in_output the stop token's text stays in the output
    kept = complete(client, max_tokens=12, stop_token_ids=[stop], include_stop_str_in_output=True).choices[0].text
    assert greedy.choices[0].text.startswith(kept) and len(kept) > len(text)


def test_stop_token_ids_while_streaming(client, http):
    greedy = complete(client, max_tokens=12).choices[0].text
    ids = http.post("/tokenize", json={"model": MODEL, "prompt": greedy}).json()["tokens"]
    whole = complete(client, max_tokens=12, stop_token_ids=[ids[3]]).choices[0].text
    chunks = list(complete(client, max_tokens=12, stream=True, stop_token_ids=[ids[3]]))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_min_tokens_masks_end_of_sequence(client):
    plain = chat(client, max_tokens=64)
    assert plain.choices[0].finish_reason == "stop"  # the answer ends by itself, well before 64 tokens
    n = plain.usage.completion_tokens
    longer = chat(client, max_tokens=n + 20, min_tokens=n + 10)
    assert longer.usage.completion_tokens >= n + 10
    assert longer.choices[0].message.content.startswith(plain.choices[0].message.content)


def test_include_stop_str_in_output_keeps_the_stop_string(client):
    greedy = complete(client, max_tokens=12).choices[0].text
    stop = greedy.strip().split()[1]  # a word from the middle of the answer
    cut = complete(client, max_tokens=12, stop=[stop]).choices[0].text
    kept = complete(client, max_tokens=12, stop=[stop], include_stop_str_in_output=True).choices[0].text
    assert kept == cut + stop


def test_special_tokens_shown_when_not_skipped(client):
    plain = chat(client).choices[0].message.content
    shown = chat(client, skip_special_tokens=False, include_stop_str_in_output=True).choices[0].message.content
    assert "<|im_end|>" not in plain
    assert shown.startswith(plain) and shown.endswith("<|im_end|>"), shown


# -- sampling filters --------------------------------------------------------------------------------------


def test_top_k_1_and_min_p_1_are_greedy(client):
    greedy = chat(client).choices[0].message.content
    for seed in (1, 2):
        assert chat(client, temperature=1.0, seed=seed, top_k=1).choices[0].message.content == greedy
        assert chat(client, temperature=1.0, seed=seed, min_p=1.0).choices[0].message.content == greedy
    # and the control: without either, some seed samples something else at temperature 2
    sampled = {chat(client, temperature=2.0, seed=seed).choices[0].message.content for seed in (1, 2, 3)}
    assert sampled != {greedy}


def test_repetition_penalty_changes_a_repetitive_answer(client):
    greedy = chat(client, messages=REPEAT, max_tokens=40).choices[0].message.content
    penalised = chat(client, messages=REPEAT, max_tokens=40, repetition_penalty=1.8).choices[0].message.content
    assert penalised != greedy
    assert chat(client, messages=REPEAT, max_tokens=40, repetition_penalty=1.0).choices[0].message.content == greedy


def test_bad_words_change_the_answer(client):
    greedy = chat(client).choices[0].message.content
    assert "Paris" in greedy
    other = chat(client, bad_words=["Paris"]).choices[0].message.content
    assert other != greedy


# -- return_token_ids ------------------------------------------------------------------------------------


def test_return_token_ids_are_the_prompts_and_the_outputs(client, http):
    r = complete(client, return_token_ids=True)
    choice = r.choices[0].model_dump()
    prompt_ids = http.post("/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()["tokens"]
    assert choice["prompt_token_ids"] == prompt_ids
    assert len(choice["token_ids"]) == r.usage.completion_tokens
    decoded = http.post("/detokenize", json={"model": MODEL, "tokens": choice["token_ids"]}).json()["prompt"]
    assert decoded.startswith(r.choices[0].text)  # the ids spell the text (and an end-of-sequence token, if any)
    reply = chat(client, return_token_ids=True).model_dump()
    assert reply["prompt_token_ids"] == http.post("/tokenize", json={"model": MODEL, "messages": QUESTION}).json()[
        "tokens"]
    assert len(reply["choices"][0]["token_ids"]) == reply["usage"]["completion_tokens"]


# -- refusals ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("param, extra", [
    ("logit_bias", {"logit_bias": {str(VOCAB): 5}}),  # out of the model's vocabulary: the engine's check
    ("logit_bias", {"logit_bias": {"one": 5}}),
    ("stop_token_ids", {"stop_token_ids": [VOCAB + 7]}),
    ("allowed_token_ids", {"allowed_token_ids": [1, VOCAB]}),
    ("allowed_token_ids", {"allowed_token_ids": []}),
    ("top_k", {"top_k": -2}),
    ("min_p", {"min_p": 1.5}),
    ("repetition_penalty", {"repetition_penalty": 0}),
    ("min_tokens", {"min_tokens": 9, "max_tokens": 4}),
    ("bad_words", {"bad_words": [""]}),
])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bad_values_are_a_400_naming_the_parameter(client, endpoint, param, extra):
    extra = dict(extra)
    if endpoint == "chat":
        body = refused(chat, client, **extra)
    else:
        body = refused(complete, client, **extra)
    assert body["param"] == param, body


def test_the_engine_still_serves_after_the_refusals(client, service):
    assert "Paris" in chat(client).choices[0].message.content
    stats = service.wait_idle()
    assert stats["engine"]["running"] == 0 and stats["admission"]["in_system"] == 0


def test_the_chat_template_options_reach_the_model_s_template(client):
    """vLLM's add_generation_prompt, continue_final_message, chat_template_kwargs and echo on the real template."""
    story = [{"role": "user", "content": "Tell me a story."},
             {"role": "assistant", "content": "Once upon a time, there was a"}]
    opened = client.chat.completions.create(model=MODEL, messages=story[:1], max_tokens=2, temperature=0)
    unopened = client.chat.completions.create(model=MODEL, messages=story[:1], max_tokens=2, temperature=0,
                                              extra_body={"add_generation_prompt": False})
    assert unopened.usage.prompt_tokens < opened.usage.prompt_tokens  # no "<|im_start|>assistant\n" at the end
    continued = client.chat.completions.create(
        model=MODEL, messages=story, max_tokens=8, temperature=0,
        extra_body={"add_generation_prompt": False, "continue_final_message": True, "echo": True})
    text = continued.choices[0].message.content
    assert text.startswith(story[1]["content"]) and len(text) > len(story[1]["content"]), text
    kwargs = client.chat.completions.create(model=MODEL, messages=story[:1], max_tokens=2, temperature=0,
                                            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert kwargs.usage.prompt_tokens == opened.usage.prompt_tokens  # a variable this template does not use
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=story, max_tokens=2,
                                       extra_body={"continue_final_message": True})
    assert refused.value.body["param"] == "continue_final_message"


def test_structured_outputs_hold_the_real_engine_to_each_kind(client):
    question = [{"role": "user", "content": "What is the capital of France?"}]

    def answer(constraint: dict) -> str:
        r = client.chat.completions.create(model=MODEL, messages=question, max_tokens=12, temperature=0,
                                           extra_body={"structured_outputs": constraint})
        return r.choices[0].message.content

    assert answer({"choice": ["Paris", "London", "Rome"]}) in ("Paris", "London", "Rome")
    assert re.fullmatch(r"[0-9]{3}", answer({"regex": "[0-9]{3}"}))
    with pytest.raises(openai.BadRequestError) as refused:
        answer({"grammar": "this is not a grammar ::= ::="})
    assert refused.value.body["param"] == "structured_outputs"


def test_usage_carries_the_prefix_caches_cached_tokens_and_metrics_its_counters(client, http):
    """The prefix cache's hits on the real engine (what vLLM reports as the request's num_cached_tokens): in the
    Responses API's `input_tokens_details.cached_tokens`, as vLLM always reports them; chat's
    `usage.prompt_tokens_details` is null, as `vllm serve` without --enable-prompt-tokens-details sends it (the
    stack's config leaves `service.enable_prompt_tokens_details` off). And vLLM's prefix-cache counters in /metrics.
    (A repeated prompt reported 0 cached tokens on this CPU build in the run of 01:40, so the test asserts the shape
    and bounds, not a hit.)"""
    question = "Here is a question asked twice, long enough to fill more than two blocks of sixteen tokens: " * 2
    ask = {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 1, "temperature": 0}
    assert client.chat.completions.create(**ask).usage.prompt_tokens_details is None
    for _ in range(2):
        usage = client.responses.create(model=MODEL, input=question, max_output_tokens=1, temperature=0).usage
        assert 0 <= usage.input_tokens_details.cached_tokens < usage.input_tokens, usage
    metrics = http.get("/metrics").text
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        assert re.search(rf'^{name}\{{[^}}]*\}} \S+$', metrics, re.M), name


def test_return_tokens_as_token_ids_names_the_tokens_that_spell_the_answer(http):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 2,
            "return_tokens_as_token_ids": True, "ignore_eos": True}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    assert len(tokens) == 4 and all(re.fullmatch(r"token_id:\d+", t) for t in tokens), tokens
    assert all(re.fullmatch(r"token_id:\d+", t) for top in choice["logprobs"]["top_logprobs"] for t in top)
    ids = [int(t.split(":")[1]) for t in tokens]
    assert http.post("/detokenize", json={"model": MODEL, "tokens": ids}).json()["prompt"] == choice["text"]


# -- issue 26: named-token logprobs, beam search, batched chat, through the openai SDK ------------------------------


def test_logprob_token_ids_give_each_named_token_s_logprob_at_every_step(client, http):
    paris, word = token_id(http, " Paris")
    answer = chat(client, logprobs=True, max_tokens=4, logprob_token_ids=[paris, 0])
    for step in answer.choices[0].logprobs.content:
        listed = [t.token for t in step.top_logprobs]
        assert listed[0] == step.token and word in listed, listed  # the chosen token, then the named ones
        assert all(t.logprob <= 0 for t in step.top_logprobs)
    body = refused(chat, client, logprob_token_ids=[paris])  # without logprobs: vLLM's 400
    assert body["param"] == "logprob_token_ids"
    out = refused(chat, client, logprobs=True, logprob_token_ids=[VOCAB + 5])  # outside the vocabulary: the engine's
    assert out["param"] == "logprob_token_ids"


def test_beam_search_answers_n_distinct_beams_best_first(client):
    answer = chat(client, n=3, max_tokens=8, use_beam_search=True)
    texts = [c.message.content for c in answer.choices]
    assert [c.index for c in answer.choices] == [0, 1, 2] and len(set(texts)) == 3, texts
    assert answer.usage.completion_tokens >= 3 and "Paris" in texts[0]
    completion = complete(client, n=2, max_tokens=6, use_beam_search=True, length_penalty=0.5)
    assert len({c.text for c in completion.choices}) == 2
    assert "streaming" in refused(complete, client, stream=True, use_beam_search=True)["message"].lower()


def test_batched_chat_answers_each_conversation_through_the_sdk(client):
    conversations = [QUESTION, [{"role": "user", "content": "What is the capital of Italy?"}]]
    answer = client.post("/chat/completions/batch", body={"model": MODEL, "messages": conversations,
                                                          "max_tokens": 12, "temperature": 0},
                         cast_to=openai.types.chat.ChatCompletion)
    assert [c.index for c in answer.choices] == [0, 1]
    alone = [chat(client, messages=m, max_tokens=12).choices[0].message.content for m in conversations]
    assert [c.message.content for c in answer.choices] == alone  # each as its own chat request answers it
