"""The plot: goodput (requests/s within both targets) against offered load (requests/s), one line per system,
each point labelled with its multiple of that system's capacity; the dotted diagonal is "everything served"."""

from __future__ import annotations

from pathlib import Path

from loadkit.bench.systems import LABELS
from loadkit.goodput.results import Row


def write_plot(path: Path, rows: list[Row], title_note: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    top = 0.0
    for system in dict.fromkeys(r.system for r in rows):
        pts = sorted((r.figures.offered_rps, r.figures.goodput_rps, r.multiple) for r in rows if r.system == system)
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        top = max(top, *xs)
        (line,) = ax.plot(xs, ys, marker="o", label=LABELS.get(system, system))
        for x, y, m in pts:
            ax.annotate(f"{m:g}x", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8,
                        color=line.get_color())
    if top:
        ax.plot([0, top], [0, top], linestyle=":", color="grey", label="offered (all within targets)")
    ax.set_xlabel("offered load (requests/s, open loop)")
    ax.set_ylabel("goodput (requests/s within both targets)")
    ax.set_title("Goodput vs. offered load" + (f" ({title_note})" if title_note else ""))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
