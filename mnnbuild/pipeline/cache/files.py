"""A cache's root on a file system (local or fsspec): its marker, the names of its blobs and entries, atomic writes,
hard links to artifacts, removal that never raises."""

from __future__ import annotations

import logging
import os
import stat
import uuid
from pathlib import Path

from mnnbuild.base.errors import CacheError
from mnnbuild.pipeline.cache.entries import (
    BLOB_NAME,
    ENTRY_NAME,
    MARKER,
    MARKER_PROOF,
    MARKER_TEXT,
    PARTIAL_MARK,
    PARTIAL_NAME,
    STAMP_NAME,
    STAMP_SUFFIX,
    CacheEntry,
)
from mnnbuild.pipeline.cache.env import kind
from mnnbuild.pipeline.layout import CODE_DIGESTS

log = logging.getLogger(__name__)

ATOMIC_PUT_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
"""Object stores whose uploads appear whole or not at all: written in place, not to a temp name and renamed."""


class CacheFiles:
    """The files of a cache under its root: what `ArtifactCache` reads, writes and deletes through."""

    def __init__(self, url: str, *, writable: bool = True) -> None:
        from fsspec.core import url_to_fs

        self.url = url
        self.writable = writable
        """False: read from, never written nor deleted in (a runner read-only towards a shared remote)."""
        self.fs, root = url_to_fs(url)
        self.root = root.rstrip("/")
        # a cache on this machine's file system: blobs can be hard links to artifacts (`_link`)
        self.local = getattr(self.fs, "local_file", False) or type(self.fs).__name__ == "LocalFileSystem"
        # an object store shows an object only once its upload completed (a multipart one too): written under its
        # name, no temp name and server-side copy (a copy of every byte on S3)
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        self.atomic_put = bool(protocols & ATOMIC_PUT_PROTOCOLS)

    # -- what proves a directory is an mnnbuild cache ----------------------------------------------------------

    def _marker(self) -> str:
        return f"{self.root}/{MARKER}"

    def has_marker(self) -> bool:
        try:
            return MARKER_PROOF in self.fs.cat_file(self._marker()).decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - absent, unreadable, not a file: no proof
            return False

    def not_a_cache(self) -> str | None:
        """Why this cache's root is not an mnnbuild cache, or None when it is one (its marker), is absent or empty.

        A cache made before the marker existed is recognised by its contents: only names the cache writes (blobs,
        entries that parse as entries, the code-digest memo, temps of those). Anything else there means the
        directory holds someone's files: nothing is stored in it, nothing deleted."""
        if self.has_marker():
            return None
        try:
            if not self.fs.exists(self.root):
                return None
            if not self.fs.isdir(self.root):
                return f"{self.url} is not a directory"
            names = self.fs.find(self.root, withdirs=False)
        except Exception as exc:  # noqa: BLE001 - a backend problem
            return f"cannot list {self.url} ({kind(exc)}: {exc})"
        for path in names:
            rel = path[len(self.root) :].lstrip("/")
            if rel == CODE_DIGESTS or rel.startswith(f".{CODE_DIGESTS}.") or BLOB_NAME.match(rel):
                continue
            if STAMP_NAME.match(rel):
                continue
            if PARTIAL_NAME.match(rel) or (ENTRY_NAME.match(rel) and self._is_entry(path, rel)):
                continue
            return f"{self.url} holds {rel}, which the cache does not write, and no {MARKER} of mnnbuild"
        return None

    def probe(self) -> str | None:
        """None when the cache answers and is an mnnbuild cache (or is empty); else why it cannot be used: it does
        not answer (an endpoint down, no credentials), or it is someone else's directory (`not_a_cache`)."""
        if self.local:
            problem = self.not_a_cache()
            return None if problem is None else f"not an mnnbuild cache ({problem})"
        try:
            marker = self.fs.cat_file(self._marker())
        except FileNotFoundError:
            marker = b""
        except Exception as exc:  # noqa: BLE001 - whatever the backend throws: it cannot be used
            return f"unreachable ({kind(exc)}: {str(exc).splitlines()[0] if str(exc) else ''})"
        if MARKER_PROOF in marker.decode("utf-8", "replace"):
            return None
        problem = self.not_a_cache()
        return None if problem is None else f"not an mnnbuild cache ({problem})"

    def _is_entry(self, path: str, rel: str) -> bool:
        try:
            entry = CacheEntry.model_validate_json(self.fs.cat_file(path))
        except Exception:  # noqa: BLE001 - unreadable: not an entry
            return False
        return f"{entry.stage}/{entry.key}.json" == rel

    def ensure_cache(self) -> None:
        """Check that the root is an mnnbuild cache (`not_a_cache`) and write its marker if it has none (a new
        cache, or one made before the marker existed); a `CacheError` otherwise."""
        problem = self.not_a_cache()
        if problem is not None:
            raise CacheError(f"{problem}; not an mnnbuild cache, left as it is")
        if not self.has_marker():
            self.fs.makedirs(self.root, exist_ok=True)
            self._put_atomic(None, MARKER_TEXT.encode(), self._marker())

    def _blob(self, sha: str) -> str:
        return f"{self.root}/blobs/{sha[:2]}/{sha}"

    def _entry(self, stage: str, key: str) -> str:
        """Where entry ``key`` of ``stage`` is: ``<root>/<stage>/<key>.json``, refused (`CacheError`) unless that is an
        entry name (`ENTRY_NAME`): a key read from a record (an origin record's) never names a file elsewhere."""
        rel = f"{stage}/{key}.json"
        if not ENTRY_NAME.match(rel) or "\0" in rel:
            raise CacheError(f"stage {stage!r} key {key!r} is no cache entry name; expected <stage>/<key>.json")
        return f"{self.root}/{rel}"

    def _put_atomic(self, local: Path | None, data: bytes | None, dest: str) -> None:
        if self.atomic_put:
            if local is not None:
                self.fs.put_file(str(local), dest)
            else:
                self.fs.pipe_file(dest, data)
            return
        parent = dest.rsplit("/", 1)[0]
        self.fs.makedirs(parent, exist_ok=True)
        tmp = f"{dest}{PARTIAL_MARK}{uuid.uuid4().hex[:8]}"
        try:
            if local is not None:
                self.fs.put_file(str(local), tmp)
            else:
                self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, dest)
        except BaseException:
            # a failed write (full disk, lost connection) must not leave a partial blob behind
            self._remove(tmp)
            raise

    def _link(self, src: Path | str, dest: Path | str) -> bool:
        """Hard-link the regular file ``src`` as ``dest`` (through a temp name and a rename, like `_put_atomic`),
        when the cache is local and both are on one device; False (nothing changed) where that cannot be, and the
        caller copies instead: another device or a remote cache, a symlink, a link the file system refuses
        (EXDEV between two mounts of one device, EPERM, EMLINK ...)."""
        if not self.local:
            return False
        src, dest = Path(src), Path(dest)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            st = os.lstat(src)
            if not stat.S_ISREG(st.st_mode) or st.st_dev != os.stat(dest.parent).st_dev:
                return False
        except OSError:
            return False
        tmp = dest.with_name(f"{dest.name}{PARTIAL_MARK}{uuid.uuid4().hex[:8]}")
        try:
            os.link(src, tmp, follow_symlinks=False)
            os.replace(tmp, dest)
        except OSError as exc:
            log.debug("cache: cannot link %s as %s (%s); copying it", src, dest, exc)
            return False
        finally:
            # a rename onto a link to the same inode (a concurrent writer linked it first) leaves the temp name
            tmp.unlink(missing_ok=True)
        return True

    def _stamp_file(self, sha: str) -> Path:
        return Path(f"{self._blob(sha)}{STAMP_SUFFIX}")

    def _remove_blob(self, sha: str) -> str | None:
        """Delete blob ``sha`` and, first, its stamp record; None when the blob is gone, else why it stays."""
        if self.local:
            self._remove(str(self._stamp_file(sha)))
        return self._remove(self._blob(sha))

    def _touch(self, path: str) -> None:
        """Mark an entry as used (least recently used entries are pruned first); local caches only."""
        if self.local:
            try:
                os.utime(path)
            except OSError:
                pass

    def discard(self, stage: str, key: str) -> str:
        """Remove an entry; returns what became of it, for the warning that says why (``entry discarded``, or why it
        stays: a read-only cache)."""
        problem = self._remove(self._entry(stage, key))
        return "entry discarded" if problem is None else f"entry kept: cannot remove it ({problem})"

    def _remove(self, path: str) -> str | None:
        """Delete a cache file; None when it is gone, else why it stays (a read-only share): never an error."""
        if not self.writable:
            return "the cache is read-only for this runner"
        try:
            self.fs.rm(path)
        except FileNotFoundError:
            pass
        except Exception as exc:  # e.g. a read-only cache: the entry just stays
            log.debug("cache: cannot remove %s (%s: %s)", path, kind(exc), exc)
            return f"{kind(exc)}: {getattr(exc, 'strerror', None) or exc}"
        return None
