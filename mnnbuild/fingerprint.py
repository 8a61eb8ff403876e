"""Fingerprints of a stage's own code: the stage module and every mnnbuild module it imports.

Editing a module changes the fingerprint of exactly the stages that import it (directly or
through other mnnbuild modules), so only those stages and their dependents rebuild.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import re
from pathlib import Path

PACKAGE = "mnnbuild"
# a cheap first look: only files with an import of mnnbuild or a relative import are parsed
_MAYBE_OURS = re.compile(rf"^\s*(from|import)\s+({PACKAGE}\b|\.)", re.MULTILINE)


def _module_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


@functools.cache
def _imports(path: Path, module: str) -> frozenset[str]:
    """Names of mnnbuild modules imported by the source at ``path``."""
    text = path.read_text(encoding="utf-8")
    if not _MAYBE_OURS.search(text):
        return frozenset()  # e.g. the large generated flatbuffers module: parsing it is the slow part
    tree = ast.parse(text, filename=str(path))
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(p for p in [*parts, base] if p)
            found.add(base)
            # `from pkg import mod` may name a submodule
            found.update(f"{base}.{a.name}" for a in node.names)
    return frozenset(n for n in found if n == PACKAGE or n.startswith(PACKAGE + "."))


@functools.cache
def module_closure(module: str) -> tuple[tuple[str, Path], ...]:
    """Every mnnbuild module reachable by imports from ``module``, with its file, sorted by name."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen[name] = path
        todo.extend(_imports(path, name) - seen.keys())
        # importing a submodule runs its parents' __init__ too
        parent = name.rpartition(".")[0]
        if parent:
            todo.append(parent)
    return tuple(sorted(seen.items()))


@functools.cache
def code_fingerprint(module: str) -> str:
    """sha256 over the sources of ``module`` and its mnnbuild imports (generated code included)."""
    digest = hashlib.sha256()
    for name, path in module_closure(module):
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
