"""app/'s layering rules, read from the code's own imports (an AST walk, nothing imported):

    cli -> rayserve -> http -> openai -> engine,   rayserve -> routing -> host -> engine,   rayserve -> scaling,
    http reads host's, routing's and scaling's types only (host.stats, routing, scaling.decision)

and the base (config, errors, api_keys, tenancy, logs) under all of them. Nothing imports upward or in a circle, only
`app/engine/vllm/` imports vLLM, no module imports both FastAPI and vLLM, and every package says what it owns.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
BASE = {"config", "errors", "api_keys", "tenancy", "logs"}
# What each package (or base module) may import from app, besides itself.
MAY_IMPORT: dict[str, set[str]] = {
    "base": {"base"},
    "engine": {"base"},
    "host": {"base", "engine"},
    "openai": {"base", "engine"},
    "routing": {"base", "engine", "host"},
    "scaling": {"base"},
    "http": {"base", "engine", "openai", "host.stats", "routing", "scaling.decision"},
    "rayserve": {"base", "engine", "host", "openai", "http", "routing", "scaling"},
    "cli": {"base", "engine", "host", "openai", "http", "rayserve", "routing", "scaling"},
}
LINES_MAX = 300
FUNCTION_LINES_MAX = 60
# Modules still over LINES_MAX, each at most its size when the packages were drawn: they may only shrink, and
# leave this list when they fit.
STILL_OVER: dict[str, int] = {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(APP.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, by its full dotted name (`from app.http import sse` names `app.http.sse`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import"
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
    return names


def _room(module: str) -> str:
    """The package a module of app belongs to ('base' for the base's modules and the config package)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "main"
    return "base" if parts[1] in BASE else parts[1]


def _allowed(importer: str, imported: str) -> bool:
    room, target = _room(importer), _room(imported)
    if room in ("main", target):
        return True
    allowed = MAY_IMPORT[room]
    return target in allowed or imported.removeprefix("app.") in allowed


def test_the_packages_are_there_and_say_what_they_own():
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py" and m != "app"}
    assert packages >= {"app.config", "app.engine", "app.engine.vllm", "app.engine.cpu", "app.host", "app.openai",
                        "app.http", "app.rayserve", "app.routing", "app.scaling", "app.cli"}
    for name in packages:
        assert ast.get_docstring(ast.parse(MODULES[name].read_text())), f"{name} does not say what it owns"
    top = {m.split(".")[1] for m in MODULES if m.count(".") >= 1}
    assert top <= BASE | {"engine", "host", "openai", "http", "rayserve", "routing", "scaling", "cli", "__main__"}, \
        f"only the base stays at the top of app/ beside the packages: {sorted(top)}"


def test_no_module_imports_upward():
    wrong = [
        f"{m} -> {i}"
        for m, p in MODULES.items()
        for i in _imports(p)
        if i.startswith("app.") and i in MODULES and not _allowed(m, i)
    ]
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_no_import_circle():
    graph = {m: {i for i in _imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(node):], node]))
        if node in done:
            return
        for nxt in graph[node]:
            if not MODULES[nxt].name == "__init__.py":  # a package's docstring-only __init__ imports nothing
                visit(nxt, [*path, node])
        done.add(node)

    for module in graph:
        visit(module, [])


def test_only_engine_vllm_imports_vllm_and_nothing_imports_both_fastapi_and_vllm():
    for module, path in MODULES.items():
        roots = {i.split(".")[0] for i in _imports(path)}
        if "vllm" in roots:
            assert module.startswith("app.engine.vllm"), f"{module} imports vLLM"
        assert not ({"fastapi", "starlette"} & roots and "vllm" in roots), f"{module} imports FastAPI and vLLM"


def test_no_module_is_over_the_size_of_one_job():
    sizes = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    over = {m: n for m, n in sizes.items() if n > STILL_OVER.get(m, LINES_MAX)}
    assert not over, f"over {LINES_MAX} lines (or grown past their size in STILL_OVER): {over}"
    fitted = {m for m in STILL_OVER if sizes.get(m, 0) <= LINES_MAX}
    assert not fitted, f"now within {LINES_MAX} lines: take them off STILL_OVER: {fitted}"


def test_no_function_is_over_the_length_of_one_job():
    """About a screen: a function longer than FUNCTION_LINES_MAX (docstring and all) does several jobs. The one
    table of declarations at the limit (http/metrics.py's `Metrics.__init__`) is data, not steps."""
    over = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES_MAX:
                    over[f"{module}.{node.name}"] = length
    assert not over, f"functions over {FUNCTION_LINES_MAX} lines: {over}"


def test_the_architecture_map_names_every_module():
    """docs/architecture.md's table is where a newcomer looks a module up: a module it does not name is lost."""
    doc = (APP.parent / "docs" / "architecture.md").read_text()
    rows = {m.group(1): line for line in doc.splitlines() if (m := re.match(r"\| `(app/[a-z_/]*)`", line))}
    unnamed = []
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            continue
        folder = f"{path.relative_to(APP.parent).parent.as_posix()}/"
        row = max((package for package in rows if folder.startswith(package)), key=len)  # its package's, or above
        if f"`{module.rsplit('.', 1)[-1]}`" not in rows[row]:
            unnamed.append(f"{module} (row {row})")
    assert not unnamed, f"docs/architecture.md's rows name no {unnamed}: add each to its package's row"
