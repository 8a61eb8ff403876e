"""Blobs hashed once (local caches): the stamp a blob had when its bytes were checked, recorded beside it, lets a
restore take it without hashing it again; and restoring one blob, checked against its name."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import threading
import time
import uuid
from pathlib import Path

from mnnbuild.base.fsutil import (
    copy_content,
    copy_hashed,
    file_stamp,
    hash_stamped,
    parse_json,
    settled,
    sha256_file,
)
from mnnbuild.pipeline.cache.entries import PARTIAL_MARK, CachedFile
from mnnbuild.pipeline.cache.files import CacheFiles

log = logging.getLogger(__name__)

_COPY_CHUNK = 8 << 20


class VouchedBlobs(CacheFiles):
    """Writing, vouching for and restoring blobs."""

    def _vouch(self, sha: str, stamp: list[int] | None) -> None:
        """Record that blob ``sha`` holds the bytes of that name while it has ``stamp`` (taken when they were checked,
        and `settled` then: None records nothing). Written under a temp name and renamed; only a speed-up, so a
        write that fails is no error."""
        if not self.local or not self.writable or stamp is None:
            return
        path = self._stamp_file(sha)
        tmp = path.with_name(f"{path.name}{PARTIAL_MARK}{uuid.uuid4().hex[:8]}")
        try:
            tmp.write_text(json.dumps(stamp), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:  # a read-only cache: a hash when restored
            log.debug("cache: cannot record the stamp of blob %s (%s)", sha[:12], exc)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)

    def _vouched(self, sha: str, size: int) -> list[int] | None:
        """The stamp of blob ``sha`` when it is the one recorded when its bytes were checked (`_vouch`): those bytes
        are still there. None: not recorded, or the blob changed since (written, replaced, touched)."""
        if not self.local:
            return None
        try:
            recorded = parse_json(self._stamp_file(sha).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        now = file_stamp(Path(self._blob(sha)))
        return now if now is not None and now == recorded and now[0] == size else None

    def _vouch_linked(self, sha: str, before: list[int]) -> None:
        """Vouch for blob ``sha``, which had ``before`` (a vouched stamp) just before a hard link to it was made: the
        link moved its ctime, nothing else (the same size, mtime and inode), so its new stamp holds the same bytes."""
        after = file_stamp(Path(self._blob(sha)))
        if after is not None and [after[0], after[1], after[3]] == [before[0], before[1], before[3]]:
            self._vouch(sha, after if settled(after, time.time_ns()) else None)

    def _hash_vouched(self, path: Path, sha: str) -> str:
        """The sha256 of ``path``, a hard link to blob ``sha``; vouching for the blob when that is its name."""
        digest, stamp = hash_stamped(path)
        if digest == sha:
            self._vouch(sha, stamp)
        return digest

    def _copy_vouched(self, sha: str, dest: Path) -> str:
        """Copy local blob ``sha`` to ``dest`` and return the sha256 of what ``dest`` holds (`copy_hashed`); vouching
        for the blob when that is its name and it had one stamp, `settled`, throughout."""
        blob = Path(self._blob(sha))
        at, before = time.time_ns(), file_stamp(blob)
        digest = copy_hashed(blob, dest)
        if digest == sha and before is not None and before == file_stamp(blob) and settled(before, at):
            self._vouch(sha, before)
        return digest

    def _put_checked(self, path: Path, sha: str) -> None:
        """Store a copy of ``path`` as local blob ``sha``, hashed as it is written (`copy_hashed`): a file that is not
        ``sha`` (changed since its stage hashed it) is refused (an OSError), and the blob is vouched for. The copy
        gets the file's mtime (its ctime is the copy's), which `settled` tells any later write apart by."""
        dest = Path(self._blob(sha))
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{dest.name}{PARTIAL_MARK}{uuid.uuid4().hex[:8]}")
        try:
            digest = copy_hashed(path, tmp)
            if digest != sha:
                raise OSError(f"{path} changed since it was hashed (sha256 {digest[:12]}, recorded {sha[:12]})")
            st = os.stat(path)
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            stamp = file_stamp(tmp)
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise
        after = file_stamp(dest)  # the rename may move the ctime: only that
        if stamp is not None and after is not None and [after[0], after[1], after[3]] == [stamp[0], stamp[1], stamp[3]]:
            self._vouch(sha, after if settled(after, time.time_ns()) else None)

    def _restore_blob(self, rec: CachedFile, dest: Path, link: bool) -> str:
        """Write blob ``rec`` at ``dest`` (a hard link where ``link`` and the cache allow, else a copy) and return the
        sha256 of what ``dest`` holds: a blob edited in place under any name is caught by its caller. A local blob
        vouched for (`_vouched`) is those bytes without a hash: linked, when the link moved only its ctime; copied,
        when it kept its stamp through the copy. Any other is hashed (and vouched for when it is good)."""
        blob = self._blob(rec.sha256)
        trusted = self._vouched(rec.sha256, rec.size)
        if link and self._link(blob, dest):
            if trusted is not None:
                self._vouch_linked(rec.sha256, trusted)
                if self._vouched(rec.sha256, rec.size) is not None:
                    return rec.sha256
            return self._hash_vouched(dest, rec.sha256)
        if trusted is not None:
            copy_content(Path(blob), dest)
            return rec.sha256 if file_stamp(Path(blob)) == trusted else sha256_file(dest)
        if self.local:
            return self._copy_vouched(rec.sha256, dest)
        return self._get_hashed(blob, dest)

    def _get_hashed(self, blob: str, dest: Path) -> str:
        """Copy ``blob`` to ``dest`` and return the sha256 of what was written, reading the bytes once. A blob of
        more than one chunk is hashed in a second thread beside the copy (hashlib and file I/O release the GIL): a
        restore takes the longer of the two, not their sum."""
        digest = hashlib.sha256()
        with self.fs.open(blob, "rb") as src, open(dest, "wb") as out:
            chunk = src.read(_COPY_CHUNK)
            if len(chunk) < _COPY_CHUNK:
                digest.update(chunk)
                out.write(chunk)
                return digest.hexdigest()
            chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=4)

            def hash_chunks() -> None:
                while (part := chunks.get()) is not None:
                    digest.update(part)

            hasher = threading.Thread(target=hash_chunks, name="cache-restore-hash", daemon=True)
            hasher.start()
            try:
                while chunk:
                    chunks.put(chunk)
                    out.write(chunk)
                    chunk = src.read(_COPY_CHUNK)
            finally:
                chunks.put(None)  # the hasher drains the queue first, so this never waits for long
                hasher.join()
        return digest.hexdigest()
