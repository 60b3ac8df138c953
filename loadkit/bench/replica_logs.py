"""What the engine replicas of the `app-cluster` system wrote in Ray's per-worker stderr files: each replica's
start-up time and its share of a load run's requests and output tokens.

Ray keeps a worker's stderr as `<session>/logs/worker-<id>-<job>-<pid>.err`; the service writes JSON lines there
(app/logs.py): `model <id> ready in N s` (logger app.server) when the engine has loaded, and one `engine request`
line per request, with `trace_id` (the client's X-Request-Id) and `generated_tokens`. The load generator sends
`X-Request-Id: <prefix><n>` for the requests it measures (not for its warm-ups), so a run's requests are the lines
whose trace_id starts with that run's prefix.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

READY = re.compile(r"^model \S+ ready in ([0-9.]+) s")


def json_lines(text: str) -> list[dict]:
    """The JSON objects among a log's lines (Ray's and vLLM's own plain lines are skipped)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def read_worker_lines(logs_dir: Path, pid: int) -> list[dict]:
    """The JSON lines of the Ray worker process `pid` (every stderr file Ray kept for it)."""
    lines: list[dict] = []
    for path in sorted(logs_dir.glob(f"worker-*-{pid}.err")):
        lines += json_lines(path.read_text(errors="replace"))
    return lines


def startup_seconds(lines: list[dict]) -> float | None:
    """The engine's start-up time from the first `model <id> ready in N s` line, if any."""
    for line in lines:
        if line.get("logger") == "app.server":
            m = READY.match(str(line.get("message", "")))
            if m:
                return float(m.group(1))
    return None


def engine_requests(lines: list[dict], trace_prefix: str) -> list[dict]:
    """The `engine request` lines of the requests whose trace id starts with `trace_prefix`."""
    return [ln for ln in lines if ln.get("message") == "engine request"
            and str(ln.get("trace_id", "")).startswith(trace_prefix)]


@dataclass(frozen=True)
class Share:
    """One replica's part of one load run (or of several, pooled)."""

    node: str  # the worker node's name ("worker-1", ...)
    requests: int
    tokens: int
    failed: int = 0  # lines whose outcome is not "finished"

    def to_dict(self) -> dict:
        return asdict(self)


def shares(lines_by_node: dict[str, list[dict]], trace_prefix: str) -> list[Share]:
    """Each node's replica's requests and output tokens in the run with `trace_prefix`, in node order."""
    out = []
    for node in sorted(lines_by_node):
        mine = engine_requests(lines_by_node[node], trace_prefix)
        out.append(Share(node=node, requests=len(mine), tokens=sum(int(ln.get("generated_tokens") or 0) for ln in mine),
                         failed=sum(1 for ln in mine if ln.get("outcome") != "finished")))
    return out


def pooled(runs: list[list[Share]]) -> list[Share]:
    """Shares of several runs (rounds) summed per node."""
    by_node: dict[str, Share] = {}
    for run in runs:
        for s in run:
            had = by_node.get(s.node, Share(s.node, 0, 0, 0))
            by_node[s.node] = Share(s.node, had.requests + s.requests, had.tokens + s.tokens, had.failed + s.failed)
    return [by_node[n] for n in sorted(by_node)]


def fractions(parts: list[Share]) -> list[tuple[str, float, float]]:
    """(node, share of requests, share of tokens) per replica; 0 where the run had none."""
    requests = sum(s.requests for s in parts)
    tokens = sum(s.tokens for s in parts)
    return [(s.node, s.requests / requests if requests else 0.0, s.tokens / tokens if tokens else 0.0) for s in parts]


def imbalance(parts: list[Share]) -> float | None:
    """The busiest replica's share of output tokens over the even share (1.0: perfectly even), or None."""
    tokens = sum(s.tokens for s in parts)
    if not parts or not tokens:
        return None
    return max(s.tokens for s in parts) / (tokens / len(parts))
