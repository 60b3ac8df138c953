"""`python -m loadkit overload`: one overload run from start to report: the service (its own, or a running one
by URL), phases a to d, the targets, the section in docs/overload.md; exit status 0 only if every target passes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from loadkit.machine import git_commit, machine, vllm_version
from loadkit.overload.client import HUNG_GRACE_S, one_request
from loadkit.overload.phases import Driving, Phase, idle_phase, log, run_phase
from loadkit.overload.report import DOC, evaluate, mib, render
from loadkit.overload.result import DEFAULT_TTFT_TARGET_S, Admission, Liveness, OverloadResult, refusal_breakdown
from loadkit.overload.timing import parse_target_s
from loadkit.precision import precision_label, resolved_dtype
from loadkit.report import Check, RunFacts, command_line, publish
from loadkit.server_stats import get_stats, normal_chat, wait_idle
from loadkit.service import BASE_CONFIG, REPO, NotLoopback, OwnService, RunningService, loopback_url
from loadkit.workload import Ask, PromptMaker

DEFAULT = object()  # --ttft-target not given: leave the config's ttft_target_s as it is
ABOUT = """Overload check: overload must become queueing and fast, honest refusals.

Bounded in time and request count, loopback only. By default it starts its own service (`python -m app serve`)
from a config derived from configs/cpu.yaml with a free port and a small, explicit capacity, and stops it at the
end (Ctrl-C to its process group), leaving no process behind; with --base-url it drives a running service. Phases:
idle, at capacity, overload, after (loadkit/overload/__init__.py). Prints PASS/FAIL per target and writes the
results into docs/overload.md between generated-section markers (a --quick run only prints, unless --output is
given).

    python -m loadkit overload            # full run, ~45 s per phase (make overload)
    python -m loadkit overload --quick    # smoke run, short phases, prints only
    python -m loadkit overload --ttft-target 5     # a tighter first-token target (none: off)
    python -m loadkit overload --base-url http://127.0.0.1:8000 --api-key KEY --max-ongoing 32
"""


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
    capacity: Admission
    output: Path  # '-': print only
    startup_timeout: float


def own_service(base_config: Path, cap: Admission, repo: Path = REPO) -> OwnService:
    """`python -m app serve` on `base_config` with a free port, a fresh API key and `cap`; `cap` learns the
    time target in effect and the refusal status from the config."""
    deployment = {"max_ongoing_requests": cap.max_ongoing, "max_queued_requests": cap.max_queued,
                  "queue_timeout_s": cap.queue_timeout_s}
    if cap.ttft_target_given:
        deployment["ttft_target_s"] = cap.ttft_target_s  # None: null, no time target
    service = OwnService(base_config, "overload", repo=repo, deployment=deployment,
                         service={"request_timeout_s": cap.request_timeout_s, "drain_grace_s": 10})
    written = service.config["models"][0]["deployment"]
    if cap.ttft_target_given:
        cap.ttft_target_source = "--ttft-target"
    elif "ttft_target_s" in written:
        cap.ttft_target_s, cap.ttft_target_source = written["ttft_target_s"], service.base_name
    else:
        cap.ttft_target_s, cap.ttft_target_source = DEFAULT_TTFT_TARGET_S, "the config's default"
    cap.refusal_status = service.config["service"].get("refusal_status", 429)
    return service


def mode(service: OwnService | RunningService) -> str:
    if isinstance(service, RunningService):
        seen = f" (process tree of pid {service.pid})" if service.pid else " (process not found: no RSS)"
        return f"running service at {service.base_url}{seen}"
    engine, deployment = service.config["models"][0]["engine"], service.config["models"][0]["deployment"]
    return (f"own `python -m app serve` on a config derived from {service.base_name} (free port, the capacity "
            f"below, engine {json.dumps(engine)}, deployment {json.dumps(deployment)})")


def precision(service: OwnService | RunningService) -> str:
    """The configured dtype, and (for `auto`) what the engine's start-up log line said it became."""
    if isinstance(service, RunningService):
        return "as that service is configured (not read)"
    asked = str(service.config["models"][0].get("engine", {}).get("dtype", "the service's default"))
    return precision_label(asked, resolved_dtype(service.log_text()))


def alive(service: OwnService | RunningService) -> Liveness:
    if isinstance(service, OwnService):
        return Liveness(service.running(), f"service pid {service.pid} running")
    if not service.pid:
        return Liveness(True, "pid unknown")
    return Liveness(service.running(), f"service pid {service.pid} alive")


async def _liveness(http: httpx.AsyncClient, d: Driving, service, engines_before: set[int]) -> Check:
    """The service, its /health and its EngineCore: all alive, and the same EngineCore as at idle."""
    health = await http.get("/health", timeout=30)
    engines_after = d.tree.engine_pids()
    stats = await get_stats(http, d.model)
    alive_now = alive(service)
    problems = []
    if health.status_code != 200:
        problems.append(f"/health {health.status_code}")
    if not stats.healthy:
        problems.append("/stats says unhealthy")
    if not alive_now.ok:
        problems.append(alive_now.detail)
    if engines_before and engines_after != engines_before:
        problems.append(f"EngineCore pids changed {sorted(engines_before)} -> {sorted(engines_after)} "
                        "(engine died or was replaced)")
    if d.tree.root_pid is None:
        seen = " (process tree not observed)"
    elif engines_before:
        seen = f", {alive_now.detail}, EngineCore pid(s) {sorted(engines_after)} unchanged since idle"
    else:
        seen = f", {alive_now.detail} (no EngineCore process in its tree: not a vLLM engine?)"
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
            warm = await one_request(http, model, prompts, Ask(-1 - stream, 100, 32, stream), d.hung_after_s)
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
        normal = await normal_chat(http, model, d.hung_after_s)
        log(f"normal request after overload: {normal.detail}")
        liveness = await _liveness(http, d, service, engines_before)
        return OverloadResult(model=model, prompts=prompts, loadavg_start=loadavg_start, idle=idle,
                              capacity=capacity, overload=overload, idle_after=idle_after, normal=normal,
                              alive=liveness)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run(o: Options) -> int:
    facts_machine, vllm, commit = machine(), vllm_version(), git_commit(o.repo)
    signal.signal(signal.SIGTERM, _interrupt)
    if o.base_url:
        service = RunningService(o.base_url, o.api_key, o.model, o.service_pid)
    else:
        service = own_service(o.config, o.capacity, o.repo)
        service.model = o.model or service.model
    result: OverloadResult | None = None
    try:
        if isinstance(service, OwnService):
            t0 = time.monotonic()
            log(f"starting the service on {service.base_url}; log {service.log_path}")
            why = service.start(o.startup_timeout)
            if why is not None:
                log(f"the service did not become healthy ({why}); log tail:\n{service.log_tail()}")
                return 2
            log(f"healthy after {time.monotonic() - t0:.0f} s")
        result = asyncio.run(drive(o, service))
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        if isinstance(service, OwnService):
            if service.running():
                log("stopping the service (SIGINT to its process group)")
            report = service.stop()
            left = service.leftover() or []
            log(f"service stopped ({report.text() if report else 'never started'}); {len(service.tree.seen)} "
                f"processes observed, {len(left)} left behind" + (f": {left}" if left else ""))
            if result is None or (report and report.returncode not in (0, None)):
                log(f"service log kept at {service.log_path}; tail:\n{service.log_tail(2000)}")
            if result is not None:
                result.breakdown = refusal_breakdown(service.log_text(), result.overload.of("refused"))
                result.leftover = left
    targets = evaluate(o.capacity, result)
    facts = RunFacts(command=o.command, machine=facts_machine, vllm=vllm, commit=commit, mode=mode(service),
                     precision=precision(service), quick=o.quick)
    passed = publish(render(facts, o.capacity, result, targets), targets, o.output, DOC, log)
    if isinstance(service, OwnService):
        if passed:
            shutil.rmtree(service.dir, ignore_errors=True)
        else:
            log(f"service config and log kept in {service.dir}")
    return 0 if passed else 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m loadkit overload", description=ABOUT,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds per loaded phase (default 45; 12 with --quick)")
    parser.add_argument("--overload-factor", type=float, default=6.0,
                        help="overload clients as a multiple of max_ongoing_requests (default 6)")
    parser.add_argument("--quick", action="store_true", help="smoke run: short phases; figures not meaningful")
    parser.add_argument("--base-url", help="drive this running service instead of starting one (loopback only)")
    parser.add_argument("--api-key", default=os.environ.get("OVERLOAD_API_KEY"), help="bearer key for --base-url")
    parser.add_argument("--model", help="model id (default: the config's first model, or the first of /v1/models)")
    parser.add_argument("--service-pid", type=int,
                        help="with --base-url: the `app serve` pid, for RSS (default: found via the port)")
    parser.add_argument("--config", type=Path, default=BASE_CONFIG, help="base config of the service it starts")
    parser.add_argument("--max-ongoing", type=int, default=8,
                        help="max_ongoing_requests (set in the generated config; tell it for --base-url)")
    parser.add_argument("--max-queued", type=int, default=8, help="max_queued_requests")
    parser.add_argument("--queue-timeout", type=float, default=10.0, help="queue_timeout_s")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="service.request_timeout_s")
    parser.add_argument("--ttft-target", type=parse_target_s, default=DEFAULT, metavar="SECONDS",
                        help="deployment.ttft_target_s, the first-token target of admission by time ('0' or 'none': "
                             "off; default: the config's own, 10 s unless it says otherwise; tell it for "
                             "--base-url)")
    parser.add_argument("--output", type=Path, default=None,
                        help="report file, results replaced between markers ('-': do not write; default "
                             "docs/overload.md, '-' with --quick)")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.base_url:
        try:
            loopback_url(args.base_url)
        except NotLoopback as err:
            parser.error(str(err))
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    cap = Admission(args.max_ongoing, args.max_queued, args.queue_timeout, args.request_timeout)
    if args.ttft_target is not DEFAULT:
        cap.ttft_target_s, cap.ttft_target_given = args.ttft_target, True
    output = args.output or (Path("-") if args.quick else REPO / "docs" / "overload.md")
    return run(Options(
        repo=REPO, command=command_line("overload", argv), duration=args.duration or (12.0 if args.quick else 45.0),
        idle_s=3.0 if args.quick else 5.0, overload_factor=args.overload_factor, quick=args.quick,
        base_url=args.base_url, api_key=args.api_key, model=args.model, service_pid=args.service_pid,
        config=args.config, output=output, startup_timeout=args.startup_timeout, capacity=cap))
