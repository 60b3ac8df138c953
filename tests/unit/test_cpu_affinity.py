"""`cpu_affinity.keep_off_engine_cores` on real processes: a stand-in replica with a stand-in compute
worker (bound to one core, named as vLLM names it) and a stand-in EngineCore. It runs in a child
process, so the test runner's own affinity is never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.fake_stack import REPO_ROOT

REPLICA = r"""
import json, os, subprocess, sys
import psutil
from app.engine.cpu.affinity import keep_off_engine_cores

compute = int(sys.argv[1])
# A stand-in names itself and binds itself, says so on stdout, and then only stays alive until killed.
named = ("import ctypes, os, sys, time; ctypes.CDLL('libc.so.6').prctl(15, sys.argv[1].encode(), 0, 0, 0); "
         "os.sched_setaffinity(0, {int(c) for c in sys.argv[2].split(',')}); print('ready', flush=True); "
         "time.sleep(60)")
everything = ",".join(map(str, sorted(os.sched_getaffinity(0))))
worker = subprocess.Popen([sys.executable, "-c", named, "VLLM::Worker", str(compute)],
                          stdout=subprocess.PIPE, text=True)
core = subprocess.Popen([sys.executable, "-c", named, "VLLM::EngineCo", everything],
                        stdout=subprocess.PIPE, text=True)
for child in (worker, core):  # both have applied their names and affinity
    assert child.stdout.readline().strip() == "ready"
front = keep_off_engine_cores()
print(json.dumps({"front": sorted(front), "me": sorted(os.sched_getaffinity(0)),
                  "core": sorted(psutil.Process(core.pid).cpu_affinity()),
                  "worker": sorted(psutil.Process(worker.pid).cpu_affinity())}))
for p in (worker, core):
    p.kill()
"""


def _run(compute: int) -> dict:
    out = subprocess.run([sys.executable, "-c", REPLICA, str(compute)], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to set one apart")
def test_the_front_end_moves_off_the_core_the_worker_computes_on():
    cpus = sorted(os.sched_getaffinity(0))
    compute = cpus[0]
    rest = [c for c in cpus if c != compute]
    seen = _run(compute)
    assert seen["front"] == rest
    assert seen["me"] == rest and seen["core"] == rest  # the replica and the EngineCore leave the compute core
    assert seen["worker"] == [compute]  # the worker keeps its binding


COMPUTING_CORE = r"""
import json, os, subprocess, sys
import psutil
from app.engine.cpu.affinity import keep_off_engine_cores

compute = int(sys.argv[1])
# A stand-in EngineCore that computes itself: its main thread bound to the compute core (as OpenMP binds it), and
# a second thread started after, inheriting that binding (as vLLM's input and output threads do).
core_script = ("import os, sys, threading, time; os.sched_setaffinity(0, {int(sys.argv[1])}); "
               "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
               "print('ready', flush=True); time.sleep(60)")
core = subprocess.Popen([sys.executable, "-c", core_script, str(compute)], stdout=subprocess.PIPE, text=True)
assert core.stdout.readline().strip() == "ready"
front = keep_off_engine_cores({compute})
threads = {t.id: sorted(os.sched_getaffinity(t.id)) for t in psutil.Process(core.pid).threads()}
print(json.dumps({"front": sorted(front), "me": sorted(os.sched_getaffinity(0)),
                  "main": threads.pop(core.pid), "others": list(threads.values())}))
core.kill()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to set one apart")
def test_an_engine_core_computing_itself_keeps_its_main_thread_and_lets_the_others_go():
    cpus = sorted(os.sched_getaffinity(0))
    compute = cpus[0]
    rest = [c for c in cpus if c != compute]
    out = subprocess.run([sys.executable, "-c", COMPUTING_CORE, str(compute)], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["front"] == rest and seen["me"] == rest
    assert seen["main"] == [compute]  # the computing thread keeps its core
    assert seen["others"] and all(t == rest for t in seen["others"])  # its other threads leave it
