"""loadkit.service: a server started as a process group is stopped by "Ctrl-C" even when this process runs with
SIGINT ignored, and what escaped its group is found by its tag and killed."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import psutil

from loadkit.service import ProcessGroup, free_port
from loadkit.waiting import wait_until

SERVER = """
import signal, subprocess, sys, time
print("sigint", signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
# What a leftover engine looks like: its own session (out of reach of the group's signals), deaf to both.
escapee = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN);"
                            " signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"],
                           start_new_session=True)
print("escapee", escapee.pid, flush=True)
time.sleep(120)
"""


def test_ctrl_c_stops_the_group_and_the_escaped_leftover_is_killed(tmp_path: Path):
    log = tmp_path / "server.log"
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under a non-interactive shell's `cmd &`
    try:
        group = ProcessGroup([sys.executable, "-c", SERVER], cwd=tmp_path, log_path=log)
    finally:
        signal.signal(signal.SIGINT, before)
    assert wait_until(lambda: "up" in log.read_text(), timeout_s=30, gave_up=lambda: not group.running())
    assert "sigint True" in log.read_text()  # SIGINT was given back its default in the child
    escapee = int(log.read_text().split("escapee ", 1)[1].split()[0])
    assert psutil.Process(escapee).ppid() == group.pid

    report = group.stop(sigint_wait_s=20, leftover_wait_s=1)
    assert report.how == "stopped by SIGINT", report
    assert report.returncode == -signal.SIGINT  # KeyboardInterrupt, not a SIGKILL
    assert len(report.killed) == 1 and report.killed[0].startswith(str(escapee)), report
    assert not report.still_alive
    assert "1 process(es) still alive" in report.text(1)
    assert not psutil.pid_exists(escapee) or psutil.Process(escapee).status() == psutil.STATUS_ZOMBIE


def test_a_server_that_exits_by_itself_leaves_a_clean_report(tmp_path: Path):
    group = ProcessGroup([sys.executable, "-c", "print('bye')"], cwd=tmp_path, log_path=tmp_path / "log")
    assert wait_until(lambda: not group.running(), timeout_s=30)
    report = group.stop()
    assert report.clean and report.returncode == 0
    assert report.text() == "exited by itself before the stop; no process left behind"
    assert group.log_tail() == "bye\n"


def test_free_ports_are_never_the_services_default():
    assert all(free_port() != 8000 for _ in range(20))
