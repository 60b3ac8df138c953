"""loadkit.precision: the precisions a benchmark is asked for, and what an engine said `auto` became."""

from __future__ import annotations

import pytest

from loadkit.precision import parse_dtypes, precision_label, resolved_dtype

VLLM_LINE = ("(EngineCore pid=123) INFO 12-01 09:50:01 [core.py:134] Initializing a V1 LLM engine (v0.32.0) with "
             "config: model='/m', speculative_config=None, tokenizer='/m', dtype=torch.bfloat16, max_seq_len=2048, "
             "kv_cache_dtype=auto, device_config=cpu")


def test_a_list_of_precisions_keeps_its_order_and_drops_repeats():
    assert parse_dtypes("bfloat16, float32,auto,float32") == ["bfloat16", "float32", "auto"]
    with pytest.raises(ValueError, match="fp8"):
        parse_dtypes("bfloat16,fp8")
    with pytest.raises(ValueError):
        parse_dtypes(" , ")


def test_the_engines_own_log_line_says_what_it_computes_in():
    assert resolved_dtype("noise\n" + VLLM_LINE + "\nmore") == "bfloat16"  # not kv_cache_dtype
    assert resolved_dtype("no engine here") is None
    assert precision_label("auto", "float32") == "auto → float32"
    assert precision_label("bfloat16", "bfloat16") == "bfloat16"
    assert precision_label("auto", None) == "auto"
