"""The requests: the curated set, one or more for every item of the surface the service shares with `vllm serve`,
and the property-generated ones, a seeded random walk over the endpoints and parameters (the same seed, the same
requests in the same order), mostly valid, some out of range on purpose.

Every request is short (a few tokens) and greedy (`temperature: 0`) or seeded, so each server's answer is a function
of the request alone and the curated set runs on both servers in about a minute on two cores. A case's `expect` is
"equal", or the '+'-joined names of the known differences (differences.py) it may show; the integration test
asserts that it is equal or shows only those.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from loadkit.differential.exchange import Request

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
PROMPT_IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is" in SmolLM2's tokenizer
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
TOOL_TURN = [*QUESTION,
             {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": {
                 "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
             {"role": "tool", "tool_call_id": "call_0", "content": "18 degrees and sunny"}]


@dataclass(frozen=True)
class Case:
    name: str
    request: Request
    expect: str = "equal"


def chat(**fields: object) -> Request:
    return Request("POST", "/v1/chat/completions",
                   {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 8, **fields})


def completion(**fields: object) -> Request:
    return Request("POST", "/v1/completions",
                   {"model": MODEL, "prompt": PROMPT, "temperature": 0, "max_tokens": 8, **fields})


def responses(**fields: object) -> Request:
    return Request("POST", "/v1/responses", {"model": MODEL, "input": "What is the capital of France?",
                                             "temperature": 0, "max_output_tokens": 8, **fields})


# the known differences (differences.py) most cases show
EXTRAS = "vllm_extra_fields"
FORCED = "forced_tools_without_parser"
STREAM_USAGE = {"stream": True, "stream_options": {"include_usage": True}}

CURATED: list[Case] = [
    # plain chat and completions, streamed and not
    Case("chat", chat(), expect=EXTRAS),
    # a role outside OpenAI's five goes to the chat template, as vLLM passes it (issue 26)
    Case("chat_custom_role", chat(messages=[{"role": "user_custom", "content": "What is the capital of France?"}]),
         expect=EXTRAS),
    Case("chat_stream_usage", chat(**STREAM_USAGE), expect=EXTRAS),
    Case("chat_stream_continuous_usage", chat(stream=True, stream_options={
        "include_usage": True, "continuous_usage_stats": True}), expect="continuous_usage_per_chunk+vllm_extra_fields"),
    Case("chat_logprobs", chat(logprobs=True, top_logprobs=2), expect=EXTRAS),
    Case("chat_logprobs_top0_stream", chat(logprobs=True, top_logprobs=0, stream=True), expect=EXTRAS),
    Case("completion", completion(), expect=EXTRAS),
    Case("completion_stream_usage", completion(**STREAM_USAGE), expect=EXTRAS),
    Case("completion_logprobs_0", completion(logprobs=0), expect=EXTRAS),
    Case("completion_logprobs_2_stream", completion(logprobs=2, stream=True), expect=EXTRAS),
    Case("completion_echo", completion(echo=True), expect=EXTRAS),
    Case("completion_echo_stream", completion(echo=True, stream=True), expect=EXTRAS),
    # vLLM's echo with max_tokens 0: the prompt alone (one token generated, counted, not shown)
    Case("completion_echo_only", completion(echo=True, max_tokens=0, logprobs=1), expect=EXTRAS),
    Case("completion_echo_only_stream", completion(echo=True, max_tokens=0, stream=True), expect=EXTRAS),
    Case("completion_max_tokens_0", completion(max_tokens=0)),
    Case("completion_token_ids", completion(prompt=PROMPT_IDS), expect=EXTRAS),
    Case("completion_batch_strings", completion(prompt=[PROMPT, "One, two, three,"]), expect=EXTRAS),
    Case("completion_batch_token_ids_n2", completion(prompt=[PROMPT_IDS, PROMPT_IDS[:3]], n=2, temperature=0.8,
                                                     seed=11), expect=EXTRAS),
    Case("completion_batch_stream", completion(prompt=[PROMPT, "One, two, three,"], **STREAM_USAGE), expect=EXTRAS),
    Case("chat_n2_seeded", chat(n=2, temperature=1.0, seed=7), expect=EXTRAS),
    # tools
    Case("tools_none", chat(tools=[WEATHER], tool_choice="none"), expect=EXTRAS),
    Case("tools_auto_without_parser", chat(tools=[WEATHER], tool_choice="auto")),
    Case("tools_required", chat(tools=[WEATHER, TIME], tool_choice="required", max_tokens=40), expect=FORCED),
    Case("tools_required_single", chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=40), expect=FORCED),
    Case("tools_named", chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                             max_tokens=20), expect=FORCED),
    Case("tools_named_stream", chat(tools=[WEATHER], tool_choice={
        "type": "function", "function": {"name": "get_weather"}}, max_tokens=20, stream=True), expect=FORCED),
    Case("tool_messages", chat(messages=TOOL_TURN, tools=[WEATHER])),
    Case("tool_choice_unknown_function", chat(tools=[WEATHER], tool_choice={
        "type": "function", "function": {"name": "nope"}})),
    # vLLM's sampling extensions
    Case("logit_bias", chat(logit_bias={"504": 100}), expect=EXTRAS),
    Case("top_k_min_p", chat(temperature=0.7, seed=3, top_k=5, min_p=0.1), expect=EXTRAS),
    Case("min_tokens_ignore_eos", completion(prompt="Paris.", min_tokens=6, max_tokens=6, ignore_eos=True),
         expect=EXTRAS),
    Case("repetition_penalty", chat(repetition_penalty=1.3), expect=EXTRAS),
    Case("stop_token_ids", chat(stop_token_ids=[7042], max_tokens=10), expect=EXTRAS),
    Case("include_stop_str", completion(stop=[" France"], include_stop_str_in_output=True, max_tokens=16,
                                        prompt="Paris is the capital of"), expect=EXTRAS),
    Case("skip_special_tokens_false", chat(skip_special_tokens=False, include_stop_str_in_output=True,
                                           max_tokens=16), expect=EXTRAS),
    Case("bad_words", chat(bad_words=["Paris"], max_tokens=12), expect=EXTRAS),
    Case("allowed_token_ids", chat(allowed_token_ids=[504, 3575, 282, 4649]), expect=EXTRAS),
    Case("truncate_prompt_tokens", completion(truncate_prompt_tokens=3), expect=EXTRAS),
    Case("prompt_logprobs_completion", completion(prompt_logprobs=1, max_tokens=2), expect=EXTRAS),
    Case("prompt_logprobs_chat", chat(prompt_logprobs=0, max_tokens=2), expect=EXTRAS),
    Case("return_token_ids_chat_stream", chat(return_token_ids=True, stream=True), expect=EXTRAS),
    Case("return_token_ids_completion", completion(return_token_ids=True), expect=EXTRAS),
    # prompt ids on each completions choice, with echo and logprobs too, and with a character of several bytes
    Case("return_token_ids_completion_emoji", completion(prompt="I love coding \U0001f680", return_token_ids=True),
         expect=EXTRAS),
    Case("return_token_ids_completion_echo_logprobs", completion(return_token_ids=True, echo=True, logprobs=1),
         expect=EXTRAS),
    Case("return_tokens_as_token_ids", chat(logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True),
         expect=EXTRAS),
    Case("structured_json", chat(structured_outputs={"json": {"type": "object", "properties": {
        "capital": {"type": "string"}}, "required": ["capital"]}}, max_tokens=20), expect=EXTRAS),
    Case("structured_regex", completion(structured_outputs={"regex": "[A-Z][a-z]+"}, max_tokens=6), expect=EXTRAS),
    Case("structured_choice", chat(structured_outputs={"choice": ["Paris", "Lyon"]}), expect=EXTRAS),
    Case("structured_grammar", completion(structured_outputs={"grammar": 'root ::= "yes" | "no"'}), expect=EXTRAS),
    Case("response_format_json_schema", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object", "properties": {"capital": {"type": "string"}}}}}, max_tokens=20),
         expect=EXTRAS),
    Case("completion_response_format_json_schema", completion(response_format={"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object", "properties": {"capital": {"type": "string"}}}}}, max_tokens=20),
         expect=EXTRAS),
    Case("priority", chat(priority=0), expect=EXTRAS),
    # issue 26: the logprobs of named token ids; beam search (2 wide: the peer's max_logprobs is the config's 5)
    Case("chat_logprob_token_ids", chat(logprobs=True, logprob_token_ids=[7042, 504], max_tokens=4), expect=EXTRAS),
    Case("completion_logprob_token_ids", completion(logprobs=0, logprob_token_ids=[7042], max_tokens=4),
         expect=EXTRAS),
    Case("chat_beam_search", chat(use_beam_search=True, n=2, max_tokens=6), expect=EXTRAS),
    Case("completion_beam_search", completion(use_beam_search=True, n=2, max_tokens=6, length_penalty=0.5),
         expect=EXTRAS),
    # chat templates and messages
    Case("chat_template_kwargs", chat(chat_template_kwargs={"enable_thinking": False}), expect=EXTRAS),
    Case("add_generation_prompt_false", chat(add_generation_prompt=False), expect=EXTRAS),
    Case("continue_final_message", chat(messages=[*QUESTION, {"role": "assistant", "content": "The capital is"}],
                                        add_generation_prompt=False, continue_final_message=True), expect=EXTRAS),
    Case("echo_chat", chat(messages=[*QUESTION, {"role": "assistant", "content": "The capital is"}],
                           add_generation_prompt=False, continue_final_message=True, echo=True),
         expect=EXTRAS),
    Case("echo_chat_user_last", chat(add_generation_prompt=False, echo=True), expect=EXTRAS),
    Case("chat_batch_roles_echo", Request("POST", "/v1/chat/completions/batch", {
        "model": MODEL, "temperature": 0, "max_tokens": 8, "add_generation_prompt": False, "echo": True,
        "messages": [[*QUESTION, {"role": "assistant", "content": "The capital is"}], QUESTION]}), expect=EXTRAS),
    Case("content_parts_name_extra", chat(messages=[
        {"role": "system", "content": [{"type": "text", "text": "Answer briefly."}], "name": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}], "name": "ann", "x": 1}]),
         expect=EXTRAS),
    # the Responses API
    Case("responses", responses(), expect="responses_fields+vllm_extra_fields"),
    Case("responses_stream", responses(stream=True), expect="responses_fields+vllm_extra_fields"),
    Case("responses_instructions", responses(instructions="Answer in one word."),
         expect="responses_fields+vllm_extra_fields"),
    Case("responses_tool_required", responses(tools=[{"type": "function", **WEATHER["function"]}],
                                              tool_choice="required", max_output_tokens=30), expect=FORCED),
    # other routes
    Case("version", Request("GET", "/version")),
    Case("tokenize_prompt", Request("POST", "/tokenize", {"model": MODEL, "prompt": "The capital of France is"}),
         expect=EXTRAS),
    Case("tokenize_messages_tools", Request("POST", "/tokenize", {"model": MODEL, "messages": QUESTION,
                                                                  "tools": [WEATHER]}), expect=EXTRAS),
    Case("tokenize_messages_open", Request("POST", "/tokenize", {
        "model": MODEL, "messages": [*QUESTION, {"role": "assistant", "content": "The capital is"}],
        "add_generation_prompt": False, "continue_final_message": True}), expect=EXTRAS),
    Case("detokenize", Request("POST", "/detokenize", {"model": MODEL, "tokens": PROMPT_IDS})),
    Case("model_card", Request("GET", f"/v1/models/{MODEL}"), expect="model_card_route"),
    Case("models", Request("GET", "/v1/models"), expect="model_root_is_source"),
    # refusals: the same status, the same parameter named
    Case("top_logprobs_over_max", chat(logprobs=True, top_logprobs=6), expect="top_logprobs_param"),
    Case("unknown_model", chat(model="no-such-model")),
    # `model` left out or null: the served model answers, as in vLLM
    Case("chat_without_model", Request("POST", "/v1/chat/completions",
                                       {"messages": QUESTION, "temperature": 0, "max_tokens": 8}), expect=EXTRAS),
    Case("completion_model_null", completion(model=None), expect=EXTRAS),
    # vLLM's cache_salt: served (the prefix cache keyed by it), and refused in vLLM's words when malformed
    Case("chat_cache_salt", chat(cache_salt="k" * 43), expect=EXTRAS),
    Case("cache_salt_slash", chat(cache_salt="a/b")),
    # vLLM's request_id names the answer (ids are not compared: both serve it); add_special_tokens at its defaults
    Case("chat_request_id", chat(request_id="order-7", add_special_tokens=False), expect=EXTRAS),
    Case("completion_add_special_tokens", completion(add_special_tokens=True, request_id="c-1"), expect=EXTRAS),
    # return_tokens_as_token_ids names logprobs by id, but vLLM's prompt_logprobs keep the decoded text (seed 13)
    Case("prompt_logprobs_token_ids", completion(prompt_logprobs=1, logprobs=0, return_tokens_as_token_ids=True),
         expect=EXTRAS),
    Case("over_context", chat(max_tokens=4096)),
    Case("temperature_negative", chat(temperature=-1)),
    Case("allowed_token_ids_empty", chat(allowed_token_ids=[])),
    Case("structured_two_constraints", chat(structured_outputs={"regex": "a", "choice": ["a"]})),
    Case("continue_and_generation_prompt", chat(continue_final_message=True, add_generation_prompt=True)),
    Case("truncate_over_context", completion(truncate_prompt_tokens=4096)),
    Case("min_tokens_over_max", chat(min_tokens=9)),
    Case("prompt_logprobs_stream", completion(prompt_logprobs=1, stream=True)),
    Case("logprob_token_ids_without_logprobs", chat(logprob_token_ids=[7042])),
    Case("beam_search_stream_completion", completion(use_beam_search=True, stream=True)),
    # issue 26: a completions request without a prompt (vLLM's message), a seed past a 64-bit int (pydantic's bound)
    Case("completion_no_prompt", Request("POST", "/v1/completions", {"model": MODEL, "temperature": 0,
                                                                      "max_tokens": 8})),
    Case("completion_empty_prompt", completion(prompt="")),
    Case("seed_over_int64", chat(seed=2**63)),
    Case("seed_under_int64", completion(seed=-(2**63) - 1)),
]


# -- the generated requests ------------------------------------------------------------------------------------

PROMPTS = ("The capital of France is", "One, two, three,", "def add(a, b):", "Once upon a time",
           "The quick brown fox")
QUESTIONS = ("What is the capital of France?", "Name a colour.", "Say hello.", "What is 2+2?",
             "Write one word about the sea.")
# ids of common SmolLM2 tokens (" Paris", ".", the end-of-text 2, "The", " capital", ...), for every id parameter
TOKEN_POOL = (*PROMPT_IDS, 7042, 30, 2, 28, 29, 198, 1345, 256)
WORDS = ("Paris", "the", "is", "France", "hello", "blue")
# out-of-range values vLLM refuses (and so must the service, naming the same parameter)
INVALID = (("temperature", -0.5), ("top_p", 0.0), ("max_tokens", 0), ("n", 0), ("presence_penalty", 3.0),
           ("frequency_penalty", -2.5), ("min_p", 1.5), ("repetition_penalty", 0.0), ("top_k", -2),
           ("logit_bias", {"abc": 1}), ("allowed_token_ids", []), ("stop_token_ids", ["x"]),
           ("min_tokens", -1), ("truncate_prompt_tokens", -2), ("seed", "seven"), ("bad_words", "Paris"))


def _maybe(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def _sampling(rng: random.Random, body: dict, chat: bool) -> None:
    """vLLM's sampling extensions and OpenAI's sampling fields, each now and then."""
    if _maybe(rng, 0.25):
        body.update(temperature=round(rng.uniform(0.3, 1.2), 2), seed=rng.randrange(1000))
        if _maybe(rng, 0.4):
            body["n"] = rng.randint(2, 3)
    for key, p, value in (
            ("top_k", 0.15, lambda: rng.choice([-1, 0, 1, 5, 50])),
            ("min_p", 0.1, lambda: round(rng.uniform(0, 0.5), 2)),
            ("top_p", 0.1, lambda: round(rng.uniform(0.5, 1), 2)),
            ("repetition_penalty", 0.15, lambda: round(rng.uniform(0.8, 1.5), 2)),
            ("presence_penalty", 0.1, lambda: round(rng.uniform(-1, 1), 2)),
            ("frequency_penalty", 0.1, lambda: round(rng.uniform(-1, 1), 2)),
            ("logit_bias", 0.15, lambda: {str(rng.choice(TOKEN_POOL)): rng.choice([-100, -5, 5, 100])}),
            ("stop_token_ids", 0.1, lambda: rng.sample(TOKEN_POOL, rng.randint(1, 3))),
            ("stop", 0.1, lambda: rng.sample([".", " is", "\n", " the"], rng.randint(1, 2))),
            ("include_stop_str_in_output", 0.1, lambda: True),
            ("ignore_eos", 0.1, lambda: True),
            ("skip_special_tokens", 0.1, lambda: False),
            ("bad_words", 0.1, lambda: rng.sample(WORDS, rng.randint(1, 2))),
            ("allowed_token_ids", 0.08, lambda: rng.sample(TOKEN_POOL, rng.randint(2, 6))),
            ("return_token_ids", 0.15, lambda: True),
            ("truncate_prompt_tokens", 0.08, lambda: rng.randint(2, 12)),
            ("priority", 0.05, lambda: rng.randint(-5, 5))):
        if _maybe(rng, p):
            body[key] = value()
    if _maybe(rng, 0.15):
        body["min_tokens"] = rng.randint(0, body["max_tokens"])
    if _maybe(rng, 0.2):
        if chat:
            body.update(logprobs=True, top_logprobs=rng.randint(0, 5))
        else:
            body["logprobs"] = rng.randint(0, 5)
        if _maybe(rng, 0.2):
            body["return_tokens_as_token_ids"] = True
    if _maybe(rng, 0.08) and not body.get("stream"):
        body["prompt_logprobs"] = rng.randint(0, 2)
    if _maybe(rng, 0.08):
        body["structured_outputs"] = rng.choice([
            {"choice": ["yes", "no", "Paris"]}, {"regex": "[a-z ]{1,12}"},
            {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}}])


def _chat(rng: random.Random) -> dict:
    messages: list[dict] = [{"role": "user", "content": rng.choice(QUESTIONS)}]
    if _maybe(rng, 0.2):
        messages.insert(0, {"role": "system", "content": "Answer briefly."})
    body: dict = {"model": MODEL, "messages": messages}
    if _maybe(rng, 0.15):
        body["tools"] = rng.sample([WEATHER, TIME], rng.randint(1, 2))
        body["tool_choice"] = rng.choice(["none", "required", {"type": "function", "function": {
            "name": body["tools"][0]["function"]["name"]}}])
        if _maybe(rng, 0.3):
            body["parallel_tool_calls"] = False
    elif _maybe(rng, 0.08):
        messages.append({"role": "assistant", "content": "The answer is"})
        body.update(add_generation_prompt=False, continue_final_message=True, echo=_maybe(rng, 0.5))
    return body


def _completion(rng: random.Random) -> dict:
    prompt: object = rng.choice(PROMPTS)
    if _maybe(rng, 0.15):
        prompt = PROMPT_IDS[: rng.randint(2, len(PROMPT_IDS))]
    elif _maybe(rng, 0.15):
        prompt = rng.sample(PROMPTS, 2)
    body: dict = {"model": MODEL, "prompt": prompt}
    if _maybe(rng, 0.15):
        body["echo"] = True
    return body


def generated_request(rng: random.Random) -> Request:
    kind = rng.choices(("chat", "completion", "responses"), (0.55, 0.37, 0.08))[0]
    if kind == "responses":
        body = {"model": MODEL, "input": rng.choice(QUESTIONS), "temperature": 0,
                "max_output_tokens": rng.randint(1, 16), "stream": _maybe(rng, 0.3)}
        return Request("POST", "/v1/responses", body)
    body = _chat(rng) if kind == "chat" else _completion(rng)
    body.update(temperature=0, max_tokens=rng.randint(1, 16))
    if _maybe(rng, 0.3):
        body["stream"] = True
        if _maybe(rng, 0.6):
            body["stream_options"] = {"include_usage": True}
    _sampling(rng, body, kind == "chat")
    if _maybe(rng, 0.08):
        key, value = rng.choice(INVALID)
        body[key] = value
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    return Request("POST", path, body)


def generated(count: int, seed: int) -> list[Case]:
    """`count` requests, the same for the same seed."""
    rng = random.Random(seed)
    return [Case(f"generated-{i}", generated_request(rng)) for i in range(count)]
