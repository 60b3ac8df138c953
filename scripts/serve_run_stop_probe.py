"""`serve run configs/serve-cpu.yaml` stopped as a user stops it: what is left of vLLM's processes afterwards?

Starts Ray's own CLI on the default Serve config, waits until `/health` answers, then stops it in one of two ways:
`--stop ctrl-c` types Ctrl-C into the pseudo-terminal it runs in (the kernel sends SIGINT to the terminal's
foreground process group, as in a shell), `--stop sigterm` sends SIGTERM to its process alone (what `kill <pid>`
or `docker stop` does), `--stop sigterm-all` to every process of its session at once (what systemd's default
`KillMode=control-group` does). Prints how long it took to exit and the vLLM processes (`VLLM::...`) left 5 s and 30 s
after; any left are then killed, with the rest of its session.

    .venv/bin/python scripts/serve_run_stop_probe.py [--stop ctrl-c|sigterm|sigterm-all]

Run it from the repository root with nothing listening on port 8000 (the config's port).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pty
import select
import signal
import time

import httpx
import psutil

HEALTH = "http://127.0.0.1:8000/health"


def _in_session(session: int) -> list[psutil.Process]:
    """The processes still in `session` (the pty child's: serve run, Ray and the replicas' vLLM processes)."""
    def sid_of(pid: int) -> int | None:
        with contextlib.suppress(OSError):
            return os.getsid(pid)
        return None
    return [p for p in psutil.process_iter(["cmdline"]) if sid_of(p.pid) == session]


def _vllm_processes(session: int) -> list[psutil.Process]:
    return [p for p in _in_session(session) if any("VLLM::" in part for part in p.info["cmdline"] or [])]


def _signal_all(processes: list[psutil.Process], kill: bool) -> None:
    for p in processes:
        with contextlib.suppress(psutil.Error):
            (p.kill if kill else p.terminate)()


def _read(fd: int, seconds: float) -> None:
    """Keeps the terminal's output flowing (a full pty would block the writer)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                os.read(fd, 65536)
            except OSError:
                return


def _healthy() -> bool:
    try:
        return httpx.get(HEALTH, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stop", choices=("ctrl-c", "sigterm", "sigterm-all"), default="ctrl-c")
    parser.add_argument("--startup-timeout", type=float, default=300)
    args = parser.parse_args()

    pid, fd = pty.fork()  # the child leads a new session whose controlling terminal is this pty
    if pid == 0:
        os.execv(".venv/bin/serve", [".venv/bin/serve", "run", "configs/serve-cpu.yaml"])
    started = time.monotonic()
    while not _healthy():
        _read(fd, 2)
        if time.monotonic() - started > args.startup_timeout:
            raise SystemExit("serve run did not become healthy")
    print(f"serving after {time.monotonic() - started:.0f} s; vLLM processes: {len(_vllm_processes(pid))}", flush=True)

    stopped = time.monotonic()
    if args.stop == "ctrl-c":
        os.write(fd, b"\x03")
    elif args.stop == "sigterm":
        os.kill(pid, signal.SIGTERM)
    else:
        _signal_all(_in_session(pid), kill=False)
    status = None
    while time.monotonic() - stopped < 120:
        _read(fd, 1)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
    print(f"serve run exited {time.monotonic() - stopped:.0f} s after {args.stop} (wait status {status})", flush=True)
    for wait_s in (5, 25):
        time.sleep(wait_s)
        left = _vllm_processes(pid)
        print(f"{time.monotonic() - stopped:.0f} s after: vLLM processes left: "
              f"{[(p.pid, p.info['cmdline'][0]) for p in left]}", flush=True)
    _signal_all(_in_session(pid), kill=True)  # whatever the probe's run left, by its session


if __name__ == "__main__":
    main()
