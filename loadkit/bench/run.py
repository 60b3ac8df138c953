"""One benchmark run from start to report: rounds over every variant, pooling, results.json, report and plots.

`run(options)` is what `scripts/bench.py` calls; `report_only(...)` rewrites the report of an earlier run.
Rounds, not one system's repeats back to back: the machine's speed drifts over minutes, and in rounds that drift
falls on every system (and every precision) alike.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadkit.bench.launch import Sweep, bench_variant, say
from loadkit.bench.load import DEFAULT_INPUT_LEN, FULL_SWEEP, plan, repeats_for
from loadkit.bench.meta import ReportOptions, RunMeta
from loadkit.bench.plots import write_plots
from loadkit.bench.report import short, write_report
from loadkit.bench.results import Launch, StepRecord, SystemRun, pool_rounds
from loadkit.bench.systems import DEFAULT_SYSTEMS, Engine, Launchable, Variant, variants
from loadkit.machine import machine, versions
from loadkit.service import PEER_MARKERS, processes_started_since


@dataclass
class Options:
    repo: Path
    systems: list[str]
    dtypes: list[str]
    dtypes_asked: bool
    config_dtype: str
    concurrency: list[int]
    repeats: int | None
    quick: bool
    num_prompts: int | None
    input_len: int
    output_len: int | None
    warmups: int | None
    out_dir: Path
    work_dir: Path | None
    model_dir: str | None
    startup_timeout: float
    run_timeout: float | None
    stop_grace: float
    ray_stream_batching_ms: float | None
    note: str
    command: str  # as the report quotes it

    @property
    def full(self) -> bool:
        """The whole default sweep (else the report says it is a reduced run)."""
        return (not self.quick and set(DEFAULT_SYSTEMS) <= set(self.systems)
                and self.concurrency == list(FULL_SWEEP) and self.num_prompts is None and self.output_len is None
                and self.input_len == DEFAULT_INPUT_LEN)

    def report_options(self) -> ReportOptions:
        return ReportOptions(input_len=self.input_len, warmups=self.warmups, repeats=self.repeats,
                             ray_stream_batching_ms=self.ray_stream_batching_ms, note=self.note, dtypes=self.dtypes,
                             dtypes_asked=self.dtypes_asked)


def prepare_model(repo: Path) -> str:
    """The default model's folder, as the service prepares it (run as a command: the kit imports no app/)."""
    out = subprocess.run([sys.executable, "-m", "app", "prepare-model"], cwd=repo, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip().splitlines()[-1]


def _rounds(o: Options, sweep: Sweep, plan_: list[Variant]) -> tuple[dict, dict, bool]:
    launches: dict[Variant, list[Launch]] = {v: [] for v in plan_}
    records: dict[Variant, list[StepRecord]] = {v: [] for v in plan_}
    try:
        for round_ in range(max(repeats_for(v.system, o.repeats) for v in plan_)):
            for v in plan_:
                # A variant that failed once is not started again: its later rounds would fail the same way.
                if round_ < repeats_for(v.system, o.repeats) and all(la.status == "ok" for la in launches[v]):
                    launch, done = bench_variant(v, sweep, round_)
                    launches[v].append(launch)
                    records[v].extend(done)
    except KeyboardInterrupt:
        say("interrupted; writing what there is")
        return launches, records, True
    return launches, records, False


def _on_term(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run(o: Options) -> int:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work = (o.work_dir or o.repo / "bench-results" / stamp).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out_dir = o.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _on_term)
    started_wall, started, started_epoch = dt.datetime.now(), time.monotonic(), time.time()
    model_dir = o.model_dir or prepare_model(o.repo)
    steps = plan(o.concurrency, o.num_prompts, o.output_len)
    engine = Engine(dtype=o.dtypes[0])  # the dtype here is only the first; each variant carries its own
    at = Launchable(repo=o.repo, model_dir=model_dir, work=work, max_concurrency=max(s.concurrency for s in steps),
                    max_output_len=max(s.output_len for s in steps), engine=engine,
                    ray_stream_batching_ms=o.ray_stream_batching_ms)
    sweep = Sweep(at=at, steps=steps, input_len=o.input_len, num_prompts=o.num_prompts, warmups=o.warmups,
                  startup_timeout_s=o.startup_timeout, run_timeout_s=o.run_timeout, stop_grace_s=o.stop_grace)
    plan_ = variants(o.systems, o.dtypes)
    say(f"variants {[v.key for v in plan_]}; steps {[(s.concurrency, s.num_prompts, s.output_len) for s in steps]}; "
        f"model {model_dir}; raw results in {work}")
    launches, records, interrupted = _rounds(o, sweep, plan_)
    runs = [pool_rounds(v, o.input_len, launches[v], records[v]) for v in plan_ if launches[v]]
    meta = RunMeta(started=started_wall.strftime("%Y-%m-%d %H:%M"), finished=dt.datetime.now().strftime("%H:%M"),
                   wall_s=time.monotonic() - started, machine=machine(), versions=versions(), model_dir=model_dir,
                   full=o.full and not interrupted, work_dir=short(str(work), o.repo), command=short(o.command, o.repo),
                   config_dtype=o.config_dtype,
                   foreign=processes_started_since(started_epoch, PEER_MARKERS, untagged_only=True))
    opts = o.report_options()
    (work / "results.json").write_text(json.dumps({"meta": meta.to_dict(), "options": vars(opts),
                                                   "engine": vars(engine), "runs": [r.to_dict() for r in runs]},
                                                  indent=2))
    report = write_report(out_dir, runs, opts, meta, engine, o.repo)
    plots = write_plots(out_dir, runs, meta.full)
    say(f"wrote {report}, {', '.join(str(p) for p in plots)}; raw results in {work}")
    if interrupted:
        return 130
    return 0 if runs and all(run.ok for run in runs) and len(runs) == len(plan_) else 1


def report_only(work: Path, out_dir: Path, repo: Path) -> int:
    """Rewrites the report and plots from a finished run's results.json (no system is started)."""
    data = json.loads((work / "results.json").read_text())
    runs = [SystemRun.from_dict(r) for r in data["runs"]]
    opts = ReportOptions.from_dict(data.get("options") or data.get("args") or {})
    if "options" not in data:  # an older results.json: one precision, the engine's of the time
        opts.dtypes = sorted({r.dtype for r in runs}) or ["bfloat16"]
    meta = RunMeta.from_dict(data["meta"])
    engine = Engine(**data["engine"]) if "engine" in data else Engine()
    out_dir.mkdir(parents=True, exist_ok=True)
    report = write_report(out_dir, runs, opts, meta, engine, repo)
    plots = write_plots(out_dir, runs, meta.full)
    say(f"wrote {report}, {', '.join(str(p) for p in plots)} from {work / 'results.json'}")
    return 0
