"""loadkit.machine: the CPU facts a report is read against, parsed from a given /proc/cpuinfo text."""

from __future__ import annotations

from loadkit.machine import CpuFacts, machine, parse_cpuinfo, versions


def _cpu(n: int, flags: str, model: str = "AMD EPYC 7B13", cores_per_socket: int | None = None) -> str:
    blocks = []
    for i in range(n):
        lines = [f"processor\t: {i}", "vendor_id\t: AuthenticAMD", f"model name\t: {model}"]
        if cores_per_socket:
            lines += ["physical id\t: 0", f"core id\t\t: {i % cores_per_socket}"]
        lines.append(f"flags\t\t: fpu sse sse2 {flags}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def test_an_avx2_only_cpu_has_no_native_bfloat16():
    facts = parse_cpuinfo(_cpu(2, "avx avx2 fma"))
    assert facts == CpuFacts(model="AMD EPYC 7B13", flags=("avx2",), logical_cpus=2, physical_cores=None)
    assert not facts.native_bf16
    assert facts.flags_text == "avx2"


def test_avx512_bf16_and_amx_are_listed_in_order_and_mean_native_bfloat16():
    facts = parse_cpuinfo(_cpu(4, "amx_tile avx512_vnni avx512_bf16 avx512f avx2 amx_bf16 amx_int8",
                               model="Intel(R) Xeon(R) Platinum 8481C", cores_per_socket=2))
    assert facts.flags == ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")
    assert facts.native_bf16
    assert facts.logical_cpus == 4 and facts.physical_cores == 2  # two hyperthreads per core
    assert facts.model.startswith("Intel")


def test_a_cpuinfo_without_x86_fields_gives_what_it_has():
    facts = parse_cpuinfo("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\n\nprocessor\t: 1\n")
    assert facts == CpuFacts(model="?", flags=(), logical_cpus=2)
    assert facts.flags_text.startswith("none of avx2")


def test_this_machine_and_its_versions_are_described():
    m = machine()
    assert m.usable_cpus >= 1 and m.memory_gib > 0 and m.python.count(".") == 2
    assert "logical CPU(s) visible" in m.cpu_text
    assert "fastapi" in versions()
