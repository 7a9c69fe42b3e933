"""The package's shape stays readable: no file in visionmoe/splat over 600 lines, no function
over 80, no import cycle between its modules, no module state changed at run time (``global``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "visionmoe" / "splat"
FILES = sorted(PKG.rglob("*.py"))
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
# Known exceptions, each to be split by the module's owner (path relative to visionmoe/splat: function)
KNOWN_LONG_FUNCTIONS = {"formats/compressed_ply.py": {"read_compressed_ply"}}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parents[1]).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in FILES}


def test_the_package_is_found():
    assert "visionmoe.splat.codec" in MODULES and "visionmoe.splat.encoder.rungs" in MODULES


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_file_and_function_lengths(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_FILE_LINES, f"{path.name}: {len(text.splitlines())} lines"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
            and node.name not in KNOWN_LONG_FUNCTIONS.get(path.relative_to(PKG).as_posix(), ())]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_no_module_state_written_at_run_time(path):
    globals_ = [node.lineno for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Global)]
    assert not globals_, f"{path.name}: `global` statements at lines {globals_} (pass options as arguments)"


def imports_of(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its file (lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:  # a name inside a module: the module
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                out.add(t)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_cycle():
    graph = {}
    for name, path in MODULES.items():
        # a package's __init__ is imported by its submodules' import machinery anyway; an edge
        # from a submodule to its own package (``from . import x`` of a sibling) is not a cycle
        graph[name] = {m for m in imports_of(name, path) if not name.startswith(m + ".")}
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_the_cycle_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_library_never_imports_the_command_line():
    for name, path in MODULES.items():
        if not name.startswith("visionmoe.splat.cli") and name != "visionmoe.splat.__main__":
            assert not any(m.startswith("visionmoe.splat.cli") for m in imports_of(name, path)), name
