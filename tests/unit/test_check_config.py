"""`python -m app check-config` says what `engine.dtype` resolves to on the machine at hand, and warns."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.cli import main as cli
from app.engine.cpu import precision
from app.engine.cpu.facts import CpuFacts

REPO = Path(__file__).resolve().parents[2]
AVX2_ONLY = CpuFacts("x86_64", "Test EPYC", frozenset("fpu sse2 avx avx2 fma f16c".split()), (0, 1))
AVX512_BF16 = CpuFacts("x86_64", "Test Zen 4", AVX2_ONLY.flags | {"avx512f", "avx512bw", "avx512_bf16"}, (0, 1))


def _check(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["check-config", str(path)]) == 0
    return capsys.readouterr().out


def _with_dtype(tmp_path: Path, dtype: str) -> Path:
    config = yaml.safe_load((REPO / "configs" / "cpu.yaml").read_text())
    config["models"][0]["engine"]["dtype"] = dtype
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_default_config_prints_what_auto_resolves_to_here(capsys):
    out = _check(REPO / "configs" / "cpu.yaml", capsys)
    here = precision.resolve_cpu_precision("auto", on_gpu=False)
    assert f"engine.dtype auto -> precision {here.dtype} ({here.reason})" in out
    assert "compute cores" in out and "front-end cores" in out and "KV cache 2 GiB" in out


@pytest.mark.parametrize(("facts", "dtype"), [(AVX2_ONLY, "float32"), (AVX512_BF16, "bfloat16")])
def test_auto_follows_the_cpu(monkeypatch, capsys, facts, dtype):
    monkeypatch.setattr(precision, "read_cpu_facts", lambda: facts)
    out = _check(REPO / "configs" / "cpu.yaml", capsys)
    assert f"engine.dtype auto -> precision {dtype} (Test" in out
    assert "warning" not in out


def test_explicit_bfloat16_on_an_avx2_cpu_is_honoured_with_a_warning(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(precision, "read_cpu_facts", lambda: AVX2_ONLY)
    out = _check(_with_dtype(tmp_path, "bfloat16"), capsys)
    assert "engine.dtype bfloat16 -> precision bfloat16 (as configured" in out
    assert "warning: engine.dtype bfloat16 on a CPU without native bf16" in out


def test_gpu_config_leaves_auto_to_vllm(capsys):
    out = _check(REPO / "configs" / "gpu.yaml", capsys)
    assert "compute on the GPU" in out


def test_the_default_config_is_configs_cpu_yaml_found_through_the_package():
    """`python -m app serve` without --config reads configs/cpu.yaml through the package's own link to it, which a
    wheel carries as a file (pyproject's package-data), so an installed service finds its default too."""
    link = REPO / "app" / "cli" / "default.yaml"
    assert link.is_symlink() and link.resolve() == (REPO / "configs" / "cpu.yaml").resolve()
    assert cli.DEFAULT_CONFIG == link.resolve()
    assert cli.DEFAULT_CONFIG.name == "cpu.yaml"
