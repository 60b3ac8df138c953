"""The load: vLLM's own load generator (`vllm bench serve`, via benchmarks/vllm_bench_serve.py), the sweep of
steps it is run at, and how many warm-ups and rounds each system gets.

The same for every system: backend openai-chat, streaming /v1/chat/completions, random dataset with a fixed seed
per round, fixed input and output lengths with ignore_eos, greedy; byte-identical prompts (server-side
re-alignment off).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from loadkit.peers import MODEL_ID

FULL_SWEEP = (1, 4, 16, 64)
DEFAULT_INPUT_LEN = 128
DEFAULT_REPEATS = 3
NAIVE_MAX_PROMPTS = 32
SEED = 0


@dataclass(frozen=True)
class Step:
    concurrency: int
    num_prompts: int
    output_len: int


def plan(concurrency: list[int], num_prompts: int | None, output_len: int | None) -> list[Step]:
    """One step per concurrency: prompts scaled to it, 64 output tokens at concurrency 1, else 128."""
    return [Step(c, num_prompts or max(8, 4 * c), output_len or (64 if c == 1 else 128)) for c in concurrency]


def prompts_for(system: str, step: Step, chosen: int | None) -> int:
    # The naive baseline serves ~30 tok/s whatever the load: 256 prompts at c=64 would take 20 minutes.
    if system == "naive" and chosen is None:
        return min(step.num_prompts, NAIVE_MAX_PROMPTS)
    return step.num_prompts


def warmups_for(system: str, concurrency: int, chosen: int | None) -> int:
    """By default a run starts with the engine having just served a batch of the run's own size, so one-off
    costs of a new batch size stay out of the figures. The naive baseline never batches; two warm-ups are all it
    needs (each costs it seconds)."""
    if chosen is not None:
        return chosen
    return 2 if system == "naive" else max(2, concurrency)


def warmups_text(chosen: int | None) -> str:
    if chosen is not None:
        return f"{chosen} warm-up request(s) per run"
    return ("warm-up requests per run sent at the run's concurrency, as many as the concurrency (at least 2; the "
            "naive baseline: 2)")


def repeats_for(system: str, chosen: int | None) -> int:
    """The naive baseline runs once unless asked: its figures barely move and each run costs it minutes."""
    if chosen is not None:
        return chosen
    return 1 if system == "naive" else DEFAULT_REPEATS


def repeats_text(chosen: int | None) -> str:
    if chosen is not None:
        return f"{chosen} for every system"
    return f"{DEFAULT_REPEATS} for the vLLM-based systems, 1 for the naive baseline"


def load_command(repo: Path, port: int, model_dir: str, step: Step, num_prompts: int, input_len: int, warmups: int,
                 result_dir: Path, result_name: str, seed: int = SEED, request_id_prefix: str | None = None
                 ) -> list[str]:
    """`request_id_prefix`: the X-Request-Id of the measured requests is this plus their index (the warm-ups
    send none), so a server's own log tells them apart."""
    ids = [] if request_id_prefix is None else ["--request-id-prefix", request_id_prefix]
    return [sys.executable, str(repo / "benchmarks" / "vllm_bench_serve.py"), "--no-server-alignment",
            "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--host", "127.0.0.1", "--port", str(port), "--model", MODEL_ID, "--tokenizer", model_dir,
            "--dataset-name", "random", "--random-input-len", str(input_len),
            "--random-output-len", str(step.output_len), "--random-range-ratio", "0", "--seed", str(seed),
            "--ignore-eos", "--temperature", "0", "--num-prompts", str(num_prompts),
            "--max-concurrency", str(step.concurrency), "--num-warmups", str(warmups),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", result_name,
            "--disable-tqdm", *ids]


def run_load(repo: Path, cmd: list[str], log_path: Path, timeout_s: float) -> str | None:
    """Runs the load generator in its own process group; None on success, else why it failed."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env["PYTHONUNBUFFERED"] = "1"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"load generator timed out after {timeout_s:.0f} s"
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if rc != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()
        tail = [line for line in tail if not line.startswith((" - leaked", "nanobind"))]
        return f"load generator exited with status {rc}: {' | '.join(tail[-3:])[:400]}"
    return None
