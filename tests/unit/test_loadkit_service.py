"""loadkit.service: a server started as a process group is stopped by "Ctrl-C" even when this process runs with
SIGINT ignored, and what escaped its group is found by its tag and killed; a Server is ready once it answers (or
says why it is not) and stops leaving nothing; this project's service runs on a config derived from a base one."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from loadkit.service import (
    BASE_CONFIG,
    NotLoopback,
    OwnService,
    ProcessGroup,
    RunningService,
    Server,
    derive_config,
    free_port,
)
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


# -- the service under test -------------------------------------------------------------------------------------

ANSWERING = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, {"ok": True})
        elif self.path == "/v1/models":
            self._send(200, {"data": [{"id": "m"}]})
        else:
            self._send(404, {})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        authorized = self.headers.get("Authorization") == "Bearer k"
        self._send(200 if authorized else 401, {"choices": [{"message": {"content": "hi"}}]})

    def log_message(self, *args):
        pass

print("listening", flush=True)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_a_server_is_ready_when_it_answers_and_stops_leaving_nothing(tmp_path: Path):
    port = free_port()
    server = Server([sys.executable, "-c", ANSWERING, str(port)], port=port, log_path=tmp_path / "log", cwd=tmp_path,
                    sample_peak=True)
    try:
        assert server.wait_ready(30) is None  # /health
        assert server.wait_ready(30, "m", api_key="k") is None  # /v1/models lists it and a chat is answered
        assert server.wait_ready(2, "m").startswith("not ready within 2 s (last: probe chat completion: HTTP 401")
        assert server.sampler.sample() > 0
    finally:
        report = server.stop(sigint_wait_s=20, leftover_wait_s=1)
    assert report.clean and report.how == "stopped by SIGINT", report


def test_a_server_that_dies_while_starting_says_why(tmp_path: Path):
    server = Server([sys.executable, "-c", "raise RuntimeError('no model here')"], port=free_port(),
                    log_path=tmp_path / "log", cwd=tmp_path)
    why = server.wait_ready(30)
    assert why.startswith("exited with status 1 while starting: RuntimeError: no model here"), why
    assert server.stop().clean


def test_a_derived_config_changes_only_what_it_is_told(tmp_path: Path):
    base = yaml.safe_load(BASE_CONFIG.read_text())
    config = derive_config(BASE_CONFIG, 41234, "key", service={"drain_grace_s": 5}, model={"id": "x"},
                           deployment={"max_ongoing_requests": 2}, engine=None)
    assert config["service"] == {**base["service"], "host": "127.0.0.1", "port": 41234, "api_keys": ["key"],
                                 "drain_grace_s": 5}
    model, before = config["models"][0], base["models"][0]
    assert model["id"] == "x" and model["engine"] == before["engine"] and model["limits"] == before["limits"]
    assert model["deployment"] == {**before["deployment"], "max_ongoing_requests": 2}
    assert derive_config(base, 1)["service"]["api_keys"] == [] and base == yaml.safe_load(BASE_CONFIG.read_text())


def test_an_own_service_writes_its_config_in_a_folder_of_its_own(tmp_path: Path):
    service = OwnService(BASE_CONFIG, "probe", work_dir=tmp_path, deployment={"queue_timeout_s": 3})
    written = yaml.safe_load(service.config_path.read_text())
    assert service.config_path.parent.parent == tmp_path and written == service.config
    assert written["service"]["api_keys"] == [service.api_key] and service.api_key.startswith("probe-")
    assert service.base_url == f"http://127.0.0.1:{service.port}" and service.model == "smollm2-135m-instruct"
    assert service.stop() is None and service.leftover() is None  # never started: nothing to stop
    assert OwnService(BASE_CONFIG, "nokey", work_dir=tmp_path, key=False).api_key is None


def test_a_running_service_is_driven_on_loopback_only():
    assert RunningService("http://localhost:9/", "k").base_url == "http://localhost:9"
    with pytest.raises(NotLoopback):
        RunningService("http://10.1.2.3:8000")
