"""Content hashing and atomic outputs: a stage's output directory appears whole or not at all."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

_CHUNK = 8 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's content (symlinks followed), read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(*parts: bytes) -> str:
    """Hex sha256 of the concatenated ``parts`` (the one content hash of mnnbuild and its runtime)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


@contextlib.contextmanager
def staged_dir(out_dir: Path) -> Iterator[Path]:
    """Yield an empty temp directory next to ``out_dir``; on success it replaces ``out_dir``.

    On any exception the temp directory is removed and an existing ``out_dir`` is left as it
    was, so a failed or interrupted stage never leaves a half artifact under the final name.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, out_dir)


def replace_dir(src: Path, dst: Path) -> None:
    """Move directory ``src`` to ``dst``, replacing an existing ``dst`` with two renames."""
    old = None
    if dst.exists() or dst.is_symlink():
        old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(dst, old)
    os.replace(src, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a file through a temp name and rename, so readers never see it half written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def relative_symlink(target: Path, link: Path) -> None:
    """Create ``link`` pointing at ``target`` by a relative path (portable when both move together)."""
    rel = os.path.relpath(Path(target).resolve(), Path(link).parent.resolve())
    os.symlink(rel, link)
