"""Fingerprints of a stage's own code: the stage module and every mnnbuild module it imports.

Editing a module changes the fingerprint of exactly the stages that import it (directly or
through other mnnbuild modules). Stages never import each other (they share `mnnbuild.manifests`),
so a stage's fingerprint covers its own code and the library code it calls, nothing downstream
of it or beside it. Only what runs counts: a module is hashed as its syntax tree without
docstrings, comments or pydantic ``Field(description=..., title=...)`` text, so editing docs
rebuilds nothing.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mnnbuild.base.fsutil import atomic_write_text, parse_json

PACKAGE = "mnnbuild"
PACKAGES = (PACKAGE, "mnnbuild_runtime")
"""Our code: a stage's fingerprint covers what it imports of both (verify runs bundles with the runtime)."""
# a cheap first look: only files with an import of ours or a relative import are parsed
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
_MAYBE_OURS = re.compile(r"^\s*(from|import)\s+(mnnbuild(_runtime)?\b|\.)", re.MULTILINE)


@functools.cache
def _package_dir(package: str = PACKAGE) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def _ours(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in PACKAGES)


@functools.cache  # a doit start looks up the same names for every stage's closure
def _module_file(name: str) -> Path | None:
    """The source file of an mnnbuild module, found on disk: ``importlib.util.find_spec`` would import the
    parent of a name such as ``mnnbuild.report.render.render_html`` (a function, not a module), and with it
    Jinja2, at every doit start."""
    parts = name.split(".")
    if parts[0] not in PACKAGES:
        return None
    root = _package_dir(parts[0])
    base = root.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if len(parts) > 1 and path.is_file():
            return path
    return root / "__init__.py" if len(parts) == 1 else None


def _parse(path: Path) -> ast.Module:
    st = path.stat()
    return _parse_version(path, st.st_size, st.st_mtime_ns)


@functools.cache
def _parse_version(path: Path, size: int, mtime_ns: int) -> ast.Module:
    """One parse per file version (the import scan and the digest share it)."""
    return ast.parse(path.read_bytes(), filename=str(path))


@functools.cache
def _imports(path: Path, module: str) -> frozenset[str]:
    """Names of our modules (mnnbuild, mnnbuild_runtime) imported by the source at ``path``."""
    text = path.read_text(encoding="utf-8")
    if not _MAYBE_OURS.search(text):
        return frozenset()  # e.g. the large generated flatbuffers module: parsing it is the slow part
    tree = _parse(path)
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    # a From(...) edge needs the name From in the source: most modules have none, and their walk is the cost
    edges = _edge_only_names(tree) if _FROM.search(text) else set()
    found: set[str] = set()
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = [a for a in node.names if (a.asname or a.name) not in edges]
            if not names:
                continue  # only names an upstream stage's manifest in a From(...) edge: no code of it runs here
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(p for p in [*parts, base] if p)
            found.add(base)
            # `from pkg import mod` may name a submodule
            found.update(f"{base}.{a.name}" for a in names)
    return frozenset(n for n in found if _ours(n))


_FROM = re.compile(r"\bFrom\b")


def _statements(stmts: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement in ``stmts`` and, recursively, in their blocks (function and class bodies, branches,
    handlers, match cases): where imports can be. Expressions hold no statements, so they are not walked."""
    for stmt in stmts:
        yield stmt
        for block in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, block, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                yield from _statements(inner)
        for holder in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
            yield from _statements(holder.body)


def _edge_only_names(tree: ast.Module) -> set[str]:
    """Names used only as the manifest type of a ``From(...)`` edge: a stage's Inputs name the upstream stage that
    way, which makes the upstream's dir an input (by content), not its code or schema part of this stage's."""
    in_edges: dict[str, int] = {}
    uses: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "From" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Name):
                in_edges[first.id] = in_edges.get(first.id, 0) + 1
        elif isinstance(node, ast.Name):
            uses[node.id] = uses.get(node.id, 0) + 1
    # every use of the name: the From argument is an ast.Name too, so it is counted in both
    return {name for name, n in in_edges.items() if uses.get(name, 0) == n}


@functools.cache
def module_closure(module: str, memo: DigestMemo | None = None) -> tuple[tuple[str, Path], ...]:
    """Every module of ours reachable by imports from ``module``, with its file, sorted by name.

    With a ``memo`` a file's imports are scanned once per file version, across runs.
    """
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
        todo.extend((memo.imports(path, name) if memo else _imports(path, name)) - seen.keys())
        # importing a submodule runs its parents' __init__ too
        parent = name.rpartition(".")[0]
        if parent:
            todo.append(parent)
    return tuple(sorted(seen.items()))


_DOC_KEYWORDS = frozenset({"description", "title"})


def _is_doc(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _drop_field_docs(value: ast.expr | None) -> None:
    """``Field(..., description=..., title=...)`` as a statement's value: drop the doc keywords."""
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "Field":
            value.keywords = [k for k in value.keywords if k.arg not in _DOC_KEYWORDS]


def _strip_docs(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """Statements without docstrings (module, class, function and attribute ones), recursively.

    Walks statements only (not every expression node): docstrings and pydantic fields only occur there.
    """
    kept = [s for s in stmts if not _is_doc(s)]
    for stmt in kept:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            _drop_field_docs(stmt.value)
        for block in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, block, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                setattr(stmt, block, _strip_docs(inner))
        for handler in getattr(stmt, "handlers", ()):
            handler.body = _strip_docs(handler.body)
        for case in getattr(stmt, "cases", ()):
            case.body = _strip_docs(case.body)
    return kept or [ast.Pass()]


def _source_digest(path: Path) -> str:
    """What of one module's source can change behaviour: its syntax tree without docs and comments.

    The large generated flatbuffers module is hashed as bytes (parsing it is the slow part, and it is
    only ever regenerated, never edited by hand).
    """
    if "_generated" in path.parts:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    tree = _parse(path)
    tree.body = _strip_docs(tree.body)  # in place: imports are untouched, and the tree is cached
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


@functools.cache
def _content_version(path: Path, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _content_sha(path: Path) -> str:
    """sha256 of a file's bytes, read once per file version in this process."""
    st = path.stat()
    return _content_version(path, st.st_size, st.st_mtime_ns)


class DigestMemo:
    """Per-file source digests and import lists remembered across runs by the file's content hash.

    Keyed by content, not by path or mtime, the memo is valid wherever the same source is found: a fresh
    clone or a new artifact root parses only files it has never seen. An entry can't be stale: another
    content is another key.
    """

    MAX_ENTRIES = 8192  # a few hundred files x many versions; beyond it, entries this run did not use go first

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, Any] = {}
        self.used: set[str] = set()
        self.dirty = False
        self.closures: dict[str, dict[str, str]] = {}
        """`module_digests` by module, made once with this memo (a doit run's): its stages share their closures."""
        if path is not None:
            try:
                loaded = parse_json(path.read_text(encoding="utf-8"))
                self.entries = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                self.entries = {}

    def _remembered(self, key: str, compute: Callable[[], Any]) -> Any:
        self.used.add(key)
        if key in self.entries:
            return self.entries[key]
        value = self.entries[key] = compute()
        self.dirty = True
        return value

    def remembered(self, key: str, compute: Callable[[], str], valid: Callable[[str], object]) -> str:
        """The string remembered under ``key``, or ``compute()`` remembered: a value ``valid`` refuses (a memo that is
        not ours: edited, damaged) is made again."""
        value = self._remembered(key, compute)
        if isinstance(value, str) and valid(value):
            return value
        value = self.entries[key] = compute()
        self.dirty = True
        return value

    def digest(self, path: Path) -> str:
        return str(self._remembered(f"digest {_content_sha(path)}", lambda: _source_digest(path)))

    def imports(self, path: Path, module: str) -> frozenset[str]:
        """`_imports`, remembered: a no-op build parses no source at all."""
        names = self._remembered(f"imports {module} {_content_sha(path)}", lambda: sorted(_imports(path, module)))
        if isinstance(names, list) and all(isinstance(n, str) and _MODULE_NAME.match(n) for n in names):
            return frozenset(names)
        # a memo that is not ours (edited, damaged) names no file: only a dotted name can, and only under our packages
        return _imports(path, module)

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        if len(self.entries) > self.MAX_ENTRIES:
            self.entries = {k: v for k, v in self.entries.items() if k in self.used}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps(self.entries, sort_keys=True))
        except OSError:
            return  # only a speed-up
        self.dirty = False


def module_digests(module: str, memo: DigestMemo | None = None) -> dict[str, str]:
    """The code digest of ``module`` and of each of its imports of ours, by module name (sorted). With a ``memo``,
    once per module for that memo, as ``module_closure`` is once per process: a run's code does not change under
    it, and each task's key and code record would otherwise look up the same files again."""
    if memo is None:
        return {name: _source_digest(path) for name, path in module_closure(module)}
    if module not in memo.closures:
        memo.closures[module] = {name: memo.digest(path) for name, path in module_closure(module, memo)}
    return dict(memo.closures[module])


def code_fingerprint(module: str, memo: DigestMemo | None = None) -> str:
    """sha256 over the code of ``module`` and its imports of ours (generated code included)."""
    digest = hashlib.sha256()
    for name, value in module_digests(module, memo).items():
        digest.update(name.encode() + b"\0" + value.encode() + b"\0")
    return digest.hexdigest()[:16]
