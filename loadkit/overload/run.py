"""One overload run from start to report: the service (own or by URL), phases a to d, targets, the section.

`run(options)` is what `scripts/overload.py` calls; it returns the exit status (0 only if every target passes).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from loadkit.machine import git_commit, machine, vllm_version
from loadkit.markdown import write_section
from loadkit.overload.access_log import refusal_breakdown
from loadkit.overload.capacity import Capacity, OwnService, UrlService, find_service_pid, wait_for_health
from loadkit.overload.client import HUNG_GRACE_S, one_request
from loadkit.overload.mix import PromptMaker, Spec
from loadkit.overload.phases import Driving, Phase, idle_phase, log, run_phase
from loadkit.overload.render import DOC, RunFacts, render
from loadkit.overload.result import Check, OverloadResult
from loadkit.overload.stats_poll import get_stats, wait_idle
from loadkit.overload.targets import evaluate, mib


@dataclass
class Options:
    repo: Path
    command: str  # as the report quotes it
    duration: float
    idle_s: float
    overload_factor: float
    quick: bool
    base_url: str | None
    api_key: str | None
    model: str | None
    service_pid: int | None
    config: Path
    capacity: Capacity
    output: Path  # '-': print only
    startup_timeout: float


async def _normal_request(http: httpx.AsyncClient, model: str, timeout_s: float) -> Check:
    try:
        t0 = time.monotonic()
        r = await http.post("/v1/chat/completions", timeout=timeout_s, json={
            "model": model, "temperature": 0, "max_tokens": 20,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text
        return Check(r.status_code == 200 and bool(text.strip()),
                     f"HTTP {r.status_code} in {time.monotonic() - t0:.2f} s: {text.strip()[:60]!r}")
    except Exception as err:
        return Check(False, f"{type(err).__name__}: {err}")


async def _liveness(http: httpx.AsyncClient, d: Driving, service, engines_before: set[int]) -> Check:
    """The service, its /health and its EngineCore: all alive, and the same EngineCore as at idle."""
    health = await http.get("/health", timeout=30)
    engines_after = d.tree.engine_pids()
    stats = await get_stats(http, d.model)
    alive = service.alive()
    problems = []
    if health.status_code != 200:
        problems.append(f"/health {health.status_code}")
    if not stats.healthy:
        problems.append("/stats says unhealthy")
    if not alive.ok:
        problems.append(alive.detail)
    if engines_before and engines_after != engines_before:
        problems.append(f"EngineCore pids changed {sorted(engines_before)} -> {sorted(engines_after)} "
                        "(engine died or was replaced)")
    if d.tree.root_pid is None:
        seen = " (process tree not observed)"
    elif engines_before:
        seen = f", {alive.detail}, EngineCore pid(s) {sorted(engines_after)} unchanged since idle"
    else:
        seen = f", {alive.detail} (no EngineCore process in its tree: not a vLLM engine?)"
    return Check(not problems, "; ".join(problems) if problems else "/health 200, /stats healthy" + seen)


async def drive(o: Options, service) -> OverloadResult:
    cap = o.capacity
    headers = {"Authorization": f"Bearer {service.api_key}"} if service.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    timeout = httpx.Timeout(cap.request_timeout_s + HUNG_GRACE_S + 30, connect=10)
    async with httpx.AsyncClient(base_url=service.base_url, headers=headers, limits=limits, timeout=timeout) as http:
        model = service.model or (await http.get("/v1/models")).json()["data"][0]["id"]
        loadavg_start = os.getloadavg()
        prompts = PromptMaker()
        await prompts.calibrate(http, model)
        log(f"model {model}; prompts: {prompts.base:.0f} + {prompts.per_word:.2f} tokens per word")
        d = Driving(http, model, prompts, service.tree, cap.request_timeout_s + HUNG_GRACE_S)

        # a. idle baseline, after one warm-up request of each kind
        for stream in (False, True):
            warm = await one_request(http, model, prompts, Spec(-1 - stream, 100, 32, stream, False, 0, 0),
                                     d.hung_after_s)
            log(f"warm-up ({'stream' if stream else 'plain'}): {warm.outcome} in {warm.latency:.1f} s")
        await wait_idle(http, model, 60)
        await asyncio.sleep(2)  # let the warm-up's after-effects (frees, logging) settle before the baseline
        idle = await idle_phase(d, o.idle_s)
        engines_before = d.tree.engine_pids()
        log(f"idle RSS of the service tree: {mib(idle.rss_peak)}; EngineCore pids {sorted(engines_before)}")

        # b. at capacity
        capacity = await run_phase(Phase("at capacity", cap.max_ongoing, o.duration), d)
        again = await wait_idle(http, model, cap.request_timeout_s + 30)
        log(f"idle again after capacity phase: {again.reached} ({again.took_s:.1f} s)")
        await asyncio.sleep(2)

        # c. overload
        n = max(cap.max_ongoing + 1, round(cap.max_ongoing * o.overload_factor))
        overload = await run_phase(Phase(f"overload ({o.overload_factor:g}x)", n, o.duration), d,
                                   probe=(service.base_url, service.api_key))

        # d. after
        idle_after = await wait_idle(http, model, cap.queue_timeout_s + cap.request_timeout_s + 30)
        log(f"after overload: idle {idle_after.reached} in {idle_after.took_s:.1f} s")
        normal = await _normal_request(http, model, d.hung_after_s)
        log(f"normal request after overload: {normal.detail}")
        alive = await _liveness(http, d, service, engines_before)
        return OverloadResult(model=model, prompts=prompts, loadavg_start=loadavg_start, idle=idle,
                              capacity=capacity, overload=overload, idle_after=idle_after, normal=normal,
                              alive=alive)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run(o: Options) -> int:
    facts_machine, vllm, commit = machine(), vllm_version(), git_commit(o.repo)
    signal.signal(signal.SIGTERM, _interrupt)
    if o.base_url:
        pid = o.service_pid or find_service_pid(o.base_url)
        service = UrlService(o.base_url.rstrip("/"), o.api_key, o.model, pid)
    else:
        service = OwnService(o.repo, o.config, o.capacity, o.startup_timeout)
        service.model = o.model or service.model
    result: OverloadResult | None = None
    try:
        if isinstance(service, OwnService) and not wait_for_health(service):
            return 2
        result = asyncio.run(drive(o, service))
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        if isinstance(service, OwnService):
            report = service.stop()
            if result is None or (report and report.returncode not in (0, None)):
                log(f"service log kept at {service.log_path}; tail:\n{service.log_tail(2000)}")
            if result is not None:
                result.breakdown = refusal_breakdown(service.log_text(), result.overload.of("refused"))
                result.leftover = service.leftover()
    targets = evaluate(o.capacity, result)
    facts = RunFacts(command=o.command, machine=facts_machine, vllm=vllm, commit=commit, mode=service.mode,
                     precision=service.precision, quick=o.quick)
    section = render(facts, o.capacity, result, targets)
    print(section)
    print("\n".join(t.line() for t in targets))
    if str(o.output) != "-":
        write_section(o.output, DOC, section)
        log(f"wrote {os.path.relpath(o.output, Path.cwd())}")
    passed = all(t.ok for t in targets)
    if isinstance(service, OwnService):
        if passed:
            shutil.rmtree(service.dir, ignore_errors=True)
        else:
            log(f"service config and log kept in {service.dir}")
    return 0 if passed else 1
