"""The benchmark's two plots: output throughput and TTFT p50 against concurrency, one line per system and
precision."""

from __future__ import annotations

from pathlib import Path

from loadkit.bench.results import SystemRun
from loadkit.precision import precision_label

PLOTS = (("output_tok_s", "output tokens/s", "Output throughput vs. concurrency", "bench_throughput.png"),
         ("ttft_p50_ms", "TTFT p50 (ms)", "Time to first token (p50) vs. concurrency", "bench_ttft.png"))


def write_plots(out_dir: Path, runs: list[SystemRun], full: bool) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    paths = []
    for key, ylabel, title, name in PLOTS:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        xs_all: set[int] = set()
        for run in runs:
            pts = [(r.concurrency, getattr(r.figures, key)) for r in run.rows
                   if r.ok and getattr(r.figures, key) is not None]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            xs_all.update(xs)
            ax.plot(xs, ys, marker="o", label=f"{run.variant.label} ({precision_label(run.dtype, run.resolved_dtype)})")
        ax.set_xscale("log", base=2)
        if xs_all:
            ax.set_xticks(sorted(xs_all))
            ax.set_xticklabels([str(x) for x in sorted(xs_all)])
        if key == "ttft_p50_ms":
            ax.set_yscale("log")
        ax.set_xlabel("concurrency (--max-concurrency)")
        ax.set_ylabel(ylabel)
        ax.set_title(title + ("" if full else " (reduced run)"))
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend()
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
