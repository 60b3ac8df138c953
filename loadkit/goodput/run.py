"""`python -m loadkit goodput`: one goodput run from start to report (rounds over every system, each started,
driven at every rate and stopped; results.json, docs/goodput.md and docs/goodput.png), or `--report-only`, which
rewrites the report from a saved run.

Rounds, not one system's repeats back to back (as loadkit.bench): the machine's speed drifts over minutes, and in
rounds that drift falls on every system alike. A system that failed once is not started again.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

from loadkit.goodput.figures import Targets, launch_from_dict, launch_to_dict, pool
from loadkit.goodput.launch import LaunchRun, Plan, run_launch, say
from loadkit.goodput.loops import KINDS, Rate
from loadkit.goodput.report import REPORT, Setup, render, write_plot
from loadkit.machine import git_commit, machine, versions
from loadkit.markdown import write_section
from loadkit.peers import LABELS, SYSTEMS, Engine, Launchable, Variant
from loadkit.precision import same_precision
from loadkit.report import RunMeta, command_line, short
from loadkit.service import PEER_MARKERS, REPO, prepare_model, processes_started_since
from loadkit.workload import LONG_OUTPUT, PromptMaker

DEFAULT_SYSTEMS = ("app", "vllm", "ray-llm")
DEFAULT_MULTIPLES = (1.0, 2.0, 4.0, 8.0)
ADMISSION_KEYS = ("max_ongoing_requests", "max_queued_requests", "queue_timeout_s")
ABOUT = """Goodput under overload, side by side: this project, bare vLLM and Ray Serve LLM, open loop.

For each system in turn (interleaved rounds, identical engine settings, the bench's start-up): start it, measure
the rate it can serve (a closed loop at the engine's batch size; or --capacity), then send the same seeded mix of
chat requests at 1x, 2x, 4x and 8x that rate on a seeded Poisson (or uniform) schedule whatever the answers,
through the real `openai` SDK with its default retry policy; stop it, leaving no process behind. Reports goodput
per system and rate (requests/s and output tokens/s within both targets), latency, refusal latency, wasted wait,
attempts per served request and peak RSS, to docs/goodput.md and docs/goodput.png.

    python -m loadkit goodput                              # make goodput: all three, 1x-8x
    python -m loadkit goodput --systems app --multiples 1,2 --duration 30   # a smoke run
    python -m loadkit goodput --report-only bench-results/goodput-<timestamp>

On a shared machine wrap real runs: flock /tmp/realstack.lock .venv/bin/python -m loadkit goodput ...
"""
DEFAULTS = {"systems": ",".join(DEFAULT_SYSTEMS), "multiples": ",".join(f"{m:g}" for m in DEFAULT_MULTIPLES),
            "duration": 60.0, "rounds": 2, "capacity": None, "capacity_duration": 45.0, "arrivals": "poisson",
            "seed": 15, "ttft_target": 10.0, "total_target": 60.0}


@dataclass
class Options:
    repo: Path
    command: str
    systems: list[str]
    multiples: list[float]
    duration_s: float
    drain_s: float
    arrivals: str
    seed: int
    targets: Targets
    client_timeout_s: float
    capacity: float | None
    capacity_concurrency: int | None
    capacity_duration_s: float
    rounds: int
    dtype: str | None
    out_dir: Path
    work_dir: Path | None
    model_dir: str | None
    startup_timeout_s: float
    stop_grace_s: float
    note: str
    defaults: bool  # every option at its default: the report does not call itself reduced


def shipped(repo: Path) -> tuple[dict, dict, dict]:
    """configs/cpu.yaml's engine, deployment and service sections (this project's settings as shipped)."""
    model = yaml.safe_load((repo / "configs" / "cpu.yaml").read_text())
    first = model["models"][0]
    return first.get("engine") or {}, first.get("deployment") or {}, model.get("service") or {}


def _on_term(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _write(out_dir: Path, launches: list[LaunchRun], setup: Setup, meta: RunMeta, engine: Engine,
           systems: list[str]) -> tuple[Path, Path]:
    rows = pool(launches, setup.targets)
    report = write_section(out_dir / "goodput.md", REPORT, render(rows, launches, setup, meta, engine, systems))
    plot = write_plot(out_dir / "goodput.png", rows, "" if meta.full else "reduced run")
    return report, plot


def run(o: Options) -> int:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work = (o.work_dir or o.repo / "bench-results" / f"goodput-{stamp}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _on_term)
    started_wall, started, started_epoch = dt.datetime.now(), time.monotonic(), time.time()
    model_dir = o.model_dir or prepare_model(o.repo)
    engine_cfg, deployment, service = shipped(o.repo)
    engine = Engine(dtype=same_precision(o.dtype or str(engine_cfg.get("dtype", "auto"))),
                    max_num_seqs=int(engine_cfg.get("max_num_seqs", Engine.max_num_seqs)))
    at = Launchable(repo=o.repo, model_dir=model_dir, work=work, max_concurrency=engine.max_num_seqs,
                    max_output_len=LONG_OUTPUT[1], engine=engine, shipped_admission=True)
    plan = Plan(at=at, multiples=o.multiples, duration_s=o.duration_s, drain_s=o.drain_s, arrivals=o.arrivals,
                seed=o.seed, client_timeout_s=o.client_timeout_s,
                capacity_concurrency=o.capacity_concurrency or engine.max_num_seqs,
                capacity_duration_s=o.capacity_duration_s, startup_timeout_s=o.startup_timeout_s,
                stop_grace_s=o.stop_grace_s)
    prompts = PromptMaker.for_model(model_dir)
    say(f"systems {o.systems}, multiples {o.multiples}, {o.rounds} round(s); prompt calibration: "
        f"{prompts.base:.1f} tokens + {prompts.per_word:.2f} a word; raw results in {work}")
    capacities: dict[str, Rate] = {}
    if o.capacity:
        capacities = {s: Rate(rate_rps=o.capacity, measured=False) for s in o.systems}
    launches: list[LaunchRun] = []
    interrupted = False
    try:
        for round_ in range(o.rounds):
            for system in o.systems:
                if any(la.system == system and la.status != "ok" for la in launches):
                    continue
                measured = next(((k, c) for k, c in capacities.items() if c.rate_rps > 0), None)
                fallback = replace(measured[1], note=f"{LABELS.get(measured[0], measured[0])}'s rate") if measured \
                    else None
                launch = run_launch(Variant(system, engine.dtype), plan, round_, prompts, capacities.get(system),
                                    fallback)
                launches.append(launch)
                if launch.capacity is not None:
                    capacities.setdefault(system, launch.capacity)
    except KeyboardInterrupt:
        say("interrupted; writing what there is")
        interrupted = True
    admission = {k: deployment[k] for k in ADMISSION_KEYS if k in deployment} | {
        "request_timeout_s": service.get("request_timeout_s")}
    setup = Setup(multiples=o.multiples, duration_s=o.duration_s, drain_s=o.drain_s, arrivals=o.arrivals, seed=o.seed,
                  targets=o.targets, client_timeout_s=o.client_timeout_s, rounds=o.rounds, capacity_given=o.capacity,
                  capacity_concurrency=plan.capacity_concurrency, capacity_duration_s=o.capacity_duration_s,
                  app_admission=admission, commit=git_commit(o.repo).text, note=o.note)
    meta = RunMeta(started=started_wall.strftime("%Y-%m-%d %H:%M"), finished=dt.datetime.now().strftime("%H:%M"),
                   wall_s=time.monotonic() - started, machine=machine(), versions=versions(), model_dir=model_dir,
                   full=o.defaults and not interrupted, work_dir=short(str(work), o.repo),
                   command=short(o.command, o.repo), config_dtype=engine.dtype,
                   foreign=processes_started_since(started_epoch, PEER_MARKERS, untagged_only=True))
    (work / "results.json").write_text(json.dumps({
        "meta": meta.to_dict(), "setup": asdict(setup), "engine": asdict(engine), "systems": o.systems,
        "launches": [launch_to_dict(la) for la in launches]}))
    report, plot = _write(o.out_dir.resolve(), launches, setup, meta, engine, o.systems)
    say(f"wrote {report} and {plot}; raw results in {work}")
    if interrupted:
        return 130
    return 0 if launches and all(la.status == "ok" for la in launches) else 1


def report_only(work: Path, out_dir: Path) -> int:
    """Rewrites docs/goodput.md and the plot from an earlier run's results.json (nothing is started)."""
    data = json.loads((work / "results.json").read_text())
    s = data["setup"]
    setup = Setup(**{**s, "targets": Targets(**s["targets"])})
    launches = [launch_from_dict(d) for d in data["launches"]]
    report, plot = _write(out_dir.resolve(), launches, setup, RunMeta.from_dict(data["meta"]), Engine(**data["engine"]),
                          data["systems"])
    say(f"wrote {report} and {plot} from {work / 'results.json'}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadkit goodput", description=ABOUT,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    p.add_argument("--systems", default=d["systems"], help=f"comma-separated, of {', '.join(SYSTEMS)} "
                   f"(default {d['systems']})")
    p.add_argument("--multiples", default=d["multiples"], help=f"offered rates as multiples of each system's "
                   f"capacity (default {d['multiples']})")
    p.add_argument("--duration", type=float, default=d["duration"], help="seconds of arrivals per rate (default 60)")
    p.add_argument("--drain", type=float, default=None, help="seconds after the last arrival before what still "
                   "runs is cut off (default: the whole-request target)")
    p.add_argument("--rounds", type=int, default=d["rounds"], help="rounds, systems interleaved (default 2)")
    p.add_argument("--capacity", type=float, default=d["capacity"], help="req/s to take as every system's capacity "
                   "instead of measuring it")
    p.add_argument("--capacity-duration", type=float, default=d["capacity_duration"],
                   help="seconds of the closed loop that measures capacity (default 45)")
    p.add_argument("--capacity-concurrency", type=int, default=None,
                   help="clients of that closed loop (default: the engine's max_num_seqs)")
    p.add_argument("--arrivals", choices=KINDS, default=d["arrivals"], help="arrival schedule (default poisson)")
    p.add_argument("--seed", type=int, default=d["seed"], help="seed of the mix and the schedule (default 15)")
    p.add_argument("--ttft-target", type=float, default=d["ttft_target"], help="first-token target, s (default 10)")
    p.add_argument("--total-target", type=float, default=d["total_target"],
                   help="whole-request target, s (default 60)")
    p.add_argument("--client-timeout", type=float, default=None,
                   help="the SDK's timeout per attempt, s (default: the whole-request target)")
    p.add_argument("--dtype", default=None,
                   help="engine dtype for every system (default: configs/cpu.yaml's; `auto` is resolved as this "
                   "project resolves it, bfloat16 where the CPU computes it natively, else float32, and that one "
                   "precision is given to every system)")
    p.add_argument("--out-dir", type=Path, default=REPO / "docs", help="where goodput.md and goodput.png go")
    p.add_argument("--work-dir", type=Path, default=None, help="raw results and logs "
                   "(default bench-results/goodput-<timestamp>/)")
    p.add_argument("--model-dir", default=None, help="model folder (default: `python -m app prepare-model`)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds each system may take to start")
    p.add_argument("--stop-grace", type=float, default=60.0, help="seconds after SIGINT before SIGTERM/SIGKILL")
    p.add_argument("--note", default="", help="a line for the top of the report")
    p.add_argument("--report-only", type=Path, default=None, metavar="WORK_DIR",
                   help="start nothing: rewrite the report and plot from WORK_DIR/results.json")
    return p


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def options(argv: list[str]) -> Options | argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    if a.report_only:
        return a
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS or s == "naive"]
    if bad or not systems:
        p.error(f"systems: {', '.join(bad) or 'none'}; choose vLLM-based ones of {', '.join(SYSTEMS[:-1])}")
    multiples = floats(a.multiples)
    if not multiples or any(m <= 0 for m in multiples):
        p.error("--multiples needs positive numbers")
    if a.rounds < 1 or a.duration <= 0:
        p.error("--rounds and --duration must be positive")
    targets = Targets(ttft_s=a.ttft_target, total_s=a.total_target)
    defaults = all(getattr(a, k) == v for k, v in DEFAULTS.items()) and a.drain is None and a.client_timeout is None
    return Options(
        repo=REPO, command=command_line("goodput", argv), systems=systems, multiples=multiples,
        duration_s=a.duration, drain_s=a.total_target if a.drain is None else a.drain, arrivals=a.arrivals,
        seed=a.seed, targets=targets, client_timeout_s=a.client_timeout or a.total_target, capacity=a.capacity,
        capacity_concurrency=a.capacity_concurrency, capacity_duration_s=a.capacity_duration, rounds=a.rounds,
        dtype=a.dtype, out_dir=a.out_dir, work_dir=a.work_dir, model_dir=a.model_dir,
        startup_timeout_s=a.startup_timeout, stop_grace_s=a.stop_grace, note=a.note, defaults=defaults)


def main(argv: list[str]) -> int:
    o = options(argv)
    if isinstance(o, argparse.Namespace):
        return report_only(o.report_only.resolve(), o.out_dir)
    return run(o)
