"""The sha256 of the binaries the runtime reads, each hashed once while its file is unchanged.

A plugin's context binary is read when it is checked and again at every load (with a bound on loaded contexts, a
plugin loads more than once), and each read must be the bytes that were checked: their hash proves it. Hashing
costs seconds per GB, so a :class:`FileHashes` keeps, per file, the hash of what was read together with the file's
stamp (size, mtime, ctime, inode of the open file, the same before and after the read): a later read with the same
stamp is of the same bytes and takes that hash without hashing them again. A stamp that differs (a write, a
replacement, a ``touch``) means hashing anew, so a changed file is caught exactly as before.

A caller that already knows a file's hash with its stamp (say, a build that hashed the file and recorded its stamp
then) seeds it as a :class:`KnownHash`; the runtime trusts it as far as the stamp still matches, never further.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from mnnbuild.base.fsutil import file_stamp, sha256_bytes


@dataclass(frozen=True)
class KnownHash:
    """A whole file's sha256 and the `file_stamp` it had when those bytes were hashed."""

    sha256: str
    stamp: tuple[int, ...]


def read_stamped(fh: BinaryIO, offset: int = 0, size: int = 0) -> tuple[bytes, tuple[int, ...] | None]:
    """``size`` bytes at ``offset`` (0: the whole file) of an open file, and the file's stamp when it is the same
    before and after the read (None: it changed meanwhile, or cannot be stat'ed; such bytes are always hashed)."""
    before = file_stamp(fh.fileno())
    if size:
        fh.seek(offset)
        data = fh.read(size)
    else:
        data = fh.read()
    after = file_stamp(fh.fileno())
    return data, tuple(before) if before is not None and before == after else None


class FileHashes:
    """The sha256 of bytes read from files, remembered per file, part (``offset``/``size``) and stamp (see the
    module doc). ``seconds`` and ``hashed`` say what hashing cost; ``trusted`` counts the reads that took a
    remembered hash."""

    def __init__(self, known: Mapping[str | os.PathLike[str], KnownHash] | None = None) -> None:
        self._known: dict[tuple[str, int, int], KnownHash] = {}
        for path, rec in (known or {}).items():
            self.add(path, rec)
        self.seconds = 0.0
        self.hashed = 0
        self.trusted = 0

    @staticmethod
    def _key(path: str | os.PathLike[str], offset: int, size: int) -> tuple[str, int, int]:
        return os.path.abspath(os.fspath(path)), offset if size else 0, size

    def add(self, path: str | os.PathLike[str], known: KnownHash) -> None:
        """Seed a whole file's hash (the stamp is the one it had when hashed)."""
        self._known[self._key(path, 0, 0)] = known

    def digest(
        self,
        path: Path | None,
        data: bytes,
        stamp: tuple[int, ...] | None,
        offset: int = 0,
        size: int = 0,
    ) -> str:
        """The sha256 of ``data``, read from ``path`` (None: bytes of no file) at ``offset``/``size`` while the file
        had ``stamp`` (`read_stamped`): remembered when that part of the file was hashed with that stamp, else
        hashed now (and remembered, if the stamp is known)."""
        key = self._key(path, offset, size) if path is not None else None
        if key is not None and stamp is not None:
            rec = self._known.get(key)
            if rec is not None and rec.stamp == stamp:
                self.trusted += 1
                return rec.sha256
        t0 = time.perf_counter()
        found = sha256_bytes(data)
        self.seconds += time.perf_counter() - t0
        self.hashed += 1
        if key is not None and stamp is not None:
            self._known[key] = KnownHash(found, stamp)
        return found
