"""loadkit.overload's admission-by-time figures on made-up phases: refusals by reason, first tokens against the
target, the pace read from /stats, the two time targets, the --ttft-target flag and the generated config (no
service is started)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import httpx
import pytest
import yaml

from loadkit.overload import run as overload_cli
from loadkit.overload.client import classify_error
from loadkit.overload.phases import Phase
from loadkit.overload.report import queue_timeout_target, time_lines, ttft_target
from loadkit.overload.result import Admission
from loadkit.overload.timing import (
    by_reason,
    first_tokens,
    last_pace,
    parse_target_s,
    reason,
    share_within,
)
from loadkit.record import Record
from loadkit.server_stats import Stats
from tests.unit.test_loadkit_overload import SPEC, STATS

REPO = Path(__file__).resolve().parents[2]
PLAIN = SPEC.__class__(**{**SPEC.__dict__, "stream": False})


def _answer(status: int, code: str, latency: float = 0.01) -> Record:
    rec = Record(ask=SPEC, start=1.0, end=1.0 + latency)
    classify_error(rec, status, f'{{"error": {{"code": "{code}"}}}}'.encode(), httpx.Headers({"retry-after": "3"}))
    return rec


def _stream(ttft: float | None, outcome: str = "ok") -> Record:
    return Record(ask=SPEC, start=0.0, end=5.0, outcome=outcome, status=200, ttft=ttft)


def _phase(records: list[Record], name: str = "overload (6x)", samples: list[Stats] | None = None) -> Phase:
    phase = Phase(name, 48, 10.0, records=records, before=Stats.from_json(STATS), after=Stats.from_json(STATS))
    phase.watch.samples = samples or []
    return phase


def test_an_over_time_target_429_is_a_refusal_retried_like_a_full_queue():
    rec = _answer(429, "over_time_target")
    assert (rec.outcome, rec.code, rec.retry_after) == ("refused", "over_time_target", 3.0)
    assert _answer(503, "over_time_target").outcome == "error_5xx"  # the service only ever sends it as 429


def test_refusals_are_split_by_reason_with_their_client_latency():
    records = [_answer(429, "queue_full", 0.002), _answer(429, "over_time_target", 0.004),
               _answer(429, "over_time_target", 0.006), _answer(503, "queue_timeout", 10.2),
               _answer(503, "engine_unavailable", 0.5), _answer(429, "rate_limited", 0.1),
               _answer(400, "invalid_request"), _stream(0.3)]
    assert [reason(r) for r in records] == ["queue_full", "over_time_target", "over_time_target", "queue_timeout",
                                            "other", "other", None, None]
    assert by_reason(records) == {"queue_full": [pytest.approx(0.002)],
                                  "over_time_target": [pytest.approx(0.004), pytest.approx(0.006)],
                                  "queue_timeout": [pytest.approx(10.2)],
                                  "other": [pytest.approx(0.5), pytest.approx(0.1)]}
    assert by_reason([]) == {"queue_full": [], "over_time_target": [], "queue_timeout": [], "other": []}


def test_first_tokens_count_every_admitted_stream_and_the_share_within_the_target():
    plain = Record(ask=PLAIN, start=0.0, end=2.0, outcome="ok", status=200)
    records = [_stream(1.0), _stream(4.0, "hangup"), _stream(None, "hangup"), plain, _stream(12.0),
               _answer(429, "over_time_target")]
    assert first_tokens(records) == [1.0, 4.0, 12.0]
    assert share_within([1.0, 4.0, 12.0], 10.0) == pytest.approx(2 / 3)
    assert share_within([1.0, 10.0], 10.0) == 1.0  # at the target is within it
    assert share_within([], 10.0) is None


def test_the_pace_is_read_from_stats_and_the_last_known_value_of_each_figure_is_kept():
    fresh = Stats.from_json(STATS)  # an older service without pace: nothing, not zeros
    assert (fresh.pace_samples, fresh.predicted_first_token_s, fresh.refused_over_time_target) == (None, None, 0)
    measured = Stats.from_json({**STATS, "admission": {**STATS["admission"], "refused_over_time_target": 7,
                                                       "predicted_first_token_s": 12.5},
                                "pace": {"samples": 40, "prefill_tokens_per_s": 900.0, "first_token_base_s": 0.1,
                                         "decode_s_per_token": 0.045, "output_share": 0.9}})
    assert measured.refused_over_time_target == 7 and measured.pace_prefill_tokens_per_s == 900.0
    later = Stats.from_json({**STATS, "pace": {"samples": 41, "prefill_tokens_per_s": None,
                                               "decode_s_per_token": 0.05, "output_share": 0.8}})
    seen = last_pace([fresh, measured, later])
    assert (seen.polls, seen.samples, seen.prefill_tokens_per_s, seen.decode_s_per_token, seen.output_share,
            seen.predicted_first_token_s) == (3, 41, 900.0, 0.05, 0.8, 12.5)
    assert last_pace([]).samples is None


def test_admitted_first_tokens_pass_within_target_plus_tolerance_and_fail_beyond():
    at_capacity = _phase([_stream(0.4)] * 20, "at capacity")
    late = _phase([_stream(3.0)] * 99 + [_stream(13.0)])
    ok = ttft_target(10.0, [at_capacity, late])
    assert ok.ok and "limit 12 s" in ok.detail and "99.0% within 10 s (n=100)" in ok.detail
    too_late = _phase([_stream(3.0)] * 90 + [_stream(12.5)] * 10)
    assert not ttft_target(10.0, [at_capacity, too_late]).ok
    assert not ttft_target(10.0, [at_capacity, _phase([])]).ok  # no first token seen proves nothing
    assert ttft_target(None, [at_capacity, late]) is None  # no time target, no line


def test_a_queue_timeout_fails_while_a_time_target_is_on():
    clean = [_phase([_answer(429, "over_time_target")], "at capacity"), _phase([_stream(1.0)])]
    assert queue_timeout_target(10.0, clean).ok
    waited = [clean[0], _phase([_answer(503, "queue_timeout", 10.1)])]
    t = queue_timeout_target(10.0, waited)
    assert not t.ok and "overload (6x) 1" in t.detail
    assert queue_timeout_target(None, waited) is None  # without a time target the queue timeout is the way out


def test_the_report_table_has_refusals_by_reason_first_tokens_and_the_pace():
    samples = [Stats.from_json({**STATS, "admission": {**STATS["admission"], "predicted_first_token_s": 8.25},
                                "pace": {"samples": 12, "prefill_tokens_per_s": 1234.5, "decode_s_per_token": 0.0451,
                                         "output_share": 0.87}})]
    phase = _phase([_answer(429, "over_time_target", 0.003), _answer(429, "over_time_target", 0.005),
                    _stream(2.0), _stream(11.0)], samples=samples)
    text = "\n".join(time_lines(Admission(8, 8, 10, 60), [phase]))
    assert "`ttft_target_s` 10 s" in text
    assert "| refused: over_time_target (count; client latency p50 / p99) | 2; 4.0 / 5.0 ms (n=2) |" in text
    assert "| refused: queue_timeout (count; client latency p50 / p99) | 0 |" in text
    assert "| admitted streams: first token within ttft_target_s (10 s) | 50.0% of 2 |" in text
    assert "| pace at the phase's end: prefill / decode per token / output share / samples | 1,234 tok/s / " \
           "0.0451 s / 0.87 / 12 |" in text
    assert "| latest arrival's predicted first token (admission.predicted_first_token_s) | 8.25 s (polled max " \
           "8.25 s) |" in text
    assert "| pace at the phase's end: prefill / decode per token / output share / samples | - (not in /stats) |" \
           in "\n".join(time_lines(Admission(8, 8, 10, 60), [_phase([])]))
    off = "\n".join(time_lines(Admission(8, 8, 10, 60, ttft_target_s=None), [phase]))
    assert "no time target" in off and "| admitted streams: first token within ttft_target_s (off) | - (no " in off


@pytest.mark.parametrize(("text", "value"), [("5", 5.0), ("2.5", 2.5), ("0", None), ("none", None), ("OFF", None)])
def test_the_ttft_target_flag_takes_seconds_or_off(text, value):
    assert parse_target_s(text) == value


@pytest.mark.parametrize("text", ["-1", "soon", "nan", "inf"])
def test_the_ttft_target_flag_refuses_nonsense(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_target_s(text)


@pytest.mark.parametrize(("argv", "given", "written"), [([], False, "absent"), (["--ttft-target", "4"], True, 4.0),
                                                        (["--ttft-target", "none"], True, None)])
def test_the_generated_config_carries_the_flag_or_keeps_the_default(tmp_path, argv, given, written):
    args = overload_cli.parse_args(argv)
    cap = Admission(8, 8, 10, 60)
    if given:
        cap.ttft_target_s, cap.ttft_target_given = args.ttft_target, True
    base = tmp_path / "base.yaml"
    base.write_text((REPO / "configs" / "cpu.yaml").read_text())
    service = overload_cli.own_service(base, cap, repo=tmp_path)
    try:
        deployment = yaml.safe_load(service.config_path.read_text())["models"][0]["deployment"]
    finally:
        shutil.rmtree(service.dir, ignore_errors=True)
    assert deployment.get("ttft_target_s", "absent") == written
    assert cap.ttft_target_s == (10.0 if written == "absent" else written)
    assert cap.ttft_target_source == ("--ttft-target" if given else "the config's default")
