"""loadkit.prefill_share's table (scripts/prefill_share.py): medians per budget over its trials, the worst stall."""

from __future__ import annotations

from loadkit.prefill_share import Trial, table


def test_the_table_takes_medians_per_budget_and_the_worst_stall():
    trials = [Trial(256, 0, 0.10, 0.30, 3.0, 0.5), Trial(256, 1, 0.12, 0.50, 3.4, 0.7),
              Trial(256, 1, 0.11, 0.40, 3.2, 0.6), Trial(None, 0, 0.10, 2.00, 2.0, 2.1)]
    lines = table(trials)
    assert lines[2] == "| 256 | 3 | 110 | 400 / 500 | 3.20 | 0.60 |"
    assert lines[3] == "| default (2048) | 1 | 100 | 2000 / 2000 | 2.00 | 2.10 |"
