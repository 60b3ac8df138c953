"""One hostile run from start to report: the service (own or by URL), the polite client alone, the attack, the
service afterwards, the targets, the Markdown section and the JSON file.

`run(options)` is what `scripts/hostile.py` calls; it returns the exit status (0 only if every target passes).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import resource
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loadkit.hostile.attack import attack
from loadkit.hostile.attackers import Endpoint, Fleet
from loadkit.hostile.checks import capital_of_france, engine_facts, engine_outcomes, lag_histogram, wait_idle
from loadkit.hostile.deployment import OwnService, UrlService
from loadkit.hostile.plan import Clocks, Plan
from loadkit.hostile.polite import PoliteProcess
from loadkit.hostile.render import DOC, RunFacts, render
from loadkit.hostile.result import HostileResult, write_json
from loadkit.hostile.server_view import ServerView
from loadkit.hostile.targets import evaluate
from loadkit.machine import git_commit, machine, vllm_version
from loadkit.markdown import write_section

POLITE_AFTER = 3  # polite requests sent after the attack before the run ends


def log(message: str) -> None:
    print(f"[hostile {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


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


def raise_fd_limit(needed: int) -> int:
    """This process's soft descriptor limit raised to at least `needed` (up to the hard limit); the new soft."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


async def _until(condition, timeout_s: float, interval_s: float = 0.25) -> bool:
    """Polls `condition` (plain or async) until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval_s)  # a poll interval, not a wait for something


async def drive(o: Options, service) -> HostileResult:
    plan, headers = o.plan, ({"Authorization": f"Bearer {service.api_key}"} if service.api_key else {})
    async with httpx.AsyncClient(base_url=service.base_url, headers=headers, timeout=30) as http:
        model = service.model or (await http.get("/v1/models")).json()["data"][0]["id"]
        engine = await engine_facts(http, model)
        view = ServerView(service.port, service.tree)
        view.locate()
        log(f"model {model}, engine dtype {engine.dtype}; {view.describe()}")
        warm = await capital_of_france(http, model)
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
            paris = await capital_of_france(http, model)
            log(f"after: {paris.detail}")
            lag_after = await lag_histogram(http)
        finally:
            fleet.close()
            records = polite.stop()
    return HostileResult(plan=plan, clocks=service.clocks, model=model, engine=engine, attack=a,
                         sockets=fleet.records, polite=records, lag_before=lag_before, lag_after=lag_after,
                         baseline=baseline, samples=view.samples, after=after, idle_after=idle, paris=paris,
                         view=view.describe())


async def _released(view: ServerView, baseline) -> bool:
    ports = await asyncio.to_thread(view.remote_ports)
    return ports is None or baseline is None or len(ports) <= baseline.connections + 4


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _service(o: Options):
    if o.url:
        clocks = Clocks(**o.clocks, source="as told by the command line for this service") if o.clocks else Clocks()
        return UrlService(o.url.rstrip("/"), o.api_key, clocks, o.model)
    service = OwnService(o.repo, o.config, o.clocks, o.startup_timeout, o.work_dir)
    service.model = o.model or service.model
    return service


def run(o: Options) -> int:
    raise_fd_limit(o.plan.hostile_sockets + 512)
    o.work_dir.mkdir(parents=True, exist_ok=True)
    facts_machine, vllm, commit = machine(), vllm_version(), git_commit(o.repo)
    signal.signal(signal.SIGTERM, _interrupt)
    service = _service(o)
    own = isinstance(service, OwnService)
    result: HostileResult | None = None
    try:
        if own:
            log(f"starting the service on {service.base_url} (config {service.config_path})")
            if not service.start():
                log(f"the service did not become healthy; log tail:\n{service.log_tail()}")
                return 2
        result = asyncio.run(drive(o, service))
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
    facts = RunFacts(command=o.command, machine=facts_machine, vllm=vllm, commit=commit, mode=service.mode)
    section = render(facts, result, targets)
    print(section)
    print("\n".join(t.line() for t in targets))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = write_json(o.work_dir / f"hostile-{stamp}.json", result,
                      {"command": o.command, "targets": targets, "mode": service.mode})
    log(f"wrote {path}")
    if str(o.output) != "-":
        write_section(o.output, DOC, section)
        log(f"wrote {os.path.relpath(o.output, Path.cwd())}")
    passed = all(t.ok for t in targets)
    if own and passed:
        shutil.rmtree(service.dir, ignore_errors=True)
    elif own:
        log(f"service config and log kept in {service.dir}")
    return 0 if passed else 1
