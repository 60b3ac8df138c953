"""Two CPU engines on one host compute on cores of their own (app/engine/cpu/claims.py): claims are real flocks in a
folder, so these tests hold and probe them exactly as two replica processes would (two opens of one file do not
share a flock, in one process or two)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

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


def test_the_claims_folder_is_this_user_s_own():
    """Issue 27: one folder in /tmp for every local user, whose lock another user could hold for ever."""
    from app.engine.cpu.claims import CLAIMS_DIR

    assert str(os.getuid()) in CLAIMS_DIR.name or os.environ.get("APP_CORE_CLAIMS_DIR")


def test_a_planning_lock_held_elsewhere_delays_an_engine_by_a_bounded_time_not_for_ever(tmp_path, on_cores,
                                                                                         monkeypatch):
    import fcntl

    on_cores(2)
    monkeypatch.setattr(core_claims, "PLANNING_WAIT_S", 0.2)
    fd = os.open(tmp_path / ".planning", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process holds it and never lets go
    lock_holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(fd,))
    os.close(fd)
    try:
        plan, claim = plan_own_cores(folder=tmp_path)  # returns: the wait is bounded
        assert plan.compute_cores and claim.cores == plan.compute_cores
        claim.release()
    finally:
        lock_holder.kill()
        lock_holder.wait()


def test_a_folder_that_is_not_this_user_s_is_not_used(tmp_path, on_cores, monkeypatch):
    on_cores(2)
    real_stat = Path.stat

    def owned_by_someone_else(self, *args, **kwargs):
        st = real_stat(self, *args, **kwargs)
        if self == tmp_path:
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, os.getuid() + 1, *tuple(st)[5:]))
        return st

    monkeypatch.setattr(Path, "stat", owned_by_someone_else)
    plan, claim = plan_own_cores(folder=tmp_path)
    assert plan.compute_cores and claim.cores == () and not (tmp_path / ".planning").exists()
