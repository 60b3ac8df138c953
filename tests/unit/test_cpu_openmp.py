"""The OpenMP placement of an EngineCore that computes itself (app/engine/cpu/openmp.py), as vLLM's
multiprocessing executor sets it for its worker, and the engine arguments that make the EngineCore compute."""

from __future__ import annotations

import os

from app.engine.cpu.core_plan import CorePlan
from app.engine.cpu.openmp import openmp_env, spawned_with


def _plan(ranks: tuple[tuple[int, ...], ...], source: str = "vllm-auto") -> CorePlan:
    return CorePlan(ranks, (), (0, 1, 2, 3), source)


def test_gnu_s_placement_unless_another_runtime_is_preloaded():
    # vLLM preloads torch's libgomp before it spawns the EngineCore, so GNU's variables apply with nothing preloaded
    assert openmp_env(_plan(((0, 1, 2),)), environ={}) == {"OMP_NUM_THREADS": "3", "GOMP_CPU_AFFINITY": "0 1 2"}
    gnu = openmp_env(_plan(((0, 1),)), environ={"LD_PRELOAD": "/usr/lib/libgomp.so.1"})
    assert gnu == {"OMP_NUM_THREADS": "2", "GOMP_CPU_AFFINITY": "0 1"}
    intel = openmp_env(_plan(((2,),)), environ={"LD_PRELOAD": "/opt/libiomp5.so:/usr/lib/libtcmalloc.so"})
    assert intel["KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[2]" and intel["OMP_NUM_THREADS"] == "1"
    assert "GOMP_CPU_AFFINITY" not in intel


def test_nothing_is_placed_unbound_or_for_several_workers():
    assert openmp_env(_plan(((0, 1, 2, 3),), source="nobind"), environ={}) == {}
    assert openmp_env(_plan(((0,), (1,))), environ={}) == {}
    assert openmp_env(_plan(((),)), environ={}) == {}


def test_the_environment_is_restored_after_the_spawn(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    monkeypatch.delenv("OMP_PLACES", raising=False)
    with spawned_with({"OMP_NUM_THREADS": "1", "OMP_PLACES": "{0}"}):
        assert (os.environ["OMP_NUM_THREADS"], os.environ["OMP_PLACES"]) == ("1", "{0}")
    assert os.environ["OMP_NUM_THREADS"] == "8" and "OMP_PLACES" not in os.environ


def test_a_cpu_engine_computes_in_its_engine_core_and_a_gpu_engine_keeps_vllm_s_executor():
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    from app.config.app_config import parse_config
    from app.engine.vllm.to_vllm import computes_in_process, engine_args

    cpu, gpu = parse_config({"models": [{"id": "c", "source": "fake"},
                                        {"id": "g", "source": "fake", "deployment": {"num_gpus": 1}}]}).models
    assert computes_in_process(cpu) and not computes_in_process(gpu)
    assert engine_args(cpu, "float32").distributed_executor_backend is UniProcExecutor
    assert engine_args(gpu, "bfloat16").distributed_executor_backend is None  # vLLM's choice on a GPU
