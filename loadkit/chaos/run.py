"""`python -m loadkit chaos`: a local cluster of its own (`python -m app cluster up`: a head and two worker nodes),
the KubeRay manifest's Serve config deployed onto it with `serve deploy` (two engine replicas, one per worker, the
ingress and Serve's proxy on the head), each fault of issue 13 in turn under steady load (round.py), then the
table into docs/chaos.md. Bounded: one round per fault, each within --round-timeout; loopback only; the cluster is
stopped at the end, leaving no process. About 15 minutes on two cores.
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from pathlib import Path

from loadkit.chaos.faults import FAULTS, Target
from loadkit.chaos.round import (
    ANSWER_TOKENS,
    DOC,
    LONG_STREAMS,
    TOOL_CALL_PARSER,
    RoundResult,
    passed,
    row,
    run_round,
    section,
)
from loadkit.cluster import CLUSTER_DIR_ENV, LocalCluster, cluster_cli
from loadkit.long_stream import LONG
from loadkit.machine import git_commit, machine, vllm_version
from loadkit.markdown import write_section
from loadkit.peers import APP_NAME, ENGINE_DEPLOYMENT, MANIFEST, MODEL_ID, manifest_serve_config
from loadkit.report import command_line, progress
from loadkit.service import REPO, child_env, free_port
from loadkit.waiting import wait_until

log = progress("chaos")


def serve_config(manifest: Path, port: int, drain_grace_s: float) -> dict:
    """The manifest's serveConfigV2 as it is, but for where the proxy listens (loopback, a free port), the engine
    replicas' drain grace (short, so that a rolling update stops replicas with requests in flight) and a tool-call
    parser (for the tool-call twin)."""
    config = manifest_serve_config(manifest.read_text())
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    config["applications"][0]["args"]["config"]["service"]["drain_grace_s"] = drain_grace_s
    # The default model's template has no tools; a parser still reads the calls a regex holds it to.
    config["applications"][0]["args"]["config"]["models"][0]["engine"]["tool_call_parser"] = TOOL_CALL_PARSER
    return config


def drive(o: argparse.Namespace, env: dict[str, str], key: str) -> list[RoundResult]:
    cluster = LocalCluster(o.work_dir / "cluster")
    port = free_port()
    target = Target(cluster, APP_NAME, ENGINE_DEPLOYMENT, serve_config(o.manifest, port, o.drain_grace), o.work_dir,
                    add_worker=lambda: cluster_cli(env, "add-worker"))
    log(f"deploying {o.manifest.name}'s serveConfigV2 onto the cluster (proxy on 127.0.0.1:{port})")
    cluster.deploy(target.serve_config, o.work_dir)
    wait_until(target.whole, timeout_s=o.round_timeout, interval_s=2, what="both engine replicas serving")
    results = []
    for name in o.faults:
        log(f"round {name}: {FAULTS[name].what}")
        result = run_round(target, FAULTS[name], f"http://127.0.0.1:{port}", key, MODEL_ID,
                           timeout_s=o.round_timeout)
        log(row(result))
        results.append(result)
        if result.capacity_back_s is None:
            log("the deployment did not become whole again: the remaining rounds would not measure their fault")
            break
    return results


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m loadkit chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="python -m loadkit chaos --faults node-loss --output -")
    repo = REPO
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, in order (default {','.join(FAULTS)})")
    p.add_argument("--manifest", type=Path, default=repo / MANIFEST)
    p.add_argument("--round-timeout", type=float, default=900, help="bound on each fault's recovery, seconds")
    p.add_argument("--drain-grace", type=float, default=2, help="the engine replicas' drain_grace_s")
    p.add_argument("--work-dir", type=Path, default=repo / "bench-results" / "chaos")
    p.add_argument("--output", default=str(repo / "docs" / "chaos.md"), help="report file, or - to print only")
    o = p.parse_args(argv)
    o.faults = [f.strip() for f in o.faults.split(",") if f.strip()]
    unknown = [f for f in o.faults if f not in FAULTS]
    if unknown:
        p.error(f"unknown faults {unknown}; choose from {list(FAULTS)}")
    o.work_dir = o.work_dir.resolve()
    o.work_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(16)
    env = child_env(**{CLUSTER_DIR_ENV: str(o.work_dir / "cluster"), "APP_API_KEYS": key})
    facts_machine, vllm, commit = machine(), vllm_version(), git_commit(repo)
    command = command_line("chaos", argv)
    results: list[RoundResult] = []
    log(f"starting a local cluster (a head and 2 worker nodes; state in {o.work_dir / 'cluster'})")
    try:
        cluster_cli(env, "up", "--workers", "2")
        results = drive(o, env, key)
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        log(cluster_cli(env, "down") or "cluster down")
    facts = [f"Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, `{command.strip()}`, commit "
             f"{commit.text}; vLLM {vllm}; {facts_machine.cpu_text}, {facts_machine.memory_gib} GiB.",
             f"Each round: 2 plain + 2 streaming SDK clients ({ANSWER_TOKENS} tokens, greedy and sampled) and "
             f"{LONG_STREAMS} long greedy streams ({LONG['max_tokens']} tokens) in flight when the fault hits; counted "
             "over every answer that ended after it."]
    text = section(results, facts)
    print(text)
    if o.output != "-" and results:
        write_section(Path(o.output), DOC, text)
        log(f"wrote {os.path.relpath(o.output)}")
    return 0 if results and len(results) == len(o.faults) and all(passed(r) for r in results) else 1
