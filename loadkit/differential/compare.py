"""What of two answers is compared, and how: each answer normalized (what must differ between two servers left out:
generated ids, clocks, fingerprints; an error is its status and its `param`; a stream is what a client assembles
from it), then compared field by field with a readable diff: everything equal but floats, which may differ by
`FLOAT_TOLERANCE`. docs/differential.md ("How answers are compared") gives the rules and why.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from loadkit.differential.exchange import Answer

VOLATILE_KEYS = frozenset({"created", "created_at", "completed_at", "system_fingerprint", "call_id", "item_id"})
GENERATED_ID = re.compile(r"^(chatcmpl|cmpl|resp|msg|call|fc|rs|ctc|modelperm)[-_]")
STREAM_CHOICE_LISTS = ("tokens", "token_logprobs", "top_logprobs", "text_offset", "content")


def strip_volatile(value: object) -> object:
    """`value` with every volatile key, and every `id` that is a generated id, removed (recursively)."""
    if isinstance(value, dict):
        return {k: strip_volatile(v) for k, v in value.items()
                if k not in VOLATILE_KEYS and not (k == "id" and isinstance(v, str) and GENERATED_ID.match(v))}
    if isinstance(value, list):
        return [strip_volatile(v) for v in value]
    return value


def field_paths(value: object, prefix: str = "") -> set[str]:
    """Every key path in `value` that holds a value (not null), list positions written `[]`
    (`choices[].delta.content`). Null fields are compared in non-streamed bodies, where they are reported one by
    one; in a stream's shape they would only repeat that on every chunk."""
    paths: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if v is None:
                continue
            path = f"{prefix}.{k}" if prefix else k
            paths.add(path)
            paths |= field_paths(v, path)
    elif isinstance(value, list):
        for v in value:
            paths |= field_paths(v, f"{prefix}[]")
    return paths


def shape(events: list[dict]) -> dict[str, bool]:
    """The field paths a stream's events carry, as a dict so that a diff names each path one side lacks."""
    return dict.fromkeys(sorted(set().union(*(field_paths(strip_volatile(e)) for e in events))), True)


def error_of(answer: Answer) -> dict:
    """A validation error's `param` from vLLM is pydantic's location (`body.seed`); the field is what it names."""
    error = answer.body.get("error") if isinstance(answer.body, dict) else None
    param = error.get("param") if isinstance(error, dict) else None
    if isinstance(param, str):
        param = param.removeprefix("body.")
    return {"status": answer.status, "param": param}


def _merge_tool_calls(into: list[dict], deltas: list[dict]) -> None:
    for d in deltas:
        i = d.get("index", 0)
        while len(into) <= i:
            into.append({"type": None, "name": "", "arguments": ""})
        call, fn = into[i], d.get("function") or {}
        call["type"] = d.get("type") or call["type"]
        call["name"] += fn.get("name") or ""
        call["arguments"] += fn.get("arguments") or ""


def _add_logprobs(into: dict, logprobs: dict | None) -> None:
    for key in STREAM_CHOICE_LISTS:
        if logprobs and logprobs.get(key) is not None:
            into.setdefault(key, []).extend(strip_volatile(logprobs[key]))  # type: ignore[arg-type]


def assemble_choice(into: dict, choice: dict) -> None:
    """Adds one chunk's choice to what its client has assembled so far."""
    delta = choice.get("delta")
    piece = delta if isinstance(delta, dict) else choice
    for key in ("content", "text", "reasoning_content", "reasoning"):
        if piece.get(key) is not None:
            into[key] = into.get(key, "") + piece[key]
    if piece.get("role") is not None:
        into["role"] = piece["role"]
    if piece.get("tool_calls"):
        _merge_tool_calls(into.setdefault("tool_calls", []), piece["tool_calls"])
    for key in ("token_ids",):
        if choice.get(key) is not None:
            into.setdefault(key, []).extend(choice[key])
    if choice.get("prompt_token_ids") is not None:
        into.setdefault("prompt_token_ids", choice["prompt_token_ids"])
    if choice.get("logprobs") is not None:
        _add_logprobs(into.setdefault("logprobs", {}), choice["logprobs"])
    if choice.get("finish_reason") is not None:
        into["finish_reason"] = choice["finish_reason"]
    if choice.get("stop_reason") is not None:
        into["stop_reason"] = choice["stop_reason"]


def assemble_stream(events: list[dict], done: bool) -> dict:
    """A chat or completions stream as its client assembles it (see the module's docstring)."""
    choices: dict[int, dict] = {}
    out: dict = {"done": done, "fields": shape(events)}
    for event in events:
        if "error" in event:
            out["error"] = {"param": (event["error"] or {}).get("param")}
        for choice in event.get("choices") or ():
            assemble_choice(choices.setdefault(int(choice.get("index", 0)), {}), choice)
        if event.get("usage") is not None:
            out["usage"] = event["usage"]
        if event.get("prompt_token_ids") is not None:
            out.setdefault("prompt_token_ids", event["prompt_token_ids"])
    out["choices"] = [choices[i] for i in sorted(choices)]
    return out


def collapse_runs(types: list[str]) -> list[str]:
    """Event types with runs of the same delta type made one (how many deltas is how the text was cut)."""
    out: list[str] = []
    for t in types:
        if not (out and out[-1] == t and t.endswith(".delta")):
            out.append(t)
    return out


def assemble_response_stream(events: list[dict]) -> dict:
    """A Responses API stream: its event types in order (delta runs collapsed), whether `sequence_number`
    counts from 0 without a gap, the text and arguments the deltas add up to, and the final response."""
    out: dict = {"types": collapse_runs([str(e.get("type")) for e in events]),
                 "sequence_ok": [e.get("sequence_number") for e in events] == list(range(len(events))),
                 "output_text": "".join(e.get("delta", "") for e in events
                                        if e.get("type") == "response.output_text.delta"),
                 "arguments": "".join(e.get("delta", "") for e in events
                                      if e.get("type") == "response.function_call_arguments.delta"),
                 "fields": shape(events)}
    final = [e for e in events if e.get("type") in ("response.completed", "response.incomplete", "response.failed")]
    out["response"] = strip_volatile(final[-1].get("response")) if final else None
    return out


def normalized(answer: Answer, path: str) -> dict:
    """What is compared of `answer` to a request on `path`."""
    if answer.status != 200:
        return {"error": error_of(answer)}
    if answer.streamed:
        if path.endswith("/responses"):
            return {"status": 200, "stream": assemble_response_stream(answer.events)}
        return {"status": 200, "stream": assemble_stream(answer.events, answer.done)}
    return {"status": 200, "body": strip_volatile(answer.body)}


# -- the comparison ----------------------------------------------------------------------------------------------

# Absolute, in natural-log units. Measured: see docs/differential.md (the largest logprob difference of a run).
FLOAT_TOLERANCE = 0.05
ABSENT = "<absent>"


@dataclass(frozen=True)
class Mismatch:
    """One field that differs: its path, and what each server had there."""

    path: str
    vllm: object
    service: object

    @property
    def where(self) -> str:
        """The path with list positions made generic (`choices[].logprobs.content[].logprob`): a cause's key."""
        return re.sub(r"\[\d+\]", "[]", self.path)

    def line(self, width: int = 160) -> str:
        def show(v: object) -> str:
            text = v if v == ABSENT else json.dumps(v, ensure_ascii=False)
            return str(text) if len(str(text)) <= width else str(text)[:width] + "…"
        return f"{self.path or '(root)'}: vllm {show(self.vllm)} | service {show(self.service)}"


def _numbers(a: object, b: object) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
        and not isinstance(b, bool)


def diff(vllm: object, service: object, path: str = "", tolerance: float = FLOAT_TOLERANCE) -> list[Mismatch]:
    """Every field where the two differ (see the module's docstring); [] when they are equal."""
    if isinstance(vllm, dict) and isinstance(service, dict):
        out: list[Mismatch] = []
        for key in list(vllm) + [k for k in service if k not in vllm]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in service:
                out.append(Mismatch(sub, vllm[key], ABSENT))
            elif key not in vllm:
                out.append(Mismatch(sub, ABSENT, service[key]))
            else:
                out += diff(vllm[key], service[key], sub, tolerance)
        return out
    if isinstance(vllm, list) and isinstance(service, list):
        out = []
        if len(vllm) != len(service):
            out.append(Mismatch(f"{path}.length", len(vllm), len(service)))
        for i, (a, b) in enumerate(zip(vllm, service, strict=False)):
            out += diff(a, b, f"{path}[{i}]", tolerance)
        return out
    if _numbers(vllm, service) and (isinstance(vllm, float) or isinstance(service, float)):
        return [] if abs(float(vllm) - float(service)) <= tolerance else [Mismatch(path, vllm, service)]  # type: ignore[arg-type]
    return [] if vllm == service and type(vllm) is type(service) else [Mismatch(path, vllm, service)]


def compare_errors(vllm: dict, service: dict) -> list[Mismatch]:
    """Two normalized errors: the status, and `param` where vLLM names one."""
    out = []
    if vllm["status"] != service["status"]:
        out.append(Mismatch("error.status", vllm["status"], service["status"]))
    named, ours = vllm.get("param"), service.get("param")
    # pydantic locates an element inside the field (`stop_token_ids.0`); the service names the field
    if named and named != ours and not (ours and named.startswith(f"{ours}.")):
        out.append(Mismatch("error.param", named, ours))
    return out


def compare(vllm: dict, service: dict, tolerance: float = FLOAT_TOLERANCE) -> list[Mismatch]:
    """Two normalized answers (normalize.normalized), field by field."""
    if "error" in vllm and "error" in service:
        return compare_errors(vllm["error"], service["error"])
    if "error" in vllm or "error" in service:
        return [Mismatch("status", vllm.get("status", vllm.get("error", {}).get("status")),
                         service.get("status", service.get("error", {}).get("status")))]
    return diff(vllm, service, "", tolerance)


def max_float_gap(vllm: object, service: object) -> float:
    """The largest difference between two floats at the same place (what the tolerance has to cover)."""
    if isinstance(vllm, dict) and isinstance(service, dict):
        return max((max_float_gap(vllm[k], service[k]) for k in vllm if k in service), default=0.0)
    if isinstance(vllm, list) and isinstance(service, list):
        return max((max_float_gap(a, b) for a, b in zip(vllm, service, strict=False)), default=0.0)
    if _numbers(vllm, service) and (isinstance(vllm, float) or isinstance(service, float)):
        return abs(float(vllm) - float(service))  # type: ignore[arg-type]
    return 0.0
