"""loadkit.overload on made-up phases: the request mix, error classification, the access-log join, the targets
and the rendered section (no service is started)."""

from __future__ import annotations

import httpx

from loadkit.machine import Commit, CpuFacts, Machine
from loadkit.overload.client import classify_error
from loadkit.overload.mix import Mix
from loadkit.overload.phases import Phase
from loadkit.overload.report import evaluate, render
from loadkit.overload.result import Admission, Liveness, OverloadResult, refusal_breakdown
from loadkit.probe import ProbeFindings
from loadkit.record import Record
from loadkit.report import Check, RunFacts
from loadkit.server_stats import Idle, Stats
from loadkit.workload import Ask, PromptMaker

SPEC = Ask(index=0, prompt_tokens=50, max_tokens=32, stream=True, hangup=False, hangup_chunks=2, hangup_after_s=1)
STATS = {"healthy": True, "kv_cache_tokens": 93000,
         "engine": {"running": 0, "generation_tokens_total": 1000, "kv_cache_usage": 0.25, "preemptions_total": 0},
         "admission": {"running": 0, "waiting": 0, "in_system": 0, "peak_waiting": 8, "refused_queue_full": 0,
                       "refused_queue_timeout": 0, "token_budget": 90000}}


def _ok(end: float, tokens: int = 32) -> Record:
    return Record(ask=SPEC, start=end - 1, end=end, outcome="ok", status=200, output_tokens=tokens, prompt_tokens=50,
                  ttft=0.5)


def _refused(latency: float = 0.01) -> Record:
    return Record(ask=SPEC, start=1.0, end=1.0 + latency, outcome="refused", status=429, code="queue_full",
                  request_id="ovl-" + "0" * 32)


def _phase(name: str, clients: int, records: list[Record], rss: int) -> Phase:
    phase = Phase(name, clients, 10.0, records=records, before=Stats.from_json(STATS), after=Stats.from_json(STATS))
    phase.watch.rss = [rss]
    return phase


def _result() -> OverloadResult:
    overload = _phase("overload (6x)", 48, [_ok(5), _ok(9), _refused(), _refused(), _refused()], rss=105)
    overload.probe = ProbeFindings(refused=[0.002] * 10, livez=[0.001] * 10)
    return OverloadResult(model="m", prompts=PromptMaker(38, 1.0), loadavg_start=(1.0, 1.0, 1.0),
                          idle=_phase("idle", 0, [], rss=90), capacity=_phase("at capacity", 8, [_ok(4), _ok(8)], 100),
                          overload=overload, idle_after=Idle(True, 0.5, Stats.from_json(STATS)),
                          normal=Check(True, "HTTP 200 in 1.00 s: 'Paris'"), alive=Liveness(True, "pid 1 running"),
                          leftover=[])


def test_the_same_seed_draws_the_same_requests():
    first, second = Mix(7), Mix(7)
    assert [first.next() for _ in range(20)] == [second.next() for _ in range(20)]


def test_a_full_queue_is_a_refusal_and_other_errors_are_counted_apart():
    rec = Record(ask=SPEC, start=0)
    classify_error(rec, 429, b'{"error": {"code": "queue_full"}}', httpx.Headers({"retry-after": "2"}))
    assert (rec.outcome, rec.code, rec.retry_after) == ("refused", "queue_full", 2.0)
    rec = Record(ask=SPEC, start=0)
    classify_error(rec, 503, b"not json", httpx.Headers())
    assert (rec.outcome, rec.code) == ("error_5xx", None)


def test_refusals_join_the_services_access_log_by_request_id():
    line = ('{"logger": "app.access", "request_id": "ovl-' + "0" * 32 + '", "status": 429, "duration_ms": 1.5}')
    b = refusal_breakdown("noise\n" + line + "\n", [_refused(0.01)])
    assert b.joined == 1 and b.service == [0.0015] and abs(b.client_minus_service[0] - 0.0085) < 1e-9


def test_a_healthy_run_passes_every_target_and_renders_its_setup():
    result = _result()
    targets = evaluate(Admission(8, 8, 10, 60, refusal_status=429), result)
    assert [t.name for t in targets if not t.ok] == []
    assert len(targets) == 13  # 11, and the two of admission by time (ttft_target_s 10 s by default)
    avx2 = Machine(cpu=CpuFacts("AMD EPYC", ("avx2",), 2, 2), usable_cpus=2, memory_gib=23.5, kernel="6.1",
                   system="Linux", arch="x86_64", python="3.11.7")
    facts = RunFacts(command="scripts/overload.py --quick", machine=avx2, vllm="0.32.0", commit=Commit("abc123"),
                     mode="own service", precision="auto → float32", quick=True)
    text = render(facts, Admission(8, 8, 10, 60, refusal_status=429), result, targets)
    assert "- Machine: Linux 6.1 (x86_64); AMD EPYC, 2 logical CPU(s) visible, 2 physical core(s), flags avx2;" in text
    assert "- Precision: engine dtype auto → float32; this CPU has no native bfloat16" in text
    assert "| 429/503 queue full (refused) | 0 | 3 |" in text
    assert "| served output tokens/s (completed in window) | 6.4 | 6.4 |" in text
    assert "| no process left behind after stopping the service | **PASS** | none |" in text


def test_lost_throughput_and_a_leftover_fail():
    result = _result()
    result.overload.records = [r for r in result.overload.records if r.outcome != "ok"]
    result.leftover = ["123 VLLM::EngineCore"]
    failed = {t.name for t in evaluate(Admission(8, 8, 10, 60, ttft_target_s=None), result) if not t.ok}
    assert failed == {"overload served output tokens/s >= 90% of at-capacity",
                      "overload served requests/s >= 90% of at-capacity",
                      "no process left behind after stopping the service"}
