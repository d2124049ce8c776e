"""The shape of the package, as docs/design.md draws it: small modules and functions, no import
cycles, and the detection core (gpusync/detect/) importing nothing of the wing that drives it."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "gpusync"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 60
# Leaf modules of the whole package (they import nothing of gpusync): the core may use them.
CORE_MAY_IMPORT = {"gpusync.errors", "gpusync.modes"}
# Built-in example workloads are user code written as a user would, not gpusync's own design.
EXAMPLES = "gpusync.examples"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The gpusync modules `name` imports, lazily or not."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


@pytest.mark.parametrize("name", [n for n in MODULES if not n.startswith(EXAMPLES)])
def test_small_modules_and_functions(name):
    source = MODULES[name].read_text()
    lines = source.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines: split it"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{name}: {', '.join(long)}"


def test_no_import_cycles():
    """A package importing its own submodules (its face) is not a cycle; anything else is."""
    def edges(name):
        return {m for m in GRAPH[name] if not m.startswith(name + ".")}

    cycles, state = [], {}

    def visit(name, stack):
        state[name] = "open"
        for nxt in sorted(edges(name)):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*stack[stack.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[name] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


def test_leaf_modules_import_nothing_of_gpusync():
    """The core may use them only because they stand below everything, lazily or not."""
    imported = {name: sorted(GRAPH[name]) for name in CORE_MAY_IMPORT if GRAPH[name]}
    assert not imported, imported


def test_detection_core_imports_nothing_above_it():
    upward = {f"{name} -> {m}" for name, deps in GRAPH.items()
              if name.startswith("gpusync.detect") for m in deps
              if not m.startswith("gpusync.detect") and m not in CORE_MAY_IMPORT}
    assert not upward, "\n".join(sorted(upward))


# docs/design.md's Layout, top to bottom: a module imports only from its own layer or below.
# (gpusync.errors, _version, api and pytest_plugin, the package's face, stand outside.)
LAYERS = [
    "cli", "commands", "reporters", "fix", "tune_script", "tune", "gate", "baseline", "bench",
    "examples", "runs", "knobs", "remedies", "integrations", "techniques", "scan", "_spawned",
    "costmodel", "outputs", "trace", "report", "cost", "targets", "profiles", "workload", "stats",
    "fileio", "yamlfile", "progress", "verbosity", "processes", "schemas", "devtools", "detect",
]


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_each_layer_imports_only_from_below():
    upward = sorted(f"{name} -> {dep}" for name, deps in GRAPH.items() for dep in deps
                    if None not in (_layer(name), _layer(dep)) and _layer(dep) < _layer(name))
    assert not upward, "\n".join(upward)


def test_every_module_has_a_layer():
    outside = {"gpusync", "gpusync.__main__", "gpusync.errors", "gpusync.modes", "gpusync._version",
               "gpusync.api", "gpusync.pytest_plugin"}
    assert {m for m in MODULES if _layer(m) is None} == outside
