"""A run's launches as saved in results.json, and their figures pooled per system and rate multiple over rounds
(every request of every round, windows' lengths summed: never a mean of per-round figures)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from loadkit.goodput.capacity import Capacity
from loadkit.goodput.client import Attempt, Record
from loadkit.goodput.figures import Figures, Targets, figures
from loadkit.goodput.launch import LaunchRun, WindowRun
from loadkit.goodput.workload import Ask


@dataclass
class Row:
    system: str
    multiple: float
    rounds: int
    figures: Figures


def pool(launches: list[LaunchRun], targets: Targets) -> list[Row]:
    """One row per system (in launch order) and multiple (in run order)."""
    groups: dict[tuple[str, float], list[WindowRun]] = {}
    for launch in launches:
        for w in launch.windows:
            groups.setdefault((launch.system, w.multiple), []).append(w)
    rows = []
    for (system, multiple), windows in groups.items():
        records = [r for w in windows for r in w.records]
        f = figures(records, sum(w.duration_s for w in windows), sum(w.offered_rps for w in windows) / len(windows),
                    targets, max(w.peak_rss_bytes for w in windows))
        rows.append(Row(system, multiple, len(windows), f))
    return rows


def record_from_dict(d: dict) -> Record:
    return Record(**{**d, "ask": Ask(**d["ask"]), "attempts": [Attempt(**a) for a in d["attempts"]]})


def launch_to_dict(launch: LaunchRun) -> dict:
    return asdict(launch)


def launch_from_dict(d: dict) -> LaunchRun:
    windows = [WindowRun(**{**w, "records": [record_from_dict(r) for r in w["records"]]}) for w in d["windows"]]
    capacity = Capacity(**d["capacity"]) if d.get("capacity") else None
    own = Capacity(**d["own_capacity"]) if d.get("own_capacity") else None
    return LaunchRun(**{**d, "windows": windows, "capacity": capacity, "own_capacity": own})
