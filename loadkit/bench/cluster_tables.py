"""The report's section on the multi-replica topology (`app-cluster`): the deployment's timings, each replica's
share of the load, and throughput per replica beside the one-replica systems and bare vLLM.

On a 2-core machine the two engines of `app-cluster` each have one core for everything, where bare vLLM and `app`
compute on one core with the other left to their front end: so both the total and the figure per replica are
reported, and the shares say whether the proxy's routing left throughput unused (measured 17:19 on 1 Dec: 32/32
requests at c=16 and c=64; total 0.74x and 0.86x bare vLLM, per replica 0.37x and 0.43x).
"""

from __future__ import annotations

from loadkit.bench.replica_logs import Share, fractions, imbalance, pooled
from loadkit.bench.results import SystemRun
from loadkit.precision import precision_label
from loadkit.stats import ratio_text

ONE_REPLICA = ("app", "app-proxy", "app-ingress")


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
