"""The package's shape stays readable, for the whole of ``visionmoe``: no file over 600 lines,
no function over 80, no import cycle between modules, no module state changed at run time
(``global``), and the layers hold: ``ops`` and ``common`` know nothing of the plug-ins, the two
plug-ins never import each other, the library never imports a command line, ``scripts/`` or
``tests/``, run-time code never imports evaluation or training code, and only ``ops`` and the
tests use ``ops._torch_ref`` (the tests' oracle)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "visionmoe"
FILES = sorted(PKG.rglob("*.py"))
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
# rooms whose code a user runs only to evaluate, train or type commands
OFFLINE_ROOMS = {"evaluation", "training", "cli", "__main__"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in FILES}
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def rel(path: Path) -> str:
    return path.relative_to(PKG).as_posix()


def test_the_package_is_found():
    for name in ("visionmoe.ops.raster", "visionmoe.common.files", "visionmoe.splat.encoder",
                 "visionmoe.splat.pgms", "visionmoe.video.pila", "visionmoe.video.hooks"):
        assert name in MODULES, name


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_file_and_function_lengths(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{rel(path)}: {lines} lines"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(TREES[module_name(path)])
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{rel(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_no_module_state_written_at_run_time(path):
    found = [node.lineno for node in ast.walk(TREES[module_name(path)]) if isinstance(node, ast.Global)]
    assert not found, f"{rel(path)}: `global` statements at lines {found} (pass options as arguments)"


def raw_imports(name: str) -> set[str]:
    """Every module name ``name`` imports anywhere in its file (lazy imports included),
    relative imports resolved; names imported from a module are kept as ``module.name``."""
    package = name if MODULES[name].name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.update(f"{mod}.{a.name}" for a in node.names)
            out.add(mod)
    return out


def package_imports(name: str) -> set[str]:
    """The package's modules that ``name`` imports (a name inside a module counts as the module)."""
    out = set()
    for target in raw_imports(name):
        while target and target not in MODULES:
            target = target.rsplit(".", 1)[0] if "." in target else ""
        if target and target != name:
            out.add(target)
    return out


IMPORTS = {name: package_imports(name) for name in MODULES}


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
    # a submodule importing its own package (``from . import x`` of a sibling) is no cycle: the
    # import machinery loads the package first anyway
    graph = {name: {m for m in deps if not name.startswith(m + ".")} for name, deps in IMPORTS.items()}
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def area(name: str) -> str:
    return name.split(".")[1] if "." in name else ""


def offline(name: str) -> bool:
    """A plug-in's evaluation, training or command-line module (``common``'s CLI scaffolding is
    shared run-time code, not a command line)."""
    return area(name) in ("splat", "video") and bool(OFFLINE_ROOMS & set(name.split(".")[2:]))


def command_line(name: str) -> bool:
    return area(name) in ("splat", "video") and bool({"cli", "__main__"} & set(name.split(".")[2:]))


def offenders(rule) -> list[str]:
    return sorted(f"{a} imports {b}" for a, deps in IMPORTS.items() for b in deps if rule(a, b))


def test_layers_ops_and_common_know_nothing_of_the_plugins():
    assert not offenders(lambda a, b: area(a) in ("ops", "common") and area(b) in ("splat", "video"))
    assert not offenders(lambda a, b: area(a) == "common" and area(b) != "common")


def test_common_is_standard_library_only():
    for name in (n for n in MODULES if area(n) == "common"):
        outside = {t.split(".")[0] for t in raw_imports(name)} - set(sys.stdlib_module_names) - {"visionmoe", ""}
        assert not outside, f"{name} imports {sorted(outside)}"


def test_the_plugins_never_import_each_other():
    assert not offenders(lambda a, b: {area(a), area(b)} == {"splat", "video"})


def test_the_library_never_imports_a_command_line_scripts_or_tests():
    assert not offenders(lambda a, b: command_line(b) and not command_line(a))
    for name in MODULES:
        roots = {t.split(".")[0] for t in raw_imports(name)}
        assert not roots & {"scripts", "tests", "conftest"}, name


def test_run_time_code_never_imports_evaluation_or_training():
    assert not offenders(lambda a, b: not offline(a) and offline(b))


def test_only_ops_uses_the_tests_reference():
    assert not offenders(lambda a, b: b == "visionmoe.ops._torch_ref" and area(a) != "ops")


def test_the_rules_catch_what_they_forbid():
    assert offline("visionmoe.video.evaluation.metrics") and not offline("visionmoe.video.physics.tracks")
    assert command_line("visionmoe.splat.cli.pgms") and not command_line("visionmoe.common.cli")
    assert area("visionmoe.splat.pgms.decode") == "splat"
