"""What an engine says it is doing (`Engine.stats()`): its queue, its KV cache, its counters and how it was set
up. The replica's own figures (admission, pace) are app/host/stats.py's."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineStats:
    """What the engine is doing now, as it reports it."""

    running: int = 0  # requests inside the engine (vLLM: unfinished requests)
    waiting: int = 0  # requests the engine's scheduler holds waiting
    kv_cache_usage: float = 0.0  # fraction of KV cache blocks in use
    preemptions_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefix_cache_queries_total: int = 0  # prompt tokens looked up in the prefix cache (vLLM's counter, tokens)
    prefix_cache_hits_total: int = 0  # ... and found there
    extra: dict[str, float] = field(default_factory=dict)
    # How the engine was set up here (at start): its dtype and why; on a CPU its workers' cores and the front end's.
    dtype: str = ""
    dtype_reason: str = ""
    compute_cores: tuple[int, ...] = ()
    front_end_cores: tuple[int, ...] = ()
