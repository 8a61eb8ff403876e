"""The patches the conformance build applies to an MNN source tree, and a strict unified-diff applier.

Each patch is a file in ``mnnbuild/conform/patches/`` (applied in name order): free text saying why, then
a unified diff (``--- a/<path>`` / ``+++ b/<path>`` / ``@@`` hunks). Hunks must match exactly (no fuzz, no
offset search beyond the whole file): a patch written for another MNN commit must not land somewhere else.
:func:`check_patches` applies every patch in memory first, so a patch that no longer fits stops the build
with one line naming the patch and the file before anything is built or written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mnnbuild.base.errors import PatchError

PATCH_DIR = Path(__file__).parent / "patches"

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old: tuple[str, ...]
    new: tuple[str, ...]


@dataclass(frozen=True)
class FilePatch:
    path: str
    hunks: tuple[Hunk, ...]


@dataclass(frozen=True)
class Patch:
    name: str
    why: str
    files: tuple[FilePatch, ...]
    text: str


def _strip_prefix(header: str, patch_name: str) -> str:
    path = header.split("\t", 1)[0].strip()
    if not path.startswith(("a/", "b/")):
        raise PatchError(f"patch {patch_name}: file header {header!r} must name a/<path> or b/<path>")
    rel = path[2:]
    if rel.startswith("/") or ".." in Path(rel).parts:
        raise PatchError(f"patch {patch_name}: file {rel!r} must be a relative path inside the source tree")
    return rel


def parse_patch(path: Path) -> Patch:
    """Read one patch file; its text before the first ``--- `` line is the reason it exists (required)."""
    name = path.name
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("--- ")), None)
    if first is None:
        raise PatchError(f"patch {name}: no '--- a/<file>' line; expected a unified diff")
    why = "\n".join(lines[:first]).strip()
    if not why:
        raise PatchError(f"patch {name}: no comment header before the diff saying why the patch exists")
    files: list[FilePatch] = []
    i = first
    while i < len(lines):
        if not lines[i].startswith("--- "):
            raise PatchError(f"patch {name}: line {i + 1}: expected '--- a/<file>', got {lines[i]!r}")
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"patch {name}: line {i + 2}: expected '+++ b/<file>' after the '---' line")
        rel = _strip_prefix(lines[i + 1][4:], name)
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK.match(lines[i])
            if not m:
                raise PatchError(f"patch {name}: {rel}: line {i + 1}: malformed hunk header {lines[i]!r}")
            old_len = int(m.group(2) or 1)
            new_len = int(m.group(4) or 1)
            i += 1
            old: list[str] = []
            new: list[str] = []
            while i < len(lines) and (len(old) < old_len or len(new) < new_len):
                line = lines[i]
                tag, body = (line[:1], line[1:]) if line else (" ", "")
                if tag == " ":
                    old.append(body)
                    new.append(body)
                elif tag == "-":
                    old.append(body)
                elif tag == "+":
                    new.append(body)
                elif tag != "\\":
                    raise PatchError(f"patch {name}: {rel}: line {i + 1}: unexpected {line!r} inside a hunk")
                i += 1
            if len(old) != old_len or len(new) != new_len:
                raise PatchError(f"patch {name}: {rel}: hunk at line {m.group(1)} is shorter than its header says")
            hunks.append(Hunk(int(m.group(1)), tuple(old), tuple(new)))
        if not hunks:
            raise PatchError(f"patch {name}: {rel}: no hunks")
        files.append(FilePatch(rel, tuple(hunks)))
    return Patch(name, why, tuple(files), text)


def load_patches(patch_dir: Path = PATCH_DIR) -> list[Patch]:
    return [parse_patch(p) for p in sorted(patch_dir.glob("*.patch"))]


def _apply_file(lines: list[str], fp: FilePatch, patch_name: str) -> list[str]:
    out = list(lines)
    shift = 0
    for n, hunk in enumerate(fp.hunks, 1):
        at = hunk.old_start - 1 + shift if hunk.old else hunk.old_start + shift
        if out[at : at + len(hunk.old)] != list(hunk.old):
            raise PatchError(
                f"patch {patch_name} does not apply to {fp.path}: hunk {n} (line {hunk.old_start}) "
                "does not match the source; the patch needs updating for this MNN source"
            )
        out[at : at + len(hunk.old)] = hunk.new
        shift += len(hunk.new) - len(hunk.old)
    return out


def check_patches(source_dir: Path, patches: list[Patch]) -> dict[str, str]:
    """Apply every patch in memory, in order; returns the patched text per touched file (nothing written).

    Raises :class:`PatchError` with one line naming the first patch and file that do not apply."""
    patched: dict[str, list[str]] = {}
    endings: dict[str, bool] = {}
    for patch in patches:
        for fp in patch.files:
            if fp.path not in patched:
                target = source_dir / fp.path
                if not target.is_file():
                    raise PatchError(f"patch {patch.name} does not apply to {fp.path}: no such file in {source_dir}")
                text = target.read_text(encoding="utf-8")
                endings[fp.path] = text.endswith("\n")
                patched[fp.path] = text.splitlines()
            patched[fp.path] = _apply_file(patched[fp.path], fp, patch.name)
    return {path: "\n".join(lines) + ("\n" if endings[path] else "") for path, lines in patched.items()}
