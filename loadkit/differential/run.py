"""`python -m loadkit differential`: the long differential run. This service and bare vLLM started side by side
with the same engine arguments, the curated set and N property-generated requests sent to both one at a time, the
verdicts counted, grouped by cause and written to docs/differential.md; both stopped leaving no process behind.

The service is started as the bench starts it (`python -m app serve` on configs/cpu.yaml with only the port, no
API key and open admission changed; `engine.dtype: auto` kept), the peer by peer.py with that config's engine.
Requests go one at a time, so neither server batches them with another and greedy answers are the engine's alone.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import yaml

from loadkit.differential.cases import CURATED, Case, generated
from loadkit.differential.exchange import Request, send
from loadkit.differential.peer import STARTUP_TIMEOUT_S, STOP_GRACE_S, EngineSettings, Peer, binding_beside
from loadkit.differential.report import Figures, write_report
from loadkit.differential.verdict import Verdict, judge
from loadkit.peers import MODEL_ID, Launchable, Variant, start
from loadkit.precision import resolved_dtype
from loadkit.report import command_line, progress
from loadkit.service import REPO, Server, prepare_model

say = progress("differential")


def run_cases(requests: Iterable[Request], vllm_url: str, service_url: str, service_headers: dict[str, str],
              deadline: float | None = None, on_verdict: Callable[[Verdict], None] = lambda v: None) -> list[Verdict]:
    """Each request to bare vLLM, then to the service, judged; stops early at `deadline` (monotonic)."""
    verdicts = []
    with httpx.Client(base_url=vllm_url) as peer, httpx.Client(base_url=service_url) as service:
        for request in requests:
            if deadline is not None and time.monotonic() > deadline:
                break
            verdict = judge(request, send(peer, request), send(service, request, service_headers))
            verdicts.append(verdict)
            on_verdict(verdict)
    return verdicts


@dataclass(frozen=True)
class Options:
    repo: Path
    count: int
    seed: int
    time_budget_s: float
    report: Path
    work: Path
    command: str


def _start_service(settings: EngineSettings, repo: Path, model_dir: str, work: Path) -> Server:
    at = Launchable(repo=repo, model_dir=model_dir, work=work, max_concurrency=settings.max_num_seqs,
                    max_output_len=1024, engine=settings.bench_engine())
    config = yaml.safe_load((repo / "configs" / "cpu.yaml").read_text())
    dtype = str(config["models"][0].get("engine", {}).get("dtype", "auto"))  # as shipped: `auto` stays `auto`
    server = start(Variant("app", dtype), at, work / "service.log")
    why = server.wait_ready(STARTUP_TIMEOUT_S, MODEL_ID)
    if why:
        stopped = server.stop(STOP_GRACE_S).text()
        raise RuntimeError(f"the service did not start: {why} ({stopped})\n{server.log_tail(3000)}")
    return server


def run(o: Options) -> int:
    o.work.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((o.repo / "configs" / "cpu.yaml").read_text())
    settings = EngineSettings.from_config(config)
    model_dir = prepare_model(o.repo)
    cases: list[Case] = [*CURATED, *generated(o.count, o.seed)]
    say(f"{len(CURATED)} curated + {o.count} generated requests (seed {o.seed}); engine {settings}; work {o.work}")
    service = peer = None
    stops: list[str] = []
    try:
        service = _start_service(settings, o.repo, model_dir, o.work)
        service_dtype = resolved_dtype(service.group.log_tail(500_000))
        say(f"service up on port {service.port} (engine dtype {service_dtype})")
        engine = httpx.get(f"{service.base_url}/stats", timeout=30).json()[settings.model_id]["engine"]
        peer = Peer.start(settings, o.repo, model_dir, o.work, env=binding_beside(engine))
        say(f"bare vLLM up on port {peer.server.port} (engine dtype {peer.engine_dtype}): "
            f"{' '.join(peer.server.command)}")
        started = time.monotonic()
        log = (o.work / "verdicts.jsonl").open("w")

        def note(v: Verdict) -> None:
            log.write(json.dumps({"request": asdict(v.request), "outcome": v.outcome, "cause": v.cause,
                                  "mismatches": [m.line() for m in v.mismatches], "vllm": v.vllm,
                                  "service": v.service}) + "\n")
            log.flush()

        verdicts = run_cases([c.request for c in cases], peer.base_url, f"http://127.0.0.1:{service.port}", {},
                             deadline=started + o.time_budget_s, on_verdict=note)
        elapsed = time.monotonic() - started
    finally:
        for name, s in (("bare vLLM", peer), ("service", service)):
            if s is not None:
                stops.append(f"{name}: {s.stop() if isinstance(s, Peer) else s.stop(STOP_GRACE_S).text()}")
                say(stops[-1])
    curated, rest = verdicts[:len(CURATED)], verdicts[len(CURATED):]
    figures = Figures(command=o.command, settings=settings, service_dtype=service_dtype,
                      peer_dtype=peer.engine_dtype if peer else None, peer_command=peer.server.command if peer else [],
                      curated=curated, generated=rest, asked=o.count, seed=o.seed, elapsed_s=elapsed, stops=stops)
    path = write_report(o.report, figures)
    say(f"generated: {sum(v.outcome == 'equal' for v in rest)} of {len(rest)} matched field by field; "
        f"curated: {sum(v.outcome == 'equal' for v in curated)} equal of {len(curated)}; report {path}")
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m loadkit differential", description=__doc__.split("\n\n")[0],
                                epilog="Raw verdicts (each request, both normalized answers, the mismatches) go to "
                                "--work-dir/verdicts.jsonl (default bench-results/differential-<timestamp>/), beside "
                                "both servers' logs.")
    p.add_argument("--count", type=int, default=300, help="property-generated requests (default 300)")
    p.add_argument("--seed", type=int, default=1, help="the generator's seed (default 1)")
    p.add_argument("--time-budget-s", type=float, default=1200,
                   help="stop sending after this long, counting what was judged (default 1200)")
    p.add_argument("--report", type=Path, default=REPO / "docs" / "differential.md")
    p.add_argument("--work-dir", type=Path, default=None)
    args = p.parse_args(argv)
    work = args.work_dir or REPO / "bench-results" / f"differential-{time.strftime('%Y%m%d-%H%M%S')}"
    return run(Options(repo=REPO, count=args.count, seed=args.seed, time_budget_s=args.time_budget_s,
                       report=args.report, work=work.resolve(), command=command_line("differential", argv)))
