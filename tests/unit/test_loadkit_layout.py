"""loadkit's layout rules: it imports nothing from app/ (it drives any deployment by URL), every module opens with a
docstring saying what it owns, and no module imports, however indirectly, one that imports it back."""

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


def _name(path: Path) -> str:
    parts = path.relative_to(KIT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _kit_imports(tree: ast.Module, known: set[str]) -> set[str]:
    """The kit's own modules `tree` imports, anywhere in it (a lazy import inside a function closes a circle too):
    `from loadkit.x import y` names loadkit.x.y when that is a module, else loadkit.x."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            out.update(subs or ({node.module} & known))
    return out


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (its modules in order, the first repeated last), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        stack.append(module)
        for other in sorted(graph[module]):
            if state.get(other) == "open":
                return [*stack[stack.index(other):], other]
            if other not in state and (found := visit(other)):
                return found
        stack.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_the_kit_has_its_modules():
    assert {p.relative_to(KIT).as_posix() for p in MODULES} >= {
        "service.py", "proctree.py", "machine.py", "stats.py", "sse.py", "markdown.py", "probe.py",
        "bench/run.py", "overload/run.py"}


def test_no_module_imports_app_and_each_is_documented():
    for path in MODULES:
        tree = ast.parse(path.read_text())
        assert "app" not in _imported(tree), f"{path} imports from app/"
        assert ast.get_docstring(tree), f"{path} has no docstring"


def test_no_import_circle():
    trees = {_name(p): ast.parse(p.read_text()) for p in MODULES}
    graph = {name: _kit_imports(tree, set(trees)) - {name} for name, tree in trees.items()}
    circle = _circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_circle_check_finds_a_lazy_circle():
    a = ast.parse("from loadkit.b import x\n")
    b = ast.parse("def f():\n    from loadkit import a\n")
    known = {"loadkit.a", "loadkit.b"}
    graph = {"loadkit.a": _kit_imports(a, known), "loadkit.b": _kit_imports(b, known)}
    assert _circle(graph) == ["loadkit.a", "loadkit.b", "loadkit.a"]
