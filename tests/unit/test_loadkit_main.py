"""`python -m loadkit`: one command line for every experiment; the list costs no experiment's import, and each
experiment answers --help without starting anything."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from loadkit.__main__ import EXPERIMENTS, main

REPO = Path(__file__).resolve().parents[2]


def test_help_lists_every_experiment(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in EXPERIMENTS)
    assert set(EXPERIMENTS) == {"bench", "goodput", "overload", "burst", "hostile", "chaos", "routing", "tenants",
                                "fairness", "autoscaling", "differential",
                                "prefill-share", "probe", "capacity"}


def test_no_or_an_unknown_experiment_is_a_usage_error(capsys):
    assert main([]) == 2 and main(["nope"]) == 2
    assert "no experiment 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_each_experiment_has_a_main_and_its_own_help(name, capsys):
    module = importlib.import_module(EXPERIMENTS[name][0])
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m loadkit {name} ")


def test_the_command_line_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "loadkit", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "prefill-share" in out.stdout
