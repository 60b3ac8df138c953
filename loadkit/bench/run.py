"""`python -m loadkit bench`: one benchmark run from start to report (rounds over every variant, pooling,
results.json, report and plots), or `--report-only`, which rewrites the report of an earlier run.

Rounds, not one system's repeats back to back: the machine's speed drifts over minutes, and in rounds that drift
falls on every system (and every precision) alike.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from loadkit.bench.launch import Sweep, bench_variant, say
from loadkit.bench.load import DEFAULT_INPUT_LEN, DEFAULT_REPEATS, FULL_SWEEP, plan, repeats_for
from loadkit.bench.report import ReportOptions, write_plots, write_report
from loadkit.bench.results import BenchLaunch, StepRecord, SystemRun, pool_rounds
from loadkit.machine import machine, versions
from loadkit.peers import DEFAULT_SYSTEMS, SYSTEMS, Engine, Launchable, Variant, config_dtype, variants
from loadkit.precision import DTYPES, parse_dtypes
from loadkit.report import RunMeta, command_line, short
from loadkit.service import PEER_MARKERS, REPO, prepare_model, processes_started_since

ABOUT = """This project against its peers, side by side: each system in turn started on the default model with
identical engine settings, driven with the same load (vLLM's own load generator, `vllm bench serve`, on the
streaming chat endpoint) at each --max-concurrency of the sweep, stopped leaving no process behind; in --repeats
interleaved rounds, pooled; then docs/benchmarks.md and two plots (docs/benchmarks.md says how to read them).

Systems (--systems; by default app, vllm, ray-llm, naive; `all` adds the others):
  app          this project: `python -m app serve --config <derived from configs/cpu.yaml>`
  app-proxy    the same through Ray Serve's HTTP proxy (`--serve-proxy`), the KubeRay path
  app-ingress  the same with a separate ingress deployment (`service.colocate_ingress: false`)
  app-cluster  the KubeRay path with two replicas on a local multi-node Ray cluster (benchmarks/app_cluster.py)
  vllm         bare vLLM: `python -m vllm.entrypoints.openai.api_server ...`
  ray-llm      Ray Serve LLM: benchmarks/ray_serve_llm.py (ray.serve.llm.build_openai_app)
  naive        baseline: benchmarks/naive_fastapi.py (FastAPI + transformers generate, Semaphore(2))

    python -m loadkit bench                       # the full sweep (make bench)
    python -m loadkit bench --systems app,vllm --dtype bfloat16,float32,auto --concurrency 1,4
    python -m loadkit bench --quick               # naive baseline, a handful of requests
    python -m loadkit bench --report-only bench-results/<timestamp>   # redo report + plots only
"""


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


def _rounds(o: Options, sweep: Sweep, plan_: list[Variant]) -> tuple[dict, dict, bool]:
    launches: dict[Variant, list[BenchLaunch]] = {v: [] for v in plan_}
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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadkit bench", description=ABOUT,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=None, help=f"comma-separated subset of {','.join(SYSTEMS)}, or `all` "
                   f"(default: {','.join(DEFAULT_SYSTEMS)}; with --quick: naive)")
    p.add_argument("--dtype", default=None,
                   help=f"comma-separated precisions, of {', '.join(DTYPES)}: every vLLM-based system runs at each "
                   "(default: configs/cpu.yaml's engine.dtype)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"rounds: every system swept this many times, interleaved, pooled (default {DEFAULT_REPEATS}; "
                   "the naive baseline 1; --quick: 1)")
    p.add_argument("--concurrency", default=None,
                   help="comma-separated --max-concurrency sweep (default 1,4,16,64; with --quick: 2)")
    p.add_argument("--quick", action="store_true",
                   help="one system, one concurrency, a handful of short requests (a smoke run)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="prompts per run (default max(8, 4 x concurrency); --quick: 4)")
    p.add_argument("--input-len", type=int, default=None,
                   help=f"prompt tokens (default {DEFAULT_INPUT_LEN}; --quick: 32)")
    p.add_argument("--output-len", type=int, default=None,
                   help="output tokens (default 64 at concurrency 1, else 128; --quick: 16)")
    p.add_argument("--warmups", type=int, default=None,
                   help="warm-up requests before each run (default: as many as the concurrency, at least 2; "
                   "naive: 2; --quick: 1)")
    p.add_argument("--out-dir", type=Path, default=REPO / "docs",
                   help="where benchmarks.md and the plots go (default docs/)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="raw results and logs (default bench-results/<timestamp>/)")
    p.add_argument("--model-dir", default=None, help="model folder (default: `python -m app prepare-model`)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds each system may take to become ready")
    p.add_argument("--run-timeout", type=float, default=None,
                   help="seconds one load run may take (default: scaled to its size)")
    p.add_argument("--stop-grace", type=float, default=60.0, help="seconds after SIGINT before SIGTERM/SIGKILL")
    p.add_argument("--ray-stream-batching-ms", type=float, default=None,
                   help="Ray Serve LLM's stream_batching_interval_ms (default: its own, 50 ms; 0 sends every token "
                   "at once)")
    p.add_argument("--report-only", type=Path, default=None, metavar="WORK_DIR",
                   help="start nothing: rewrite the report and plots from WORK_DIR/results.json of an earlier run")
    p.add_argument("--note", default="", help="a line for the top of the report")
    return p


def options(argv: list[str]) -> Options | argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.report_only:
        return args
    names = ",".join(SYSTEMS) if args.systems == "all" else args.systems
    systems = [s.strip() for s in names.split(",") if s.strip()] if names else (
        ["naive"] if args.quick else list(DEFAULT_SYSTEMS))
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        p.error(f"unknown system(s) {', '.join(bad)}; choose from {', '.join(SYSTEMS)}")
    try:
        dtypes = parse_dtypes(args.dtype) if args.dtype else [config_dtype(REPO)]
    except ValueError as err:
        p.error(str(err))
    conc = args.concurrency or ("2" if args.quick else ",".join(map(str, FULL_SWEEP)))
    concurrency = [int(c) for c in conc.split(",") if c.strip()]
    if args.quick:
        systems, concurrency = systems[:1], concurrency[:1]
        args.num_prompts = args.num_prompts or 4
        args.input_len = args.input_len or 32
        args.output_len = args.output_len or 16
        args.warmups = 1 if args.warmups is None else args.warmups
        args.repeats = args.repeats or 1
    if not concurrency or any(c < 1 for c in concurrency):
        p.error("--concurrency needs positive integers")
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats needs a positive integer")
    return Options(
        repo=REPO, systems=systems, dtypes=dtypes, dtypes_asked=bool(args.dtype), config_dtype=config_dtype(REPO),
        concurrency=concurrency, repeats=args.repeats, quick=args.quick, num_prompts=args.num_prompts,
        input_len=args.input_len or DEFAULT_INPUT_LEN, output_len=args.output_len, warmups=args.warmups,
        out_dir=args.out_dir, work_dir=args.work_dir, model_dir=args.model_dir, startup_timeout=args.startup_timeout,
        run_timeout=args.run_timeout, stop_grace=args.stop_grace, ray_stream_batching_ms=args.ray_stream_batching_ms,
        note=args.note, command=command_line("bench", argv))


def main(argv: list[str]) -> int:
    o = options(argv)
    if isinstance(o, argparse.Namespace):
        return report_only(o.report_only.resolve(), o.out_dir.resolve(), REPO)
    return run(o)
