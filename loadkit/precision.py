"""Precisions (vLLM's `dtype`): the names a run is asked for, and the one an engine actually chose.

`auto` lets the engine decide (vLLM: from the model folder's config and what the CPU supports; this project:
its config's `engine.dtype: auto`). What it decided is read back from vLLM's own start-up log line
("... dtype=torch.bfloat16, ..."), so a report can say what `auto` meant on that machine. Where systems must
compute alike, `same_precision` gives every one what this project's `auto` means on this CPU.
"""

from __future__ import annotations

import re

from loadkit.machine import cpu_facts

DTYPES = ("auto", "bfloat16", "float16", "float32")
_ENGINE_DTYPE = re.compile(r"\bdtype=torch\.(\w+)")


def parse_dtypes(text: str) -> list[str]:
    """'bfloat16,float32,auto' -> ['bfloat16', 'float32', 'auto'] (order kept, duplicates dropped)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in DTYPES]
    if bad or not names:
        raise ValueError(f"unknown precision(s) {', '.join(bad) or '(none)'}; choose from {', '.join(DTYPES)}")
    return list(dict.fromkeys(names))


def resolved_dtype(log_text: str) -> str | None:
    """The dtype vLLM's engine reported at start-up in `log_text`, if it did."""
    found = _ENGINE_DTYPE.findall(log_text)
    return found[-1] if found else None


def precision_label(asked: str, resolved: str | None) -> str:
    """'bfloat16', or 'auto → float32' when the engine said what `auto` became."""
    if asked == "auto" and resolved:
        return f"auto → {resolved}"
    return asked


def same_precision(dtype: str) -> str:
    """`auto` as this project resolves it on this CPU (bfloat16 where the CPU computes it natively and vLLM computes it
    right, float32 otherwise: app/engine/cpu/precision.py, which loadkit does not import), to give to every system:
    bare vLLM's own `auto` takes the model folder's bfloat16, which a CPU without AVX-512 bf16 emulates many times
    slower (docs/goodput.md), and which vLLM 0.32's AMX kernels answer wrong (docs/precision.md)."""
    if dtype != "auto":
        return dtype
    facts = cpu_facts()
    return "bfloat16" if facts.native_bf16 and "amx_bf16" not in facts.flags else "float32"
