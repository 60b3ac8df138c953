"""`python -m loadkit autoscaling`'s figures, from records: time to the second replica, the refusals meanwhile and
their Retry-After, first tokens within the target, the scale-down and what broke through it."""

from __future__ import annotations

from loadkit.autoscaling import Run, ratios, report
from loadkit.record import Attempt, Record


def _rec(kind: str, start: float, outcome: str = "ok", status: int | None = 200, ttft: float | None = 1.0,
         retry_after: str | None = None) -> Record:
    rec = Record(start=start, end=start + 5, outcome=outcome, status=status, kind=kind, ttft=ttft)
    rec.attempts = [Attempt(status, 0.1, retry_after=retry_after)]
    return rec


def test_the_report_counts_the_warm_up_refusals_and_what_the_scale_down_broke():
    run = Run(capacity=300.0, stepped=100.0, second_at=160.0, dropped=400.0, back_at=550.0)
    run.records = [
        _rec("light", 50.0),
        _rec("step", 110.0),  # in time, before the second replica
        _rec("step", 120.0, ttft=14.0),  # answered, late
        _rec("step", 130.0, "refused", 429, None, "25"),
        _rec("step", 140.0, "refused", 429, None, "15"),
        _rec("step", 200.0),  # after the second replica came
        _rec("long", 401.0),
        _rec("long", 402.0, "failed", 200, 1.0),  # a broken stream
        _rec("long", 403.0, "refused", 429, None, "5"),  # refused at once: not broken
        _rec("after", 450.0, "timed_out", None, None),
    ]
    run.ended = 700.0
    run.states = [(0.0, 1, 0, {}), (150.0, 1, 1, {}), (160.0, 2, 0, {}), (550.0, 1, 0, {})]
    text = report([("ours", run)], ["facts"])
    assert "| figure | ours |" in text
    assert "| from the step to the second replica serving | 60 s |" in text
    assert "| requests of the step before it served | 4: 2 answered, 2 refused with 429, 0 other |" in text
    assert "| their Retry-After (min / median / max) | 15 / 20 / 25 s (2 of 2 refusals carried one) |" in text
    assert "| step requests with a first token within 10 s | 2 of 5 (40%) |" in text
    assert "| all requests after the warm-up with a first token within 10 s | 3 of 7 (43%) |" in text
    # 1 replica 100-150, 2 (one starting) 150-550, 1 from 550 to the end at 700
    assert "| replica-seconds from the step to the end | 1000 |" in text
    assert "| from the drop to one replica | 150 s |" in text
    assert "| requests after the drop: failed or timed out | 2 of 4 |" in text
    assert "| long streams (400 tokens) broken | 1 of 3 (1 refused with 429) |" in text


def test_a_replica_that_never_came_says_so():
    run = Run(capacity=300.0, stepped=100.0, dropped=400.0)
    other = Run(capacity=300.0, stepped=100.0, second_at=130.0, dropped=400.0)
    text = report([("ours", run), ("Serve's", other)], [])
    assert "| figure | ours | Serve's |" in text
    assert "| from the step to the second replica serving | never | 30 s |" in text
    assert "| from the drop to one replica | never | never |" in text


def _run(in_target: int, late: int, replicas: int) -> Run:
    """A run whose step had `in_target` first tokens within 10 s and `late` after, on `replicas` replicas from the
    step (at 100 s) to the end (at 200 s)."""
    run = Run(stepped=100.0, dropped=150.0, ended=200.0)
    run.records = [_rec("step", 110.0 + i) for i in range(in_target)] + [
        _rec("step", 130.0 + i, ttft=20.0) for i in range(late)]
    run.states = [(0.0, replicas, 0, {})]
    return run


def test_rounds_end_with_the_ratios_of_the_service_s_policy_to_serve_s_round_by_round():
    results = [("token_demand", 1, _run(6, 4, 1)), ("ongoing_requests", 1, _run(5, 5, 2)),
               ("ongoing_requests", 2, _run(4, 6, 2)), ("token_demand", 2, _run(6, 4, 2))]
    lines = ratios(results)
    # round 1: 0.6 / 0.5 = 1.2x attainment at 100 / 200 replica-seconds; round 2: 0.6 / 0.4 = 1.5x at 200 / 200
    assert lines[1:] == ["- round 1: step attainment 1.20x, replica-seconds 0.50x",
                         "- round 2: step attainment 1.50x, replica-seconds 1.00x"]
    assert "median of 2 round(s): step attainment **1.35x**, replica-seconds **0.75x**" in lines[0]
    text = report([("a", results[0][2]), ("b", results[1][2])], ["facts"], lines)
    assert text.endswith("\n\n" + "\n".join(lines))


def test_one_policy_alone_has_no_ratios():
    assert ratios([("token_demand", 1, _run(6, 4, 1))]) == []
