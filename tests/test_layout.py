"""The package's layers, as the README's Layout section writes them (once), held against the code.

Every module of the package belongs to a unit: a subpackage (`run/`) or a top-level module
(`hparams.py`). The Layout block gives each unit a layer number; a module may import its own
unit and units of a higher-numbered layer only, so imports run one way, and nothing imports
in a circle. Imports under `if TYPE_CHECKING:` are annotations, never run, and are left out.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "domaingen"
# units that must not import each other although the layers would allow it: data code imports no model code
FORBIDDEN = {("datasets", "networks"), ("datasets", "masks"), ("datasets", "algorithms")}
LINE = re.compile(r"^\s*(\d+)\s+(\S+)\s+\S")


def readme_layers(readme: str) -> dict[str, int]:
    """unit -> layer, from the first fenced block after the '## Layout' heading."""
    section = readme.split("\n## Layout", 1)[1]
    block = section.split("```", 2)[1]
    layers = {}
    for line in block.splitlines():
        match = LINE.match(line)
        if match:
            unit = match.group(2).rstrip("/").removesuffix(".py")
            layers[unit] = int(match.group(1))
    return layers


def package_units() -> set[str]:
    """Every subpackage and top-level module of domaingen/ (the root __init__ as '__init__')."""
    units = set()
    for path in PACKAGE.iterdir():
        if path.is_dir() and (path / "__init__.py").exists():
            units.add(path.name)
        elif path.suffix == ".py":
            units.add(path.stem)
    return units


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def unit_of(module: str) -> str:
    """'domaingen.run.training' -> 'run'; 'domaingen' (the root package) -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(id(n) for n in ast.walk(child))
    return skipped


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports when it runs (at module level or inside functions)."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_blocks(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "domaingen":
                continue
            for alias in node.names:  # `from domaingen.sweep import parallel` imports a module
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "domaingen")
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {module: imports_of(path, set(paths)) for module, path in paths.items()}


def layer_violations(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        source = unit_of(module)
        for target in sorted(targets):
            dest = unit_of(target)
            if dest == source:
                continue
            if (source, dest) in FORBIDDEN:
                problems.append(f"{module} imports {target}: {source} never imports {dest}")
            elif layers[dest] <= layers[source]:
                problems.append(f"{module} (layer {layers[source]}) imports {target} (layer {layers[dest]})")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), a package's __init__
    importing its own children excepted (that is how a package re-exports, not a circle)."""
    def edges(module):
        # a child module's import of its own package runs that package's __init__ first,
        # before the child: the arrow from __init__ down to the child is not part of a circle
        return [t for t in graph.get(module, ()) if t in graph and not t.startswith(module + ".")]

    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return result


def test_every_unit_has_a_layout_line_and_every_line_a_unit():
    layers = readme_layers((ROOT / "README.md").read_text())
    units = package_units()
    assert sorted(units - set(layers)) == [], "units without a line in the README's Layout"
    assert sorted(set(layers) - units) == [], "Layout lines for units that are gone"


def test_imports_run_down_the_layers():
    layers = readme_layers((ROOT / "README.md").read_text())
    assert layer_violations(import_graph(), layers) == []


def test_no_import_circle_in_the_package():
    assert cycles(import_graph()) == []


def test_the_checks_catch_what_they_should(tmp_path):
    layers = {"cli": 1, "run": 5, "datasets": 7, "networks": 8, "errors": 10}
    graph = {"domaingen.run.training": {"domaingen.cli.main"}, "domaingen.datasets.x": {"domaingen.networks"},
             "domaingen.cli.main": {"domaingen.run.training"}, "domaingen.errors": set()}
    assert layer_violations(graph, layers) == [
        "domaingen.datasets.x imports domaingen.networks: datasets never imports networks",
        "domaingen.run.training (layer 5) imports domaingen.cli.main (layer 1)",
    ]
    assert cycles(graph) == [["domaingen.cli.main", "domaingen.run.training"]]
    readme = "x\n## Layout\n\n```\n1  cli/   the command\n10 errors.py  errors\n```\n"
    assert readme_layers(readme) == {"cli": 1, "errors": 10}
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from domaingen.cli import x\n"
                      "def f():\n    from domaingen.run import training\n")
    assert imports_of(source, {"domaingen.run.training"}) == {"domaingen.run.training"}
