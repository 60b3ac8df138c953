"""The curated set: one or more requests for every item of the surface the service shares with `vllm serve`.

Every case is greedy (`temperature: 0`) or seeded, and short (a few tokens), so the whole set runs on both
servers in about a minute on two cores. `expect` is "equal", or the '+'-joined names of the known differences
(differences.py) the case may show; the integration test asserts that it is equal or shows only those.
"""

from __future__ import annotations

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
    Case("return_tokens_as_token_ids", chat(logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True),
         expect=EXTRAS + "+token_id_bytes"),
    Case("structured_json", chat(structured_outputs={"json": {"type": "object", "properties": {
        "capital": {"type": "string"}}, "required": ["capital"]}}, max_tokens=20), expect=EXTRAS),
    Case("structured_regex", completion(structured_outputs={"regex": "[A-Z][a-z]+"}, max_tokens=6), expect=EXTRAS),
    Case("structured_choice", chat(structured_outputs={"choice": ["Paris", "Lyon"]}), expect=EXTRAS),
    Case("structured_grammar", completion(structured_outputs={"grammar": 'root ::= "yes" | "no"'}), expect=EXTRAS),
    Case("response_format_json_schema", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object", "properties": {"capital": {"type": "string"}}}}}, max_tokens=20),
         expect=EXTRAS),
    Case("priority", chat(priority=0), expect=EXTRAS),
    # chat templates and messages
    Case("chat_template_kwargs", chat(chat_template_kwargs={"enable_thinking": False}), expect=EXTRAS),
    Case("add_generation_prompt_false", chat(add_generation_prompt=False), expect=EXTRAS),
    Case("continue_final_message", chat(messages=[*QUESTION, {"role": "assistant", "content": "The capital is"}],
                                        add_generation_prompt=False, continue_final_message=True), expect=EXTRAS),
    Case("echo_chat", chat(messages=[*QUESTION, {"role": "assistant", "content": "The capital is"}],
                           add_generation_prompt=False, continue_final_message=True, echo=True),
         expect=EXTRAS + "+echo_prompt_logprobs"),
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
    Case("model_card", Request("GET", f"/v1/models/{MODEL}"), expect="model_card_route"),
    Case("models", Request("GET", "/v1/models"), expect="model_root_is_source"),
    # refusals: the same status, the same parameter named
    Case("top_logprobs_over_max", chat(logprobs=True, top_logprobs=6), expect="top_logprobs_param"),
    Case("unknown_model", chat(model="no-such-model")),
    Case("over_context", chat(max_tokens=4096)),
    Case("temperature_negative", chat(temperature=-1)),
    Case("allowed_token_ids_empty", chat(allowed_token_ids=[])),
    Case("structured_two_constraints", chat(structured_outputs={"regex": "a", "choice": ["a"]})),
    Case("continue_and_generation_prompt", chat(continue_final_message=True, add_generation_prompt=True)),
    Case("truncate_over_context", completion(truncate_prompt_tokens=4096)),
    Case("min_tokens_over_max", chat(min_tokens=9)),
    Case("prompt_logprobs_stream", completion(prompt_logprobs=1, stream=True)),
]
