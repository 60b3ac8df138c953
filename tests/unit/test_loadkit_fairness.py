"""loadkit's fairness suites, the pure parts: arrivals, the tenants of each system, service per window, the
backlogged gap, capacity, overrun, and the report's tables and plot (no service started)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from loadkit.fairness import account, render
from loadkit.fairness.account import OPEN, Answer
from loadkit.fairness.plan import BUDGETS, DEFAULT, FIRST_COME, RATE, Capacity, Shape, arrivals, suites, tenancy
from loadkit.fairness.run import ANCHOR, DOC, TITLE, _write

CAP = Capacity(service_s=768.0, output_tok_s=192.0, tokens_s=576.0)  # 3 requests/s of 128/64


def test_arrivals_are_poisson_at_the_rate_and_repeatable():
    times = arrivals(5.0, 400.0, seed=1)
    assert times == arrivals(5.0, 400.0, seed=1) != arrivals(5.0, 400.0, seed=2)
    assert all(0 <= a < b < 400 for a, b in zip(times, times[1:], strict=False))
    assert abs(len(times) / 400 - 5.0) < 0.4
    assert arrivals(0.0, 10, 1) == [] and arrivals(1.0, 0, 1) == []


def test_on_off_arrivals_fall_only_in_the_on_periods():
    times = arrivals(10.0, 120.0, seed=3, on_off_s=30.0)
    assert times and all(int(t // 30) % 2 == 0 for t in times)
    assert abs(len(times) / 60 - 10.0) < 1.5  # the rate holds while on


def test_loads_are_multiples_of_the_capacity_in_vtc_units():
    s4 = next(s for s in suites(45) if s.key == "s4")
    short_long, long_short = s4.clients
    assert CAP.req_s == pytest.approx(3.0)
    assert short_long.rate(CAP) == pytest.approx(768 / (16 + 512))
    assert long_short.rate(CAP) == pytest.approx(768 / (1024 + 32))
    assert DEFAULT.cost == 256 and Shape(16, 256).tokens == 272


def test_the_on_off_suite_scales_with_the_duration():
    s3 = next(s for s in suites(45) if s.key == "s3")
    assert s3.seconds == 90 and s3.clients[1].on_off_s == 30
    assert next(s for s in suites(10) if s.key == "s3").seconds == 20


def test_each_system_is_a_tenant_configuration_of_one_service():
    plan = suites(45)
    t = tenancy(plan, CAP, burst_budget=6144)
    names = [e["name"] for e in t.entries]
    assert len(names) == len(set(names)) and all("+" not in n for n in names)
    keys = [k for e in t.entries for k in e["api_keys"]]
    assert len(keys) == len(set(keys))
    by_key = {e["api_keys"][0]: e for e in t.entries}
    # first-come: every client of the suite on the one tenant's key
    assert t.keys["s2", FIRST_COME, "A"] == t.keys["s2", FIRST_COME, "B"] == t.keys["s2", FIRST_COME, "C"]
    # budgets and rate limits at the fair share: s2's C has weight 4 of 7
    c_budget = by_key[t.keys["s2", BUDGETS, "C"]]
    assert c_budget["weight"] == 4 and c_budget["tokens_per_minute"] == round(4 / 7 * 3.0 * 192 * 60)
    assert by_key[t.keys["s1", RATE, "B"]]["requests_per_minute"] == 90 and "tokens_per_minute" not in by_key[
        t.keys["s1", RATE, "B"]]
    assert by_key[t.keys["prio", "batch flood", "F"]]["priority"] == "batch"
    assert "priority" not in by_key[t.keys["prio", "interactive flood", "F"]]
    assert ("prio", "alone", "F") not in t.keys
    assert by_key[t.keys["overrun", "", ""]]["tokens_per_minute"] == 6144


def _answer(client, sent, first, tokens, prompt=100, step=1.0, status=200):
    progress = [(first + i * step, i + 1) for i in range(tokens)]
    return Answer(client, sent, status=status, first=first, ended=progress[-1][0] if progress else first,
                  prompt_tokens=prompt, progress=progress)


def test_service_is_charged_as_the_fair_queue_charges_it_per_window_and_weight():
    a = _answer("A", 0.0, 1.0, 3, prompt=100)  # prompt at 1 s, tokens at 1, 2, 3 s
    b = _answer("B", 0.0, 6.0, 2, prompt=10)  # prompt at 6 s, tokens at 6, 7 s
    late = _answer("B", 0.0, 9.5, 2, prompt=10)  # its second token at 10.5 s: after the end
    s = account.service_per_window([a, b, late], {"A": 1.0, "B": 2.0}, window=5.0, duration=10.0)
    assert s == {"A": [106.0, 0.0], "B": [0.0, (10 + 4 + 10 + 2) / 2]}


def test_coverage_and_backlog():
    assert account.covered([(0, 2), (1, 3), (4, 5)], 0, 5) == pytest.approx(0.8)
    assert account.covered([], 0, 5) == 0.0
    waiting = [Answer("A", 0.0, first=4.8), Answer("A", 4.0, first=9.9), Answer("A", 12.0, status=429, ended=12.1)]
    assert account.backlogged(waiting, "A", 5.0, 15.0) == [True, True, False]
    cut = [Answer("A", 1.0, code=OPEN)]  # still waiting when the run ended
    assert account.backlogged(cut, "A", 5.0, 10.0) == [False, True]


def test_the_gap_is_the_cumulative_difference_over_a_common_backlog():
    service = {"A": [10, 10, 10, 10, 10], "B": [5, 5, 5, 5, 40]}
    backlog = {"A": [True, True, True, True, False], "B": [False, True, True, True, True]}
    gap = account.largest_gap(service, backlog)
    assert gap.pair == ("A", "B") and gap.windows == 3 and gap.largest == 15
    assert (gap.first_half, gap.second_half) == (10, 15)
    assert account.largest_gap(service, {"A": [False] * 5, "B": [True] * 5}).windows == 0


def test_a_bounded_gap_against_a_growing_one():
    backlog = {c: [True] * 8 for c in "AB"}
    fair = account.largest_gap({"A": [10, 0, 10, 0, 10, 0, 10, 0], "B": [0, 10, 0, 10, 0, 10, 0, 10]}, backlog)
    unfair = account.largest_gap({"A": [10] * 8, "B": [2] * 8}, backlog)
    assert fair.largest == 10 and fair.first_half == fair.second_half
    assert unfair.largest == 64 and unfair.second_half == 2 * unfair.first_half


def test_output_rate_counts_tokens_before_the_end_only():
    answers = [_answer("A", 0, 1.0, 10), _answer("B", 0, 8.0, 5)]  # A's at 1..10 s, B's at 8..12 s
    assert account.output_tok_s(answers, 10.0) == pytest.approx((9 + 2) / 10)


def test_capacity_from_a_closed_loop():
    answers = [_answer("capacity", 0, 1.0 + i, 4, prompt=128, step=0.5) for i in range(8)]
    cap = account.measure_capacity(answers, 2.0, 6.0)  # prompts at 2, 3, 4, 5 s; 2 + 4 + 4 + 4 + 2 tokens
    assert cap.output_tok_s == pytest.approx(16 / 4) and cap.service_s == pytest.approx((4 * 128 + 32) / 4)
    assert cap.tokens_s == pytest.approx((4 * 128 + 16) / 4) and cap.req_s == pytest.approx(cap.service_s / 256)
    with pytest.raises(ValueError):
        account.measure_capacity([], 0, 1)


def test_overrun_is_the_usage_past_the_budget():
    burst = [_answer("burst", 0, 1, 64, prompt=128) for _ in range(3)]
    burst += [Answer("burst", 0, status=429, code="tenant_rate_limited") for _ in range(5)]
    o = account.overrun(burst, 1000)
    assert (o.used, o.answered, o.overrun, o.fits) == (576, 3, 0, 5)
    assert o.refused == {"tenant_rate_limited": 5}
    assert account.overrun(burst, 500).overrun == 76


def _outcomes():
    s1 = next(s for s in suites(10) if s.key == "s1")
    fc, fair = s1.systems[0], s1.systems[1]
    a = [_answer("A", 0, 1.0, 4, step=2.0), _answer("B", 0, 2.0, 4, step=2.0),
         Answer("B", 3.0, status=429, code="over_time_target"), Answer("B", 9.0, code=OPEN)]
    return [render.Outcome(s1, fc, a, 5.0), render.Outcome(s1, fair, a[:2], 5.0)]


def test_tables():
    outcomes = _outcomes()
    summary = render.summary_table(outcomes, CAP)
    assert summary[2].startswith("| s1 | first-come | 10 | 1 | 1.00x |") and "| 0.90x |" not in summary[3]
    longer = render.Outcome(replace(outcomes[1].suite, seconds=20), outcomes[1].system, outcomes[1].answers, 5.0)
    # only runs of the same length compare
    assert "| s1 | fair | 20 | 0 | - |" in render.summary_table([outcomes[0], longer], CAP)[3]
    tenants = render.tenant_table(outcomes)
    assert tenants[3].startswith(
        "| s1 (10 s) | first-come | B (1, 1.5x) | 3 | 1 | 1 (over_time_target 1) | 2.00 / 2.00 | - | 0 |")
    assert all(line.count("|") == tenants[0].count("|") for line in tenants)
    windows = render.window_table(outcomes, "s1")
    assert windows[0] == "| system | tenant | 0-5 s | 5-10 s |" and len(windows) == 2 + 4
    o = account.overrun([_answer("burst", 0, 1, 64, prompt=128)], 6144)
    assert "| 6144 | 64 | 1 | 0 | 192 | **0** | 32 |" in render.overrun_table(o, 64)


def test_each_tenant_s_first_token_sits_beside_its_own_when_it_sent_alone():
    s1 = next(s for s in suites(10) if s.key == "s1")
    b_alone = next(x for x in s1.systems if x.alone == "B")
    assert b_alone.name == "B alone" and s1.senders(b_alone) == (s1.clients[1],)
    t = tenancy([s1], CAP, burst_budget=6144)
    assert ("s1", "B alone", "B") in t.keys and ("s1", "B alone", "A") not in t.keys
    fair = _outcomes()[1]
    solo = render.Outcome(s1, b_alone, [_answer("B", 0, 0.5, 4)], 5.0)
    rows = render.tenant_table([fair, solo])
    assert "| fair | B (1, 1.5x) |" in rows[3] and "| 2.00 / 2.00 | 0.50 / 0.50 |" in rows[3]
    assert "| fair | A (1, 0.5x) |" in rows[2] and "| 1.00 / 1.00 | - |" in rows[2]  # A never sent alone here
    assert "| B alone | B (1, 1.5x) |" in rows[4] and "| 0.50 / 0.50 | - |" in rows[4]


def test_the_plot_is_an_svg_of_polylines():
    text = render.svg(_outcomes(), "service & time")
    root = ET.fromstring(text)
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 4 and "service &amp; time" in text
    for line in lines:
        points = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
        assert len(points) == 3 and all(0 <= x <= float(root.get("width")) for x, _ in points)


def test_the_section_goes_in_before_still_missing_and_is_rewritten_in_place(tmp_path):
    doc = tmp_path / "tenants.md"
    doc.write_text(f"# Tenants\n\nintro\n\n{ANCHOR}\n\n- a gap\n")
    _write(doc, "first")
    _write(doc, "second")
    text = doc.read_text()
    assert text.index(TITLE) < text.index(DOC.begin) < text.index("second") < text.index(ANCHOR)
    assert "first" not in text and text.count(TITLE) == 1 and text.endswith("- a gap\n")


def test_answers_survive_the_results_file():
    from loadkit.fairness.run import _answers

    a = _answer("A", 0, 1.0, 2)
    from dataclasses import asdict

    assert _answers(json.loads(json.dumps([asdict(a)]))) == [a]


def test_a_later_run_replaces_its_suites_in_the_report():
    from loadkit.fairness.run import merge

    first = {"header": "one", "capacity": {}, "runs": [{"suite": "s1", "system": "fair", "answers": [1]},
                                                        {"suite": "prio", "system": "alone", "answers": [2]}],
             "burst": [3]}
    later = {"header": "two", "capacity": {}, "runs": [{"suite": "prio", "system": "alone", "answers": [4],
                                                        "seconds": 90}], "burst": []}
    merged = merge([first, later])
    assert [r["answers"] for r in merged["runs"]] == [[1], [4]] and merged["runs"][1]["seconds"] == 90
    assert merged["burst"] == [3] and merged["header"] == "one\n\ntwo"
