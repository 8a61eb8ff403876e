"""Content hashing and atomic outputs: a stage's output directory appears whole or not at all."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from mnnbuild.errors import OutputError, UnsafePathError

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
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as exc:
        raise _unwritable(out_dir, exc) from None
    try:
        yield tmp
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in _UNWRITABLE:
            raise _unwritable(out_dir, exc) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, out_dir)


# errors that mean "this location cannot take the output" (not a bug, not bad input): one line, no traceback
_UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})


def _unwritable(out_dir: Path, exc: OSError) -> OutputError:
    where = exc.filename or out_dir
    return OutputError(f"{where}: cannot write the output ({exc.strerror or exc}); {out_dir} was left as it was")


def check_free_space(directory: Path, need: int) -> None:
    """Refuse up front to write ``need`` bytes where they do not fit, for writers (MNN's) that crash on a
    full disk instead of reporting it."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    if free < need:
        raise OutputError(
            f"{directory}: No space left on device: writing needs about {need / 1e6:.1f} MB, {free / 1e6:.1f} MB free"
        )


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


def confined(base: Path, rel: str, what: str) -> Path:
    """``base / rel`` for a relative path read from a file, refused unless it stays inside ``base``.

    ``rel`` may not be absolute or contain ``..``, and once resolved (symlinks already in ``base``
    followed) it must still lie under ``base``: a path read from a cache entry, manifest or model
    directory can never name a file elsewhere. ``what`` says where ``rel`` came from, for the error.
    """
    pure = PurePosixPath(rel)
    if not rel or "\\" in rel or pure.is_absolute() or ".." in pure.parts or "\0" in rel:
        raise UnsafePathError(f"{what}: path {rel!r} must be relative, without '..', inside {base}")
    root = Path(base).resolve()
    resolved = (root / pure).resolve()
    if root not in resolved.parents:
        raise UnsafePathError(f"{what}: path {rel!r} leads outside {base} (to {resolved}) through a symlink")
    return Path(base) / pure
