"""loadkit.goodput's pure parts: the arrival schedule, the seeded mix, the figure arithmetic (goodput, wasted
wait, percentiles, attempts), the SDK client's outcome and attempt counting over a mock transport, and the
report. No service is started."""

from __future__ import annotations

import json

import httpx2
import numpy as np
import pytest

from loadkit.goodput.figures import Targets, figures, is_good, launch_from_dict, launch_to_dict, pool, wasted_share
from loadkit.goodput.launch import LaunchRun, WindowRun
from loadkit.goodput.loops import Rate, arrivals, steady_tokens
from loadkit.goodput.report import Setup, checks, render
from loadkit.machine import CpuFacts, Machine
from loadkit.peers import Engine
from loadkit.record import Attempt, Record
from loadkit.report import RunMeta
from loadkit.sdk import make_client, send, status_outcome
from loadkit.workload import Ask, PromptMaker, mix, stream

STREAM = Ask(index=0, prompt_tokens=50, max_tokens=32, stream=True)
PLAIN = Ask(index=1, prompt_tokens=50, max_tokens=32, stream=False)
T = Targets(ttft_s=10, total_s=60)


def rec(outcome: str, latency: float, ask: Ask = STREAM, ttft: float | None = 1.0, tokens: int = 32,
        attempts: list[Attempt] | None = None) -> Record:
    return Record(ask=ask, start=100.0, end=100.0 + latency, outcome=outcome, ttft=ttft if ask.stream else None,
                  output_tokens=tokens if outcome == "ok" else 0, attempts=attempts or [Attempt(200, latency)])


# --- the schedule


def test_poisson_arrivals_are_seeded_in_the_window_and_near_the_rate():
    a = arrivals(5.0, 200.0, "poisson", seed=3)
    assert a == arrivals(5.0, 200.0, "poisson", seed=3) and a != arrivals(5.0, 200.0, "poisson", seed=4)
    assert a == sorted(a) and 0 <= a[0] and a[-1] < 200.0
    assert 900 < len(a) < 1100  # 1000 expected, sd ~32


def test_a_poisson_schedule_at_another_rate_is_the_same_pattern_stretched():
    slow, fast = arrivals(1.0, 100.0, "poisson", seed=7), arrivals(4.0, 25.0, "poisson", seed=7)
    assert len(slow) == len(fast)
    assert np.allclose(np.array(slow), 4 * np.array(fast))


def test_uniform_arrivals_are_evenly_spaced():
    assert arrivals(2.0, 3.0, "uniform") == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert arrivals(0.0, 10.0) == [] and arrivals(3.0, 0.0) == []
    with pytest.raises(ValueError):
        arrivals(1.0, 1.0, "bursty")


# --- the mix


def test_the_mix_is_seeded_and_within_the_issues_ranges():
    asks = mix(15, 2000, first_index=500)
    assert asks == mix(15, 2000, first_index=500) and asks != mix(16, 2000, first_index=500)
    assert [a.index for a in asks] == list(range(500, 2500))
    assert all(40 <= a.prompt_tokens <= 430 and 16 <= a.max_tokens <= 256 for a in asks)
    assert 0.25 < sum(a.prompt_tokens >= 300 for a in asks) / len(asks) < 0.35
    assert 0.45 < sum(a.stream for a in asks) / len(asks) < 0.55
    assert mix(15, 10) == [next(s) for s in [stream(15)] for _ in range(10)]  # a prefix of the endless mix


def test_prompts_have_the_asked_length_under_a_linear_tokenizer():
    maker = PromptMaker(base_tokens=30, tokens_per_word=1.0)
    words = maker.messages(Ask(index=7, prompt_tokens=130, max_tokens=16, stream=False))[0]["content"]
    assert words.startswith("Request 7.") and len(words.split(": ", 1)[1].split()) == 100


# --- the figures


def test_goodput_needs_both_targets_and_the_first_token_only_where_there_is_one():
    assert is_good(rec("ok", 30, ttft=2), T)
    assert not is_good(rec("ok", 30, ttft=11), T)  # first token too late
    assert not is_good(rec("ok", 61, ttft=2), T)  # whole request too late
    assert not is_good(rec("ok", 30, ttft=None), T)  # streamed, but no content came
    assert is_good(rec("ok", 30, ask=PLAIN), T)  # non-streaming: only the whole-request target
    assert not is_good(rec("refused", 0.01), T)


def test_figures_goodput_wasted_share_percentiles_and_attempts():
    refused = [Attempt(429, 0.01), Attempt(429, 0.02), Attempt(429, 0.03)]
    records = [rec("ok", 5, ttft=1, tokens=100), rec("ok", 20, ttft=15, tokens=50),  # the second: ttft too late
               rec("ok", 10, ask=PLAIN, tokens=40, attempts=[Attempt(429, 0.04), Attempt(200, 8)]),
               rec("refused", 5, attempts=refused), rec("timed_out", 60, attempts=[Attempt(None, 60, "ReadTimeout")])]
    f = figures(records, window_s=10.0, offered_rps=0.5, targets=T, peak_rss_bytes=7)
    assert f.sent == 5 and f.outcomes == {"ok": 3, "refused": 1, "timed_out": 1, "failed": 0}
    assert f.good == 2 and f.goodput_rps == pytest.approx(0.2) and f.goodput_tok_s == pytest.approx(14.0)
    assert f.served_tok_s == pytest.approx(19.0)
    assert f.wasted_share == pytest.approx(65 / 100)
    assert f.ttft_p50_s == pytest.approx(8.0) and f.ttft_p99_s == pytest.approx(np.percentile([1, 15], 99))
    assert f.total_p50_s == pytest.approx(10.0) and f.total_p99_s == pytest.approx(np.percentile([5, 20, 10], 99))
    assert f.refused_attempts == 4 and f.refusal_p50_s == pytest.approx(0.025)
    assert f.refusal_p99_s == pytest.approx(np.percentile([0.01, 0.02, 0.03, 0.04], 99))
    assert f.attempts_per_served == pytest.approx(4 / 3) and f.attempts_per_request == pytest.approx(8 / 5)
    assert f.ttft_target_met_p99 is False and f.peak_rss_bytes == 7


def test_figures_of_nothing_served():
    f = figures([rec("refused", 0.01)], window_s=0.0, offered_rps=1.0, targets=T)
    assert f.goodput_rps == 0 and f.ttft_p50_s is None and f.total_p99_s is None and f.attempts_per_served is None
    assert f.ttft_target_met_p99 is None and f.wasted_share == 1.0
    assert wasted_share([]) == 0.0


def test_capacity_counts_the_tokens_streamed_after_the_ramp_in_finished_and_running_requests():
    t0 = 1000.0
    done = Record(ask=STREAM, start=t0, end=t0 + 20, outcome="ok", output_tokens=40,
                  chunk_times=[t0 + 1 + i for i in range(20)])  # 2 tokens a chunk (a system that batches them)
    running = Record(ask=STREAM, start=t0 + 5, end=t0 + 30, outcome="timed_out", detail="cut off",
                     chunk_times=[t0 + 25 + i for i in range(5)])
    tokens, span, finished = steady_tokens([done, running], t0, 30.0)
    assert span == 20.0 and finished == 1
    assert tokens == pytest.approx(2 * 11 + 2 * 5)  # 11 chunks of the finished one from t0 + 10, 5 of the other


# --- the client over a mock transport: the SDK's own retries, counted


def test_the_sdk_retries_a_429_and_every_attempt_is_counted():
    answers = iter([httpx2.Response(429, headers={"retry-after": "0.01"}, json={"error": {"code": "queue_full"}}),
                    httpx2.Response(200, json={
                        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
                        "choices": [{"index": 0, "finish_reason": "length",
                                     "message": {"role": "assistant", "content": "hi"}}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 32, "total_tokens": 37}})])
    seen = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append((request.headers.get("x-stainless-retry-count"), json.loads(request.content)["ignore_eos"]))
        return next(answers)

    import asyncio

    async def go() -> Record:
        client, log = make_client("http://test", 5.0, inner=httpx2.MockTransport(handler))
        try:
            return await send(client, log, "m", PromptMaker(), Record(ask=PLAIN, start=0.0))
        finally:
            await client.close()

    r = asyncio.run(go())
    assert r.outcome == "ok" and r.output_tokens == 32 and [a.status for a in r.attempts] == [429, 200]
    assert seen == [("0", True), ("1", True)]


def test_refusals_and_queue_timeouts_are_told_apart():
    assert status_outcome(429, {"code": "queue_full"}) == "refused"
    assert status_outcome(503, {"error": {"code": "queue_timeout"}}) == "timed_out"
    assert status_outcome(503, {"code": "starting"}) == "refused"
    assert status_outcome(400, None) == "failed"


# --- pooling, results.json and the report


def _launch(system: str, goodput_ok: int, refused: int) -> LaunchRun:
    records = [rec("ok", 5) for _ in range(goodput_ok)] + [rec("refused", 0.01, attempts=[Attempt(429, 0.01)])
                                                           for _ in range(refused)]
    return LaunchRun(system=system, round=0, command=["x"], log_path="l", status="ok",
                     capacity=Rate(rate_rps=1.0, measured=True, completed=20, counted_s=20.0),
                     windows=[WindowRun(4.0, 4.0, 10.0, records, 2**30), WindowRun(1.0, 1.0, 10.0, records[:5], 2**30)])


def test_pool_results_json_round_trip_and_the_issues_checks():
    launches = [_launch("app", 30, 10), _launch("vllm", 10, 0), _launch("ray-llm", 20, 0)]
    again = [launch_from_dict(json.loads(json.dumps(launch_to_dict(la)))) for la in launches]
    assert again == launches
    rows = pool(launches + [_launch("app", 30, 10)], T)  # two rounds of app: pooled, windows summed
    app4 = next(r for r in rows if r.system == "app" and r.multiple == 4.0)
    assert app4.rounds == 2 and app4.figures.window_s == 20.0 and app4.figures.goodput_rps == pytest.approx(3.0)
    lines = checks(rows, T)
    assert lines[0].startswith("- PASS") and "3.00 vs 1.00" in lines[0]  # 3x bare vLLM
    assert lines[1].startswith("- FAIL") and "(1.50x)" in lines[1]  # 1.5x Ray Serve LLM
    assert any("refusals under 50 ms" in x and x.startswith("- PASS") for x in lines)
    machine = Machine(cpu=CpuFacts("cpu", ("avx2",), 2), usable_cpus=2, memory_gib=24, kernel="k", system="Linux",
                      arch="x86_64", python="3.11")
    meta = RunMeta(started="s", finished="f", wall_s=60, machine=machine, versions={}, model_dir="m", full=False,
                   work_dir="w", command="python scripts/goodput.py --systems app", config_dtype="auto")
    setup = Setup(multiples=[1, 4], duration_s=10, drain_s=60, arrivals="poisson", seed=15, targets=T,
                  client_timeout_s=60, rounds=1, capacity_given=None, capacity_concurrency=32,
                  capacity_duration_s=45, app_admission={"max_ongoing_requests": 32}, commit="abc")
    text = render(rows, launches, setup, meta, Engine(), ["app", "vllm", "ray-llm"])
    assert text.splitlines()[2] == "Command: `python scripts/goodput.py --systems app`"
    assert "| this project | 4x | 4.00 | 80 |" in text and "goodput.png" in text


def test_auto_precision_is_resolved_once_for_every_system(monkeypatch):
    from loadkit import precision as run

    monkeypatch.setattr(run, "cpu_facts", lambda: CpuFacts("cpu", ("avx2",), 2))
    assert run.same_precision("auto") == "float32" and run.same_precision("bfloat16") == "bfloat16"
    monkeypatch.setattr(run, "cpu_facts", lambda: CpuFacts("cpu", ("avx2", "avx512f", "avx512_bf16"), 2))
    assert run.same_precision("auto") == "bfloat16"
    monkeypatch.setattr(run, "cpu_facts", lambda: CpuFacts("cpu", ("avx2", "avx512f", "avx512_bf16", "amx_bf16"), 2))
    assert run.same_precision("auto") == "float32"  # as the service's own `auto` (docs/precision.md)
