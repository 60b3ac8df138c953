"""loadkit's layout rules: it imports nothing from app/ (it drives any deployment by URL), and every module is
small and opens with a docstring saying what it owns."""

from __future__ import annotations

import ast
from pathlib import Path

KIT = Path(__file__).resolve().parents[2] / "loadkit"
MODULES = sorted(KIT.rglob("*.py"))


def _imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_kit_has_its_modules():
    assert {p.relative_to(KIT).as_posix() for p in MODULES} >= {
        "service.py", "proctree.py", "machine.py", "stats.py", "sse.py", "markdown.py", "probe.py",
        "bench/run.py", "overload/run.py"}


def test_no_module_imports_app_and_each_is_small_and_documented():
    for path in MODULES:
        tree = ast.parse(path.read_text())
        assert "app" not in _imported(tree), f"{path} imports from app/"
        assert len(path.read_text().splitlines()) <= 300, f"{path} is over 300 lines"
        assert ast.get_docstring(tree), f"{path} has no docstring"
