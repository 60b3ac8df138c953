"""The noisy-neighbour experiment's figures (loadkit/tenants.py), from records made up here."""

from __future__ import annotations

from collections import Counter

from loadkit.tenants import Figures, _table


def test_the_longest_time_without_an_answer_counts_from_the_start_to_the_end_of_the_round():
    f = Figures(light=[(0.0, 429, "queue_full", None), (2.0, 200, "", 0.5), (4.0, 429, "queue_full", None),
                       (6.0, 429, "queue_full", None), (8.0, 200, "", 1.0)], seconds=20.0)
    assert f.longest_without_answer() == 20.0 - 9.0
    assert Figures(seconds=30.0).longest_without_answer() == 30.0  # never answered: the whole round


def test_the_table_has_a_row_per_system_with_the_refusals_by_code():
    f = Figures(light=[(0.0, 200, "", 0.4), (2.0, 429, "over_time_target", None)], heavy_chunks=600,
                heavy_refused=Counter(queue_full=30), seconds=60.0)
    lines = _table({"two-tenants": [f]})
    assert len(lines) == 3
    assert lines[2] == "| two-tenants | 2 | 1 | 1 (over_time_target 1) | 0.40 / 0.40 | 59.6 | 10 | 0.5 |"
