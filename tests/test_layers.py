"""Layering: lower layers never import higher ones, and no two packages import each other (even lazily).

Units are mnnbuild's subpackages and top-level modules, plus ``mnnbuild_runtime``. Imports are read with
``ast`` (function-level and ``TYPE_CHECKING`` imports included), never by importing the code.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from tests.conftest import PROJECT_ROOT

LAYERS: list[set[str]] = [
    {"mnnbuild", "base"},  # foundations: errors, hashing and atomic files, logging, the numeric comparison
    {"mnn", "qnn", "cpu"},  # format layers: MNN flatbuffers, QNN C API, MNN's CPU runtime
    {"pipeline"},  # the DAG's machinery: stage declaration, manifests, layout, fingerprints, cache, settings
    {"dag"},  # the only doit code: tasks derived from the stage declarations it is handed (dodo.py hands the chain)
    {"model"},  # what a model is: spec, targets, the model directory's files, a visual encoder's inputs
    {"manifests"},  # what each stage reads and writes (stages share these instead of importing each other)
    {"mnnbuild_runtime"},  # runs a bundle; knows nothing about the build
    {"samples"},  # the io stage's reference samples: their inputs, what a model must be to make them
    {"lowering"},
    {"partition"},  # the cut: which ops run where, the plugins' graphs
    {"plugin"},  # what is made of a plugin's graphs: lowered graphs, context binaries, their twins
    {"verify"},
    {"report"},  # the page report's data, figures and HTML
    {"stages"},
    {"conform"},  # runs bundles through MNN's own engine (a command, not a stage)
    {"__main__"},
]
"""Bottom to top; a unit may import its own layer (without a cycle) and the layers below."""

RUNTIME_MAY_IMPORT = {"mnnbuild_runtime", "mnnbuild", "base", "mnn", "qnn", "cpu"}
"""The runtime installs on its own: it ships with the format layers and nothing of the build."""

DAG_MAY_IMPORT = {"dag", "mnnbuild", "base", "pipeline"}
"""dag derives every task from the declarations (`mnnbuild.pipeline.stage.Stage`) and the models the chain is declared
over (`mnnbuild.pipeline.models.Models`): it names no stage, imports no stage, manifest, model or library package (the
per-plugin fan-out, the lock of a source, a guard's check, what the run's ending says are declared on the stages; how
specs are found and what a model's parts are, on the chain's models)."""

PACKAGE_ROOTS = {
    "mnnbuild": PROJECT_ROOT / "mnnbuild",
    "mnnbuild_runtime": PROJECT_ROOT / "runtime" / "mnnbuild_runtime",
}


def unit_of(module: str) -> str | None:
    """The layering unit of a dotted module name, or None for code outside the project."""
    parts = module.split(".")
    if parts[0] == "mnnbuild_runtime":
        return "mnnbuild_runtime"
    if parts[0] != "mnnbuild":
        return None
    return parts[1] if len(parts) > 1 else "mnnbuild"


def module_name(root_name: str, root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("").parts
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join((root_name, *rel))


def imports_of(path: Path, module: str) -> set[str]:
    """Absolute names of every module ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def unit_edges(roots: dict[str, Path]) -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> the files where that happens, for edges between different units."""
    edges: dict[tuple[str, str], list[str]] = {}
    for root_name, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            if "_generated" in path.parts:
                continue
            module = module_name(root_name, root, path)
            src = unit_of(module)
            for target in imports_of(path, module):
                dst = unit_of(target)
                if dst is None or dst == src or (dst == "mnnbuild" and target != "mnnbuild"):
                    continue  # `from mnnbuild import x`: the unit is x's, counted through "mnnbuild.x"
                edges.setdefault((src, dst), []).append(str(path.relative_to(root.parent)))
    return edges


def layer_of(unit: str) -> int:
    for level, units in enumerate(LAYERS):
        if unit in units:
            return level
    raise AssertionError(f"unit {unit!r} has no layer; add it to LAYERS in tests/test_layers.py")


def upward_imports(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    problems = []
    for (src, dst), files in sorted(edges.items()):
        if layer_of(dst) > layer_of(src):
            problems.append(f"{src} imports higher layer {dst} in {sorted(set(files))}")
        if src == "mnnbuild_runtime" and dst not in RUNTIME_MAY_IMPORT:
            problems.append(
                f"mnnbuild_runtime imports {dst} (only {sorted(RUNTIME_MAY_IMPORT)}) in {sorted(set(files))}"
            )
        if src == "dag" and dst not in DAG_MAY_IMPORT:
            problems.append(f"dag imports {dst} (only {sorted(DAG_MAY_IMPORT)}) in {sorted(set(files))}")
    return problems


def cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)
        graph.setdefault(dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_upward_imports() -> None:
    edges = unit_edges(PACKAGE_ROOTS)
    assert edges, "no imports found: the scan is broken"
    assert upward_imports(edges) == []


def test_no_import_cycles_between_packages() -> None:
    assert cycles(unit_edges(PACKAGE_ROOTS)) == []


def test_every_unit_has_a_layer() -> None:
    for src, dst in unit_edges(PACKAGE_ROOTS):
        layer_of(src), layer_of(dst)


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    """The checker itself: a lazy upward import, a relative import cycle and a runtime reaching the build."""
    pkg = tmp_path / "mnnbuild"
    for sub in ("mnn", "lowering", "partition"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "mnn" / "model.py").write_text("def f():\n    from mnnbuild.partition import cut\n")
    (pkg / "lowering" / "lower.py").write_text("from ..partition.cut import plan\n")
    (pkg / "partition" / "cut.py").write_text("from mnnbuild.lowering import lower\n")
    rt = tmp_path / "runtime" / "mnnbuild_runtime"
    rt.mkdir(parents=True)
    (rt / "__init__.py").write_text("import mnnbuild.stages.verify\n")
    (pkg / "dag").mkdir()
    (pkg / "dag" / "tasks.py").write_text("def f():\n    from mnnbuild.mnn import model\n")
    edges = unit_edges({"mnnbuild": pkg, "mnnbuild_runtime": rt})
    problems = upward_imports(edges)
    assert any(p.startswith("mnn imports higher layer partition") for p in problems), problems
    assert any(p.startswith("lowering imports higher layer partition") for p in problems), problems
    assert any(p.startswith("mnnbuild_runtime imports higher layer stages") for p in problems), problems
    assert any(p.startswith("mnnbuild_runtime imports stages") for p in problems), problems
    assert any(p.startswith("dag imports mnn ") for p in problems), problems
    assert cycles(edges) == [["lowering", "partition"]]
