"""loadkit.stats: percentiles as numpy's linear interpolation, and rounds pooled into one set of figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadkit.stats import fmt_pcts, percentile, pool_result_files, pool_runs, ratio_text, spread_text


def _result(duration: float, ttfts: list[float], errors: list[str]) -> dict:
    """A load generator's detailed result: one 3-token answer per request, token gaps of 10 ms."""
    ok = [not e for e in errors]
    return {"duration": duration, "completed": sum(ok), "failed": len(ok) - sum(ok),
            "total_output_tokens": 3 * sum(ok), "output_throughput": 3 * sum(ok) / duration,
            "ttfts": ttfts, "itls": [[0.01, 0.01] if good else [] for good in ok],
            "latencies": [t + 0.02 for t in ttfts], "errors": errors}


def test_percentile_interpolates_linearly_and_knows_no_values():
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([0, 10], 99) == pytest.approx(9.9)
    assert percentile([], 50) is None


def test_fmt_pcts_scales_and_counts():
    assert fmt_pcts([0.001, 0.002, 0.003], 1000, " ms", 1) == "2.0 / 2.8 / 3.0 ms (n=3)"
    assert fmt_pcts([]) == "-"


def test_rounds_pool_into_one_set_of_figures(tmp_path: Path):
    first, second = tmp_path / "r0.json", tmp_path / "r1.json"
    first.write_text(json.dumps(_result(2.0, [0.1, 0.2], ["", ""])))
    second.write_text(json.dumps(_result(4.0, [0.3, 9.9, 0.4], ["", "Server error 503\nbusy", ""])))
    pooled = pool_result_files([first, second])

    assert pooled.repeats == 2 and pooled.completed == 4 and pooled.failed == 1
    assert pooled.output_tok_s == pytest.approx(12 / 6.0)  # all tokens over all time, not a mean of rates
    assert pooled.output_tok_s_runs == [pytest.approx(3.0), pytest.approx(1.5)]
    assert pooled.ttft_p50_ms == pytest.approx(250.0)  # over 0.1 0.2 0.3 0.4: the failed request's 9.9 is left out
    assert pooled.itl_p99_ms == pytest.approx(10.0)
    assert pooled.errors == {"busy": 1}


def test_a_run_with_no_successful_request_has_no_percentiles():
    pooled = pool_runs([_result(1.0, [5.0], ["boom"])])
    assert pooled.completed == 0 and pooled.ttft_p50_ms is None and pooled.errors == {"boom": 1}


def test_per_run_ratios_pair_each_round_with_the_references_same_round():
    assert spread_text([90, 100], [100, 100]) == "0.90–1.00×"
    assert spread_text([90], [100]) == "–"  # one run: no spread
    assert ratio_text(1, 2) == "0.50×" and ratio_text(None, 2) == "–" and ratio_text(1, 0) == "–"
