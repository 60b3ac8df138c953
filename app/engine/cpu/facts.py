"""The CPU's facts, read once: architecture, model name, feature flags, usable cores and their topology.

Parsers take text (a /proc/cpuinfo, a cpulist) so tests can feed them any machine; `read_*` read this one.
`classify_isa` names what the flags say about bf16, the one thing the precision decision needs from them.
"""

from __future__ import annotations

import glob
import os
import platform
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

# What the flags say about bf16 on this CPU, best first. Linux names the x86 flags in /proc/cpuinfo's `flags`
# line (avx512f, avx512_bf16, amx_bf16, ...) and the ARM ones in its `Features` line (asimd, sve, bf16, ...).
Isa = Literal[
    "amx",              # x86 AMX-BF16 tiles: vLLM's "amx" attention ISA and AMX GEMM kernels (bf16 only)
    "avx512_bf16",      # x86 AVX-512 with VDPBF16PS: native bf16 dot products (Zen 4/5, Cooper Lake, SPR)
    "avx512",           # x86 AVX-512 without bf16 instructions (Skylake-X, Cascade Lake, Ice Lake): bf16 converted
    "avx2_ne_convert",  # x86 AVX2 with AVX-NE-CONVERT (Sierra Forest, Arrow Lake): bf16 converts, no AVX-512
    "avx2",             # x86 AVX2 only (Zen 1-3, Haswell..Alder Lake): bf16 emulated: 5-9x slower here
    "x86_old",          # x86 without AVX2: below what vLLM's CPU kernels are built for (_C_AVX2 is the floor)
    "arm_bf16",         # aarch64 with FEAT_BF16 (BFMMLA/BFDOT: Neoverse V1/V2/N2, Graviton 3/4)
    "arm_neon",         # aarch64 with NEON (asimd) only (Neoverse N1, Graviton 2, Ampere Altra)
    "unknown",          # no flags to read (no /proc/cpuinfo, macOS) or an architecture not handled here
]



@dataclass(frozen=True)
class CpuFacts:
    arch: str                 # platform.machine(), normalised: "x86_64", "aarch64", or as given ("ppc64le", ...)
    model: str                # "AMD EPYC", "Intel(R) Xeon(R) Platinum 8480+", "ARM part 0xd40", "unknown"
    flags: frozenset[str]     # lower-case feature names from /proc/cpuinfo; empty when there is none
    cores: tuple[int, ...]    # CPUs this process may run on (os.sched_getaffinity(0)), sorted

    @property
    def is_x86(self) -> bool:
        return self.arch == "x86_64"

    @property
    def is_arm(self) -> bool:
        return self.arch == "aarch64"


def normalise_arch(machine: str) -> str:
    m = machine.strip().lower()
    if m in ("x86_64", "amd64", "x64", "i386", "i686"):
        return "x86_64"
    if m in ("aarch64", "arm64", "armv8l"):
        return "aarch64"
    return m or "unknown"


def _first_field(cpuinfo: str, names: tuple[str, ...]) -> str | None:
    """The value of the first line whose key is one of `names` (case-insensitive); /proc/cpuinfo repeats every
    key once per CPU, and every CPU of one machine reports the same features."""
    wanted = {n.lower() for n in names}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in wanted:
            return value.strip()
    return None


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """Feature flags from /proc/cpuinfo text: x86's `flags` line, or ARM's `Features` line."""
    value = _first_field(cpuinfo, ("flags", "features"))
    return frozenset(value.lower().split()) if value else frozenset()


def parse_model_name(cpuinfo: str) -> str:
    """The CPU's name: x86's `model name`; on ARM, which has none, the implementer and part numbers."""
    name = _first_field(cpuinfo, ("model name", "cpu model", "cpu", "hardware"))
    if name:
        return re.sub(r"\s+", " ", name)
    part = _first_field(cpuinfo, ("cpu part",))
    if part:
        implementer = _first_field(cpuinfo, ("cpu implementer",)) or "?"
        return f"ARM implementer {implementer} part {part}"
    return "unknown"


def _usable_cores() -> tuple[int, ...]:
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def read_cpu_facts(cpuinfo: str | None = None, machine: str | None = None,
                   cores: Iterable[int] | None = None) -> CpuFacts:
    """This machine's facts; any of them may be given instead (tests, `check-config` for another host)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    return CpuFacts(
        arch=normalise_arch(platform.machine() if machine is None else machine),
        model=parse_model_name(cpuinfo),
        flags=parse_cpu_flags(cpuinfo),
        cores=tuple(sorted(set(cores))) if cores is not None else _usable_cores(),
    )


def classify_isa(facts: CpuFacts) -> Isa:
    """The same flags vLLM's CPU backend keys on (through torch.cpu's cpuinfo: `_is_amx_tile_supported`,
    `_is_avx512_bf16_supported`, `_is_avx512_supported`; `get_capabilities()["bf16"]` on ARM).

    Not `torch.backends.cpu.get_cpu_capability()`: it names ATen's vector dispatch level ("AVX2", "AVX512",
    "SVE256", "DEFAULT"...), which is "AVX512" on Ice Lake (no bf16) and on Zen 4 (bf16) alike, and which
    ATEN_CPU_CAPABILITY can lower; it is logged with the micro-benchmark, not decided on."""
    f = facts.flags
    if facts.is_x86 and f:
        if "amx_bf16" in f:
            return "amx"
        if "avx512_bf16" in f:
            return "avx512_bf16"
        if "avx512f" in f:
            return "avx512"  # vLLM loads its _C_AVX512 build here (platforms/cpu.py `import_kernels`)
        if "avx2" in f:
            return "avx2_ne_convert" if "avx_ne_convert" in f else "avx2"  # vLLM loads _C_AVX2
        return "x86_old"
    if facts.is_arm and f:
        if "bf16" in f:
            return "arm_bf16"
        if "asimd" in f:
            return "arm_neon"
    return "unknown"


class LogicalCpu(NamedTuple):
    id: int
    core: int   # physical core key: CPUs sharing it are SMT siblings
    node: int   # NUMA node


@dataclass(frozen=True)
class CpuTopology:
    cpus: tuple[LogicalCpu, ...]   # the usable CPUs only
    mem_nodes: tuple[int, ...]     # NUMA memory nodes this process may allocate on, as vLLM sees them

    @classmethod
    def flat(cls, cores: Iterable[int]) -> CpuTopology:
        """One NUMA node, no SMT: each CPU its own core (what most VMs and containers look like)."""
        return cls(tuple(LogicalCpu(c, c, 0) for c in sorted(set(cores))), (0,))


def parse_id_list(text: str) -> list[int]:
    """'0-2,4,7-8' -> [0, 1, 2, 4, 7, 8], as vLLM's `cpu_resource_utils.parse_id_list`."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        out.update(range(int(lo), int(hi) + 1) if sep else (int(lo),))
    return sorted(out)


def format_id_list(ids: Iterable[int]) -> str:
    """[0, 1, 2, 4] -> '0-2,4' (vLLM's VLLM_CPU_OMP_THREADS_BIND syntax)."""
    s = sorted(set(ids))
    runs: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        runs.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(runs)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def read_topology(cores: Iterable[int] | None = None, *, sys_root: str = "/sys", status: str | None = None,
                  environ: Mapping[str, str] | None = None) -> CpuTopology:
    """Cores, SMT siblings and NUMA nodes from sysfs, and the memory nodes vLLM will consider (Mems_allowed_list of
    /proc/self/status, narrowed by CPU_VISIBLE_MEMORY_NODES as vllm/utils/cpu_resource_utils.py
    `get_visible_memory_node` does). vLLM reads the same facts through `lscpu --json --extended=CPU,CORE,NODE`."""
    env = os.environ if environ is None else environ
    usable = sorted(set(cores)) if cores is not None else list(_usable_cores())
    node_of: dict[int, int] = {}
    for path in glob.glob(f"{sys_root}/devices/system/node/node[0-9]*/cpulist"):
        node = int(re.findall(r"node(\d+)/cpulist$", path)[0])
        for cpu in parse_id_list(_read(path) or ""):
            node_of[cpu] = node
    cpus: list[LogicalCpu] = []
    for cpu in usable:
        siblings = parse_id_list(_read(f"{sys_root}/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") or "")
        cpus.append(LogicalCpu(cpu, min(siblings) if siblings else cpu, node_of.get(cpu, 0)))
    if status is None:
        status = _read("/proc/self/status") or ""
    mems_line = _first_field(status, ("mems_allowed_list",))
    mem_nodes = parse_id_list(mems_line) if mems_line else sorted({c.node for c in cpus} or {0})
    visible = env.get("CPU_VISIBLE_MEMORY_NODES", "")
    if visible and "VLLM_CPU_SIM_MULTI_NUMA" not in env:
        mem_nodes = [n for n in (int(v) for v in visible.split(",") if v.strip()) if n in mem_nodes]
    return CpuTopology(tuple(cpus), tuple(mem_nodes))
