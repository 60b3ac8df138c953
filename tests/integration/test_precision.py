"""`engine.dtype: auto` (the default config's) resolves on this machine, the engine runs in it, and answers right."""

from __future__ import annotations

import pytest

from app.engine.cpu.core_plan import plan_cores
from app.engine.cpu.precision import resolve_cpu_precision
from tests.support.service import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]


def test_auto_resolves_here_and_the_engine_runs_in_it(service, client):
    expected = resolve_cpu_precision("auto", on_gpu=False)
    assert expected.dtype in ("bfloat16", "float32")  # auto never leaves a CPU engine on vLLM's own 'auto'
    engine = service.stats()["engine"]
    assert engine["dtype"] == expected.dtype
    assert engine["dtype_reason"] == expected.reason
    plan = plan_cores()  # what the replica planned, from the same cores
    assert tuple(engine["compute_cores"]) == plan.compute_cores
    assert tuple(engine["front_end_cores"]) == plan.front_end_cores
    # The start-up line says what was chosen and why, once per engine.
    log = service.log_path.read_text(errors="replace")
    assert f"precision {expected.dtype} ({expected.reason})" in log
    # The model folder is bf16 safetensors; in whichever precision auto chose, greedy decoding answers right.
    reply = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=20,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert reply.choices[0].message.content.strip() == "The capital of France is Paris."
