"""One request's outcome: both answers normalized, their mismatches, and what explains them.

`equal` (no mismatch), known differences (every mismatch accounted for by differences.py's rules, named
'+'-joined in their order there), or `mismatch`, whose `cause` groups it with others in a report: the generic
path of its first unaccounted mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loadkit.differential.compare import FLOAT_TOLERANCE, Mismatch, compare, max_float_gap, normalized
from loadkit.differential.differences import DIFFERENCES, explaining
from loadkit.differential.exchange import Answer, Request


@dataclass
class Verdict:
    request: Request
    vllm: dict
    service: dict
    mismatches: list[Mismatch] = field(default_factory=list)
    difference: str | None = None  # the known differences that account for every mismatch, '+'-joined
    float_gap: float = 0.0  # the largest float difference seen, within the tolerance or not

    @property
    def outcome(self) -> str:
        if not self.mismatches:
            return "equal"
        return self.difference or "mismatch"

    @property
    def cause(self) -> str:
        if not self.mismatches:
            return "equal"
        if self.difference:
            return f"known: {self.difference}"
        first = next((m for m in self.mismatches if not any(d.explains(self.request, m) for d in DIFFERENCES)),
                     self.mismatches[0])
        return f"{self.request.method} {self.request.path}: {first.where}"

    def text(self, limit: int = 12) -> str:
        lines = [m.line() for m in self.mismatches[:limit]]
        if len(self.mismatches) > limit:
            lines.append(f"... and {len(self.mismatches) - limit} more")
        return "\n".join(lines)


# What a server's prefix cache found depends on what it served before: compared only between servers that served
# the same requests in the same order (the long run starts both fresh; the suite's shared stack has served others).
HISTORY_DEPENDENT = ("prompt_tokens_details.cached_tokens", "input_tokens_details.cached_tokens")


def judge(request: Request, vllm: Answer, service: Answer, tolerance: float = FLOAT_TOLERANCE,
          same_history: bool = True) -> Verdict:
    a, b = normalized(vllm, request.path), normalized(service, request.path)
    mismatches = compare(a, b, tolerance)
    if not same_history:
        mismatches = [m for m in mismatches if not m.where.endswith(HISTORY_DEPENDENT)]
    found = explaining(request, mismatches) if mismatches else None
    name = "+".join(d.name for d in found) if found else None
    return Verdict(request, a, b, mismatches, name, max_float_gap(a, b))
