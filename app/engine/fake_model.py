"""What the fake engine's model says and refuses: a vocabulary of 256 byte tokens, a fixed answer sentence (numbered
words with `ignore_eos` or `min_tokens`), the smallest JSON a schema allows, the first tool "called", and vLLM's own
refusals of ids outside the vocabulary. Pure functions: `FakeEngine` (fake.py) streams them."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

from app.engine.interface import EngineRejected, GenerationParams, PromptTokenLogprob, TokenLogprob, ToolCallDelta
from app.errors import InvalidRequest

ANSWER = "This is a fake answer from the test engine."
VOCAB_SIZE = 256
EMBEDDING_SIZE = 32


def answer_words(params: GenerationParams, index: int) -> list[str]:
    """The tokens (as text) choice `index` answers with."""
    if params.json_schema is not None and params.json_schema_param == "tools":
        # The smallest instance of the schema, in pieces of 5 characters: streamed tool calls get split
        # arguments, as a real engine's tokens split them.
        text = json.dumps(schema_instance(params.json_schema, params.json_schema))
        return [text[i : i + 5] for i in range(0, len(text), 5)]
    if params.json_schema is not None or params.json_object:
        return ['{"fake": ', "true}"]
    if params.choice is not None:
        return [params.choice[0]]
    if params.regex is not None or params.grammar is not None:
        return ["fake"]
    if params.ignore_eos:
        # vLLM samples choice i with seed + i
        offset = ((params.seed or 0) + index) * 1000 if params.temperature > 0 else 0
        return [f"w{offset + i} " for i in range(params.max_tokens)]
    words = ANSWER.split(" ")
    if params.temperature > 0 and (params.seed is not None or index):
        words = [f"{w}{(params.seed or 0) + index}" for w in words]
    if params.min_tokens > len(words):  # end-of-sequence is masked until min_tokens
        words = words + [f"w{i}" for i in range(params.min_tokens - len(words))]
    return [w + " " for w in words[:-1]] + [words[-1]]


def check_params(params: GenerationParams) -> None:
    """What vLLM refuses once it knows the model (the vocabulary) and the final max_tokens."""
    for name, ids in (
        ("logit_bias", [t for t, _ in params.logit_bias]),
        ("allowed_token_ids", list(params.allowed_token_ids or ())),
        ("stop_token_ids", list(params.stop_token_ids)),
    ):
        invalid = [t for t in ids if not 0 <= t < VOCAB_SIZE]
        if invalid:
            raise InvalidRequest(
                f"token_id(s) {invalid} in {name} contain out-of-vocab token ids. Vocabulary size: {VOCAB_SIZE}",
                param=name,
            )
    if params.min_tokens > params.max_tokens:
        raise InvalidRequest(
            f"min_tokens must be less than or equal to max_tokens={params.max_tokens}, got {params.min_tokens}.",
            param="min_tokens",
        )


def check_schema(params: GenerationParams) -> None:
    """A structured-output schema that is not a JSON schema: vLLM's engine refuses it, naming the tools' parameter
    as the request's error and a response_format's as the engine's."""
    if params.json_schema is None:
        return
    try:
        import jsonschema

        jsonschema.Draft202012Validator.check_schema(params.json_schema)
    except Exception as err:
        if params.json_schema_param != "response_format":
            raise InvalidRequest(f"invalid JSON schema: {err}", param=params.json_schema_param) from None
        raise EngineRejected(f"invalid JSON schema: {err}") from None


def token_logprobs(params: GenerationParams, step: int, token: str,
                   decode: Callable[[list[int]], str]) -> tuple[TokenLogprob, ...] | None:
    """The sampled token at -0.5 and the `logprobs` others (or the ids asked for) below it, as vLLM ranks them."""
    if params.logprobs is None:
        return None
    name = f"token_id:{step % VOCAB_SIZE}" if params.tokens_as_ids else token
    ids = params.logprob_token_ids or range(VOCAB_SIZE - 1, VOCAB_SIZE - 1 - params.logprobs, -1)
    top = tuple((f"token_id:{t}" if params.tokens_as_ids else decode([t])
                 if params.logprob_token_ids else f"alt{k}", -1.0 - k) for k, t in enumerate(ids))
    shown = len(ids) if params.logprob_token_ids else max(0, params.logprobs - 1)
    ranked = ((name, -0.5),) + top[:shown] if params.logprobs else ()
    return (TokenLogprob(name, -0.5, ranked, token if params.tokens_as_ids else None),)


def prompt_logprobs(
    prompt: list[int], params: GenerationParams, decode: Callable[[list[int]], str]
) -> tuple[tuple[PromptTokenLogprob, ...] | None, ...] | None:
    """As vLLM's: None for the first token, then each token (rank 1 here) and `prompt_logprobs` others."""
    k = params.prompt_logprobs
    if k is None:
        return None

    def alternatives(t: int) -> tuple[PromptTokenLogprob, ...]:
        others = [o for o in range(VOCAB_SIZE) if o != t][:k]
        return (PromptTokenLogprob(t, -0.25, 1, decode([t])),
                *(PromptTokenLogprob(o, -2.0 - r, r + 2, decode([o])) for r, o in enumerate(others)))
    return (None, *(alternatives(t) for t in prompt[1:]))


def schema_instance(schema: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """The smallest JSON value valid against `schema` for the schemas tests use (types, properties, required,
    enum, const, anyOf/oneOf, items with minItems, local `$ref`s); what a constrained decoder could produce."""
    if not isinstance(schema, dict) or depth > 32:
        return {}
    if "$ref" in schema:
        target: Any = root
        for part in str(schema["$ref"]).lstrip("#/").split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return schema_instance(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return schema_instance({**schema, key: None, **schema[key][0]}, root, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else None)
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "array":
        return [schema_instance(schema.get("items", {}), root, depth + 1) for _ in range(schema.get("minItems", 0))]
    if kind == "string":
        return "x" * int(schema.get("minLength", 1))
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    properties = schema.get("properties") or {}
    return {name: schema_instance(sub, root, depth + 1) for name, sub in properties.items()}


def auto_call(tool: dict[str, Any], choice: int) -> ToolCallDelta:
    function = tool.get("function", {})
    arguments = schema_instance(function.get("parameters") or {}, function.get("parameters") or {})
    return ToolCallDelta(index=0, id=f"call_fake{choice}", name=function.get("name"), arguments=json.dumps(arguments))


def calls_text(message: dict[str, Any]) -> str:
    calls = message.get("tool_calls")
    tool = f"[{message['tool_call_id']}]" if message.get("tool_call_id") else ""
    return tool + ("<|calls|>" + ",".join(c["function"]["name"] for c in calls) if calls else "")


def float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])
