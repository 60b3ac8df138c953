"""Smoke test for `python -m loadkit bench`: the cheapest real path, end to end.

`python -m loadkit bench --quick --systems naive --repeats 2` starts the naive FastAPI baseline (no vLLM
engine, up in seconds) twice, in two rounds; each time drives it with vLLM's own load generator (a
handful of short requests at one concurrency) and stops it; then pools the rounds and writes the
report and plots. The report's table must have a row, labelled with its precision,
with nonzero throughput and no failed request, and nothing the run started may be left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A hang guard, not a speed target (speed is the benchmarks' business): two quick rounds of the naive baseline
# took 50-120 s here, depending on what else the machine ran.
HANG_GUARD_S = 600

pytestmark = [pytest.mark.integration, pytest.mark.stack("own")]


def _table_rows(markdown: str) -> list[dict[str, str]]:
    """The first Markdown table under '## Results', as dicts keyed by its header."""
    section = markdown.split("## Results", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        if line.startswith("|---"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(header):
            break
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def test_bench_quick_naive(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "loadkit", "bench", "--quick", "--systems", "naive", "--repeats", "2",
         "--dtype", "float32",
         "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "raw"), "--startup-timeout", "300"],
        cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0, f"python -m loadkit bench failed ({proc.returncode}):\n{proc.stderr[-4000:]}"

    report = (tmp_path / "benchmarks.md").read_text()
    rows = [r for r in _table_rows(report) if r["System"] == "naive baseline"]
    assert rows, f"no naive row in the results table:\n{report}"
    row = rows[0]
    assert float(row["Output tok/s"]) > 0, row
    assert float(row["Req/s"]) > 0, row
    assert int(row["Failed"]) == 0, row
    assert row["Runs"] == "2", row
    assert row["Precision"] == "float32", row
    assert "Reduced smoke run" in report
    assert "Not every system ran" not in report
    assert "- Precision: float32 (asked with `--dtype`)" in report and "logical CPUs" in report
    for name in ("bench_throughput.png", "bench_ttft.png"):
        assert (tmp_path / name).stat().st_size > 1000, name

    results = json.loads((tmp_path / "raw" / "results.json").read_text())
    (run,) = results["runs"]
    assert run["port"] != 8000
    assert "--port 8000 " not in run["rows"][0]["load_command"] + " "
    figures = run["rows"][0]["figures"]
    assert figures["completed"] == 2 * 4 and figures["failed"] == 0
    assert len(figures["output_tok_s_runs"]) == 2
    assert run["dtype"] == "float32" and "--dtype float32" in " ".join(run["command"])
    assert "--seed 1 " in run["rows"][0]["load_command"]  # the second repeat sends new prompts
    assert "no process left behind" in run["stop_report"], run["stop_report"]
