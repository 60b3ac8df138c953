"""Two CPU engines on one host compute on cores of their own (app/engine/cpu/claims.py): claims are real flocks in a
folder, so these tests hold and probe them exactly as two replica processes would (two opens of one file do not
share a flock, in one process or two)."""

from __future__ import annotations

import functools

import pytest

from app.engine.cpu import claims as core_claims
from app.engine.cpu.claims import CoreClaims, plan_own_cores
from app.engine.cpu.core_plan import plan_cores
from app.engine.cpu.facts import CpuTopology


@pytest.fixture
def on_cores(monkeypatch):
    """plan_cores on a made-up flat host of `n` cores (x86, no operator binding), whatever this machine is."""
    def use(n: int) -> None:
        fake = functools.partial(plan_cores, topology=CpuTopology.flat(range(n)), arch="x86_64", environ={})
        monkeypatch.setattr(core_claims, "plan_cores", fake)
    return use


def test_a_claim_is_seen_by_others_until_it_is_released(tmp_path):
    claims = CoreClaims(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    claim = claims.claim([0, 1])
    assert claim.cores == (0, 1)
    assert claims.held_elsewhere([0, 1, 2]) == {0, 1}
    assert claims.claim([1, 2]).cores == (2,)  # 1 is someone else's: only 2 is taken
    claim.release()
    assert claims.held_elsewhere([0, 1]) == set()


def test_the_first_engine_keeps_vllms_plan_and_the_second_computes_on_the_free_core(tmp_path, on_cores):
    on_cores(2)
    first_plan, first = plan_own_cores(folder=tmp_path)
    assert first_plan.compute_cores == (0,) and first_plan.source == "vllm-auto"  # vLLM's: compute 0, front end 1
    second_plan, second = plan_own_cores(folder=tmp_path)
    assert second_plan.compute_cores == (1,) and second_plan.source == "explicit"
    assert second_plan.env == {"VLLM_CPU_OMP_THREADS_BIND": "1"}
    assert any("another engine" in note for note in second_plan.notes)
    assert (first.cores, second.cores) == ((0,), (1,))
    third_plan, third = plan_own_cores(folder=tmp_path)  # no core left: vLLM's own plan, shared, and said
    assert third_plan.compute_cores == (0,) and third.cores == ()
    assert any("shares them" in w for w in third_plan.warnings)
    first.release()
    again, claim = plan_own_cores(folder=tmp_path)  # a released (or exited) engine's cores are free again
    assert again.compute_cores == (0,) and claim.cores == (0,)


def test_on_four_cores_the_second_engine_gets_the_three_left(tmp_path, on_cores):
    on_cores(4)
    first_plan, _first = plan_own_cores(folder=tmp_path)
    assert first_plan.compute_cores == (0, 1, 2)  # vLLM keeps the last core for the front end
    second_plan, _second = plan_own_cores(folder=tmp_path)
    assert second_plan.compute_cores == (3,)
