"""The known differences from `vllm serve`, each a rule that recognises the mismatches it accounts for.

`intended`: a deliberate difference docs/api.md documents (a stricter limit, a route or behaviour vLLM lacks).
Not intended: a difference this harness found and docs/differential.md records with its reason, whose fix
lies outside the files this harness's author could change (or awaits a decision); it is named so that every
other mismatch stands out, not to excuse it. A comparison is explained when every one of its mismatches is
accounted for by some rule; `explaining` names the rules it took.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from loadkit.differential.compare import ABSENT, Mismatch
from loadkit.differential.exchange import Request

# vLLM's own fields, which it sends on every answer (null when unused) and the service leaves out
VLLM_EXTRAS = frozenset({"stop_reason", "token_ids", "prompt_token_ids", "prompt_logprobs", "prompt_text",
                         "routed_experts", "service_tier", "kv_transfer_params", "refusal", "annotations", "audio",
                         "function_call", "reasoning", "reasoning_content", "created_cache_tokens",
                         "multimodal_tokens", "completion_tokens_details", "token_strs"})
# what a Responses answer says that is not its settings' echo: compared as everywhere else
RESPONSES_CORE = ("output[].content[].text", "output[].type", "output[].name", "output[].arguments",
                  "status", "usage.input_tokens", "usage.output_tokens", "usage.total_tokens",
                  "output_text", "arguments", "types", "sequence_ok", "incomplete_details", "output.length")

Rule = Callable[[Request, Mismatch], bool]


@dataclass(frozen=True)
class Difference:
    name: str
    intended: bool
    reason: str
    explains: Rule


def _body(r: Request) -> dict:
    return r.body or {}


def _key(m: Mismatch) -> str:
    return m.where.rsplit(".", 1)[-1]


def _forced_tools(r: Request, m: Mismatch) -> bool:
    choice = _body(r).get("tool_choice")
    return bool(_body(r).get("tools")) and (choice == "required" or isinstance(choice, dict))


def _vllm_extras(r: Request, m: Mismatch) -> bool:
    if m.where.startswith("stream.fields."):
        return m.service == ABSENT and m.where.rsplit(".", 1)[-1].removesuffix("[]") in VLLM_EXTRAS | {
            "prompt_token_ids", "prompt_text", "created_cache_tokens"}
    return m.service == ABSENT and (m.vllm is None or _key(m) in ("stop_reason", "created_cache_tokens"))


def _responses_fields(r: Request, m: Mismatch) -> bool:
    inner = m.where.split(".", 1)[-1].removeprefix("response.")
    return r.path == "/v1/responses" and not any(inner == c or inner.startswith(c + "[") for c in RESPONSES_CORE)


DIFFERENCES: list[Difference] = [
    Difference("forced_tools_without_parser", True,
               "`tool_choice` `required` or a named function is forced by the tools' schemas with any model; "
               "`vllm serve` forces it through its tool-call parser and without `--tool-call-parser` refuses it "
               "(400) or, on /v1/responses, answers in text (docs/api.md, Tools)", _forced_tools),
    Difference("continuous_usage_per_chunk", True,
               "with `continuous_usage_stats` each chunk's usage counts every choice so far, and the first chunk "
               "already carries the first token (vLLM: a role-only chunk first; docs/api.md, extensions)",
               lambda r, m: bool((_body(r).get("stream_options") or {}).get("continuous_usage_stats"))
               and m.where.startswith("stream.fields.usage")),
    Difference("model_card_route", True,
               "`GET /v1/models/{id}` answers the model card; vLLM 0.32's server has no such route (404)",
               lambda r, m: r.method == "GET" and r.path.startswith("/v1/models/")),
    Difference("model_root_is_source", True,
               "a model's `root` is the config's `source`, not the server's local folder path (docs/api.md, "
               "Endpoints)", lambda r, m: m.where == "body.data[].root"),
    Difference("max_tokens_limit", True, "`limits.max_tokens` (1024) bounds one request's work (docs/api.md, Limits)",
               lambda r, m: int(_body(r).get("max_tokens") or 0) > 1024 and m.path == "status"),
    Difference("responses_incomplete", True,
               "/v1/responses cut off at `max_output_tokens`: `status: \"incomplete\"` with "
               "`incomplete_details.reason: \"max_output_tokens\"` and a `response.incomplete` event, as OpenAI's "
               "API answers; vLLM says `completed`",
               lambda r, m: r.path == "/v1/responses" and "incomplete" in json.dumps(m.service)),
    Difference("token_id_text_offset", True,
               "completions `text_offset` with `return_tokens_as_token_ids`: offsets into the choice's text; vLLM "
               "counts the length of each `token_id:<id>` name instead",
               lambda r, m: bool(_body(r).get("return_tokens_as_token_ids")) and "text_offset" in m.where),
    Difference("grammar_without_allowed_tokens", True,
               "a structured-output constraint that `allowed_token_ids` leaves no token for: the engine fails the "
               "request (vLLM: \"grammar rejected tokens\"); vLLM's server answers 200 and then an error event (a 500 "
               "without a stream), the service a 400 naming the constraint before the first byte (docs/api.md: a "
               "stream never starts with a 200 only to fail, and the request would fail so anywhere)",
               lambda r, m: bool(_body(r).get("allowed_token_ids")) and bool(
                   _body(r).get("structured_outputs") or _body(r).get("response_format"))
               and m.path in ("status", "error.status") and m.service == 400),
    # Only the status differs: vLLM's stream was nothing but an error event naming the parameter the 400 names.
    Difference("refused_before_the_stream", True,
               "a streamed request that vLLM's engine refuses once its server has answered 200 (an error event naming "
               "the parameter: `allowed_token_ids: []` in a stream) is refused here with a 400 naming the same "
               "parameter before the first byte (docs/api.md: a stream never starts with a 200 only to fail)",
               lambda r, m: bool(_body(r).get("stream")) and m.path == "status" and m.vllm == 200
               and m.service == 400),
    Difference("vllm_extra_fields", True,
               "vLLM's always-null extension fields (`routed_experts`, `service_tier`, `kv_transfer_params`, "
               "`ec_transfer_params`, `metrics`, "
               "`prompt_text`, a message's `refusal`/`annotations`/`audio`/`function_call`/`reasoning`, "
               "`usage.completion_tokens_details`, `prompt_tokens_details.multimodal_tokens`, `/tokenize`'s "
               "`token_strs`) are left out; "
               "`stop_reason`, which has a value, is sent",
               _vllm_extras),
    Difference("responses_fields", True,
               "/v1/responses echoes different settings: vLLM adds `background`, `service_tier`, `truncation`, "
               "per-turn usage details and more, says `metadata: null`, `text: null`, `tool_choice: \"none\"` "
               "without tools, `logprobs: null` on text parts; the text, status and token counts are compared",
               _responses_fields),
    Difference("top_logprobs_param", True,
               "`top_logprobs` over the model's max: the service's 400 names `top_logprobs`, the parameter the client "
               "sent; vLLM's names `logprobs`",
               lambda r, m: m.path == "error.param" and m.vllm == "logprobs" and m.service == "top_logprobs"),
]


def explaining(request: Request, mismatches: list[Mismatch]) -> list[Difference] | None:
    """The known differences that together account for every one of `mismatches` (the first rule that takes
    each), or None when some mismatch is unaccounted for."""
    used: dict[str, Difference] = {}
    for m in mismatches:
        found = next((d for d in DIFFERENCES if d.explains(request, m)), None)
        if found is None:
            return None
        used[found.name] = found
    return [d for d in DIFFERENCES if d.name in used]


def by_name(name: str) -> Difference:
    return next(d for d in DIFFERENCES if d.name == name)
