"""The field-by-field comparison of two normalized answers, and its readable diff.

Everything must be equal (the same keys, the same list lengths, the same strings, integers and booleans) except
floats, which may differ by `FLOAT_TOLERANCE`: logprobs come out of two engine processes that compute the same
model in the same precision but not necessarily with the same thread count or batch shapes (the service's engine
runs in a Ray worker, vLLM's API server in its own process), and a float reduction in another order moves a
bfloat16 logit by a rounding step. Greedy token choice is compared exactly, so a rounding difference that flips
a near-tie shows up as a mismatch, never hidden. An error compares its status, and its `param` only where vLLM
names one (vLLM leaves `param` empty for many of its refusals; docs/api.md says the service always names it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

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
    if vllm.get("param") and vllm["param"] != service.get("param"):
        out.append(Mismatch("error.param", vllm["param"], service.get("param")))
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
