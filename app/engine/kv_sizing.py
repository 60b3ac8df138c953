"""Whether `engine.kv_cache_gib` holds one request of `max_model_len` tokens, said before any engine starts.

vLLM refuses such a cache only once its EngineCore has loaded the weights, and on the CPU it says "No available memory
for the cache blocks. Try increasing `gpu_memory_utilization`": the wrong knob, in a replica's log, after Serve has
retried the replica. The size is plain arithmetic on the model's config.json (a key and a value per layer, KV head and
head dimension, in blocks of the CPU backend's 128 tokens, one of which vLLM keeps back); models whose cache is not
that shape (latent attention, hybrid layers) are left to vLLM.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from app.config.model import ModelConfig
from app.engine.cpu.precision import resolve_cpu_precision
from app.engine.model_store import resolve_source

CPU_BLOCK_TOKENS = 128  # vLLM's CPU backend's KV block: a cache holds whole blocks
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token(config: dict[str, Any], dtype: str) -> int | None:
    """Bytes of KV cache one token takes, from a Hugging Face config.json; None where the cache is not one key and
    one value per layer and KV head."""
    text = config.get("text_config") or config
    if any(k in text for k in ("kv_lora_rank", "layer_types", "layers_block_type", "attn_layer_indices")):
        return None
    try:
        layers, heads = int(text["num_hidden_layers"]), int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    width = _BYTES.get(dtype)
    return 2 * layers * kv_heads * head_dim * width if width else None


def kv_cache_shortfall(model_dir: str | Path, dtype: str, kv_cache_gib: float, max_model_len: int) -> str | None:
    """What to change, where a CPU KV cache of `kv_cache_gib` cannot hold one request of `max_model_len` tokens of
    the model in `model_dir` in `dtype`; None where it can or where that is not known here (a hub id not
    downloaded, an unusual cache shape)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    per_token = kv_bytes_per_token(config, dtype)
    if not per_token:
        return None
    block = per_token * CPU_BLOCK_TOKENS
    held = max(0, int(kv_cache_gib * 2**30) // block - 1) * CPU_BLOCK_TOKENS  # vLLM's pool keeps one block back
    needed = math.ceil(max_model_len / CPU_BLOCK_TOKENS)
    if held >= needed * CPU_BLOCK_TOKENS:
        return None
    gib = math.ceil((needed + 1) * block / 2**30 * 1000) / 1000
    fix = f"raise engine.kv_cache_gib to at least {gib:g}"
    if held:
        fix += f", or lower engine.max_model_len to {held} or less"
    return (f"engine.kv_cache_gib {kv_cache_gib:g} holds {held} tokens of this model in {dtype}, fewer than one "
            f"request of engine.max_model_len {max_model_len} needs: {fix}")


def kv_cache_short(model: ModelConfig) -> str | None:
    """`kv_cache_shortfall` for `model` on this machine, in the precision `engine.dtype` resolves to here (what the
    command line checks before Ray starts)."""
    if model.engine_kind != "vllm" or model.on_gpu or not model.engine.kv_cache_gib:
        return None
    try:
        folder = resolve_source(model.source)
    except FileNotFoundError:
        return None
    dtype = resolve_cpu_precision(model.engine.dtype, on_gpu=False).dtype
    return kv_cache_shortfall(folder, dtype, model.engine.kv_cache_gib, model.engine.max_model_len)
