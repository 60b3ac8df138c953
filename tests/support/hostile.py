"""The hand-written hostile request list, and what every case must come to.

`hostile_cases(model)` builds the list for any model id and the service's limits: the unit suite
sends it to the in-process app (tests/unit/test_hostile_inputs.py), the integration suite once to
the real stack (tests/integration/test_fuzz_real.py), so nothing here depends on the fake engine.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.error_shape import ERROR_KEYS

ANY_PARAM = object()  # the error may name any parameter, or none
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
CASE_TIMEOUT_S = 30  # a hostile request that takes longer than this has hung the app


@dataclass(frozen=True)
class Hostile:
    name: str
    path: str
    body: bytes
    statuses: tuple[int, ...] = (400,)  # acceptable statuses; a 4xx among them must be OpenAI-shaped
    param: Any = ANY_PARAM  # the parameter a 4xx must name (None: must name none)
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False  # send without Content-Length, in chunks
    server_level: bool = False  # the HTTP server itself may refuse it (real stack): any non-5xx, any shape
    over_http: bool = True  # False: an HTTP client library will not send it (e.g. a lying Content-Length)

    def __repr__(self) -> str:  # keeps pytest ids and failure messages short
        return f"Hostile({self.name})"


EMBEDDINGS = "/v1/embeddings"


def as_json(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def small_chat(model: str, content: Any = "Hello", **extra: Any) -> dict[str, Any]:
    """A small valid chat body for `model`."""
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def _nested(depth: int, opening: str, closing: str, leaf: str) -> str:
    return opening * depth + leaf + closing * depth


# Wrong JSON types, one parameter at a time: (path, parameter, value).
WRONG_TYPES: list[tuple[str, str, Any]] = [
    (CHAT, "model", 5), (CHAT, "model", ["m"]), (CHAT, "messages", "Hello"), (CHAT, "messages", {"role": "user"}),
    (CHAT, "temperature", "hot"), (CHAT, "top_p", []), (CHAT, "n", "many"), (CHAT, "n", 1.5),
    (CHAT, "max_tokens", {"a": 1}), (CHAT, "max_tokens", 2.5), (CHAT, "max_completion_tokens", "x"),
    (CHAT, "stop", 5), (CHAT, "stop", [None]), (CHAT, "seed", "x"), (CHAT, "seed", 0.5),
    (CHAT, "presence_penalty", "x"), (CHAT, "frequency_penalty", []), (CHAT, "stream", "maybe"),
    (CHAT, "top_k", "x"), (CHAT, "min_p", []), (CHAT, "logit_bias", [1]), (CHAT, "stop_token_ids", "1"),
    (COMPLETIONS, "bad_words", "word"), (COMPLETIONS, "allowed_token_ids", {"1": 1}),
    (CHAT, "stream_options", 5), (CHAT, "ignore_eos", {}), (CHAT, "logprobs", "x"), (CHAT, "top_logprobs", "x"),
    (CHAT, "response_format", "json"), (CHAT, "response_format", {"type": 5}),
    (COMPLETIONS, "prompt", 5), (COMPLETIONS, "prompt", {"text": "x"}), (COMPLETIONS, "prompt", [[1, "a"]]),
    (COMPLETIONS, "echo", "x"), (COMPLETIONS, "logprobs", "x"), (COMPLETIONS, "max_tokens", "x"),
    ("/tokenize", "prompt", 5), ("/tokenize", "messages", "x"),
    ("/detokenize", "tokens", "abc"), ("/detokenize", "tokens", [1.5]), ("/detokenize", "tokens", [-1]),
]


def embedding_cases(model: str) -> list[Hostile]:
    """Hostile /v1/embeddings bodies for an embedding model (`runner: embed`); none depends on the engine (the
    out-of-vocabulary id is beyond every vocabulary), so the real stack gets the same list."""
    def case(name: str, body: dict, param: object, statuses: tuple[int, ...] = (400,)) -> Hostile:
        return Hostile(f"embeddings-{name}", EMBEDDINGS, as_json({"model": model, **body}), statuses, param)

    huge = "x" * 600_000  # certainly over the prompt limit from its size alone, under the body limit
    return [
        case("no-input", {}, "input"),
        case("null-input", {"input": None}, "input"),
        case("number-input", {"input": 7}, "input"),
        case("object-input", {"input": {"text": "a"}}, "input"),
        case("mixed-list", {"input": [1, "a"]}, "input"),
        case("float-ids", {"input": [1.5, 2]}, "input"),
        case("negative-id", {"input": [-1]}, "input"),
        case("huge-id", {"input": [2**64]}, "input"),
        case("out-of-vocabulary-id", {"input": [[1, 2], [2**31 - 1]]}, "input"),
        case("empty-string", {"input": ""}, "input"),
        case("empty-list", {"input": []}, "input"),
        case("empty-id-list", {"input": [[]]}, "input"),
        case("too-many-inputs", {"input": ["a"] * 300}, "input"),
        case("too-long", {"input": huge}, "input"),
        case("too-long-in-a-batch", {"input": ["ok", huge[:100_000]]}, "input"),
        case("lone-surrogate", {"input": "\ud800"}, ANY_PARAM, (200, 400)),
        case("nan-dimensions", {"input": "a", "dimensions": float("nan")}, "dimensions"),
        case("zero-dimensions", {"input": "a", "dimensions": 0}, "dimensions"),
        case("huge-dimensions", {"input": "a", "dimensions": 2**40}, "dimensions"),
        case("format-hex", {"input": "a", "encoding_format": "hex"}, "encoding_format"),
        case("format-bytes", {"input": "a", "encoding_format": "bytes"}, "encoding_format"),
        case("format-null", {"input": "a", "encoding_format": None}, "encoding_format"),
        case("embed-dtype", {"input": "a", "embed_dtype": "float16"}, "embed_dtype"),
        case("unknown-field", {"input": "a", "normalize": True}, "normalize"),
        case("messages", {"messages": [{"role": "user", "content": "a"}]}, ANY_PARAM),
        case("truncate-over-context", {"input": "a", "truncate_prompt_tokens": 10**6}, "truncate_prompt_tokens"),
    ]


def hostile_cases(model: str, max_messages: int = 512, max_body_bytes: int = 1_000_000) -> list[Hostile]:
    """The hostile list for a service that serves `model` with these limits (the defaults are the
    service's defaults; everything else is far beyond any sane limit)."""
    name = model.encode()

    def chat(**extra: Any) -> bytes:
        return as_json(small_chat(model, **extra))

    def raw_chat(tail: bytes) -> bytes:  # a valid chat body with `tail` as raw JSON fields at its end
        return b'{"model":"' + name + b'","messages":[{"role":"user","content":"Hi"}],"max_tokens":4,' + tail + b"}"

    def raw_content(content: str) -> bytes:  # a chat body whose one message has `content` as raw JSON
        return b'{"model":"' + name + b'","messages":[{"role":"user","content":' + content.encode() + b"}]}"

    def messages(value: Any) -> bytes:
        return as_json({"model": model, "messages": value, "max_tokens": 4})

    def completion(**fields: Any) -> bytes:
        return as_json({"model": model, "prompt": "Hi", "max_tokens": 4, **fields})

    def tokens(**fields: Any) -> bytes:  # a /tokenize or /detokenize body
        return as_json({"model": model, **fields})

    def schema(value: Any, schema_name: str = "x") -> bytes:
        return chat(response_format={"type": "json_schema", "json_schema": {"name": schema_name, "schema": value}})

    either = (200, 400)  # refused, or answered: an engine may take it
    user_hi = {"role": "user", "content": "Hi"}
    oversized = as_json(small_chat(model, "x" * (max_body_bytes + 1000)))
    cases = [
        # -- not JSON, or not a JSON object --
        Hostile("malformed-json", CHAT, b'{"model": "' + name + b'", "messages": [', param=None),
        Hostile("trailing-garbage", CHAT, chat() + b"}}", param=None),
        Hostile("body-list", CHAT, b"[1, 2, 3]", param=None),
        Hostile("body-string", CHAT, b'"Hello"', param=None),
        Hostile("body-null", CHAT, b"null", param=None),
        Hostile("body-number", CHAT, b"42", param=None),
        Hostile("body-empty", CHAT, b"", param=None),
        Hostile("body-whitespace", CHAT, b" \n\t ", param=None),
        Hostile("invalid-utf8-body", CHAT, b"\xff\xfe\xfa" + chat(), param=None),
        Hostile("invalid-utf8-in-string", CHAT, chat(content="@@").replace(b"@@", b"\xc3\x28\xa0\xa1"), param=None),
        Hostile("nul-bytes-in-string", CHAT, chat(content="a\x00b\x00"), statuses=either),
        Hostile("duplicate-keys", CHAT, raw_chat(b'"n":1,"n":"two"'), param="n"),
        # -- values out of range --
        Hostile("n-1e9", CHAT, chat(n=10**9), param="n"),
        Hostile("n-zero", CHAT, chat(n=0), param="n"),
        Hostile("n-negative", CHAT, chat(n=-1), param="n"),
        Hostile("max-tokens-negative", CHAT, chat(max_tokens=-1), param="max_tokens"),
        Hostile("max-tokens-zero", CHAT, chat(max_tokens=0), param="max_tokens"),
        Hostile("max-tokens-1e12", CHAT, chat(max_tokens=10**12), param="max_tokens"),
        Hostile("max-tokens-1e40", CHAT, chat(max_tokens=10**40), param="max_tokens"),
        Hostile("max-completion-tokens-1e12", CHAT, chat(max_completion_tokens=10**12), param="max_completion_tokens"),
        Hostile("completion-max-tokens-1e12", COMPLETIONS, completion(max_tokens=10**12), param="max_tokens"),
        Hostile("top-logprobs-1e6", CHAT, chat(logprobs=True, top_logprobs=10**6), param="top_logprobs"),
        Hostile("top-logprobs-negative", CHAT, chat(logprobs=True, top_logprobs=-1), param="top_logprobs"),
        Hostile("completion-logprobs-1e6", COMPLETIONS, completion(logprobs=10**6), param="logprobs"),
        Hostile("seed-2e70", CHAT, chat(seed=2**70), param="seed"),
        Hostile("temperature-huge-int", CHAT, chat(temperature=10**400), param="temperature"),
        Hostile("integer-5000-digits", CHAT, raw_chat(b'"n":' + b"9" * 5000), param=ANY_PARAM),
        Hostile("n-1e308-float", CHAT, raw_chat(b'"n":1e308'), param="n"),
        # -- NaN and the infinities (Python's json accepts them; send them raw) --
        Hostile("temperature-nan", CHAT, raw_chat(b'"temperature":NaN'), param="temperature"),
        Hostile("temperature-infinity", CHAT, raw_chat(b'"temperature":Infinity'), param="temperature"),
        Hostile("top-p-nan", CHAT, raw_chat(b'"top_p":NaN'), param="top_p"),
        Hostile("presence-penalty-minus-infinity", CHAT, raw_chat(b'"presence_penalty":-Infinity'),
                param="presence_penalty"),
        Hostile("frequency-penalty-nan", CHAT, raw_chat(b'"frequency_penalty":NaN'), param="frequency_penalty"),
        Hostile("max-tokens-nan", COMPLETIONS, b'{"model":"' + name + b'","prompt":"Hi","max_tokens":NaN}',
                param="max_tokens"),
        Hostile("seed-infinity", CHAT, raw_chat(b'"seed":Infinity'), param="seed"),
        # -- vLLM's sampling extensions: sizes, ids and values beyond their bounds --
        Hostile("logit-bias-20000-entries", CHAT, chat(logit_bias={str(i): 1 for i in range(20_000)}),
                param="logit_bias"),
        Hostile("logit-bias-key-not-an-id", CHAT, chat(logit_bias={"the": 5}), param="logit_bias"),
        Hostile("logit-bias-key-5000-digits", CHAT, chat(logit_bias={"9" * 5000: 5}), param="logit_bias"),
        Hostile("logit-bias-id-2e70", CHAT, chat(logit_bias={str(2**70): 5}), param="logit_bias"),
        Hostile("logit-bias-out-of-vocab", CHAT, chat(logit_bias={str(10**9): 5}), param="logit_bias"),
        Hostile("logit-bias-nan", CHAT, raw_chat(b'"logit_bias":{"1":NaN}'), param="logit_bias"),
        Hostile("allowed-token-ids-empty", CHAT, chat(allowed_token_ids=[]), param="allowed_token_ids"),
        Hostile("allowed-token-ids-100000", COMPLETIONS, completion(allowed_token_ids=list(range(100_000))),
                param="allowed_token_ids"),
        Hostile("allowed-token-ids-out-of-vocab", CHAT, chat(allowed_token_ids=[1, 10**9]), param="allowed_token_ids"),
        Hostile("stop-token-ids-2e70", CHAT, chat(stop_token_ids=[2**70]), param="stop_token_ids"),
        Hostile("stop-token-ids-out-of-vocab", COMPLETIONS, completion(stop_token_ids=[10**9]), param="stop_token_ids"),
        Hostile("bad-words-5000", CHAT, chat(bad_words=[f"w{i}" for i in range(5000)]), param="bad_words"),
        Hostile("bad-words-100k-chars", CHAT, chat(bad_words=["x" * 100_000]), param="bad_words"),
        Hostile("bad-words-lone-surrogate", CHAT, chat(bad_words=["\ud800"]), param="bad_words"),
        Hostile("bad-words-whitespace", CHAT, chat(bad_words=[" "]), statuses=(200, 400), param="bad_words"),
        Hostile("top-k-2e70", CHAT, chat(top_k=2**70), param="top_k"),
        Hostile("min-tokens-1e12", CHAT, chat(min_tokens=10**12), param="min_tokens"),
        Hostile("min-tokens-over-max-tokens", COMPLETIONS, completion(min_tokens=5), param="min_tokens"),
        Hostile("repetition-penalty-nan", CHAT, raw_chat(b'"repetition_penalty":NaN'), param="repetition_penalty"),
        Hostile("min-p-infinity", CHAT, raw_chat(b'"min_p":Infinity'), param="min_p"),
        # -- stop sequences --
        Hostile("stop-5000-strings", CHAT, chat(stop=[f"s{i}" for i in range(5000)]), param="stop"),
        Hostile("stop-100k-chars", CHAT, chat(stop="x" * 100_000), param="stop"),
        Hostile("stop-empty-string", CHAT, chat(stop=""), param="stop"),
        Hostile("stop-list-with-empty", CHAT, chat(stop=["a", ""]), param="stop"),
        # -- prompts and messages --
        Hostile("messages-empty-list", CHAT, messages([]), param="messages"),
        Hostile("messages-missing", CHAT, as_json({"model": model, "max_tokens": 4}), param="messages"),
        Hostile("message-not-object", CHAT, messages(["Hi"]), param="messages"),
        Hostile("message-role-missing", CHAT, messages([{"content": "Hi"}]), param="messages"),
        # Any role string goes to the chat template as vLLM passes it (issue 26); one that is no word is a 400.
        Hostile("role-endless", CHAT, messages([{"role": "r" * 10_000, "content": "Hi"}]), param="messages"),
        Hostile("role-not-a-string", CHAT, messages([{"role": 7, "content": "Hi"}]), param="messages"),
        Hostile("tool-call-id-not-a-string", CHAT, messages([{"role": "tool", "content": "Hi", "tool_call_id": 1}]),
                param="messages"),
        Hostile("assistant-tool-calls-not-a-list", CHAT, messages([{"role": "assistant", "tool_calls": "f()"}]),
                param="messages"),
        # accepted and left out of the prompt, as vLLM does
        Hostile("message-unknown-key", CHAT, messages([{**user_hi, "x": 1}]), statuses=(200,)),
        Hostile("content-image-part", CHAT, chat(content=[{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]),
                param="messages"),
        Hostile("content-part-without-text", CHAT, chat(content=[{"type": "text"}]), param="messages"),
        Hostile(f"messages-over-{max_messages}", CHAT, messages([user_hi] * (max_messages + 1)), param="messages"),
        # empty and whitespace-only text: a chat template still renders role markers, so a 200 is fine there
        Hostile("content-empty", CHAT, chat(content=""), statuses=either, param="messages"),
        Hostile("content-whitespace", CHAT, chat(content="   \n\t "), statuses=either, param="messages"),
        Hostile("content-null", CHAT, chat(content=None), statuses=either, param="messages"),
        Hostile("content-empty-parts", CHAT, chat(content=[]), statuses=either, param="messages"),
        Hostile("prompt-empty", COMPLETIONS, completion(prompt=""), statuses=either, param="prompt"),
        Hostile("prompt-whitespace", COMPLETIONS, completion(prompt="   "), statuses=either, param="prompt"),
        Hostile("prompt-empty-list", COMPLETIONS, completion(prompt=[]), param="prompt"),
        Hostile("prompt-batch-33", COMPLETIONS, completion(prompt=["a"] * 33), param="prompt"),
        Hostile("prompt-batch-choices-65", COMPLETIONS, completion(prompt=["a"] * 17, n=4, temperature=1),
                statuses=(400,), param="n"),
        Hostile("prompt-batch-mixed", COMPLETIONS, completion(prompt=["a", [1]]), param="prompt"),
        Hostile("prompt-batch-empty-ids", COMPLETIONS, completion(prompt=[[1], []]), param="prompt"),
        Hostile("prompt-negative-token", COMPLETIONS, completion(prompt=[1, -5]), param="prompt"),
        # token ids past the vocabulary (and past 32 and 64 bits): the engine refuses them, or a fake one answers
        Hostile("prompt-token-out-of-vocab", COMPLETIONS, completion(prompt=[10**9]), statuses=either),
        Hostile("prompt-token-2e70", COMPLETIONS, completion(prompt=[2**70]), statuses=either),
        Hostile("prompt-token-2e70-echo", COMPLETIONS, completion(prompt=[2**70], echo=True), statuses=either),
        Hostile("tokenize-both", "/tokenize", tokens(prompt="Hi", messages=[user_hi]), param="prompt"),
        Hostile("tokenize-neither", "/tokenize", tokens(), param="prompt"),
        Hostile("tokenize-bad-message", "/tokenize", tokens(messages=[{"role": ""}]), param="messages"),
        Hostile("detokenize-out-of-vocab", "/detokenize", tokens(tokens=[10**9]), statuses=either, param="tokens"),
        Hostile("detokenize-2e32", "/detokenize", tokens(tokens=[2**32]), statuses=either, param="tokens"),
        Hostile("detokenize-2e70", "/detokenize", tokens(tokens=[2**70]), statuses=either, param="tokens"),
        # -- deep nesting: a 400, not a RecursionError --
        Hostile("nested-lists-in-content-10000", CHAT, raw_content(_nested(10_000, "[", "]", "")), param=ANY_PARAM),
        Hostile("nested-dicts-in-content-10000", CHAT, raw_content(_nested(10_000, '{"a":', "}", "1")),
                param=ANY_PARAM),
        Hostile("nested-lists-body-100000", CHAT, _nested(100_000, "[", "]", "").encode(), param=ANY_PARAM),
        Hostile("nested-in-ignored-field", CHAT, raw_chat(b'"user":' + _nested(5_000, "[", "]", "1").encode()),
                param=ANY_PARAM),
        Hostile("nested-json-schema-500", CHAT, schema(json.loads(_nested(500, '{"items":', "}", "{}")), "deep"),
                param="response_format"),
        Hostile("nested-json-schema-65", CHAT, schema(json.loads(_nested(65, '{"items":', "}", "{}")), "deep"),
                param="response_format"),
        Hostile("nested-tokenize-messages", "/tokenize", raw_content(_nested(10_000, "[", "]", "")), param=ANY_PARAM),
        # nested deep enough to break what serializes them (a size check's json.dumps, Ray's pickling), not the parser
        Hostile("nested-template-kwargs-960", CHAT, raw_chat(b'"chat_template_kwargs":{"a":'
                                                             + _nested(960, '{"a":', "}", "1").encode() + b"}"),
                param="chat_template_kwargs"),
        Hostile("nested-template-kwargs-450", CHAT, raw_chat(b'"chat_template_kwargs":{"a":'
                                                             + _nested(450, "[", "]", "1").encode() + b"}"),
                param="chat_template_kwargs"),
        Hostile("nested-structured-outputs-json-960", CHAT,
                raw_chat(b'"structured_outputs":{"json":' + _nested(960, '{"a":', "}", "{}").encode() + b"}"),
                param="structured_outputs"),
        Hostile("nested-tool-call-arguments-450", CHAT, as_json({"model": model, "max_tokens": 4, "messages": [
            user_hi, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "f", "arguments": json.loads(_nested(450, '{"a":', "}", "1"))}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}), param="messages"),
        Hostile("nested-responses-metadata-450", "/v1/responses", as_json({"model": model, "input": "Hi",
                "max_output_tokens": 4, "metadata": json.loads(_nested(450, '{"a":', "}", "1"))}), param="metadata"),
        # -- names and strings --
        Hostile("model-10k-chars", CHAT, as_json(small_chat("m" * 10_000)), statuses=(404,), param="model"),
        # "" (or null, or left out) is the one served model, as in vLLM
        Hostile("model-empty", CHAT, as_json(small_chat("")), statuses=(200,), param=None),
        Hostile("model-path-traversal", CHAT, as_json(small_chat("../../etc/passwd")), statuses=(404,), param="model"),
        Hostile("unknown-parameter", CHAT, chat(frobnicate=True), param="frobnicate"),
        # tools: "auto" (the default with tools) needs a tool-call parser the test models do not have
        Hostile("tools-auto-without-parser", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]),
                param="tool_choice"),
        Hostile("tools-empty", CHAT, chat(tools=[]), param="tools"),
        Hostile("tools-schema-not-a-schema", CHAT, chat(tool_choice="required", tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 5}}}]),
                param="tools"),
        Hostile("tools-schema-nested-65", CHAT, chat(tool_choice="required", tools=[{"type": "function", "function": {
            "name": "f", "parameters": json.loads(_nested(65, '{"items":', "}", "{}"))}}]), param="tools"),
        Hostile("tools-too-many", CHAT, chat(tool_choice="required", tools=[
            {"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]), param="tools"),
        Hostile("tool-choice-unknown-function", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                                           tool_choice={"type": "function", "function": {"name": "g"}}),
                param="tool_choice"),
        Hostile("tool-choice-without-tools", CHAT, chat(tool_choice="required"), param="tool_choice"),
        Hostile("stream-options-without-stream", CHAT, chat(stream_options={"include_usage": True}),
                param="stream_options"),
        Hostile("top-logprobs-without-logprobs", CHAT, chat(top_logprobs=2), param="top_logprobs"),
        Hostile("max-tokens-disagree", CHAT, chat(max_tokens=4, max_completion_tokens=5),
                param="max_completion_tokens"),
        # lone surrogates are legal JSON escapes but not text: refused or answered, never a 500
        Hostile("surrogate-in-content", CHAT, raw_chat(b'"n":1').replace(b'"Hi"', b'"Hi \\ud800 there"'),
                statuses=either),
        Hostile("surrogate-in-stop", CHAT, raw_chat(b'"stop":"\\udfff"'), param="stop"),
        Hostile("surrogate-in-choice", CHAT, raw_chat(b'"structured_outputs":{"choice":["\\ud800","b"]}'),
                param="structured_outputs"),  # was a 500: the grammar gate's cache key could not encode it
        Hostile("surrogate-in-json-schema", CHAT, raw_chat(
            b'"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","enum":["\\ud800"]}}}'),
                param="response_format"),  # was xgrammar's own words: "Failed to parse JSON: syntax error"
        Hostile("surrogate-in-schema-key", CHAT, raw_chat(
            b'"structured_outputs":{"json":{"type":"object","properties":{"\\udfff":{"type":"string"}}}}'),
                param="structured_outputs"),
        Hostile("surrogate-in-tool-schema", CHAT, raw_chat(b'"tool_choice":"required","tools":[{"type":"function",'
                                                           b'"function":{"name":"f","parameters":{"type":"object",'
                                                           b'"description":"\\ud800"}}}]'), param="tools"),
        Hostile("surrogate-in-model", CHAT, as_json(small_chat("m\ud800")), statuses=(400, 404), param="model"),
        Hostile("surrogate-in-tokenize-model", "/tokenize", as_json({"model": "m\udc00", "prompt": "Hi"}),
                statuses=(400, 404), param="model"),
        Hostile("surrogate-in-detokenize-model", "/detokenize", as_json({"model": "m\udc00", "tokens": [1]}),
                statuses=(400, 404), param="model"),
        Hostile("surrogate-in-unknown-key", CHAT, raw_chat(b'"\\ud800":1'), param=ANY_PARAM),
        Hostile("surrogate-echoed", COMPLETIONS, completion(prompt="a\ud800b", echo=True, max_tokens=2),
                statuses=either, param="prompt"),
        Hostile("surrogate-echoed-stream", COMPLETIONS,
                completion(prompt="a\ud800b", echo=True, max_tokens=2, stream=True), statuses=either, param="prompt"),
        Hostile("surrogate-pair-split", CHAT, raw_chat(b'"stop":["\\udbff","\\udc00"]'), param="stop"),
        # -- response_format --
        Hostile("json-schema-invalid-type", CHAT, schema({"type": "nonsense"}), param="response_format"),
        Hostile("json-schema-properties-not-object", CHAT, schema({"type": "object", "properties": 5}),
                param="response_format"),
        Hostile("json-schema-bad-regex", CHAT, schema({"type": "string", "pattern": "("}), param="response_format"),
        Hostile("json-schema-not-object", CHAT, schema([1, 2]), param="response_format"),
        Hostile("json-schema-missing", CHAT, chat(response_format={"type": "json_schema"}), param="response_format"),
        Hostile("json-schema-name-too-long", CHAT,
                chat(response_format={"type": "json_schema", "json_schema": {"name": "n" * 65}}),
                param="response_format"),
        Hostile("json-schema-nan", CHAT, raw_chat(
            b'"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"number","minimum":NaN}}}'),
                statuses=either, param="response_format"),
        Hostile("json-schema-remote-ref", CHAT, schema({"$ref": "http://127.0.0.1:9/x.json"}), statuses=either,
                param="response_format"),
        Hostile("response-format-unknown-type", CHAT, chat(response_format={"type": "xml"}), param="response_format"),
        # -- size --
        Hostile("body-over-limit", CHAT, oversized, statuses=(413,), param=None),
        Hostile("body-over-limit-chunked", CHAT, oversized, statuses=(413,), param=None, chunked=True),
        Hostile("content-length-lies-large", CHAT, chat(), statuses=(413,), param=None,
                headers={"content-length": str(max_body_bytes * 10)}, over_http=False),
        # -- headers --
        Hostile("header-64k", CHAT, chat(), statuses=(431,), headers={"x-padding": "a" * 65_536}, server_level=True),
        Hostile("request-id-64k", CHAT, chat(), statuses=(431,), headers={"x-request-id": "r" * 65_536},
                server_level=True),
        # curl -d's form type and fetch()'s text/plain: a 400 that says which header to send, as vLLM refuses them
        Hostile("content-type-text", CHAT, chat(), param=None, headers={"content-type": "text/plain"}),
        Hostile("content-type-form", CHAT, chat(), param=None,
                headers={"content-type": "application/x-www-form-urlencoded"}),
        Hostile("authorization-garbage", CHAT, chat(), statuses=(200, 401),
                headers={"authorization": "Bearer " + "x" * 4000}),
    ]
    valid_bodies = {CHAT: small_chat(model), COMPLETIONS: {"model": model, "prompt": "Hi", "max_tokens": 4},
                    "/tokenize": {"model": model, "prompt": "Hi"}, "/detokenize": {"model": model, "tokens": [1, 2]}}
    for path, field_name, value in WRONG_TYPES:
        body = dict(valid_bodies[path])
        if path == "/tokenize" and field_name == "messages":
            body.pop("prompt")
        body[field_name] = value
        label = "".join(ch if ch.isalnum() or ch == "." else "_" for ch in json.dumps(value))[:12]
        cases.append(Hostile(f"wrong-type-{path.strip('/').replace('/', '-')}-{field_name}={label}", path,
                             as_json(body), param=field_name,
                             statuses=(400, 404) if field_name == "model" else (400,)))
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


def check_outcome(case: Hostile, status: int, content_type: str, raw: bytes) -> None:
    """What every hostile case must come to: an allowed status, never a 5xx or a 422, and a 4xx in
    the OpenAI shape naming the expected parameter."""
    assert status < 500, f"{case.name}: {status} {raw[:300]!r}"
    assert status != 422, f"{case.name}: 422 is FastAPI's shape, not OpenAI's: {raw[:300]!r}"
    assert status in case.statuses, f"{case.name}: {status} not in {case.statuses}: {raw[:300]!r}"
    if status < 400:
        return
    if case.server_level and not content_type.startswith("application/json"):
        return  # refused by the HTTP server before the app saw it
    assert content_type.startswith("application/json"), f"{case.name}: {status} with {content_type!r}"
    body = json.loads(raw)
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, f"{case.name}: {body}"
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"], error
    assert error["type"] == ("authentication_error" if status == 401 else "invalid_request_error"), error
    if case.param is not ANY_PARAM and status != 401:
        assert error["param"] == case.param, \
            f"{case.name}: param {error['param']!r}, expected {case.param!r}: {error['message'][:200]}"


def stream_is_clean(case: Hostile, content_type: str, text: str) -> None:
    if content_type.startswith("text/event-stream"):
        assert text.endswith("data: [DONE]\n\n"), f"{case.name}: stream did not end: {text[-200:]!r}"
        assert '"internal_error"' not in text, f"{case.name}: {text[-300:]!r}"


def request_args(case: Hostile) -> dict[str, Any]:
    headers = {"content-type": "application/json", **case.headers}
    return {"headers": headers}


def body_chunks(body: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i:i + size]


async def abody_chunks(body: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for chunk in body_chunks(body, size):
        yield chunk
