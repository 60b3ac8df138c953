"""One goodput run from start to report: rounds over every system (each started, driven at every rate, stopped),
results.json, docs/goodput.md and docs/goodput.png. `report_only` rewrites the report from a saved run.

Rounds, not one system's repeats back to back (as loadkit.bench): the machine's speed drifts over minutes, and in
rounds that drift falls on every system alike. A system that failed once is not started again.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

from loadkit.bench.meta import RunMeta
from loadkit.bench.report import short
from loadkit.bench.run import prepare_model
from loadkit.bench.systems import LABELS, Engine, Launchable, Variant
from loadkit.goodput.capacity import Capacity
from loadkit.goodput.figures import Targets
from loadkit.goodput.launch import LaunchRun, Plan, run_launch, say
from loadkit.goodput.plot import write_plot
from loadkit.goodput.report import REPORT, Setup, render
from loadkit.goodput.results import launch_from_dict, launch_to_dict, pool
from loadkit.goodput.workload import LONG_OUTPUT, prompt_maker
from loadkit.machine import cpu_facts, git_commit, machine, versions
from loadkit.markdown import write_section
from loadkit.service import PEER_MARKERS, processes_started_since

DEFAULT_SYSTEMS = ("app", "vllm", "ray-llm")
DEFAULT_MULTIPLES = (1.0, 2.0, 4.0, 8.0)
ADMISSION_KEYS = ("max_ongoing_requests", "max_queued_requests", "queue_timeout_s")


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


def same_precision(dtype: str) -> str:
    """`auto` as this project resolves it on this CPU (bfloat16 where the CPU computes it natively, float32
    otherwise), given to every system: bare vLLM's own `auto` takes the model folder's bfloat16, which a CPU
    without AVX-512 bf16 emulates many times slower (the 14:22 run had this project in float32 and the peers in
    bfloat16, and the peers' engines stalled for tens of seconds a step)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if cpu_facts().native_bf16 else "float32"


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
    prompts = prompt_maker(model_dir)
    say(f"systems {o.systems}, multiples {o.multiples}, {o.rounds} round(s); prompt calibration: "
        f"{prompts.base:.1f} tokens + {prompts.per_word:.2f} a word; raw results in {work}")
    capacities: dict[str, Capacity] = {}
    if o.capacity:
        capacities = {s: Capacity(rate_rps=o.capacity, measured=False) for s in o.systems}
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
