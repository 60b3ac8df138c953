"""The benchmark report's tables: results per system, precision and concurrency; ratios against bare vLLM at the
same precision; each system's throughput across precisions; how each system started and stopped."""

from __future__ import annotations

from loadkit.bench.results import Row, SystemRun
from loadkit.precision import precision_label
from loadkit.stats import ratio_text, spread_text


def _f(v, fmt="{:.0f}") -> str:
    return "–" if v is None else fmt.format(v)


def _gib(b: int | None) -> str:
    return _f(b and b / 2**30, "{:.2f}")


def _precision(run: SystemRun) -> str:
    return precision_label(run.dtype, run.resolved_dtype)


def results_table(runs: list[SystemRun]) -> list[str]:
    lines = ["| System | Precision | Conc. | Prompts | Runs | Out len | Output tok/s | Req/s | TTFT p50 | TTFT p99 | "
             "ITL p50 | ITL p99 | E2E p50 | E2E p99 | Failed | Peak RSS (GiB) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        head = f"| {run.variant.label} | {_precision(run)} |"
        if not run.rows:
            lines.append(f"{head} – | – | – | – | not run | | | | | | | | | |")
            continue
        for r in run.rows:
            if not r.ok:
                lines.append(f"{head} {r.concurrency} | {r.num_prompts} | – | {r.output_len} | failed: "
                             f"{r.status[:120]} | | | | | | | | | {r.peak_rss_bytes / 2**30:.2f} |")
                continue
            f = r.figures
            lines.append(
                f"{head} {r.concurrency} | {r.num_prompts} | {f.repeats} | {r.output_len} | {f.output_tok_s:.1f} | "
                f"{f.req_s:.2f} | {_f(f.ttft_p50_ms)} | {_f(f.ttft_p99_ms)} | {_f(f.itl_p50_ms, '{:.1f}')} | "
                f"{_f(f.itl_p99_ms, '{:.1f}')} | {_f(f.e2el_p50_ms)} | {_f(f.e2el_p99_ms)} | {f.failed} | "
                f"{r.peak_rss_bytes / 2**30:.2f} |")
    return lines


def against_vllm(runs: list[SystemRun], ray_batches: bool) -> list[str]:
    """Each system over bare vLLM at the same precision and concurrency (the naive baseline: at its own)."""
    base: dict[tuple[str, int], Row] = {(r.dtype, r.concurrency): r for run in runs if run.system == "vllm"
                                        for r in run.rows if r.ok}
    if not base:
        return ["Bare vLLM has no successful run here, so there are no ratios.", ""]
    lines = ["Each system's figure divided by bare vLLM's at the same precision and concurrency (throughput: higher "
             "is better; latency and memory: lower is better). Per run: the lowest and highest of one round's "
             "throughput over bare vLLM's in the same round (same prompts).", "",
             "| System | Precision | Conc. | Output tok/s | per run | Req/s | TTFT p50 | ITL p50 | E2E p50 "
             "| Peak RSS |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        for r in run.rows:
            b = base.get((r.dtype, r.concurrency))
            if run.system == "vllm" or b is None or not r.ok:
                continue
            f, g = r.figures, b.figures
            # Ray Serve LLM sends tokens in batches: its ITL is not comparable (see "Reading the numbers").
            itl = "n/c" if run.system == "ray-llm" and ray_batches else ratio_text(f.itl_p50_ms, g.itl_p50_ms)
            lines.append(
                f"| {run.variant.label} | {_precision(run)} | {r.concurrency} | "
                f"{ratio_text(f.output_tok_s, g.output_tok_s)} | "
                f"{spread_text(f.output_tok_s_runs, g.output_tok_s_runs)} | {ratio_text(f.req_s, g.req_s)} | "
                f"{ratio_text(f.ttft_p50_ms, g.ttft_p50_ms)} | {itl} | "
                f"{ratio_text(f.e2el_p50_ms, g.e2el_p50_ms)} | {ratio_text(r.peak_rss_bytes, b.peak_rss_bytes)} |")
    return lines + [""]


def across_precisions(runs: list[SystemRun], dtypes: list[str]) -> list[str]:
    """Each vLLM-based system's output throughput at every precision, over its own at the first one."""
    first = dtypes[0]
    by_system: dict[str, dict[str, SystemRun]] = {}
    for run in runs:
        by_system.setdefault(run.system, {})[run.dtype] = run
    lines = [f"Output tokens/s of each system at each precision, and over its own at {first} (same rounds, same "
             "prompts).", "", "| System | Conc. | " + " | ".join(dtypes) + " |", "|---|---:|" + "---:|" * len(dtypes)]
    for by_dtype in by_system.values():
        if len(by_dtype) < 2:
            continue  # the naive baseline runs at one precision
        ref = {r.concurrency: r for r in by_dtype[first].rows if r.ok} if first in by_dtype else {}
        concurrencies = dict.fromkeys(r.concurrency for run in by_dtype.values() for r in run.rows)
        label = next(iter(by_dtype.values())).variant.label
        for c in concurrencies:
            cells = []
            for dtype in dtypes:
                row = next((r for r in by_dtype[dtype].rows if r.concurrency == c and r.ok), None) \
                    if dtype in by_dtype else None
                if row is None:
                    cells.append("–")
                    continue
                tok = row.figures.output_tok_s
                cells.append(f"{tok:.1f}" if dtype == first or c not in ref else
                             f"{tok:.1f} ({ratio_text(tok, ref[c].figures.output_tok_s)})")
            lines.append(f"| {label} | {c} | " + " | ".join(cells) + " |")
    return lines + [""]


def stop_table(runs: list[SystemRun]) -> list[str]:
    lines = ["| System | Precision | Outcome | Ready in (s) | Idle RSS (GiB) | Stop |", "|---|---|---|---:|---:|---|"]
    for run in runs:
        lines.append(f"| {run.variant.label} | {_precision(run)} | {run.status} | {_f(run.startup_s)} | "
                     f"{_gib(run.idle_rss_bytes)} | {run.stop_report} |")
    return lines
