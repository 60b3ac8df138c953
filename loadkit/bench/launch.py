"""One launch of one variant in one round of the bench: every step of the sweep once, with the round's prompts,
through vLLM's own load generator, the tree's peak RSS sampled through each (loadkit.peers.launch starts and
stops the variant)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from loadkit.bench.cluster import config_changes, observed, wait_facts
from loadkit.bench.load import SEED, Step, load_command, prompts_for, run_load, warmups_for
from loadkit.bench.results import BenchLaunch, StepRecord
from loadkit.peers import Launchable, Variant, cluster_facts_path, launch
from loadkit.proctree import PeakSampler
from loadkit.report import progress
from loadkit.service import Server

# `serve shutdown` of two engines, then three nodes stopped one by one (each may take its 40 s grace).
CLUSTER_STOP_GRACE_S = 240.0
say = progress("bench")


@dataclass(frozen=True)
class Sweep:
    """What every launch of a run shares."""

    at: Launchable
    steps: list[Step]
    input_len: int
    num_prompts: int | None  # as asked (None: scaled to the concurrency)
    warmups: int | None
    startup_timeout_s: float
    run_timeout_s: float | None
    stop_grace_s: float


def trace_prefix(v: Variant, step: Step, round_: int) -> str:
    """The X-Request-Id prefix of one load run's measured requests."""
    return f"bench-{v.system}-{v.dtype}-c{step.concurrency}-r{round_}-"


def _step(v: Variant, sweep: Sweep, port: int, sampler: PeakSampler, step: Step, round_: int) -> StepRecord:
    at = sweep.at
    n = prompts_for(v.system, step, sweep.num_prompts)
    name = f"{v.system}-{v.dtype}-c{step.concurrency}-r{round_}.json"
    cmd = load_command(at.repo, port, at.model_dir, step, n, sweep.input_len,
                       warmups_for(v.system, step.concurrency, sweep.warmups), at.work, name, seed=SEED + round_,
                       request_id_prefix=trace_prefix(v, step, round_))
    timeout = sweep.run_timeout_s or max(300.0, 60 + n * step.output_len / 10.0)  # a floor of 10 output tok/s
    say(f"{v.key}: concurrency {step.concurrency}, {n} prompts, {sweep.input_len} in / {step.output_len} out tokens, "
        f"seed {SEED + round_}")
    sampler.reset_peak()
    err = run_load(at.repo, cmd, at.work / f"{v.system}-{v.dtype}-c{step.concurrency}.load.log", timeout)
    sampler.sample()
    if err is None and not (at.work / name).exists():
        err = "no result file"
    if err is None:
        d = json.loads((at.work / name).read_text())
        say(f"{v.key}: c={step.concurrency}: {d['output_throughput']:.1f} tok/s, {d['failed']} failed")
    else:
        say(f"{v.key}: c={step.concurrency}: {err}")
    return StepRecord(concurrency=step.concurrency, num_prompts=n, output_len=step.output_len,
                      peak_rss_bytes=sampler.peak, load_command=shlex.join(cmd),
                      result=str(at.work / name) if err is None else None, error=err)


def _cluster_facts(v: Variant, sweep: Sweep, server: Server) -> dict | None:
    """For `app-cluster`: what benchmarks/app_cluster.py wrote once every replica ran, and the config's changes."""
    if v.system != "app-cluster":
        return None
    facts = wait_facts(cluster_facts_path(sweep.at.work, server.port), 120, server.group.running)
    if facts is None:
        say(f"{v.key}: no facts file from the cluster system")
        return None
    config = server.command[server.command.index("--serve-config") + 1]
    try:
        facts["config_changes"] = config_changes(sweep.at.repo, Path(config))
    except (OSError, ValueError, KeyError) as err:
        facts["config_changes"] = [f"(not compared: {err!r})"]
    say(f"{v.key}: cluster up in {facts['cluster_up_s']:.0f} s; every replica running "
        f"{facts['deploy_to_ready_s']:.0f} s after serve deploy")
    return facts


def bench_variant(v: Variant, sweep: Sweep, round_: int) -> tuple[BenchLaunch, list[StepRecord]]:
    """One launch of `v`: every step once with round `round_`'s prompts (seed SEED + round_)."""
    records: list[StepRecord] = []

    def sweep_it(server: Server, out: BenchLaunch) -> None:
        facts = _cluster_facts(v, sweep, server)
        for step in sweep.steps:
            records.append(_step(v, sweep, server.port, server.sampler, step, round_))
            if not server.running():
                out.status = f"exited with status {server.group.proc.returncode} during the benchmark"
                say(f"{v.key}: {out.status}")
                break
        if facts is not None:  # read while the cluster runs: its logs go with it
            try:
                out.cluster = observed(facts, {s.concurrency: trace_prefix(v, s, round_) for s in sweep.steps})
                say(f"{v.key}: replicas {out.cluster['engines']}; shares {out.cluster['shares']}")
            except (OSError, ValueError, KeyError, TypeError) as err:  # the load's figures stand without them
                out.cluster = {**facts, "error": f"{type(err).__name__}: {err}"}
                say(f"{v.key}: replica logs not read: {err!r}")

    grace = max(sweep.stop_grace_s, CLUSTER_STOP_GRACE_S) if v.system == "app-cluster" else sweep.stop_grace_s
    done = launch(v, sweep.at, sweep.at.work / f"{v.system}-{v.dtype}.r{round_}.server.log", round_, BenchLaunch,
                  sweep_it, startup_timeout_s=sweep.startup_timeout_s, stop_grace_s=grace, say=say)
    return done, records
