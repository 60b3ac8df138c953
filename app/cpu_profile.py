"""What the engine computes in, and on which cores, on a CPU host: decided once at start, logged in one line.

vLLM's CPU backend accepts bfloat16, float16 and float32 on every x86/ARM CPU, but only some CPUs compute in
bfloat16 natively. Elsewhere it is emulated, and the service's old default (`dtype: bfloat16`) cost a factor of
four: 26 vs 110 output tokens/s at 16 concurrent requests on an AVX2-only AMD EPYC (docs/precision.md). vLLM's own
`auto` does not help on a CPU: it keeps the checkpoint's dtype (bf16 for the default model) whatever the CPU can do
(vllm/config/model.py `_resolve_auto_dtype`), so on a CPU `auto` must become a concrete dtype here.

Public API (no vLLM import anywhere; torch only inside `measure_matmul`, and only when it runs):

    resolve_cpu_precision(requested: str, on_gpu: bool, *, facts: CpuFacts | None = None,
                          measure: Callable[[], MatmulBenchmark] | None = None) -> PrecisionChoice
        `requested` is `engine.dtype` ("auto", "bfloat16", "float16", "float32"; vLLM's "half"/"float" too).
        On a GPU it returns `requested` untouched ("auto" stays vLLM's own choice) without reading anything.
        On a CPU it reads the CPU's facts (unless given) and calls `choose_dtype`. Pass `choice.dtype` to
        `AsyncEngineArgs(dtype=...)`; log `choice.warning` at WARNING when it is not None.
    plan_cores(cores: Iterable[int] | None = None, *, topology: CpuTopology | None = None, arch: str | None = None,
               world_size: int = 1, environ: Mapping[str, str] | None = None, explicit: bool = False) -> CorePlan
        Which cores vLLM's CPU worker will compute on and which are left to the front end (this replica, the
        EngineCore, Ray). Set `plan.env` in os.environ before building the engine (usually empty: vLLM's own
        binding is what we want); log each of `plan.warnings` at WARNING. Call it in the process that builds the
        engine, before `app.cpu_affinity.keep_off_engine_cores` narrows that process's affinity: the EngineCore
        inherits the affinity and vLLM binds within it.
    describe(choice: PrecisionChoice, plan: CorePlan | None, kv_cache_gib: float | None,
             kv_cache_tokens: int | None = None) -> str
        The start-up line: precision and why, compute cores, front-end cores, KV cache size.

Lower level, for tests and for `check-config`: `read_cpu_facts`, `parse_cpu_flags`, `parse_model_name`,
`classify_isa`, `choose_dtype`, `measure_matmul`, `read_topology`, `parse_id_list`.
"""

from __future__ import annotations

import glob
import logging
import os
import platform
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

log = logging.getLogger(__name__)

# vLLM's spellings (vllm/config/model.py `_STR_DTYPE_TO_TORCH_DTYPE`) -> ours.
_ALIASES: dict[str, str] = {"auto": "auto", "half": "float16", "float": "float32",
                            "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}

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

# AVX-512 without bf16 instructions, or AVX2 with bf16 conversions only: oneDNN runs bf16 by converting to fp32,
# so bf16 may or may not beat fp32 there (half the bytes to read, extra conversions). Flags cannot tell; a start-up
# micro-benchmark does. bf16 is taken when it reaches this share of float32's one-thread linear-layer throughput: a
# judgement, not a measured optimum. Below it the compute-bound steps (prefill, batched decode) lose more than the
# halved weight/KV traffic wins back; on this AVX2 EPYC the share is 0.11-0.20 (docs/precision.md), far below.
BF16_MIN_RATIO = 0.7

# On which CPUs float16 is native. vLLM 0.32 accepts float16 on every x86/ARM CPU (vllm/platforms/cpu.py
# `CpuPlatform.supported_dtypes`: "x86/aarch64 CPU has supported both bf16 and fp16 natively"), and its attention
# backend takes it (vllm/v1/attention/backends/cpu_attn.py `supported_dtypes`). But on x86 only AVX512-FP16 /
# AMX-FP16 compute in it: vLLM gates its own fp16 GEMM on `_is_amx_fp16_supported` (layers/utils.py
# `check_cpu_sgl_kernel`), its oneDNN linear could not even be created for fp16 or bf16 on this AVX2 CPU (it falls
# back to torch), and its Zen platform drops fp16 ("AMD CPUs do not support float16 compute", platforms/zen_cpu.py).
# Measured here: float16 linear 11 GFLOPS vs float32 84. Where it is native, bf16 is native too (SPR has AMX-BF16)
# and keeps bf16 checkpoints' range, which float16 (max 65504) does not: vLLM refuses float16 for gemma2/3 and glm4
# for numerical instability (config/model.py `_FLOAT16_NOT_SUPPORTED_MODELS`). So `auto` never picks float16; asked
# for explicitly it is honoured, with a warning where it is not native.
_X86_FP16_FLAGS = frozenset({"avx512_fp16", "amx_fp16"})
_ARM_FP16_FLAGS = frozenset({"asimdhp"})  # NEON half-precision arithmetic (FEAT_FP16)

_NATIVE_BF16: frozenset[Isa] = frozenset({"amx", "avx512_bf16", "arm_bf16"})
_MEASURED: frozenset[Isa] = frozenset({"avx512", "avx2_ne_convert"})
_SLOW_BF16: frozenset[Isa] = frozenset({"avx2", "x86_old", "arm_neon"})

_WHY: dict[Isa, str] = {
    "amx": "AMX-BF16: vLLM's AMX kernels compute in bf16",
    "avx512_bf16": "AVX-512 BF16: native bf16 dot products",
    "avx512": "AVX-512 without BF16: bf16 is converted to fp32 to compute",
    "avx2_ne_convert": "AVX2 with AVX-NE-CONVERT, no AVX-512: bf16 is converted to fp32 to compute",
    "avx2": "AVX2 without AVX-512 BF16/AMX: bf16 is emulated (5-9x slower than fp32 in one-thread linear, EPYC)",
    "x86_old": "no AVX2: bf16 is emulated",
    "arm_bf16": "ARM BF16 (BFMMLA): native bf16",
    "arm_neon": "ARM NEON without BF16: bf16 is emulated",
    "unknown": "CPU features unknown",
}


# ---------------------------------------------------------------------------------------------------------------
# The CPU's facts


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


# ---------------------------------------------------------------------------------------------------------------
# The micro-benchmark


@dataclass(frozen=True)
class MatmulBenchmark:
    """One-thread throughput of a linear layer (x @ w.T, the layout vLLM's CPU linear layers use) per dtype."""

    shape: tuple[int, int, int]            # (m, k, n): x is m x k, w is n x k
    gflops: Mapping[str, float]            # dtype -> best-of-samples GFLOPS
    samples: Mapping[str, int]             # dtype -> timed calls
    elapsed_ms: float                      # everything, warm-ups and tensor set-up included
    capability: str | None = None          # torch.backends.cpu.get_cpu_capability(), for the log

    def ratio(self, dtype: str, base: str = "float32") -> float:
        return self.gflops[dtype] / self.gflops[base] if self.gflops.get(base) else 0.0

    def summary(self) -> str:
        m, k, n = self.shape
        figures = ", ".join(f"{d} {g:.1f}" for d, g in self.gflops.items())
        cap = f", torch {self.capability}" if self.capability else ""
        return f"one-thread linear {m}x{k}x{n}: {figures} GFLOPS ({self.elapsed_ms:.0f} ms{cap})"


# A runner turns a dtype name into a zero-argument call doing one linear of the benchmark's shape.
Runner = Callable[[str], Callable[[], object]]


def _torch_runner(m: int, k: int, n: int) -> tuple[Runner, Callable[[], None], str | None]:
    import torch  # lazily: only a CPU start that needs to measure pays for it (the replica imports it for vLLM)

    gen = torch.Generator().manual_seed(0)  # never touch the global RNG the engine's seed governs
    x32 = torch.randn(m, k, generator=gen)
    w32 = torch.randn(n, k, generator=gen)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # one core's speed: flags decide per core, and this must not fight for the others

    def runner(dtype: str) -> Callable[[], object]:
        dt = getattr(torch, dtype)
        x, w = x32.to(dt), w32.to(dt)
        # F.linear, not torch.mm(a, b): with a non-transposed b, bf16 mm on this AVX2 CPU ran at 0.9 GFLOPS, with
        # the weight transposed as in a linear layer at 10; vLLM computes linear layers (oneDNN, else F.linear).
        return lambda: torch.nn.functional.linear(x, w)

    def restore() -> None:
        torch.set_num_threads(previous)

    return runner, restore, torch.backends.cpu.get_cpu_capability()


def _nothing() -> None:
    pass


def measure_matmul(dtypes: Iterable[str] = ("float32", "bfloat16"), *, m: int = 32, k: int = 256, n: int = 256,
                   repeats: int = 3, budget_s: float = 0.025, timer: Callable[[], float] = time.perf_counter,
                   runner: Runner | None = None) -> MatmulBenchmark:
    """Best-of-`repeats` one-thread GFLOPS per dtype, after one warm-up call (the only sample if it alone spends
    the budget).

    Bounded: a dtype stops being sampled once `budget_s` is spent on it, so one dtype costs at most the budget plus
    one call. 32x256x256 is 4.2 MFLOP: 0.07 ms in float32 and 0.6 ms in bf16 on this AVX2 EPYC; even at the 0.3
    GFLOPS the issue saw for bf16 a call is 14 ms, so two dtypes stay under about 80 ms. `runner` replaces torch
    (tests: a fake clock that the fake call advances)."""
    restore: Callable[[], None] = _nothing
    capability: str | None = None
    if runner is None:
        import torch  # noqa: F401  (imported before the clock starts: about 2 s cold, free once vLLM has it)

        start = timer()
        runner, restore, capability = _torch_runner(m, k, n)
    else:
        start = timer()
    flop = 2.0 * m * k * n
    gflops: dict[str, float] = {}
    samples: dict[str, int] = {}
    try:
        for dtype in dtypes:
            call = runner(dtype)
            t0 = timer()
            call()  # warm-up: oneDNN builds its kernel on the first call
            t1 = timer()
            times: list[float] = []
            spent = t1 - t0
            while len(times) < repeats and spent < budget_s:
                a = timer()
                call()
                b = timer()
                times.append(b - a)
                spent += b - a
            best = min(times) if times else t1 - t0  # a warm-up already over budget is the only sample: slow enough
            gflops[dtype] = flop / max(best, 1e-9) / 1e9
            samples[dtype] = len(times) or 1
    finally:
        restore()
    return MatmulBenchmark(shape=(m, k, n), gflops=gflops, samples=samples,
                           elapsed_ms=(timer() - start) * 1e3, capability=capability)


# ---------------------------------------------------------------------------------------------------------------
# The precision decision


@dataclass(frozen=True)
class PrecisionChoice:
    dtype: str                               # what to hand vLLM: "bfloat16" | "float16" | "float32" | "auto" (GPU)
    reason: str                              # why, for the start-up line
    warning: str | None = None               # log at WARNING when set
    measured: bool = False                   # decided by the micro-benchmark
    benchmark: MatmulBenchmark | None = None  # its figures, when it ran


def _normalise_requested(requested: str) -> str:
    key = requested.strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"unknown dtype {requested!r}: use one of auto, bfloat16, float16, float32")
    return _ALIASES[key]


def _fp16_native(facts: CpuFacts) -> bool:
    if facts.is_x86:
        return bool(facts.flags & _X86_FP16_FLAGS)
    if facts.is_arm:
        return bool(facts.flags & _ARM_FP16_FLAGS)
    return False


def _explicit(dtype: str, facts: CpuFacts, isa: Isa) -> PrecisionChoice:
    """An explicit dtype is always honoured; the warning says when this CPU is known to be slow in it."""
    where = f"{facts.model}: {_WHY[isa]}"
    warning: str | None = None
    if dtype == "bfloat16" and isa in _SLOW_BF16:
        warning = (f"engine.dtype bfloat16 on a CPU without native bf16 ({where}); expect several times lower "
                   "throughput than float32 (26 vs 110 tok/s at 16 concurrent requests on an AVX2-only EPYC); "
                   "set engine.dtype: auto or float32")
    elif dtype == "bfloat16" and isa == "unknown":
        warning = "engine.dtype bfloat16 on a CPU whose features could not be read: it may be emulated and slow"
    elif dtype == "float16" and not _fp16_native(facts):
        warning = (f"engine.dtype float16 on a CPU without native fp16 compute ({facts.model}; no AVX512-FP16/AMX-FP16 "
                   "on x86, no asimdhp on ARM): emulated (11 vs 84 GFLOPS float32 in one-thread linear on an AVX2 "
                   "EPYC), and bf16 checkpoints may overflow its range; set engine.dtype: auto")
    elif dtype == "float32" and isa in _NATIVE_BF16:
        warning = (f"engine.dtype float32 on a CPU with native bf16 ({where}): slower than bfloat16 and twice the "
                   "memory for weights and KV cache; set engine.dtype: auto unless float32 is needed for accuracy")
    return PrecisionChoice(dtype=dtype, reason=f"as configured ({where})", warning=warning)


def choose_dtype(requested: str, facts: CpuFacts, *, on_gpu: bool = False,
                 measure: Callable[[], MatmulBenchmark] | None = None) -> PrecisionChoice:
    """The dtype to hand vLLM. `measure` runs only when the flags leave bf16-vs-fp32 open (default:
    `measure_matmul`); tests inject a fake."""
    wanted = _normalise_requested(requested)
    if on_gpu:
        if wanted == "auto":
            return PrecisionChoice(dtype="auto", reason="on a GPU: leave it to vLLM (the checkpoint's dtype)")
        return PrecisionChoice(dtype=wanted, reason="as configured (GPU)")
    isa = classify_isa(facts)
    if wanted != "auto":
        return _explicit(wanted, facts, isa)
    where = f"{facts.model}: {_WHY[isa]}"
    if isa in _NATIVE_BF16:
        return PrecisionChoice(dtype="bfloat16", reason=where)
    if isa == "avx2" or isa == "arm_neon":
        return PrecisionChoice(dtype="float32", reason=f"{where}; float32 is faster")
    if isa == "x86_old":
        return PrecisionChoice(dtype="float32", reason=where, warning=(
            f"{facts.model} has no AVX2, the least vLLM's CPU kernels are built for (_C_AVX2): the engine may not "
            "start; float32 chosen"))
    if isa in _MEASURED:
        try:
            bench = (measure or measure_matmul)()
            ratio = bench.ratio("bfloat16")
        except Exception as err:  # an optimisation only: never fail a start over it
            return PrecisionChoice(dtype="float32", reason=f"{where}; micro-benchmark failed", warning=(
                f"could not measure bf16 against float32 ({err!r}); float32 chosen, the safe choice"))
        dtype = "bfloat16" if ratio >= BF16_MIN_RATIO else "float32"
        reason = f"{where}; measured {bench.summary()}: bf16/fp32 {ratio:.2f} (bf16 from {BF16_MIN_RATIO})"
        log.info("precision micro-benchmark: %s -> %s", bench.summary(), dtype)
        return PrecisionChoice(dtype=dtype, reason=reason, measured=True, benchmark=bench)
    flags = " ".join(sorted(facts.flags)[:12]) or "none"
    return PrecisionChoice(dtype="float32", reason=f"{facts.model} ({facts.arch}): CPU features not recognised",
                           warning=(f"cannot tell from this CPU's features (arch {facts.arch}, flags: {flags}) "
                                    "whether bf16 is native; float32 chosen, the safe choice; set engine.dtype to "
                                    "override"))


def resolve_cpu_precision(requested: str, on_gpu: bool, *, facts: CpuFacts | None = None,
                          measure: Callable[[], MatmulBenchmark] | None = None) -> PrecisionChoice:
    """`engine.dtype` -> the dtype for vLLM, reading this machine's facts when on a CPU."""
    if on_gpu:
        return choose_dtype(requested, facts or CpuFacts("unknown", "unknown", frozenset(), ()), on_gpu=True)
    return choose_dtype(requested, facts or read_cpu_facts(), measure=measure)


# ---------------------------------------------------------------------------------------------------------------
# The core plan


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


@dataclass(frozen=True)
class CorePlan:
    compute_by_rank: tuple[tuple[int, ...], ...]  # per CPU worker (tensor-parallel rank): the cores its OpenMP
    #                                               threads are bound to, one thread per core
    front_end_cores: tuple[int, ...]   # usable cores no worker computes on: app/cpu_affinity.py moves the replica
    #                                    and the EngineCore there; empty: they share the compute cores
    usable_cores: tuple[int, ...]
    source: str                        # "vllm-auto" | "explicit" | "env" (operator's VLLM_CPU_OMP_THREADS_BIND)
    #                                    | "nobind"
    env: Mapping[str, str] = field(default_factory=dict)  # set before building the engine; {}: vLLM's own binding
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def compute_cores(self) -> tuple[int, ...]:
        return tuple(sorted({c for rank in self.compute_by_rank for c in rank}))

    @property
    def threads_per_rank(self) -> tuple[int, ...]:
        return tuple(len(r) for r in self.compute_by_rank)  # vLLM sets OMP_NUM_THREADS to this per worker


def _arch_reserve(arch: str, world_size: int) -> int:
    # vllm/utils/ompmultiprocessing.py `OMPProcessManager.__init__`: one core per local worker on x86/ARM/RISC-V
    # ("reserve ... core for scheduler proc as always use MP executor"), one elsewhere.
    return world_size if arch in ("x86_64", "aarch64") or arch.startswith("riscv") else 1


def _select_per_core(cpus: list[LogicalCpu], arch: str) -> list[LogicalCpu]:
    """One OpenMP thread per physical core, as vLLM's auto binding: the highest-numbered SMT sibling on x86 and
    s390x (`cpus[-1:]`), every CPU on ARM/RISC-V (no SMT), the first four of each eight on POWER (SMT-8)."""
    if arch.startswith("ppc"):
        return sorted(c for c in cpus if c.id % 8 < 4)
    if arch == "aarch64" or arch.startswith("riscv"):
        return sorted(cpus)
    by_core: dict[int, list[LogicalCpu]] = {}
    for c in cpus:
        by_core.setdefault(c.core, []).append(c)
    return sorted(max(group) for group in by_core.values())


def _take_reserve(ranks: list[list[int]], reserve: int, keep_one: bool = False) -> tuple[list[list[int]], list[int]]:
    """vLLM's split (`_get_autobind_cpu_ids`): `reserve` cores taken off the ends of the ranks' lists, spread evenly,
    the remainder from the last ranks; none at all when the ranks hold no more cores than `reserve` (vLLM then warns
    and computes on everything, sharing with the front end). `keep_one`: never empty a rank (vLLM does not check)."""
    total = sum(len(r) for r in ranks)
    if total <= reserve or not ranks:
        return [list(r) for r in ranks], []
    n = len(ranks)
    per = [reserve // n] * n
    for i in range(n - 1, n - 1 - reserve % n, -1):
        per[i] += 1
    reserved: list[int] = []
    out: list[list[int]] = []
    for r, k in zip(ranks, per, strict=True):
        if keep_one:
            k = min(k, len(r) - 1)
        k = max(min(k, len(r)), 0)
        reserved.extend(r[len(r) - k:])
        out.append(r[:len(r) - k])
    return out, reserved


def plan_cores(cores: Iterable[int] | None = None, *, topology: CpuTopology | None = None, arch: str | None = None,
               world_size: int = 1, environ: Mapping[str, str] | None = None, explicit: bool = False) -> CorePlan:
    """What vLLM 0.32's CPU worker will bind to (vllm/utils/ompmultiprocessing.py `OMPProcessManager`), reproduced.

    By default vLLM binds itself (VLLM_CPU_OMP_THREADS_BIND=auto) and that is kept: its split is the one the
    2-core measurements were made with (+3.5 to +4 % tok/s once the front end also keeps off the compute core,
    docs/benchmarks.md), and it binds the worker's memory to the same NUMA node. Per core count, one NUMA node, no
    SMT: 1 core: compute on it, nothing reserved, the front end shares it (vLLM warns); 2: compute 0, front end 1;
    4: 0-2 | 3; 8: 0-6 | 7; 16: 0-14 | 15. One core for the front end at 16 cores is vLLM's choice, not measured
    here. With SMT only one sibling per core computes and the others join the front end. With TP=1 vLLM computes
    on the first memory node's cores only; the other nodes' cores are left to the front end.

    The plan sets the binding explicitly (`env`) only where vLLM's own would fail: more workers than memory nodes
    (vLLM asserts), or a rank left with no core (its node has none of the usable cores, or the reserve took them);
    or when `explicit` asks for it (to pin what was planned). An operator's VLLM_CPU_OMP_THREADS_BIND is honoured
    and only described. `world_size` is the CPU workers per engine (tensor_parallel_size x pipeline stages)."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    env = os.environ if environ is None else environ
    topo = topology or read_topology(cores, environ=env)
    if cores is not None:
        keep = set(cores)
        topo = CpuTopology(tuple(c for c in topo.cpus if c.id in keep), topo.mem_nodes)
    arch_n = normalise_arch(platform.machine() if arch is None else arch)
    usable = tuple(sorted(c.id for c in topo.cpus))
    notes: list[str] = []
    warnings: list[str] = []

    def plan(ranks: list[list[int]], source: str, plan_env: dict[str, str] | None = None) -> CorePlan:
        compute = {c for r in ranks for c in r}
        front = tuple(c for c in usable if c not in compute)
        return CorePlan(tuple(tuple(r) for r in ranks), front, usable, source, plan_env or {}, tuple(notes),
                        tuple(warnings))

    bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "auto").strip() or "auto"
    if bind == "nobind":
        notes.append("VLLM_CPU_OMP_THREADS_BIND=nobind: OpenMP threads are not bound; the front end shares the cores")
        return plan([list(usable)], "nobind")
    if bind != "auto":
        given = [parse_id_list(s) for s in bind.split("|")]
        if len(given) != world_size:
            warnings.append(f"VLLM_CPU_OMP_THREADS_BIND={bind!r} names {len(given)} core lists for {world_size} "
                            "worker(s): vLLM will refuse to start")
        outside = sorted({c for r in given for c in r} - set(usable))
        if outside:
            warnings.append(f"VLLM_CPU_OMP_THREADS_BIND binds to cores {format_id_list(outside)} this process may "
                            "not use")
        return plan(given, "env")

    minimum = _arch_reserve(arch_n, world_size)
    reserve = minimum
    if "VLLM_CPU_NUM_OF_RESERVED_CPU" in env:
        reserve = int(env["VLLM_CPU_NUM_OF_RESERVED_CPU"] or 0)
        if reserve < minimum:
            warnings.append(f"VLLM_CPU_NUM_OF_RESERVED_CPU={reserve} is below vLLM's minimum of {minimum}")

    rank_nodes = topo.mem_nodes[:world_size]
    fallback = len(topo.mem_nodes) < world_size
    selected: list[list[int]] = []
    ranks: list[list[int]] = []
    reserved: list[int] = []
    if not fallback:
        for node in rank_nodes:  # rank N computes on the N-th memory node's cores
            selected.append([c.id for c in _select_per_core([c for c in topo.cpus if c.node == node], arch_n)])
        ranks, reserved = _take_reserve(selected, reserve)
        fallback = any(not r for r in ranks)
    if fallback:
        # vLLM's automatic binding would fail (assert) or bind a worker to no core; split instead, one CPU per
        # physical core, evenly and in order, and tell vLLM so.
        picked = [c.id for c in _select_per_core(list(topo.cpus), arch_n)]
        size = max(len(picked) // world_size, 1)
        selected = [picked[i * size:(i + 1) * size] or picked[-1:] for i in range(world_size)]
        ranks, reserved = _take_reserve(selected, reserve, keep_one=True)
        rank_nodes = tuple(sorted({c.node for c in topo.cpus}))
        warnings.append(f"vLLM's automatic binding cannot place {world_size} worker(s) on memory node(s) "
                        f"{list(topo.mem_nodes)} with cores {format_id_list(usable)}: binding explicitly")
    chosen = {c for r in selected for c in r}
    elsewhere = [c.id for c in topo.cpus if c.node not in rank_nodes]
    siblings = [c.id for c in topo.cpus if c.node in rank_nodes and c.id not in chosen]
    if elsewhere:
        notes.append(f"cores {format_id_list(elsewhere)} are on other NUMA nodes and do no compute "
                     f"(one worker per node: tensor_parallel_size={len(topo.mem_nodes)} would use them)")
    if siblings:
        notes.append(f"SMT siblings {format_id_list(siblings)} do no compute (one thread per physical core)")
    if not reserved and reserve > 0:
        warnings.append(f"{len(usable)} usable core(s): none can be kept for the front end, which shares the "
                        "compute cores and slows every step")
    if fallback or explicit:
        return plan(ranks, "explicit", {"VLLM_CPU_OMP_THREADS_BIND": "|".join(format_id_list(r) for r in ranks)})
    return plan(ranks, "vllm-auto")


# ---------------------------------------------------------------------------------------------------------------
# The start-up line


_SOURCE = {"vllm-auto": "vLLM's own binding", "explicit": "bound by this plan", "env": "VLLM_CPU_OMP_THREADS_BIND",
           "nobind": "not bound"}


def describe(choice: PrecisionChoice, plan: CorePlan | None, kv_cache_gib: float | None,
             kv_cache_tokens: int | None = None) -> str:
    """One line: precision and why, compute cores, front-end cores, KV cache size."""
    parts = [f"precision {choice.dtype} ({choice.reason})"]
    if plan is None:
        parts.append("compute on the GPU")
    else:
        ranks = " | ".join(format_id_list(r) or "none" for r in plan.compute_by_rank)
        threads = "+".join(str(t) for t in plan.threads_per_rank)
        how = _SOURCE[plan.source]
        parts.append(f"compute cores {ranks} ({threads} thread{'s' if plan.threads_per_rank != (1,) else ''}, {how})")
        front = format_id_list(plan.front_end_cores)
        parts.append(f"front-end cores {front}" if front else "front-end cores none (shares the compute cores)")
    kv = f"KV cache {kv_cache_gib:g} GiB" if kv_cache_gib else "KV cache sized by vLLM"
    if kv_cache_tokens:
        kv += f" ({kv_cache_tokens} tokens)"
    parts.append(kv)
    return "; ".join(parts)
