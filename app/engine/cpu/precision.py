"""The engine's precision on a CPU: `engine.dtype` (`auto` or explicit) -> the dtype handed to vLLM, and why.

vLLM's CPU backend accepts bfloat16, float16 and float32 on every x86/ARM CPU, but only some CPUs compute in
bfloat16 natively. Elsewhere it is emulated, and the service's old default (`dtype: bfloat16`) cost a factor of
four: 26 vs 110 output tokens/s at 16 concurrent requests on an AVX2-only AMD EPYC (docs/precision.md). vLLM's own
`auto` does not help on a CPU: it keeps the checkpoint's dtype (bf16 for the default model) whatever the CPU can do
(vllm/config/model.py `_resolve_auto_dtype`), so on a CPU `auto` becomes a concrete dtype here. On a GPU `auto`
stays vLLM's own choice. Where the flags leave bf16-vs-fp32 open, a micro-benchmark of a few ms decides.

    resolve_cpu_precision(requested, on_gpu) -> PrecisionChoice   # pass .dtype to vLLM; log .warning if set
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from app.engine.cpu.facts import CpuFacts, Isa, classify_isa, read_cpu_facts

log = logging.getLogger(__name__)
Dtype = Literal["auto", "bfloat16", "float16", "float32"]

# vLLM's spellings (vllm/config/model.py `_STR_DTYPE_TO_TORCH_DTYPE`) -> ours.
_ALIASES: dict[str, Dtype] = {"auto": "auto", "half": "float16", "float": "float32",
                            "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}

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
# Native, but wrong in vLLM 0.32: on a 2-core Intel Xeon with AMX (KVM), bf16 through vLLM's AMX kernels answered the
# default model's "What is the capital of France?" (greedy, eager, bare vLLM) with "L'Étoile, la Marseillaise, la
# femme," and float32 with "The capital of France is Paris." (docs/precision.md). Correct first: `auto` takes float32.
_WRONG_BF16: frozenset[Isa] = frozenset({"amx"})
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
    dtype: Dtype                             # what to hand vLLM: "bfloat16" | "float16" | "float32" | "auto" (GPU)
    reason: str                              # why, for the start-up line
    warning: str | None = None               # log at WARNING when set
    measured: bool = False                   # decided by the micro-benchmark
    benchmark: MatmulBenchmark | None = None  # its figures, when it ran


def _normalise_requested(requested: str) -> Dtype:
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


def _explicit(dtype: Dtype, facts: CpuFacts, isa: Isa) -> PrecisionChoice:
    """An explicit dtype is always honoured; the warning says when this CPU is known to be slow in it."""
    where = f"{facts.model}: {_WHY[isa]}"
    warning: str | None = None
    if dtype == "bfloat16" and isa in _WRONG_BF16:
        warning = (f"engine.dtype bfloat16 on {where}: vLLM 0.32's AMX bf16 path was measured answering wrong for the "
                   "default model (docs/precision.md); set engine.dtype: auto or float32")
    elif dtype == "bfloat16" and isa in _SLOW_BF16:
        warning = (f"engine.dtype bfloat16 on a CPU without native bf16 ({where}); expect several times lower "
                   "throughput than float32 (26 vs 110 tok/s at 16 concurrent requests on an AVX2-only EPYC); "
                   "set engine.dtype: auto or float32")
    elif dtype == "bfloat16" and isa == "unknown":
        warning = "engine.dtype bfloat16 on a CPU whose features could not be read: it may be emulated and slow"
    elif dtype == "float16" and not _fp16_native(facts):
        warning = (f"engine.dtype float16 on a CPU without native fp16 compute ({facts.model}; no AVX512-FP16/AMX-FP16 "
                   "on x86, no asimdhp on ARM): emulated (11 vs 84 GFLOPS float32 in one-thread linear on an AVX2 "
                   "EPYC), and bf16 checkpoints may overflow its range; set engine.dtype: auto")
    elif dtype == "float32" and isa in _NATIVE_BF16 - _WRONG_BF16:
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
    if isa in _WRONG_BF16:
        return PrecisionChoice(dtype="float32", reason=f"{where}, measured answering wrong in vLLM 0.32; float32")
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
        dtype: Dtype = "bfloat16" if ratio >= BF16_MIN_RATIO else "float32"
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
