"""The `app-cluster` system's own facts and its section of the report: the cluster's and every replica's start-up,
each engine replica's node, each replica's share of every load run's requests and output tokens, and the settings
changed from the manifest. benchmarks/app_cluster.py writes the first part to its facts file; the rest comes from
the replicas' own JSON log lines in Ray's per-worker stderr files (`model <id> ready in N s`, and one `engine
request` line per request whose `trace_id` is the load generator's X-Request-Id, so a load run's requests are
those with its prefix; warm-ups send none). Throughput is reported in total and per replica (docs/benchmarks.md
says why neither is like for like on two cores).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from loadkit.bench.results import SystemRun
from loadkit.peers import ENGINE_DEPLOYMENT, MANIFEST, changes, manifest_serve_config
from loadkit.precision import precision_label
from loadkit.stats import ratio_text
from loadkit.waiting import NotReached, wait_until

READY = re.compile(r"^model \S+ ready in ([0-9.]+) s")
ONE_REPLICA = ("app", "app-proxy", "app-ingress")


# -- the replicas' log lines -------------------------------------------------------------------------------------

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


# -- the launch's facts ------------------------------------------------------------------------------------------

def wait_facts(path: Path, timeout_s: float, running: Callable[[], bool]) -> dict | None:
    """The facts file's contents once the system has written it (it does so just after every replica runs)."""
    def read() -> dict | None:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):  # not yet, or caught while being written
            return json.loads(path.read_text())
        return None

    try:
        return wait_until(read, timeout_s, what="the cluster's facts file", interval_s=0.5,
                          gave_up=lambda: not running())
    except NotReached:
        return None


def config_changes(repo: Path, serve_config: Path) -> list[str]:
    """What the deployed config changed from the manifest's serveConfigV2 ('key: old -> new')."""
    manifest = manifest_serve_config((repo / MANIFEST).read_text())
    return changes(manifest, yaml.safe_load(serve_config.read_text()))


def observed(facts: dict, trace_prefixes: dict[int, str]) -> dict:
    """`facts` with each engine replica's start-up time and each load run's shares (by concurrency) added, from
    the replicas' log lines as they are now."""
    logs = Path(facts["logs_dir"])
    engines = [dict(r) for r in facts.get("replicas", []) if r.get("deployment") == ENGINE_DEPLOYMENT]
    lines = {r["node"]: read_worker_lines(logs, int(r["pid"])) for r in engines}
    for r in engines:
        r["startup_s"] = startup_seconds(lines[r["node"]])
    return {**facts, "engines": engines,
            "shares": [{"concurrency": c, "shares": [s.to_dict() for s in shares(lines, prefix)]}
                       for c, prefix in trace_prefixes.items()]}


# -- the report's section -----------------------------------------------------------------------------------------

def _s(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def _engines(run: SystemRun) -> int:
    return max((len(c.get("engines") or []) for c in run.clusters), default=0) or 1


def timings_table(run: SystemRun) -> list[str]:
    lines = ["| Round | Cluster up (s) | `serve deploy` → every replica running (s) | "
             "Engine replicas: node, start-up (s) | Ingress replicas: node |",
             "|---:|---:|---:|---|---|"]
    for i, c in enumerate(run.clusters):
        engines = ", ".join(f"{e['node']} {_s(e.get('startup_s'))}" for e in c.get("engines") or []) or "–"
        ingress = ", ".join(sorted(r["node"] for r in c.get("replicas") or [] if r.get("deployment") == "ingress"))
        lines.append(f"| {i} | {_s(c.get('cluster_up_s'))} | {_s(c.get('deploy_to_ready_s'))} | {engines} | "
                     f"{ingress or '–'} |")
    return lines


def _shares_by_concurrency(run: SystemRun) -> dict[int, list[Share]]:
    rounds: dict[int, list[list[Share]]] = {}
    for c in run.clusters:
        for entry in c.get("shares") or []:
            rounds.setdefault(int(entry["concurrency"]), []).append([Share(**s) for s in entry["shares"]])
    return {conc: pooled(runs) for conc, runs in rounds.items()}


def shares_table(run: SystemRun) -> list[str]:
    lines = ["| Conc. | Replica (node) | Requests | Share of requests | Output tokens | Share of tokens | "
             "Not finished | Busiest / even |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for conc, parts in sorted(_shares_by_concurrency(run).items()):
        worst = imbalance(parts)
        for s, (_, req, tok) in zip(parts, fractions(parts), strict=True):
            lines.append(f"| {conc} | {s.node} | {s.requests} | {req:.1%} | {s.tokens} | {tok:.1%} | {s.failed} | "
                         f"{'–' if worst is None else f'{worst:.3f}'} |")
    return lines


def throughput_table(runs: list[SystemRun]) -> list[str]:
    """Total and per-replica output tok/s of the proxy paths, over bare vLLM's at the same precision."""
    base = {(r.dtype, r.concurrency): r.figures.output_tok_s for run in runs if run.system == "vllm"
            for r in run.rows if r.ok}
    lines = ["| System | Precision | Conc. | Engine replicas | Output tok/s | per replica | ÷ bare vLLM | "
             "per replica ÷ bare vLLM |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        if run.system not in (*ONE_REPLICA, "app-cluster", "vllm"):
            continue
        n = _engines(run) if run.system == "app-cluster" else 1
        for r in run.rows:
            if not r.ok:
                continue
            tok, b = r.figures.output_tok_s, base.get((r.dtype, r.concurrency))
            ratio = "1.00× (reference)" if run.system == "vllm" else ratio_text(tok, b)
            per = "" if n == 1 else ratio_text(tok / n, b)
            lines.append(f"| {run.variant.label} | {precision_label(run.dtype, run.resolved_dtype)} | "
                         f"{r.concurrency} | {n} | {tok:.1f} | {tok / n:.1f} | {ratio} | {per or ratio} |")
    return lines


def cluster_section(runs: list[SystemRun]) -> list[str]:
    """The section, or nothing when no `app-cluster` launch left its facts."""
    clustered = [run for run in runs if run.system == "app-cluster" and run.clusters]
    if not clustered:
        return []
    lines = ["## Multi-replica topology: 2 replicas on 2 nodes behind Serve's proxy", "",
             "`app-cluster` is the path KubeRay users get: a real multi-node Ray cluster on this machine (a head "
             "with no CPUs, running Ray's control plane, the dashboard and Serve's controller; two worker nodes, "
             "each its own raylet confined to its own core, as a pod's cpuset), the CPU manifest's serveConfigV2 "
             "sent with `serve deploy`, Serve's HTTP proxy (one per node, sharing the port) in front of the "
             "ingress tier and two engine replicas, one per worker node. It is started fresh in every round, in "
             "the same rounds as the other systems, and gets the same load.", ""]
    changes = (clustered[0].clusters[0].get("config_changes") or [])
    if changes:
        lines += ["Changed from the manifest's serveConfigV2, and nothing else (the proxy's address, and the "
                  "engine settings and open admission every vLLM-based system gets):", "",
                  *[f"- `{c}`" for c in changes], ""]
    for run in clustered:
        lines += [f"### Start-up ({precision_label(run.dtype, run.resolved_dtype)})", "",
                  "Cluster up: `local_cluster.up` until every node has joined and the dashboard answers. `serve "
                  "deploy` → every replica running: from the command until `serve status` shows every engine and "
                  "ingress replica RUNNING (polled every 2 s; a replica is RUNNING only once its engine has "
                  "loaded). Start-up: the engine replica's own `model … ready in N s` line (its engine's start as "
                  "the replica times it), with the other engine loading on the other core at the same time.", "",
                  *timings_table(run), "",
                  "### Each replica's share", "",
                  "From the engine replicas' own `engine request` log lines (Ray's per-worker stderr files), the "
                  "measured requests only (the load generator's X-Request-Id prefix; warm-ups excluded). Busiest / "
                  "even: the larger replica's output tokens over half the total (1.000: an even split; what an "
                  "uneven split could cost in throughput).", "",
                  *shares_table(run), ""]
    lines += ["### Throughput per replica", "",
              "Output tokens/s of the whole service, and divided by its engine replicas. The one-replica systems' "
              "engine computes on one core with the other left to its front end and Ray; each of `app-cluster`'s "
              "two engines computes on its own core, with its replica process, EngineCore and its node's proxy and "
              "raylet beside it on that core (ingress replicas: where the table above says; the head's processes "
              "are not confined). So neither figure is like for like: per replica is what one engine gives with "
              "one core for everything (half of bare vLLM's CPU), the total is what the machine gives with two "
              "replicas; the shares above say whether routing left any of it unused.", "",
              *throughput_table(runs), ""]
    return lines
