"""`loadkit.proctree` finds an engine's EngineCore under its replica, titled by vLLM or not yet (CI found one of two
serving engines still titled as the multiprocessing child its replica spawned). A stand-in replica titles itself
as Ray titles a Serve replica and spawns its stand-in engine through `multiprocessing` (spawn, as vLLM does on the
CPU), which starts the resource tracker beside it: that one is never taken for the engine."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from loadkit.proctree import engine_core_of, role_of
from loadkit.waiting import wait_until
from tests.support.fake_stack import REPO_ROOT

REPLICA = r"""
import multiprocessing, sys, time
import setproctitle

def engine(title):
    if title:
        setproctitle.setproctitle(title)
    time.sleep(60)

if __name__ == "__main__":
    setproctitle.setproctitle("ray::ServeReplica:llm:engine")
    ctx = multiprocessing.get_context("spawn")
    ctx.SimpleQueue()  # starts the resource tracker, as vLLM's own queues and locks do
    child = ctx.Process(target=engine, args=(sys.argv[1],), daemon=True)
    child.start()
    print(child.pid, flush=True)
    time.sleep(60)
"""


@pytest.fixture(params=["VLLM::EngineCore", ""], ids=["titled", "untitled"])
def replica(request, tmp_path):
    script = tmp_path / "replica.py"
    script.write_text(REPLICA)
    proc = subprocess.Popen([sys.executable, str(script), request.param], stdout=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT)
    try:
        engine_pid = int(proc.stdout.readline())
        yield psutil.Process(proc.pid), engine_pid, request.param
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait(timeout=30)


def test_the_engine_core_is_found_under_its_replica_titled_or_not(replica):
    process, engine_pid, title = replica
    # Waited for: the child's own command line (multiprocessing's spawn entry) once it has exec'd, on a loaded machine
    # not yet at the first look; its title once it runs, as a real engine sets it after its imports.
    shown = title or "spawn_main"
    wait_until(lambda: shown in " ".join(psutil.Process(engine_pid).cmdline()), timeout_s=30)
    core = engine_core_of(process)
    assert core is not None and core.pid == engine_pid
    assert role_of(core, root_pid=None) == "vLLM EngineCore"
    others = [p for p in process.children() if p.pid != engine_pid]
    assert others and all(role_of(p, root_pid=None) != "vLLM EngineCore" for p in others)  # the resource tracker


def test_a_process_with_no_engine_under_it_has_none():
    lone = subprocess.Popen(["sleep", "60"])
    try:
        assert engine_core_of(psutil.Process(lone.pid)) is None
    finally:
        lone.kill()
        lone.wait(timeout=30)
