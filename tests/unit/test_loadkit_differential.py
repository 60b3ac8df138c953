"""loadkit.differential without a stack: what the normalizer leaves out, what the comparison reports, which known
difference accounts for what, and the generator's determinism."""

from __future__ import annotations

import json

from loadkit.differential.cases import CURATED, generated
from loadkit.differential.compare import (
    ABSENT,
    FLOAT_TOLERANCE,
    Mismatch,
    assemble_stream,
    compare,
    diff,
    normalized,
    strip_volatile,
)
from loadkit.differential.differences import DIFFERENCES, explaining
from loadkit.differential.exchange import Answer, Request
from loadkit.differential.peer import EngineSettings, binding_beside
from loadkit.differential.verdict import judge
from loadkit.sse import read_events

CHAT = Request("POST", "/v1/chat/completions", {"model": "m", "messages": [], "temperature": 0})


def _chat_body(id_: str, created: int, content: str, logprob: float = -0.5) -> dict:
    return {"id": id_, "object": "chat.completion", "created": created, "model": "m", "system_fingerprint": "fp",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": [
                {"id": "chatcmpl-tool-1" if id_.startswith("chatcmpl") else "call_2", "type": "function",
                 "function": {"name": "f", "arguments": "{}"}}]},
                "logprobs": {"content": [{"token": content, "logprob": logprob}]}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def test_ids_clocks_and_fingerprints_are_left_out_but_data_ids_stay():
    a = strip_volatile(_chat_body("chatcmpl-abc", 1, "Paris"))
    b = strip_volatile(_chat_body("chatcmpl-xyz", 2, "Paris"))
    assert a == b
    assert "id" not in a and "created" not in a and "system_fingerprint" not in a
    assert strip_volatile({"data": [{"id": "smollm2-135m-instruct", "created": 5}]}) == {
        "data": [{"id": "smollm2-135m-instruct"}]}


def test_a_different_token_or_finish_reason_is_a_mismatch_named_by_its_path():
    a = normalized(Answer(200, body=_chat_body("chatcmpl-a", 1, "Paris")), CHAT.path)
    b = normalized(Answer(200, body=_chat_body("chatcmpl-b", 1, "Lyon")), CHAT.path)
    paths = {m.path for m in compare(a, b)}
    assert "body.choices[0].message.content" in paths
    assert "body.choices[0].logprobs.content[0].token" in paths


def test_logprobs_compare_within_the_tolerance_and_not_beyond():
    close = FLOAT_TOLERANCE / 2
    assert diff({"logprob": -1.0}, {"logprob": -1.0 - close}) == []
    assert diff({"logprob": -1.0}, {"logprob": -1.0 - 2 * FLOAT_TOLERANCE}) != []
    assert diff({"n": 1}, {"n": 1.0}) == []  # numbers, not their JSON spelling
    assert diff({"ok": True}, {"ok": 1}) != []  # a boolean is not a number


def test_missing_and_extra_fields_and_list_lengths_are_reported():
    found = diff({"a": None, "l": [1, 2]}, {"b": 1, "l": [1]})
    assert Mismatch("a", None, ABSENT) in found
    assert Mismatch("b", ABSENT, 1) in found
    assert Mismatch("l.length", 2, 1) in found


def test_errors_compare_status_and_the_param_vllm_names_not_the_message():
    vllm = Answer(400, body={"error": {"message": "x", "type": "BadRequestError", "param": "n", "code": 400}})
    same = Answer(400, body={"error": {"message": "y", "type": "invalid_request_error", "param": "n", "code": None}})
    other = Answer(400, body={"error": {"message": "y", "type": "invalid_request_error", "param": "top_p"}})
    unnamed = Answer(400, body={"error": {"message": "x", "type": "BadRequestError", "param": None, "code": 400}})
    assert judge(CHAT, vllm, same).outcome == "equal"
    assert [m.path for m in judge(CHAT, vllm, other).mismatches] == ["error.param"]
    assert judge(CHAT, unnamed, other).outcome == "equal"  # vLLM names none: the service may name one
    located = Answer(400, body={"error": {"message": "x", "type": "BadRequestError", "param": "body.n", "code": 400}})
    assert judge(CHAT, located, same).outcome == "equal"  # pydantic's location of the field is the field
    element = Answer(400, body={"error": {"message": "x", "type": "BadRequestError", "param": "body.n.0", "code": 400}})
    assert judge(CHAT, element, same).outcome == "equal"  # and of an element in it
    assert judge(CHAT, Answer(400, body={"error": {"param": "body.nx"}}), same).outcome != "equal"
    assert [m.path for m in judge(CHAT, vllm, Answer(200, body={})).mismatches] == ["status"]


def test_prefix_cache_hits_compare_only_between_servers_with_the_same_history():
    def cached(n: int) -> Answer:
        body = _chat_body("chatcmpl-a", 1, "Paris")
        body["usage"]["prompt_tokens_details"] = {"cached_tokens": n}
        return Answer(200, body=body)

    assert [m.path for m in judge(CHAT, cached(0), cached(16)).mismatches] == [
        "body.usage.prompt_tokens_details.cached_tokens"]
    assert judge(CHAT, cached(0), cached(16), same_history=False).outcome == "equal"


def _sse(*events: dict) -> str:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def test_streams_compare_what_the_client_assembles_not_how_it_was_cut():
    role_first = [{"id": "a", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                  {"id": "a", "choices": [{"index": 0, "delta": {"content": "Par"}}]},
                  {"id": "a", "choices": [{"index": 0, "delta": {"content": "is"}, "finish_reason": "stop"}]}]
    one_chunk = [{"id": "b", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Paris"},
                                          "finish_reason": "stop"}]}]
    a, done_a = read_events(_sse(*role_first))
    b, done_b = read_events(_sse(*one_chunk))
    assert done_a and done_b
    assert assemble_stream(a, True)["choices"] == [{"role": "assistant", "content": "Paris", "finish_reason": "stop"}]
    assert judge(CHAT, Answer(200, events=a, done=True), Answer(200, events=b, done=True)).outcome == "equal"
    b[0]["choices"][0]["finish_reason"] = "length"
    assert judge(CHAT, Answer(200, events=a, done=True), Answer(200, events=b, done=True)).outcome == "mismatch"


def test_a_stream_cut_off_without_done_is_a_mismatch():
    events = [{"choices": [{"index": 0, "delta": {"content": "x"}}]}]
    verdict = judge(CHAT, Answer(200, events=events, done=True), Answer(200, events=events, done=False))
    assert [m.path for m in verdict.mismatches] == ["stream.done"]


def test_streamed_tool_call_arguments_are_joined_per_call():
    events = [{"choices": [{"index": 0, "delta": {"tool_calls": [
                  {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a"}}]}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\": 1}"}}]}}]}]
    calls = assemble_stream(events, True)["choices"][0]["tool_calls"]
    assert calls == [{"type": "function", "name": "f", "arguments": "{\"a\": 1}"}]


def test_a_known_difference_accounts_only_for_its_own_mismatches():
    forced = Request("POST", "/v1/chat/completions", {"tools": [{}], "tool_choice": "required"})
    status = [Mismatch("status", 400, 200)]
    assert [d.name for d in explaining(forced, status) or []] == ["forced_tools_without_parser"]
    assert explaining(CHAT, status) is None  # a status difference on a plain chat is accounted for by nothing
    null_extra = Mismatch("body.choices[0].stop_reason", None, ABSENT)
    text = Mismatch("body.choices[0].message.content", "Paris", "Lyon")
    assert [d.name for d in explaining(CHAT, [null_extra]) or []] == ["vllm_extra_fields"]
    assert explaining(CHAT, [null_extra, text]) is None
    assert explaining(CHAT, [Mismatch("body.choices[0].token_ids", [1], ABSENT)]) is None  # a value, not a null
    streamed = Request("POST", "/v1/chat/completions", {"stream": True, "allowed_token_ids": []})
    assert [d.name for d in explaining(streamed, [Mismatch("status", 200, 400)]) or []] == ["refused_before_the_stream"]
    assert explaining(streamed, [Mismatch("status", 200, 400), text]) is None  # vLLM streamed an answer: a finding


def test_every_curated_expectation_names_known_differences_and_the_set_covers_the_surface():
    names = {d.name for d in DIFFERENCES}
    for case in CURATED:
        assert case.expect == "equal" or set(case.expect.split("+")) <= names, case.name
    bodies = json.dumps([c.request.body for c in CURATED])
    for field in ("tool_choice", "parallel_tool_calls", "logit_bias", "top_k", "min_p", "min_tokens",
                  "repetition_penalty", "stop_token_ids", "ignore_eos", "include_stop_str_in_output",
                  "skip_special_tokens", "bad_words", "allowed_token_ids", "truncate_prompt_tokens",
                  "prompt_logprobs", "return_token_ids", "return_tokens_as_token_ids", "structured_outputs",
                  "continuous_usage_stats", "priority", "chat_template_kwargs", "add_generation_prompt",
                  "continue_final_message", "echo", "\"name\"", "\"tool\""):
        assert field in bodies, field
    paths = {c.request.path for c in CURATED}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/version"} <= paths


def test_the_generator_repeats_itself_for_a_seed_and_varies_across_seeds():
    first = [c.request for c in generated(40, seed=3)]
    assert first == [c.request for c in generated(40, seed=3)]
    assert first != [c.request for c in generated(40, seed=4)]
    for r in first:
        body = r.body or {}
        assert body.get("temperature") == 0 or "seed" in body, body  # greedy or seeded: repeatable
        assert int(body.get("max_tokens") or body.get("max_output_tokens") or 1) <= 16


def test_the_peer_gets_the_services_engine_arguments():
    config = {"models": [{"id": "smollm2-135m-instruct", "engine": {
        "max_model_len": 1024, "max_num_seqs": 16, "kv_cache_gib": 1, "dtype": "float32", "seed": 7,
        "tool_call_parser": "hermes"}, "limits": {"max_logprobs": 3}}]}
    s = EngineSettings.from_config(config)
    assert (s.max_model_len, s.max_num_seqs, s.kv_cache_gib, s.dtype, s.seed, s.max_logprobs) == (
        1024, 16, 1, "float32", 7, 3)
    args = s.extra_args()
    assert args[args.index("--seed") + 1] == "7" and args[args.index("--max-logprobs") + 1] == "3"
    assert args[args.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in args
    auto = EngineSettings.from_config({"models": [{"id": "m", "engine": {"dtype": "auto"}}]})
    assert auto.dtype in ("bfloat16", "float32") and auto.tool_call_parser is None
    # usage's prompt_tokens_details: null on both by default (issue 26), reported by both where the config says so
    assert "--enable-prompt-tokens-details" not in args + auto.extra_args()
    on = EngineSettings.from_config({**config, "service": {"enable_prompt_tokens_details": True}})
    assert "--enable-prompt-tokens-details" in on.extra_args()


def test_the_peer_computes_on_the_cores_the_services_engine_leaves_to_its_front_end():
    assert binding_beside({"compute_cores": [0], "front_end_cores": [1]}) == {"VLLM_CPU_OMP_THREADS_BIND": "1"}
    assert binding_beside({"compute_cores": [0, 1, 2], "front_end_cores": [3, 7]}) == {
        "VLLM_CPU_OMP_THREADS_BIND": "3,7"}
    # One core, or a service whose engine binds nothing: vLLM's own binding.
    assert binding_beside({"compute_cores": [0], "front_end_cores": []}) == {}
    assert binding_beside({"compute_cores": [0, 1], "front_end_cores": [0, 1]}) == {}
    assert binding_beside({}) == {}
