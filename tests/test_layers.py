"""The architecture holds: importing the pure core (documents, rules, fit, render, plan, saved plans, status)
loads no I/O — not the CLI, not the transport or SSH, not a state backend, not PostgreSQL."""

from __future__ import annotations

import ast
import importlib.metadata
import itertools
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SHELL_PREFIXES = ("engine_ctl.shell", "engine_ctl.cli", "engine_ctl.__main__")
SHELL = {"engine_ctl.state.local", "engine_ctl.state.postgres", "engine_ctl.state.base"}
IO_LIBRARIES = ("paramiko", "fabric", "invoke", "psycopg", "click", "rich")


def _core_modules() -> list[str]:
    """Every module under engine_ctl/core/ (the recorded state included), the providers, and the backends package."""
    names = []
    for path in sorted((ROOT / "engine_ctl" / "core").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    names += [f"engine_ctl.providers.{p.stem}" for p in sorted((ROOT / "providers").glob("*.py"))
              if p.stem != "__init__"]  # fmt: skip
    return [*names, "engine_ctl.state"]


def test_the_core_imports_no_shell_module_and_no_io_library() -> None:
    core = _core_modules()
    assert {"engine_ctl.core.plan.planner", "engine_ctl.core.plan.savedplan", "engine_ctl.core.fit.fitting"} <= set(
        core
    )
    script = (
        "import importlib, json, sys\n"
        f"for name in {core!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded = set(json.loads(out.stdout))
    shell = sorted(m for m in loaded if m in SHELL or m.startswith(SHELL_PREFIXES))
    libraries = sorted(m for m in loaded if m.split(".")[0] in IO_LIBRARIES)
    assert shell == [], f"the pure core loads shell modules: {shell}"
    assert libraries == [], f"the pure core loads I/O libraries: {libraries}"


# --- the house as drawn: the import graph, read with ast (deferred and TYPE_CHECKING imports included) ----------

PACKAGE_DIRS = {"engine_ctl": "engine_ctl", "providers": "engine_ctl.providers", "state": "engine_ctl.state",
                "templates": "engine_ctl.templates"}  # fmt: skip
LAYERS = (
    ("engine_ctl", "the package itself: its version"),
    ("engine_ctl.templates", "Jinja templates: data"),
    ("engine_ctl.providers", "everything engine-specific; needs nothing of the core (providers.base.Run)"),
    ("engine_ctl.core.*", "the core's shared values: model, diagnostics, names, sizes, weights"),
    ("engine_ctl.core.documents", "reading and checking the documents and the inventory"),
    ("engine_ctl.core.fit", "host and model facts, fit, placement, what a replica runs"),
    ("engine_ctl.core.record", "the recorded state's values"),
    ("engine_ctl.core.render", "units, the gateway's and the scaler's configuration"),
    ("engine_ctl.core.plan", "planning, saved plans, status"),
    ("engine_ctl.state", "the state backends"),
    ("engine_ctl.shell", "transport, facts, apply, the gateway's, scaler's and lifecycle's wings"),
    ("engine_ctl.cli", "click commands and views"),
    ("engine_ctl.__main__", "the entry point"),
)
"""Lowest first: a module imports only from its own layer or a lower one."""
STDLIB_ONLY = "engine_ctl.shell.remote"
"""Scripts that run on the hosts under their own Python: nothing of engine_ctl."""


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            found[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The project's modules `name` imports, anywhere in the file, each with the first line that does."""
    out: dict[str, int] = {}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.setdefault(target, node.lineno)
    return out


def _graph() -> tuple[dict[str, Path], dict[str, dict[str, int]]]:
    modules = _modules()
    return modules, {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(name: str) -> int:
    if name.startswith("engine_ctl.core.") and name.count(".") == 2:
        return next(i for i, (layer, _) in enumerate(LAYERS) if layer == "engine_ctl.core.*")
    matches = [i for i, (layer, _) in enumerate(LAYERS) if name == layer or name.startswith(layer + ".")]
    assert matches, f"{name} is in no layer: place it in tests/test_layers.py LAYERS (and docs/architecture.md)"
    return max(matches, key=lambda i: len(LAYERS[i][0]))


def _cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan, iterative), as a cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while (member := stack.pop()) != node:
                    component.append(member)
                component.append(node)
                if len(component) > 1:
                    components.append(_cycle_through(set(component), edges))
    return components


def _cycle_through(component: set[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """One cycle inside a strongly connected component: the shortest path from its first module back to it."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for child in sorted(edges[node]):
            if child == start:
                return [*paths[node], start]
            if child in component and child not in paths:
                paths[child] = [*paths[node], child]
                frontier.append(child)
    raise AssertionError(f"no cycle in {component}")


def _shown(path: list[str], edges: dict[str, dict[str, int]]) -> str:
    hops = [f"{a} (line {edges[a][b]})" for a, b in itertools.pairwise(path)]
    return " -> ".join([*hops, path[-1]])


def test_no_import_cycle_deferred_and_type_only_imports_included() -> None:
    _, edges = _graph()
    assert "engine_ctl.cli.main" in edges["engine_ctl.__main__"], "a function-local import is read"
    assert "engine_ctl.core.fit.hostfacts" in edges["engine_ctl.cli.facts_cmd"], "a TYPE_CHECKING import is read"
    cycles = [_shown(c, edges) for c in _cycles(edges)]
    assert cycles == [], "import cycles (cut them; a function-local import does not):\n" + "\n".join(cycles)


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    modules, edges = _graph()
    upward = [
        f"{a} (line {line}) imports {b}: {LAYERS[_layer(a)][0]} is below {LAYERS[_layer(b)][0]}"
        for a, targets in sorted(edges.items())
        for b, line in sorted(targets.items())
        if _layer(b) > _layer(a) or (_layer(b) == _layer(a) and b.startswith(STDLIB_ONLY) != a.startswith(STDLIB_ONLY))
    ]
    assert upward == [], "imports against the layers (core < state < shell < cli):\n" + "\n".join(upward)
    # host-side scripts import nothing of engine-ctl but the admin-socket client, which engine_ctl.shell.shipped
    # puts in place of that import when it ships them (tests/test_shipped.py runs them alone)
    shared = f"{STDLIB_ONLY}.haproxy_admin"
    remote = sorted(f"{a} imports {b}" for a, t in edges.items() if a.startswith(STDLIB_ONLY) for b in t if b != shared)
    assert remote == [], f"host-side scripts import engine-ctl: {remote}"
    assert not edges.get(shared), "the shared client imports nothing of engine-ctl"
    assert {_layer(m) for m in modules} == set(range(len(LAYERS))), "a layer with no module: update LAYERS"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution(module: str, candidates: list[str]) -> str:
    """The distribution of `module`: of several sharing its top-level name (ruamel.yaml and ruamel.yaml.clib
    share ruamel), the one whose name is the longest prefix of the module's."""
    named = [c for c in candidates if f"{_canonical(module)}-".startswith(f"{_canonical(c)}-")]
    return _canonical(max(named, key=len) if named else candidates[0])


def _requirement(text: str) -> str:
    return _canonical(re.split(r"[<>=!~\[; ]", text, maxsplit=1)[0])


def test_the_runtime_dependencies_are_exactly_what_the_product_imports() -> None:
    """No dead weight (a dependency no module imports: gguf and its numpy were one) and nothing undeclared."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_requirement(r) for r in project["dependencies"]}
    postgres = {_requirement(r) for r in project["optional-dependencies"]["postgres"]}
    distributions = importlib.metadata.packages_distributions()
    imported: dict[str, str] = {}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                modules = [node.module]
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "engine_ctl":
                    continue
                assert top in distributions, f"{name} imports {top}, which no installed distribution provides"
                imported.setdefault(_distribution(module, distributions[top]), name)
    comes_with = {"pydantic-core": "pydantic"}  # pydantic's own core, pinned by pydantic
    used = {comes_with.get(d, d) for d in imported}
    assert "gguf" not in declared and "numpy" not in declared
    assert used - declared - postgres == set(), f"imported but not declared: {sorted(used - declared - postgres)}"
    assert declared - used == set(), f"declared but imported by no module of engine-ctl: {sorted(declared - used)}"


def test_command_modules_print_only_through_the_views() -> None:
    """Issue 27: the CLI's command modules write through cli/views (output, status, plan) or a printer object, never
    the builtin print, so that colour, --json and a closed pipe are handled in one place."""
    calls = []
    for path in sorted((ROOT / "engine_ctl" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls == [], calls
