"""What every experiment's report shares: the run's facts (when, where, with what, asked how), a PASS/FAIL
target, the command line it quotes, progress lines on stderr, and the section printed and written to its doc.

The figures themselves are each experiment's; where a Markdown file keeps a generated section is `markdown`'s.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from loadkit.machine import Commit, CpuFacts, Machine
from loadkit.markdown import HeadSection, MarkedSection, write_section
from loadkit.service import REPO


def _say(tag: str, message: str) -> None:
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def progress(tag: str) -> Callable[[str], None]:
    """An experiment's progress lines on stderr: `[tag HH:MM:SS] message`."""
    return functools.partial(_say, tag)


def command_line(experiment: str, argv: list[str], repo: Path = REPO) -> str:
    """How a report quotes its run: `python -m loadkit <experiment> <argv>`, the interpreter relative to the
    checkout when it lies inside it (`.venv/bin/python`)."""
    exe = sys.executable
    if exe.startswith(str(repo) + os.sep):
        exe = os.path.relpath(exe, Path.cwd())
    return shlex.join([exe, "-m", "loadkit", experiment, *argv])


def short(text: str, repo: Path) -> str:
    return text.replace(str(repo) + "/", "").replace(sys.executable, "python")


@dataclass(frozen=True)
class Target:
    """One promise of an experiment, kept or not, with the figures it was decided on."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name}: {self.detail}"


@dataclass(frozen=True)
class Check:
    """A check's outcome and what it saw."""

    ok: bool
    detail: str


def target_table(targets: list[Target]) -> list[str]:
    return ["| target | result | figures |", "|---|---|---|",
            *(f"| {t.name} | **{'PASS' if t.ok else 'FAIL'}** | {t.detail} |" for t in targets)]


@dataclass(frozen=True)
class RunFacts:
    """Where and how a run against one service ran, as its report says it."""

    command: str
    machine: Machine
    vllm: str
    commit: Commit
    mode: str  # the service under test, in words
    precision: str = ""  # the engine dtype the service was configured with, where the report says it
    quick: bool = False


def publish(section: str, targets: list[Target], output: Path | str, layout: HeadSection | MarkedSection,
            log=lambda message: None) -> bool:
    """Prints the section and each target's line, writes the section into `output` ('-': print only); whether
    every target passed."""
    print(section)
    print("\n".join(t.line() for t in targets))
    if str(output) != "-":
        write_section(Path(output), layout, section)
        log(f"wrote {os.path.relpath(output, Path.cwd())}")
    return all(t.ok for t in targets)


@dataclass
class RunMeta:
    """A comparison run's facts, saved in its results.json so that `--report-only` can rewrite its report (older
    files, whose machine entry was a flat dict, read too)."""

    started: str
    finished: str
    wall_s: float
    machine: Machine
    versions: dict[str, str]
    model_dir: str
    full: bool
    work_dir: str
    command: str
    config_dtype: str  # the precision of configs/cpu.yaml, the default
    foreign: list[str] = field(default_factory=list)  # engine/Ray processes someone else started meanwhile

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunMeta:
        m = d["machine"]
        if "cpu" in m:
            machine = Machine(**{**m, "cpu": CpuFacts(**{**m["cpu"], "flags": tuple(m["cpu"]["flags"])})})
        else:  # an older results.json
            cpu = CpuFacts(model=m.get("cpu_model", "?"), flags=tuple(m.get("flags", "").split()),
                           logical_cpus=m.get("logical_cpus") or 0)
            machine = Machine(cpu=cpu, usable_cpus=cpu.logical_cpus, memory_gib=m.get("memory_gib", 0.0),
                              kernel=m.get("kernel", "?"), system="Linux", arch="?", python=m.get("python", "?"))
        names = {f.name for f in fields(cls)} - {"machine"}
        values = {k: v for k, v in d.items() if k in names}
        values.setdefault("config_dtype", "bfloat16")
        return cls(machine=machine, **values)
