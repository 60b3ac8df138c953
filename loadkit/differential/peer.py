"""The bare-vLLM peer: `python -m vllm.entrypoints.openai.api_server` with the engine arguments of a service config.

The command is the peers' own (`loadkit.peers.system_command` for the `vllm` system: model folder, served name,
`--enforce-eager`, dtype, max_model_len, max_num_seqs, and `VLLM_CPU_KVCACHE_SPACE` in its environment), run as a
`Server` (own process group, stopped leaving nothing behind). Added here are the engine arguments the peers leave
at vLLM's defaults and the service does not: the config's `seed`, `max_logprobs` as the config's
`limits.max_logprobs` (the bound a request meets in both; the service's engine allows 2 x `max_n` for beam search's
steps, so beams compared here are at most 2 wide), the config's tool-call parser if it names one, and
`--enable-prompt-tokens-details` where the config's `service.enable_prompt_tokens_details` turns the service's
`usage.prompt_tokens_details` on (both leave it null by default). `dtype: auto`
is given to the peer as `loadkit.precision.same_precision` gives it to every peer: what the service's `auto`
resolves to on this CPU, not vLLM's own `auto` (the checkpoint's bfloat16).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadkit.peers import MODEL_ID, Engine, Launchable, Variant, system_command, system_env
from loadkit.precision import resolved_dtype, same_precision
from loadkit.service import Server, free_port

STARTUP_TIMEOUT_S = 300.0  # a loaded 2-core machine takes minutes (docs/differential.md)
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class EngineSettings:
    """The engine arguments of one model of a service config, as the peer must get them."""

    model_id: str
    max_model_len: int
    max_num_seqs: int
    enforce_eager: bool
    kv_cache_gib: int
    seed: int
    dtype: str  # resolved: never `auto`
    max_logprobs: int
    tool_call_parser: str | None
    prompt_tokens_details: bool = False  # the service's `service.enable_prompt_tokens_details`

    @classmethod
    def from_config(cls, config: dict, model_index: int = 0) -> EngineSettings:
        """From a parsed service config (configs/cpu.yaml's layout), with the service's defaults where it is
        silent (app/config.py: max_model_len 2048, max_num_seqs 64 is vLLM's own, eager, 2 GiB, seed 0,
        limits.max_logprobs 5, prompt_tokens_details off)."""
        model = config["models"][model_index]
        engine = model.get("engine") or {}
        limits = model.get("limits") or {}
        return cls(model_id=model["id"], max_model_len=int(engine.get("max_model_len", 2048)),
                   max_num_seqs=int(engine.get("max_num_seqs", 64)),
                   enforce_eager=bool(engine.get("enforce_eager", True)),
                   kv_cache_gib=int(engine.get("kv_cache_gib") or 2), seed=int(engine.get("seed", 0)),
                   dtype=same_precision(str(engine.get("dtype", "auto"))),
                   max_logprobs=max(int(limits.get("max_logprobs", 5)), 1),
                   tool_call_parser=engine.get("tool_call_parser"),
                   prompt_tokens_details=bool((config.get("service") or {}).get("enable_prompt_tokens_details")))

    def bench_engine(self) -> Engine:
        return Engine(enforce_eager=self.enforce_eager, dtype=self.dtype, max_model_len=self.max_model_len,
                      max_num_seqs=self.max_num_seqs, kv_cache_gib=self.kv_cache_gib)

    def extra_args(self) -> list[str]:
        """What the bench's command for bare vLLM lacks for this service's engine."""
        args = ["--seed", str(self.seed), "--max-logprobs", str(self.max_logprobs)]
        if self.prompt_tokens_details:
            args.append("--enable-prompt-tokens-details")
        if self.tool_call_parser:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        return args


def binding_beside(engine_stats: Mapping[str, Any]) -> dict[str, str]:
    """The peer's environment to compute beside a service's engine: on the cores that engine leaves to its front end
    (its `/stats` engine section: `front_end_cores`, `compute_cores`); {} where it leaves none. vLLM's own binding
    would put both engines on the same core (measured: 145 s for the curated set sent to both at once, 61-66 s
    apart, and each of the service's answers 1 s slower right after one of the peer's, while its idle EngineCore
    polls; 2-core Xeon, 2026-12-07)."""
    compute = set(engine_stats.get("compute_cores") or ())
    spare = [c for c in engine_stats.get("front_end_cores") or () if c not in compute]
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, spare))} if spare else {}


def peer_command(settings: EngineSettings, port: int, repo: Path, model_dir: str, work: Path) -> list[str]:
    if settings.model_id != MODEL_ID:  # the bench serves its peers under this one name
        raise ValueError(f"the peer serves {MODEL_ID!r}; the config's model is {settings.model_id!r}")
    at = Launchable(repo=repo, model_dir=model_dir, work=work, max_concurrency=settings.max_num_seqs,
                    max_output_len=settings.max_model_len, engine=settings.bench_engine())
    return [*system_command(Variant("vllm", settings.dtype), port, at), *settings.extra_args()]


@dataclass
class Peer:
    """A running bare vLLM: its URL, the dtype its engine reported, and `stop()`."""

    server: Server
    settings: EngineSettings
    engine_dtype: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @classmethod
    def start(cls, settings: EngineSettings, repo: Path, model_dir: str, work: Path,
              timeout_s: float = STARTUP_TIMEOUT_S, env: Mapping[str, str] | None = None) -> Peer:
        """Started and answering (a tiny chat completion succeeded), or stopped again and RuntimeError. `env`: what
        its environment adds (say, `VLLM_CPU_OMP_THREADS_BIND` to compute beside a service's engine)."""
        port = free_port()
        server = Server(peer_command(settings, port, repo, model_dir, work), port=port,
                        log_path=work / "vllm-peer.log", cwd=repo,
                        env={**system_env(repo, settings.bench_engine()), **(env or {})}, sample_peak=True)
        why = server.wait_ready(timeout_s, MODEL_ID)
        if why:
            stopped = server.stop(STOP_GRACE_S).text()
            raise RuntimeError(f"bare vLLM did not start: {why} ({stopped})\n{server.log_tail(3000)}")
        return cls(server, settings, resolved_dtype(server.log_tail(200_000)))

    def stop(self) -> str:
        """Stops the peer's whole process group; how that went ('...; no process left behind' when clean)."""
        return self.server.stop(STOP_GRACE_S).text()
