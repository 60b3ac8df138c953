"""The benchmark's results: one launch of a variant (a system at a precision) in one round, what each step of its
sweep left, and the rounds pooled into one row per concurrency. Saved as results.json, read back for
`--report-only` (older files, whose rows were flat dicts without a precision, read as well)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from loadkit.peers import Launch, Variant
from loadkit.stats import PooledFigures, pool_result_files


@dataclass
class BenchLaunch(Launch):
    """One start of one variant in one round, and (app-cluster) its timings, replicas and shares."""

    cluster: dict | None = None  # loadkit.bench.cluster.observed


@dataclass
class StepRecord:
    """One step of one launch: its result file, or why it failed."""

    concurrency: int
    num_prompts: int
    output_len: int
    peak_rss_bytes: int
    load_command: str
    result: str | None
    error: str | None


@dataclass
class Row:
    """One variant at one concurrency, its rounds pooled."""

    system: str
    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    peak_rss_bytes: int
    load_command: str
    status: str  # ok, or the first error of its rounds
    dtype: str = "bfloat16"
    figures: PooledFigures | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.figures is not None

    @classmethod
    def from_dict(cls, d: dict) -> Row:
        names = {f.name for f in fields(cls)} - {"figures"}
        figures = d.get("figures")
        if figures is None and "output_tok_s" in d:  # an older results.json: the figures inline
            figures = {f.name: d[f.name] for f in fields(PooledFigures) if f.name in d}
        return cls(**{k: v for k, v in d.items() if k in names},
                   figures=PooledFigures(**figures) if figures is not None else None)


@dataclass
class SystemRun:
    """One variant over all its rounds: the first launch's facts, every launch's stop, the pooled rows."""

    system: str
    port: int
    command: list[str]
    log_path: str
    dtype: str = "bfloat16"
    resolved_dtype: str | None = None
    startup_s: float | None = None
    idle_rss_bytes: int | None = None
    status: str = "not run"
    stop_report: str = ""
    rows: list[Row] = field(default_factory=list)
    clusters: list[dict] = field(default_factory=list)  # app-cluster: each round's launch facts

    @property
    def variant(self) -> Variant:
        return Variant(self.system, self.dtype)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and all(r.ok and r.figures.failed == 0 for r in self.rows)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SystemRun:
        names = {f.name for f in fields(cls)} - {"rows"}
        return cls(**{k: v for k, v in d.items() if k in names}, rows=[Row.from_dict(r) for r in d.get("rows", [])])


def pool_rounds(v: Variant, input_len: int, launches: list[BenchLaunch], records: list[StepRecord]) -> SystemRun:
    """One variant's launches and per-round records -> one `SystemRun` whose rows pool the rounds."""
    first = launches[0]
    failed = next((launch.status for launch in launches if launch.status != "ok"), None)
    run = SystemRun(system=v.system, dtype=v.dtype, port=first.port, command=first.command, log_path=first.log_path,
                    resolved_dtype=next((la.resolved_dtype for la in launches if la.resolved_dtype), None),
                    startup_s=first.startup_s, idle_rss_bytes=first.idle_rss_bytes, status=failed or "ok",
                    stop_report="; ".join(dict.fromkeys(launch.stop_report for launch in launches)),
                    clusters=[launch.cluster for launch in launches if launch.cluster])
    for c in dict.fromkeys(r.concurrency for r in records):
        mine = [r for r in records if r.concurrency == c]
        error = next((r.error for r in mine if r.error), None)
        run.rows.append(Row(
            system=v.system, dtype=v.dtype, concurrency=c, num_prompts=mine[0].num_prompts, input_len=input_len,
            output_len=mine[0].output_len, peak_rss_bytes=max(r.peak_rss_bytes for r in mine),
            load_command=mine[-1].load_command, status=error or "ok",
            figures=None if error else pool_result_files([Path(r.result) for r in mine])))
    return run
