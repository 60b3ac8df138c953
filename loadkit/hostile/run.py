"""`python -m loadkit hostile`: one hostile run from start to report: the service (its own, or a running one by
URL), the polite client alone, the attack, the service afterwards, the targets, the section in docs/hostile.md and
the whole result as JSON; exit status 0 only if every target passes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loadkit.hostile.attack import attack
from loadkit.hostile.plan import SHORT_CLOCKS, Clocks, Plan
from loadkit.hostile.polite import PoliteProcess
from loadkit.hostile.report import DOC, evaluate, render
from loadkit.hostile.result import HostileResult, write_json
from loadkit.hostile.server_view import ServerView, engine_facts, engine_outcomes, lag_histogram
from loadkit.hostile.sockets import Endpoint, Fleet
from loadkit.machine import git_commit, machine, vllm_version
from loadkit.report import RunFacts, command_line, progress, publish
from loadkit.server_stats import normal_chat, wait_idle
from loadkit.service import BASE_CONFIG, REPO, NotLoopback, OwnService, RunningService, loopback_url
from loadkit.waiting import until

POLITE_AFTER = 3  # polite requests sent after the attack before the run ends
log = progress("hostile")
ABOUT = """Hostile clients: slow readers, idle and half-open connections, giant prompts and keys that never arrive
must not take the service from everyone else.

Bounded in count and time, loopback only. By default it starts its own service (`python -m app serve`) from a
config generated from configs/cpu.yaml (a free port, a generated API key, connection clocks lowered to keep the
run short: header 5 s, body 10 s, keep-alive 10 s, write stall 10 s) and stops it at the end, leaving no process
behind; with --url it drives a running service (tell it that service's clocks with the --*-timeout flags).

While a polite client in its own process sends one short chat a second (--polite-interval), one client process
opens, at once: --non-readers streams it never reads, --idle connections that send nothing, --slowloris connections
sending one header byte every --slowloris-interval seconds, --huge-headers header blocks of --huge-header-mb MiB,
--giant-prompts prompts of --giant-prompt-kb KB and a /tokenize flood; after --duration seconds it closes them
all, waits for the service to be idle and asks it the capital of France. Prints PASS/FAIL per target, writes the
whole result as JSON into --work-dir and the report into docs/hostile.md (--output - : print only).

    python -m loadkit hostile                        # the issue's scenario, ~5 min (make hostile)
    python -m loadkit hostile --non-readers 5 --idle 20 --slowloris 5 --duration 30 --output -
    python -m loadkit hostile --url http://127.0.0.1:8000 --api-key KEY --write-stall-timeout 30
"""
_PLAN_FLAGS = {  # flag -> (Plan field, type, scale from the flag's unit to the field's)
    "duration": ("duration_s", float, 1), "baseline": ("baseline_s", float, 1),
    "settle_timeout": ("settle_timeout_s", float, 1), "non_readers": ("non_readers", int, 1),
    "non_reader_max_tokens": ("non_reader_max_tokens", int, 1), "non_reader_rcvbuf": ("non_reader_rcvbuf", int, 1),
    "non_reader_n": ("non_reader_n", int, 1), "non_reader_logprobs": ("non_reader_logprobs", int, 1),
    "idle": ("idle", int, 1), "slowloris": ("slowloris", int, 1),
    "slowloris_interval": ("slowloris_interval_s", float, 1), "huge_headers": ("huge_headers", int, 1),
    "huge_header_mb": ("huge_header_bytes", float, 2**20), "giant_prompts": ("giant_prompts", int, 1),
    "giant_prompt_kb": ("giant_prompt_bytes", float, 1000), "tokenize_clients": ("tokenize_clients", int, 1),
    "tokenize_requests": ("tokenize_requests", int, 1), "polite_timeout": ("polite_timeout_s", float, 1),
    "polite_interval": ("polite_interval_s", float, 1),
    "serve_grace": ("serve_grace_s", float, 1),
}
_CLOCK_FLAGS = ("header_timeout", "body_timeout", "keep_alive_timeout", "write_stall_timeout")


@dataclass
class Options:
    repo: Path
    command: str  # as the report quotes it
    plan: Plan
    url: str | None
    api_key: str | None
    model: str | None
    config: Path  # the base config of an own service
    clocks: dict[str, float] = field(default_factory=dict)  # own: set in its config; by URL: what it has
    output: Path = Path("-")  # the Markdown report ('-': print only)
    work_dir: Path = Path("bench-results/hostile")
    startup_timeout: float = 600.0


def own_service(base_config: Path, clocks: dict[str, float], work_dir: Path,
                repo: Path = REPO) -> tuple[OwnService, Clocks]:
    """`python -m app serve` on `base_config` with a free port, a fresh key and the clocks given (or SHORT_CLOCKS),
    and the clocks it has."""
    overrides = {**SHORT_CLOCKS, **clocks}
    service = OwnService(base_config, "hostile", repo=repo, work_dir=work_dir,
                         service={"drain_grace_s": 10, **overrides})
    return service, Clocks.from_config(service.config, f"generated config, lowered from the defaults: "
                                                       f"{', '.join(f'{k} {v:g}' for k, v in overrides.items())}")


def mode(service: OwnService | RunningService) -> str:
    if isinstance(service, RunningService):
        seen = f"process tree of pid {service.pid}" if service.pid else "its process tree not found"
        return f"a running service at {service.base_url} ({seen})"
    return (f"own `python -m app serve` on a config generated from {service.base_name} (free loopback port, "
            f"a generated API key, the clocks below; capacity and engine as in {service.base_name})")


def raise_fd_limit(needed: int) -> int:
    """This process's soft descriptor limit raised to at least `needed` (up to the hard limit); the new soft."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


async def _until(condition, timeout_s: float) -> None:
    """Waits for `condition` (plain or async) at most `timeout_s`; the run goes on either way."""
    with contextlib.suppress(TimeoutError):
        await until(condition, timeout_s, interval_s=0.25)


async def drive(o: Options, service: OwnService | RunningService, clocks: Clocks) -> HostileResult:
    plan, headers = o.plan, ({"Authorization": f"Bearer {service.api_key}"} if service.api_key else {})
    async with httpx.AsyncClient(base_url=service.base_url, headers=headers, timeout=30) as http:
        model = service.model or (await http.get("/v1/models")).json()["data"][0]["id"]
        engine = await engine_facts(http, model)
        view = ServerView(service.port, service.tree)
        view.locate()
        log(f"model {model}, engine dtype {engine.dtype}; {view.describe()}")
        warm = await normal_chat(http, model, expect="Paris", shown=80)
        log(f"warm-up chat: {warm.detail}")
        polite = PoliteProcess(service.base_url, model, service.api_key, plan.polite_interval_s,
                               plan.polite_timeout_s, o.work_dir / f"polite-{os.getpid()}.jsonl")
        fleet = Fleet(Endpoint(service.host, service.port, service.api_key, model), plan)
        try:
            await _until(lambda: len(polite.records()) > 0, plan.polite_timeout_s)
            await asyncio.sleep(plan.baseline_s)  # the polite client alone for a while: the baseline IS a duration
            baseline = await asyncio.to_thread(view.sample)
            lag_before = await lag_histogram(http)
            log(f"attack: {plan.hostile_sockets} hostile sockets, {plan.giant_prompts} giant prompts, /tokenize "
                f"flood, for {plan.duration_s:g} s")
            limits = httpx.Limits(max_connections=plan.giant_prompts + plan.tokenize_clients + 2)
            async with httpx.AsyncClient(base_url=service.base_url, headers=headers, limits=limits) as hostile_http:
                a = await attack(fleet, view, http, hostile_http, model)
            log(f"attack over; {a.closed_by_driver} hostile sockets the server had not ended, closed here")
            await _until(lambda: sum(r.start >= a.ended for r in polite.records()) >= POLITE_AFTER,
                         plan.polite_timeout_s + 10)
            records = polite.stop()  # before the idle check: its own requests would keep the engine busy
            idle = await wait_idle(http, model, plan.settle_timeout_s)
            log(f"idle: {idle.reached} in {idle.took_s:.1f} s")
            await _until(lambda: _released(view, baseline), 30)  # the server lets go of the sockets closed here
            after = await asyncio.to_thread(view.sample)
            paris = await normal_chat(http, model, expect="Paris", shown=80)
            log(f"after: {paris.detail}")
            lag_after = await lag_histogram(http)
        finally:
            fleet.close()
            records = polite.stop()
    return HostileResult(plan=plan, clocks=clocks, model=model, engine=engine, attack=a,
                         sockets=fleet.records, polite=records, lag_before=lag_before, lag_after=lag_after,
                         baseline=baseline, samples=view.samples, after=after, idle_after=idle, paris=paris,
                         view=view.describe())


async def _released(view: ServerView, baseline) -> bool:
    ports = await asyncio.to_thread(view.remote_ports)
    return ports is None or baseline is None or len(ports) <= baseline.connections + 4


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _service(o: Options) -> tuple[OwnService | RunningService, Clocks]:
    if o.url:
        clocks = Clocks(**o.clocks, source="as told by the command line for this service") if o.clocks else Clocks()
        return RunningService(o.url, o.api_key, o.model, or_listener=True), clocks
    service, clocks = own_service(o.config, o.clocks, o.work_dir, o.repo)
    service.model = o.model or service.model
    return service, clocks


def run(o: Options) -> int:
    raise_fd_limit(o.plan.hostile_sockets + 512)
    o.work_dir.mkdir(parents=True, exist_ok=True)
    facts_machine, vllm, commit = machine(), vllm_version(), git_commit(o.repo)
    signal.signal(signal.SIGTERM, _interrupt)
    service, clocks = _service(o)
    own = isinstance(service, OwnService)
    result: HostileResult | None = None
    try:
        if own:
            log(f"starting the service on {service.base_url} (config {service.config_path})")
            why = service.start(o.startup_timeout)
            if why is not None:
                log(f"the service did not become healthy ({why}); log tail:\n{service.log_tail()}")
                return 2
        result = asyncio.run(drive(o, service, clocks))
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        if own:
            report = service.stop()
            log(f"service stopped: {report.text() if report else 'never started'}")
            if result is not None:
                result.leftover = service.leftover()
                outcomes, tokens = engine_outcomes(service.log_text())
                if outcomes:
                    result.notes.append("Service log, `engine request` lines by outcome (median generated tokens): "
                                        + ", ".join(f"{k} {v} ({tokens.get(k, 0)})" for k, v in outcomes.items()))
    targets = evaluate(result)
    facts = RunFacts(command=o.command, machine=facts_machine, vllm=vllm, commit=commit, mode=mode(service))
    section = render(facts, result, targets)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = write_json(o.work_dir / f"hostile-{stamp}.json", result,
                      {"command": o.command, "targets": targets, "mode": mode(service)})
    log(f"wrote {path}")
    passed = publish(section, targets, o.output, DOC, log)
    if own and passed:
        shutil.rmtree(service.dir, ignore_errors=True)
    elif own:
        log(f"service config and log kept in {service.dir}")
    return 0 if passed else 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m loadkit hostile", description=ABOUT,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Plan()
    for flag, (name, kind, scale) in _PLAN_FLAGS.items():
        default = getattr(defaults, name) / scale
        parser.add_argument("--" + flag.replace("_", "-"), type=kind, default=None,
                            help=f"default {default:g}")
    for flag in _CLOCK_FLAGS:
        parser.add_argument("--" + flag.replace("_", "-"), type=float, default=None,
                            help=f"service.{flag}_s: set in the generated config (own service), or what the "
                                 "--url service has (default there: the documented default)")
    parser.add_argument("--url", help="drive this running service instead of starting one (loopback only)")
    parser.add_argument("--api-key", default=os.environ.get("HOSTILE_API_KEY"), help="bearer key for --url")
    parser.add_argument("--model", help="model id (default: the config's first model, or the first of /v1/models)")
    parser.add_argument("--config", type=Path, default=BASE_CONFIG, help="base config of the service it starts")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "hostile.md",
                        help="report file, its generated section replaced ('-': print only)")
    parser.add_argument("--work-dir", type=Path, default=REPO / "bench-results" / "hostile",
                        help="where the JSON result (and an own service's config and log) go")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.url:
        try:
            loopback_url(args.url)
        except NotLoopback as err:
            parser.error(str(err))
    return args


def plan_of(args: argparse.Namespace) -> Plan:
    values = {}
    for flag, (name, _, scale) in _PLAN_FLAGS.items():
        given = getattr(args, flag)
        if given is not None:
            values[name] = int(given * scale) if scale != 1 else given
    return Plan(**values)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    clocks = {f"{flag}_s": v for flag in _CLOCK_FLAGS if (v := getattr(args, flag)) is not None}
    return run(Options(repo=REPO, command=command_line("hostile", argv), plan=plan_of(args), url=args.url,
                       api_key=args.api_key, model=args.model, config=args.config, clocks=clocks,
                       output=args.output, work_dir=args.work_dir, startup_timeout=args.startup_timeout))
