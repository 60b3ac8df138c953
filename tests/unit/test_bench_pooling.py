"""scripts/bench.py pools each concurrency's repeats into one set of figures; checked on made-up results."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench", REPO / "scripts" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench", None)


def _result(tmp_path: Path, name: str, duration: float, ttfts: list[float], errors: list[str]) -> Path:
    """A load generator's detailed result: one 3-token answer per request, token gaps of 10 ms."""
    ok = [not e for e in errors]
    data = {"duration": duration, "completed": sum(ok), "failed": len(ok) - sum(ok),
            "total_output_tokens": 3 * sum(ok), "output_throughput": 3 * sum(ok) / duration,
            "ttfts": ttfts, "itls": [[0.01, 0.01] if good else [] for good in ok],
            "latencies": [t + 0.02 for t in ttfts], "errors": errors}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_repeats_pool_into_one_set_of_figures(bench, tmp_path):
    first = _result(tmp_path, "r0.json", 2.0, [0.1, 0.2], ["", ""])
    second = _result(tmp_path, "r1.json", 4.0, [0.3, 9.9, 0.4], ["", "Server error 503\nbusy", ""])
    pooled = bench.summarize([first, second])

    assert pooled["repeats"] == 2 and pooled["completed"] == 4 and pooled["failed"] == 1
    assert pooled["output_tok_s"] == pytest.approx(12 / 6.0)  # all tokens over all time, not a mean of rates
    assert pooled["output_tok_s_runs"] == [pytest.approx(3.0), pytest.approx(1.5)]
    assert pooled["ttft_p50_ms"] == pytest.approx(250.0)  # over 0.1 0.2 0.3 0.4: the failed request's 9.9 is left out
    assert pooled["itl_p99_ms"] == pytest.approx(10.0)
    assert pooled["errors"] == {"busy": 1}


def test_per_run_ratios_pair_each_repeat_with_bare_vllms_same_prompts(bench):
    assert bench._run_ratios({"output_tok_s_runs": [90, 100]}, {"output_tok_s_runs": [100, 100]}) == "0.90–1.00×"
    assert bench._run_ratios({"output_tok_s_runs": [90]}, {"output_tok_s_runs": [100]}) == "–"  # one run: no spread


def test_the_naive_baseline_runs_once_unless_asked(bench):
    assert bench.repeats_for("naive", None) == 1
    assert bench.repeats_for("app", None) == bench.DEFAULT_REPEATS > 1
    assert bench.repeats_for("naive", 2) == 2
