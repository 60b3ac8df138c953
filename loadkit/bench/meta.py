"""What a benchmark report says besides the figures: when and where it ran, with what, asked how.

Saved in results.json beside the runs, so `--report-only` can rewrite the report of an earlier run (older
files, whose machine entry was a flat dict and whose options were the script's whole namespace, read too).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from loadkit.machine import CpuFacts, Machine


@dataclass
class ReportOptions:
    """The options of the run that the report quotes."""

    input_len: int
    warmups: int | None = None
    repeats: int | None = None
    ray_stream_batching_ms: float | None = None
    note: str = ""
    dtypes: list[str] = field(default_factory=lambda: ["bfloat16"])
    dtypes_asked: bool = False  # --dtype given (else: the config's one precision)

    @classmethod
    def from_dict(cls, d: dict) -> ReportOptions:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class RunMeta:
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
