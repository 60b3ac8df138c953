"""`app.engine.cpu.precision`, `.facts` and `.core_plan`: the precision decision from given flag sets, the
micro-benchmark on a fake clock, the core plan for given topologies (checked by hand against vLLM 0.32's own
`OMPProcessManager._get_autobind_cpu_ids`), and the start-up line. Nothing here reads the real machine except
where a test says so, and nothing is timed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from app.engine.cpu import core_plan, precision
from app.engine.cpu import facts as cpu_facts
from app.engine.cpu.facts import CpuFacts, CpuTopology, LogicalCpu
from app.engine.cpu.precision import MatmulBenchmark

# Flag sets as /proc/cpuinfo shows them (trimmed to what matters plus some noise).
BASE_X86 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi1 bmi2 popcnt aes"
AVX2_EPYC = BASE_X86 + " avx2 sha_ni vaes vpclmulqdq"   # this machine: AMD EPYC, Zen 3 class, no AVX-512
ZEN4 = AVX2_EPYC + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni avx512_vbmi2"
ICELAKE = AVX2_EPYC + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_vbmi2"
SAPPHIRE = ICELAKE + " avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8 avx_vnni"
AMX_ONLY_FLAG = AVX2_EPYC + " avx512f avx512bw avx512vl avx512dq amx_bf16 amx_tile"
SIERRA = AVX2_EPYC + " avx_vnni avx_ne_convert"
OLD_X86 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx"
GRAVITON3 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm sve svebf16 i8mm bf16"
GRAVITON2 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
ARM_NO_FP16 = "fp asimd evtstrm aes pmull sha1 sha2 crc32"


def x86(flags: str, model: str = "Test x86") -> CpuFacts:
    return CpuFacts("x86_64", model, frozenset(flags.split()), (0, 1))


def arm(flags: str) -> CpuFacts:
    return CpuFacts("aarch64", "Test ARM", frozenset(flags.split()), (0, 1))


def never_measure() -> MatmulBenchmark:
    raise AssertionError("the flags decide this one: no micro-benchmark may run")


def bench(bf16: float, fp32: float) -> Callable[[], MatmulBenchmark]:
    return lambda: MatmulBenchmark((32, 256, 256), {"float32": fp32, "bfloat16": bf16}, {"float32": 3, "bfloat16": 3},
                                   4.0, "AVX512")


# --- reading the facts -------------------------------------------------------------------------------------------

X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC
cpu MHz\t\t: 2445.406
flags\t\t: fpu vme avx2 fma f16c
vmx flags\t: not_these
bugs\t\t: sysret_ss_attrs

processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu vme avx2 fma f16c
"""

ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid bf16 sve
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
CPU revision\t: 1
"""


def test_x86_flags_and_model_come_from_the_first_cpu() -> None:
    assert cpu_facts.parse_cpu_flags(X86_CPUINFO) == frozenset({"fpu", "vme", "avx2", "fma", "f16c"})
    assert cpu_facts.parse_model_name(X86_CPUINFO) == "AMD EPYC"


def test_arm_features_and_part_number() -> None:
    flags = cpu_facts.parse_cpu_flags(ARM_CPUINFO)
    assert {"asimd", "bf16", "sve", "asimdhp"} <= flags
    assert cpu_facts.parse_model_name(ARM_CPUINFO) == "ARM implementer 0x41 part 0xd40"


def test_no_cpuinfo_reads_as_no_flags() -> None:
    assert cpu_facts.parse_cpu_flags("") == frozenset()
    assert cpu_facts.parse_model_name("") == "unknown"


def test_read_cpu_facts_from_given_text() -> None:
    facts = cpu_facts.read_cpu_facts(cpuinfo=X86_CPUINFO, machine="AMD64", cores=[3, 1, 1])
    assert facts == CpuFacts("x86_64", "AMD EPYC", frozenset({"fpu", "vme", "avx2", "fma", "f16c"}), (1, 3))
    assert cpu_facts.read_cpu_facts(cpuinfo=ARM_CPUINFO, machine="arm64", cores=[0]).arch == "aarch64"


def test_read_cpu_facts_on_this_machine_has_cores_and_an_arch() -> None:
    facts = cpu_facts.read_cpu_facts()
    assert facts.cores and facts.arch  # whatever this machine is; the decision is tested on given flag sets


@pytest.mark.parametrize(("flags", "isa"), [
    (SAPPHIRE, "amx"), (AMX_ONLY_FLAG, "amx"), (ZEN4, "avx512_bf16"), (ICELAKE, "avx512"),
    (SIERRA, "avx2_ne_convert"), (AVX2_EPYC, "avx2"), (OLD_X86, "x86_old"), ("", "unknown"),
])
def test_x86_isa_classes(flags: str, isa: str) -> None:
    assert cpu_facts.classify_isa(x86(flags)) == isa


def test_arm_and_other_isa_classes() -> None:
    assert cpu_facts.classify_isa(arm(GRAVITON3)) == "arm_bf16"
    assert cpu_facts.classify_isa(arm(GRAVITON2)) == "arm_neon"
    assert cpu_facts.classify_isa(arm("")) == "unknown"
    assert cpu_facts.classify_isa(CpuFacts("ppc64le", "POWER10", frozenset(), (0,))) == "unknown"
    # An ARM flag name on x86 means nothing there.
    assert cpu_facts.classify_isa(CpuFacts("x86_64", "x", frozenset({"bf16"}), (0,))) == "x86_old"


# --- auto on a CPU -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [ZEN4])
def test_native_bf16_picks_bfloat16_without_measuring(flags: str) -> None:
    choice = precision.choose_dtype("auto", x86(flags), measure=never_measure)
    assert (choice.dtype, choice.warning, choice.measured) == ("bfloat16", None, False)


@pytest.mark.parametrize("flags", [SAPPHIRE, AMX_ONLY_FLAG])
def test_amx_picks_float32_since_vllm_s_amx_bf16_answers_wrong(flags: str) -> None:
    choice = precision.choose_dtype("auto", x86(flags), measure=never_measure)
    assert (choice.dtype, choice.warning, choice.measured) == ("float32", None, False)
    assert "AMX" in choice.reason and "wrong" in choice.reason
    explicit = precision.choose_dtype("bfloat16", x86(flags), measure=never_measure)
    assert explicit.dtype == "bfloat16" and explicit.warning and "wrong" in explicit.warning
    assert precision.choose_dtype("float32", x86(flags), measure=never_measure).warning is None


def test_avx2_only_picks_float32_without_measuring() -> None:
    choice = precision.choose_dtype("auto", x86(AVX2_EPYC, "AMD EPYC"), measure=never_measure)
    assert (choice.dtype, choice.warning, choice.measured) == ("float32", None, False)
    assert "AMD EPYC" in choice.reason and "emulated" in choice.reason


@pytest.mark.parametrize("flags", [ICELAKE, SIERRA])
def test_bf16_without_native_dot_products_is_measured_and_bf16_wins_when_close(flags: str) -> None:
    choice = precision.choose_dtype("auto", x86(flags), measure=bench(bf16=45.0, fp32=50.0))
    assert (choice.dtype, choice.measured, choice.warning) == ("bfloat16", True, None)
    assert choice.benchmark is not None and choice.benchmark.gflops["bfloat16"] == 45.0
    assert "bfloat16 45.0" in choice.reason and "float32 50.0" in choice.reason and "0.90" in choice.reason


def test_avx512_without_bf16_picks_float32_when_bf16_measures_slow() -> None:
    choice = precision.choose_dtype("auto", x86(ICELAKE), measure=bench(bf16=6.0, fp32=48.0))
    assert (choice.dtype, choice.measured) == ("float32", True)
    assert "0.12" in choice.reason


def test_the_threshold_is_inclusive() -> None:
    at = precision.BF16_MIN_RATIO * 100.0
    assert precision.choose_dtype("auto", x86(ICELAKE), measure=bench(bf16=at, fp32=100.0)).dtype == "bfloat16"
    assert precision.choose_dtype("auto", x86(ICELAKE), measure=bench(bf16=at - 1, fp32=100.0)).dtype == "float32"


@pytest.mark.parametrize("broken", [
    lambda: (_ for _ in ()).throw(ImportError("no torch")),
    lambda: MatmulBenchmark((1, 1, 1), {"float32": 1.0}, {"float32": 1}, 1.0),  # no bf16 figure
])
def test_a_failed_measurement_falls_back_to_float32_with_a_warning(broken: Callable[[], MatmulBenchmark]) -> None:
    choice = precision.choose_dtype("auto", x86(ICELAKE), measure=broken)
    assert choice.dtype == "float32" and choice.warning and not choice.measured


def test_arm_with_bf16_picks_bfloat16() -> None:
    choice = precision.choose_dtype("auto", arm(GRAVITON3), measure=never_measure)
    assert (choice.dtype, choice.warning) == ("bfloat16", None)


def test_arm_without_bf16_picks_float32_not_float16() -> None:
    choice = precision.choose_dtype("auto", arm(GRAVITON2), measure=never_measure)  # it has asimdhp: fp16 would run
    assert (choice.dtype, choice.warning) == ("float32", None)


@pytest.mark.parametrize("facts", [
    x86(""), arm(""), CpuFacts("ppc64le", "POWER10", frozenset(), (0,)),
    CpuFacts("riscv64", "unknown", frozenset({"rv64imafdc"}), (0,)),
])
def test_unknown_or_empty_flags_fall_back_to_float32_with_a_warning(facts: CpuFacts) -> None:
    choice = precision.choose_dtype("auto", facts, measure=never_measure)
    assert choice.dtype == "float32" and choice.warning is not None and not choice.measured


def test_x86_without_avx2_warns_that_vllm_may_not_start() -> None:
    choice = precision.choose_dtype("auto", x86(OLD_X86), measure=never_measure)
    assert choice.dtype == "float32" and choice.warning and "AVX2" in choice.warning


@pytest.mark.parametrize("flags", [SAPPHIRE, ZEN4, ICELAKE, AVX2_EPYC, OLD_X86, ""])
def test_auto_never_picks_float16_on_x86(flags: str) -> None:
    choice = precision.choose_dtype("auto", x86(flags), measure=bench(bf16=1.0, fp32=1.0))
    assert choice.dtype != "float16"


# --- an explicit dtype -------------------------------------------------------------------------------------------

def test_explicit_bfloat16_on_avx2_is_honoured_with_a_warning() -> None:
    choice = precision.choose_dtype("bfloat16", x86(AVX2_EPYC), measure=never_measure)
    assert choice.dtype == "bfloat16" and not choice.measured
    assert choice.warning and "float32" in choice.warning and "emulated" in choice.warning


@pytest.mark.parametrize(("requested", "flags"), [
    ("bfloat16", ZEN4), ("bfloat16", ICELAKE), ("float32", AVX2_EPYC), ("float32", ICELAKE), ("float32", SAPPHIRE),
    ("float16", SAPPHIRE),  # AVX512-FP16: native
])
def test_explicit_dtype_that_is_fine_here_has_no_warning(requested: str, flags: str) -> None:
    choice = precision.choose_dtype(requested, x86(flags), measure=never_measure)
    assert (choice.dtype, choice.warning) == (requested, None)


@pytest.mark.parametrize("flags", [AVX2_EPYC, ZEN4, ICELAKE])
def test_explicit_float16_without_native_fp16_warns(flags: str) -> None:
    choice = precision.choose_dtype("float16", x86(flags), measure=never_measure)
    assert choice.dtype == "float16" and choice.warning and "fp16" in choice.warning


def test_explicit_float16_on_arm_with_fp16_arithmetic_is_quiet() -> None:
    assert precision.choose_dtype("float16", arm(GRAVITON2)).warning is None
    assert precision.choose_dtype("float16", arm(ARM_NO_FP16)).warning is not None


@pytest.mark.parametrize("facts", [x86(ZEN4), arm(GRAVITON3)])
def test_explicit_float32_with_native_bf16_is_honoured_with_a_warning(facts: CpuFacts) -> None:
    choice = precision.choose_dtype("float32", facts, measure=never_measure)
    assert choice.dtype == "float32" and choice.warning and "bfloat16" in choice.warning


def test_explicit_bfloat16_on_arm_without_bf16_and_on_unknown_cpus_warns() -> None:
    assert precision.choose_dtype("bfloat16", arm(GRAVITON2)).warning is not None
    assert precision.choose_dtype("bfloat16", x86("")).warning is not None


def test_vllm_spellings_and_unknown_dtypes() -> None:
    assert precision.choose_dtype("half", x86(SAPPHIRE)).dtype == "float16"
    assert precision.choose_dtype(" Float ", x86(AVX2_EPYC)).dtype == "float32"
    with pytest.raises(ValueError, match="int8"):
        precision.choose_dtype("int8", x86(AVX2_EPYC))


# --- on a GPU ----------------------------------------------------------------------------------------------------

def test_gpu_auto_is_left_to_vllm_and_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> CpuFacts:
        raise AssertionError("a GPU start must not read CPU facts")

    monkeypatch.setattr(precision, "read_cpu_facts", boom)
    choice = precision.resolve_cpu_precision("auto", on_gpu=True, measure=never_measure)
    assert (choice.dtype, choice.warning, choice.measured) == ("auto", None, False)
    assert "vLLM" in choice.reason
    assert precision.resolve_cpu_precision("float16", on_gpu=True).dtype == "float16"
    # On a GPU the CPU's flags do not matter.
    assert precision.choose_dtype("bfloat16", x86(AVX2_EPYC), on_gpu=True).warning is None


def test_resolve_on_a_cpu_uses_the_given_facts_or_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    assert precision.resolve_cpu_precision("auto", on_gpu=False, facts=x86(ICELAKE), measure=bench(40.0, 50.0)).measured
    monkeypatch.setattr(precision, "read_cpu_facts", lambda: x86(ZEN4))
    assert precision.resolve_cpu_precision("auto", on_gpu=False, measure=never_measure).dtype == "bfloat16"


# --- the micro-benchmark -----------------------------------------------------------------------------------------

class FakeClock:
    """A clock that only the fake linear calls advance, by a cost per dtype."""

    def __init__(self, cost_s: dict[str, float]):
        self.now = 100.0
        self.cost_s = cost_s
        self.calls: dict[str, int] = {}

    def __call__(self) -> float:
        return self.now

    def runner(self, dtype: str) -> Callable[[], object]:
        def call() -> None:
            self.calls[dtype] = self.calls.get(dtype, 0) + 1
            self.now += self.cost_s[dtype]
        return call


def test_measure_matmul_reports_best_gflops_per_dtype_from_the_clock() -> None:
    clock = FakeClock({"float32": 0.0001, "bfloat16": 0.001})
    result = precision.measure_matmul(("float32", "bfloat16"), m=32, k=256, n=256, repeats=3, budget_s=0.025,
                               timer=clock, runner=clock.runner)
    flop = 2 * 32 * 256 * 256
    assert result.gflops["float32"] == pytest.approx(flop / 0.0001 / 1e9)
    assert result.gflops["bfloat16"] == pytest.approx(flop / 0.001 / 1e9)
    assert result.samples == {"float32": 3, "bfloat16": 3}
    assert clock.calls == {"float32": 4, "bfloat16": 4}  # one warm-up each, then the samples
    assert result.elapsed_ms == pytest.approx(4 * 0.1 + 4 * 1.0)
    assert result.ratio("bfloat16") == pytest.approx(0.1)
    assert "float32 41.9, bfloat16 4.2 GFLOPS" in result.summary()


def test_measure_matmul_stops_sampling_a_dtype_over_its_budget() -> None:
    clock = FakeClock({"float32": 0.0001, "bfloat16": 0.010, "float16": 0.040})
    result = precision.measure_matmul(("float32", "bfloat16", "float16"), m=8, k=8, n=8, repeats=5, budget_s=0.025,
                               timer=clock, runner=clock.runner)
    assert clock.calls == {"float32": 6, "bfloat16": 3, "float16": 1}  # 10 ms + 10 + 10 reaches 25; 40 ms at once
    assert result.samples == {"float32": 5, "bfloat16": 2, "float16": 1}
    assert result.gflops["float16"] == pytest.approx(2 * 8 ** 3 / 0.040 / 1e9)  # the warm-up is its only sample
    assert result.elapsed_ms == pytest.approx(6 * 0.1 + 30 + 40)


def test_choose_dtype_with_a_measurer_built_on_the_fake_clock() -> None:
    clock = FakeClock({"float32": 0.0001, "bfloat16": 0.0001})
    choice = precision.choose_dtype("auto", x86(ICELAKE),
                             measure=lambda: precision.measure_matmul(timer=clock, runner=clock.runner))
    assert (choice.dtype, choice.measured) == ("bfloat16", True)
    assert choice.benchmark is not None and choice.benchmark.ratio("bfloat16") == pytest.approx(1.0)


def test_measure_matmul_with_real_torch_returns_figures_and_restores_threads() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    result = precision.measure_matmul(("float32", "bfloat16"), m=4, k=16, n=16, repeats=1)
    assert set(result.gflops) == {"float32", "bfloat16"} and all(g > 0 for g in result.gflops.values())
    assert result.capability  # "AVX2", "AVX512", "SVE256", "DEFAULT"...
    assert torch.get_num_threads() == before


# --- the core plan -----------------------------------------------------------------------------------------------

NO_ENV: dict[str, str] = {}


@pytest.mark.parametrize(("n", "compute", "front"), [
    (1, (0,), ()),
    (2, (0,), (1,)),
    (4, (0, 1, 2), (3,)),
    (8, tuple(range(7)), (7,)),
    (16, tuple(range(15)), (15,)),
])
@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_core_plan_per_core_count_matches_vllms_auto_binding(n: int, compute: tuple[int, ...],
                                                              front: tuple[int, ...], arch: str) -> None:
    plan = core_plan.plan_cores(topology=CpuTopology.flat(range(n)), arch=arch, environ=NO_ENV)
    assert plan.compute_by_rank == (compute,)
    assert plan.compute_cores == compute and plan.front_end_cores == front
    assert plan.threads_per_rank == (len(compute),)
    assert (plan.source, dict(plan.env)) == ("vllm-auto", {})  # vLLM binds the same way by itself
    assert bool(plan.warnings) == (n == 1)  # one core: nothing can be kept for the front end


def test_one_core_shares_it_with_the_front_end() -> None:
    plan = core_plan.plan_cores(topology=CpuTopology.flat([5]), arch="x86_64", environ=NO_ENV)
    assert plan.compute_cores == (5,) and plan.front_end_cores == ()
    assert "front end" in plan.warnings[0]


def test_cores_narrow_a_given_topology() -> None:
    plan = core_plan.plan_cores([4, 5, 6], topology=CpuTopology.flat(range(8)), arch="x86_64", environ=NO_ENV)
    assert (plan.compute_cores, plan.front_end_cores, plan.usable_cores) == ((4, 5), (6,), (4, 5, 6))


def test_x86_smt_computes_on_one_sibling_per_core() -> None:
    topo = CpuTopology(tuple(LogicalCpu(i, i % 4, 0) for i in range(8)), (0,))  # siblings (0,4) (1,5) ...
    plan = core_plan.plan_cores(topology=topo, arch="x86_64", environ=NO_ENV)
    assert plan.compute_cores == (4, 5, 6) and plan.front_end_cores == (0, 1, 2, 3, 7)
    assert any("SMT siblings 0-3" in note for note in plan.notes)


def test_arm_uses_every_cpu_even_with_shared_core_ids() -> None:
    topo = CpuTopology(tuple(LogicalCpu(i, i % 4, 0) for i in range(8)), (0,))
    plan = core_plan.plan_cores(topology=topo, arch="aarch64", environ=NO_ENV)
    assert plan.compute_cores == tuple(range(7)) and plan.front_end_cores == (7,)


def test_tp1_on_two_numa_nodes_computes_on_the_first_node_only() -> None:
    topo = CpuTopology(tuple(LogicalCpu(i, i, i // 4) for i in range(8)), (0, 1))
    plan = core_plan.plan_cores(topology=topo, arch="x86_64", environ=NO_ENV)
    assert plan.compute_cores == (0, 1, 2) and plan.front_end_cores == (3, 4, 5, 6, 7)
    assert plan.source == "vllm-auto" and any("NUMA" in note and "4-7" in note for note in plan.notes)


def test_tp2_on_two_numa_nodes_reserves_one_core_per_worker() -> None:
    topo = CpuTopology(tuple(LogicalCpu(i, i, i // 4) for i in range(8)), (0, 1))
    plan = core_plan.plan_cores(topology=topo, arch="x86_64", world_size=2, environ=NO_ENV)
    assert plan.compute_by_rank == ((0, 1, 2), (4, 5, 6)) and plan.front_end_cores == (3, 7)
    assert plan.source == "vllm-auto" and not plan.warnings


def test_more_workers_than_numa_nodes_binds_explicitly() -> None:
    plan = core_plan.plan_cores(topology=CpuTopology.flat(range(4)), arch="x86_64", world_size=2, environ=NO_ENV)
    assert plan.source == "explicit" and all(plan.compute_by_rank) and plan.warnings
    assert plan.env == {"VLLM_CPU_OMP_THREADS_BIND": "0|2"} and plan.front_end_cores == (1, 3)


def test_a_memory_node_without_usable_cores_binds_explicitly() -> None:
    topo = CpuTopology(tuple(LogicalCpu(i, i, 1) for i in (4, 5, 6, 7)), (0, 1))  # vLLM's rank 0 -> node 0: none
    plan = core_plan.plan_cores(topology=topo, arch="x86_64", environ=NO_ENV)
    assert plan.compute_cores == (4, 5, 6) and plan.env == {"VLLM_CPU_OMP_THREADS_BIND": "4-6"}


def test_explicit_pins_the_planned_split() -> None:
    plan = core_plan.plan_cores(topology=CpuTopology.flat(range(4)), arch="x86_64", environ=NO_ENV, explicit=True)
    assert (plan.source, plan.env, plan.compute_cores) == ("explicit", {"VLLM_CPU_OMP_THREADS_BIND": "0-2"}, (0, 1, 2))


def test_an_operators_bind_list_is_honoured() -> None:
    plan = core_plan.plan_cores(topology=CpuTopology.flat(range(4)), arch="x86_64",
                         environ={"VLLM_CPU_OMP_THREADS_BIND": "0-1"})
    assert (plan.source, plan.compute_cores, plan.front_end_cores, dict(plan.env)) == ("env", (0, 1), (2, 3), {})
    bad = core_plan.plan_cores(topology=CpuTopology.flat(range(4)), arch="x86_64",
                        environ={"VLLM_CPU_OMP_THREADS_BIND": "0-1|2-3"})
    assert bad.warnings  # two lists for one worker: vLLM refuses


def test_nobind_shares_every_core() -> None:
    plan = core_plan.plan_cores(topology=CpuTopology.flat(range(4)), arch="x86_64",
                         environ={"VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    assert (plan.source, plan.compute_cores, plan.front_end_cores) == ("nobind", (0, 1, 2, 3), ())


def test_reserved_cpu_count_from_the_environment() -> None:
    eight = CpuTopology.flat(range(8))
    plan = core_plan.plan_cores(topology=eight, arch="x86_64", environ={"VLLM_CPU_NUM_OF_RESERVED_CPU": "2"})
    assert plan.compute_cores == tuple(range(6)) and plan.front_end_cores == (6, 7) and not plan.warnings
    zero = core_plan.plan_cores(topology=eight, arch="x86_64", environ={"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"})
    assert zero.compute_cores == tuple(range(8)) and zero.front_end_cores == () and zero.warnings


def test_world_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        core_plan.plan_cores(topology=CpuTopology.flat(range(2)), arch="x86_64", world_size=0, environ=NO_ENV)


def test_id_lists_round_trip() -> None:
    assert cpu_facts.parse_id_list("0-2,4,7-8") == [0, 1, 2, 4, 7, 8]
    assert cpu_facts.parse_id_list("") == []
    assert cpu_facts.format_id_list([8, 7, 4, 2, 1, 0]) == "0-2,4,7-8"
    assert cpu_facts.format_id_list([]) == ""


def _fake_sys(root: Path, nodes: dict[int, str], siblings: dict[int, str]) -> None:
    for node, cpulist in nodes.items():
        d = root / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    for cpu, sib in siblings.items():
        d = root / "devices/system/cpu" / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(sib + "\n")


def test_read_topology_from_sysfs(tmp_path: Path) -> None:
    _fake_sys(tmp_path, {0: "0-1,4-5", 1: "2-3,6-7"}, {i: f"{i % 4},{i % 4 + 4}" for i in range(8)})
    topo = cpu_facts.read_topology(range(8), sys_root=str(tmp_path), status="Name:\tx\nMems_allowed_list:\t0-1\n",
                            environ=NO_ENV)
    assert topo.mem_nodes == (0, 1)
    assert topo.cpus[5] == LogicalCpu(5, 1, 0) and topo.cpus[6] == LogicalCpu(6, 2, 1)
    visible = cpu_facts.read_topology(range(8), sys_root=str(tmp_path), status="Mems_allowed_list:\t0-1\n",
                               environ={"CPU_VISIBLE_MEMORY_NODES": "1"})
    assert visible.mem_nodes == (1,)
    plan = core_plan.plan_cores(topology=topo, arch="x86_64", environ=NO_ENV)
    assert plan.compute_cores == (4,) and plan.front_end_cores == (0, 1, 2, 3, 5, 6, 7)  # node 0: cores 0/4, 1/5


def test_read_topology_without_sysfs_is_flat(tmp_path: Path) -> None:
    topo = cpu_facts.read_topology([0, 1, 2], sys_root=str(tmp_path), status="", environ=NO_ENV)
    assert topo == CpuTopology.flat([0, 1, 2])


def test_plan_on_this_machine_leaves_no_usable_core_out() -> None:
    plan = core_plan.plan_cores()  # reads this machine; whatever it is, every usable core is computing or front end
    assert set(plan.compute_cores) | set(plan.front_end_cores) == set(plan.usable_cores)


# --- the start-up line -------------------------------------------------------------------------------------------

def test_describe_names_precision_why_cores_and_kv_cache() -> None:
    choice = precision.choose_dtype("auto", x86(AVX2_EPYC, "AMD EPYC"))
    plan = core_plan.plan_cores(topology=CpuTopology.flat(range(2)), arch="x86_64", environ=NO_ENV)
    line = core_plan.describe(choice, plan, kv_cache_gib=2, kv_cache_tokens=46592)
    assert "\n" not in line
    assert line.startswith("precision float32 (AMD EPYC: AVX2")
    assert "compute cores 0 (1 thread, vLLM's own binding)" in line
    assert "front-end cores 1" in line and "KV cache 2 GiB (46592 tokens)" in line


def test_describe_one_core_measured_and_gpu() -> None:
    measured = precision.choose_dtype("auto", x86(ICELAKE), measure=bench(bf16=45.0, fp32=50.0))
    one = core_plan.plan_cores(topology=CpuTopology.flat([0]), arch="x86_64", environ=NO_ENV)
    line = core_plan.describe(measured, one, kv_cache_gib=None)
    assert "precision bfloat16" in line and "measured" in line and "bfloat16 45.0" in line
    assert "front-end cores none (shares the compute cores)" in line and "KV cache sized by vLLM" in line
    eight = core_plan.plan_cores(topology=CpuTopology.flat(range(8)), arch="x86_64", environ=NO_ENV)
    assert "compute cores 0-6 (7 threads" in core_plan.describe(measured, eight, 4)
    gpu = core_plan.describe(precision.resolve_cpu_precision("auto", on_gpu=True), None, None)
    assert gpu.startswith("precision auto (on a GPU") and "compute on the GPU" in gpu
