"""CoreClaims: which cores of this host the CPU engines already compute on, so that a second engine on the same host
computes on cores of its own.

vLLM's CPU worker binds its compute threads by the cores it can see, the same way in every process: two engine
replicas on one host (`num_replicas: 2` under `python -m app serve`, or two models) both computed on core 0 of 2
and left core 1 to their front ends. Each engine therefore claims the cores it computes on, with an exclusive
`flock` on one file per core in a folder shared by the host's processes; a later engine plans its binding among the
cores nobody claims (`core_plan.plan_cores(cores=..., explicit=True)`), and falls back to vLLM's own plan, sharing,
when every core is claimed. The kernel drops a claim when its holder exits, however it exits, so a killed replica
leaves nothing to clean up. Pods (KubeRay) have a /tmp of their own and a cpuset: claims never cross them.

The folder is the user's own (in `$XDG_RUNTIME_DIR`, else `/tmp/app-llm-serve-cores-<uid>`, mode 0700): another
user's processes can neither see nor hold it. One not owned by this user is not used (the engine plans as if
alone), and the planning lock is waited for `PLANNING_WAIT_S` at most: nothing stops an engine from starting.

    plan, claim = plan_own_cores(world_size)   # plan.env: for the processes that build the engine only
    ...
    claim.release()                            # at engine shutdown (or the process's exit)
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from app.engine.cpu.core_plan import CorePlan, plan_cores
from app.engine.cpu.facts import format_id_list

log = logging.getLogger(__name__)
PLANNING_WAIT_S = 10.0


def _default_folder() -> Path:
    if os.environ.get("APP_CORE_CLAIMS_DIR"):
        return Path(os.environ["APP_CORE_CLAIMS_DIR"])
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = Path(runtime) if runtime and os.path.isdir(runtime) else Path(tempfile.gettempdir())
    return base / f"app-llm-serve-cores-{os.getuid()}"


CLAIMS_DIR = _default_folder()


class CoreClaim:
    """The open, locked files of the cores one engine computes on."""

    def __init__(self, cores: tuple[int, ...], fds: list[int]):
        self.cores = cores
        self._fds = fds

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)  # closing the file drops its flock
        self._fds = []


class CoreClaims:
    def __init__(self, folder: Path = CLAIMS_DIR):
        self.folder = folder

    @classmethod
    @contextlib.contextmanager
    def planning(cls, folder: Path = CLAIMS_DIR) -> Iterator[CoreClaims | None]:
        """Held while one engine looks at the claims and makes its own: two engines starting at once would both
        see every core free. None: the folder is not this user's (module docstring)."""
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if folder.stat().st_uid != os.getuid():
            log.warning("core claims folder %s belongs to another user: planning this engine's cores as if alone "
                        "(set APP_CORE_CLAIMS_DIR to a folder of your own)", folder)
            yield None
            return
        fd = os.open(folder / ".planning", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            waited_until = time.monotonic() + PLANNING_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= waited_until:
                        log.warning("core claims planning lock in %s held for over %.0f s: planning without it",
                                    folder, PLANNING_WAIT_S)
                        break
                    time.sleep(0.05)
            yield cls(folder)
        finally:
            os.close(fd)

    def _path(self, core: int) -> Path:
        return self.folder / f"core-{core}.lock"

    def held_elsewhere(self, cores: Iterable[int]) -> set[int]:
        """Those of `cores` that a live process has claimed."""
        held = set()
        for core in cores:
            fd = os.open(self._path(core), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.add(core)
            finally:
                os.close(fd)  # also drops the probe's own lock
        return held

    def claim(self, cores: Iterable[int]) -> CoreClaim:
        """Claims `cores` (those already held elsewhere are left out: the engine shares them)."""
        taken, fds = [], []
        for core in sorted(set(cores)):
            fd = os.open(self._path(core), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            taken.append(core)
            fds.append(fd)
        return CoreClaim(tuple(taken), fds)


def plan_own_cores(world_size: int = 1, folder: Path = CLAIMS_DIR) -> tuple[CorePlan, CoreClaim]:
    """vLLM's own plan (`core_plan.plan_cores`) when its compute cores are free; otherwise a plan bound to the cores
    no other engine of this host claims; vLLM's own plan, sharing, when there are none. An operator's
    VLLM_CPU_OMP_THREADS_BIND is honoured as it is. Returns the plan and this engine's claim on its compute cores."""
    with CoreClaims.planning(folder) as claims:
        plan = plan_cores(world_size=world_size)
        if claims is None:
            return plan, CoreClaim((), [])
        if plan.source in ("env", "nobind"):
            return plan, claims.claim(())
        taken = claims.held_elsewhere(plan.usable_cores)
        if taken & set(plan.compute_cores):
            free = [c for c in plan.usable_cores if c not in taken]
            if free:
                own = plan_cores(free, world_size=world_size, explicit=True)
                note = f"cores {format_id_list(sorted(taken))} are computed on by another engine of this host"
                plan = replace(own, notes=(*own.notes, note))
            else:
                warning = (f"every usable core ({format_id_list(plan.usable_cores)}) is computed on by another engine "
                           "of this host: this engine shares them (fewer replicas per host, or more cores)")
                plan = replace(plan, warnings=(*plan.warnings, warning))
        return plan, claims.claim(plan.compute_cores)
