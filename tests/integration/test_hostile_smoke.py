"""Smoke test for `python -m loadkit hostile` against a real stack it may break.

The stack is the session's (tests/support/stacks.py: `running_stack` on `base_config`, 4 running + 4 queued, the
default model, its connection clocks cut to a few seconds: SHORT_CLOCKS), after every test that shares it. The
driver drives it by URL with tiny counts: 5 non-readers (n 4 and top_logprobs 5, the config's most: a few KB per
token step, so that each never-read stream fills the ~160 KB of buffers in front of the write-stall clock within
seconds; a plain stream on this CPU takes minutes), 20 idle, 5 slowloris, 2 huge header blocks, 2 giant prompts and
a short /tokenize flood, beside its polite client. Its report's targets must all pass (their bounds are generous
here: a smoke test, not a measurement), and the service must be idle afterwards.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.service import API_KEY, MODEL, REPO, SHORT_CLOCKS

pytestmark = [pytest.mark.integration, pytest.mark.stack("spare")]

TINY = {"non-readers": 5, "non-reader-n": 4, "non-reader-logprobs": 5, "idle": 20, "slowloris": 5,
        "huge-headers": 2, "huge-header-mb": 1, "giant-prompts": 2, "tokenize-clients": 2, "tokenize-requests": 20,
        "duration": 45, "baseline": 2, "serve-grace": 60, "settle-timeout": 60}
RUN_TIMEOUT_S = 420  # a bound on the whole driver run, so a hang fails the test instead of stalling the suite


def _target_rows(report: str) -> list[str]:
    """The rows of the report's targets table."""
    return [row for row in report.splitlines() if row.startswith("| ") and ("**PASS**" in row or "**FAIL**" in row)]


def test_the_hostile_driver_with_tiny_counts_passes_its_targets_and_leaves_the_service_idle(own_service,
                                                                                            tmp_path: Path):
    svc = own_service
    clocks = (f"--{k.replace('_', '-')}={v:g}" for k, v in SHORT_CLOCKS.items())
    flags = [*clocks, *(f"--{k}={v}" for k, v in TINY.items())]
    report_path = tmp_path / "hostile.md"
    proc = subprocess.run(
        [sys.executable, "-m", "loadkit", "hostile", "--url", svc.base_url, "--api-key", API_KEY, "--model", MODEL,
         *flags,
         "--output", str(report_path), "--work-dir", str(tmp_path / "work")],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert report_path.exists(), f"no report (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    rows = _target_rows(report_path.read_text())
    assert len(rows) >= 10, rows
    failed = [row for row in rows if "**FAIL**" in row]
    assert not failed, "\n".join(failed) + f"\n\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp_path / "work").glob("hostile-*.json")), "no JSON result in the work dir"

    stats = svc.wait_idle(timeout_s=30)
    assert stats["engine"]["running"] == 0 and stats["admission"]["in_system"] == 0, stats
