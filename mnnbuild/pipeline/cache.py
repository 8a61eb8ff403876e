"""A content-addressed cache of stage outputs, local or shared through any fsspec URL.

An entry is keyed by the stage name, the stage's fingerprint (code, manifest schema, tool
versions), its parameters and the sha256 of every input file. Its value is the stage's output
tree: file contents live once as blobs named by their sha256, and ``<stage>/<key>.json`` lists
the tree. Every restored file is checked against its sha256; a corrupted entry is discarded
and the stage rebuilt. Blobs and entries are written under a temp name and renamed, and an
entry is written only after all of its blobs, so concurrent writers of the same key are safe.

A local cache on the artifacts' file system stores a blob as a hard link to the artifact file and
restores it as a hard link to the blob: no byte is written twice. That is safe because nothing
writes an artifact in place (stages stage their outputs in a temp dir and rename it into place, so
a rebuild gets new inodes), the bundle copies what it ships, and a restore still checks what it
links, so a file edited in place under one name is never restored as good under another. Elsewhere
(another device, a remote fsspec backend, a link refused) blobs are copies.

A local blob is hashed once: when its bytes were checked against its name (stored from a stage's hashed output,
or hashed on a restore), its stamp (size, mtime, ctime, inode: `file_stamp`) is recorded beside it
(``<blob>.stamp``), and a restore takes a blob that still has that stamp as its bytes, without hashing it again
(the trust verify gives the stamps of files the bundle stage hashed). An edit moves the mtime or the ctime (one that
puts the old mtime back moves the ctime), a replacement the inode: such a blob is hashed, and caught.

``MNNBUILD_CACHE`` picks the cache: a directory or an fsspec URL (``file://``, ``s3://``,
``gs://``, ``hf://`` ...); ``off`` disables it. The default is ``~/.cache/mnnbuild``
(``$XDG_CACHE_HOME/mnnbuild``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import posixpath
import queue
import re
import stat
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from mnnbuild.base.errors import MnnbuildError, UnsafePathError
from mnnbuild.base.fsutil import (
    KnownHashes,
    atomic_write_text,
    confined,
    copy_content,
    copy_hashed,
    file_stamp,
    hash_stamped,
    settled,
    sha256_bytes,
    sha256_file,
    staged_dir,
)
from mnnbuild.base.sizes import human_bytes
from mnnbuild.base.userdirs import user_cache_dir
from mnnbuild.pipeline.layout import CODE_DIGESTS, ORIGIN_SUFFIX, origin_file

log = logging.getLogger(__name__)

CACHE_ENV = "MNNBUILD_CACHE"
REMOTE_ENV = "MNNBUILD_CACHE_REMOTE"
READONLY_ENV = "MNNBUILD_CACHE_REMOTE_READONLY"
DISABLED = ("off", "0", "false", "no", "none")
# Files in a stage dir that describe how it was produced, not what it is: never cached.
SIDECAR_SUFFIX = ORIGIN_SUFFIX
# Temp names of writes in progress; one older than this was left by a writer that died or failed.
PARTIAL_MARK = ".tmp-"
STALE_PARTIAL_SECONDS = 3600.0
SHA256_PATTERN = r"^[0-9a-f]{64}$"
Keep = Callable[[str], bool]
"""Which of an entry's files (by path) a restore writes; the others stay in the cache."""
ATOMIC_PUT_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
"""Object stores whose uploads appear whole or not at all: written in place, not to a temp name and renamed."""
_COPY_CHUNK = 8 << 20
STAMP_SUFFIX = ".stamp"
"""Beside a local blob: the stamp it had when its bytes were checked (`ArtifactCache._vouch`)."""

MARKER = "CACHEDIR.TAG"
"""Written when a cache is created: what proves a directory is an mnnbuild cache before anything in it is deleted.
A cache directory tag (https://bford.info/cachedir/), so backup tools skip the cache too."""
MARKER_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by mnnbuild: an mnnbuild artifact cache.\n"
    "# For information about cache directory tags see https://bford.info/cachedir/\n"
)
MARKER_PROOF = "mnnbuild artifact cache"
# Names the cache writes, relative to its root (nothing else in it is ever deleted): blobs, entries, and the temp
# names of their writes in progress; the code-digest memo beside them (`layout.CODE_DIGESTS`).
BLOB_NAME = re.compile(r"^blobs/[0-9a-f]{2}/[0-9a-f]{64}$")
STAMP_NAME = re.compile(r"^blobs/[0-9a-f]{2}/[0-9a-f]{64}\.stamp$")
ENTRY_NAME = re.compile(r"^[a-z][a-z0-9_-]*/[^/]+\.json$")
PARTIAL_NAME = re.compile(r"^(blobs/[0-9a-f]{2}/[0-9a-f]{64}(\.stamp)?|[a-z][a-z0-9_-]*/[^/]+\.json)\.tmp-[0-9a-f]{8}$")


class CacheError(MnnbuildError):
    """The cache a command names is unusable or not an mnnbuild cache (commands only: a build warns instead)."""


def cache_url(environ: Mapping[str, str]) -> str | None:
    """The cache ``MNNBUILD_CACHE`` names: its URL or local path (the default when unset), None when it is off.

    A `CacheError` when the value is no cache: empty, or a relative path (relative to which directory? doit runs
    from anywhere)."""
    raw = environ.get(CACHE_ENV)
    if raw is None:
        return default_cache_url(environ)
    url = raw.strip()
    if not url:
        raise CacheError(f"{CACHE_ENV} is set but empty; unset it for the default cache, name one, or set it to off")
    if url.lower() in DISABLED:
        return None
    if "://" in url and not url.startswith("file://"):
        return url  # an fsspec filesystem
    local = Path(url.removeprefix("file://")).expanduser()
    if not local.is_absolute():
        raise CacheError(f"{CACHE_ENV}={raw!r} is a relative path; expected an absolute path, an fsspec URL or off")
    return str(local)


class CachedFile(BaseModel):
    path: str
    size: int
    sha256: str = Field(pattern=SHA256_PATTERN)
    link: str | None = None
    """For a symlink: its target as written (the content is checked through it on restore)."""


class CacheEntry(BaseModel):
    stage: str
    key: str
    files: list[CachedFile]


def cache_key(stage: str, config: str, input_files: list[Path], hashes: KnownHashes | None = None) -> str:
    """The entry key: stage + its fingerprint/params (``config``) + content of every input file (``hashes``: those
    known already)."""
    inputs = [(Path(p).name, hashes.sha256(Path(p)) if hashes else sha256_file(p)) for p in input_files]
    return sha256_bytes(json.dumps([stage, config, inputs], sort_keys=True).encode())


def default_cache_url(environ: Mapping[str, str]) -> str:
    return str(user_cache_dir(environ))


def local_cache_dir(environ: Mapping[str, str]) -> Path | None:
    """The directory of the cache ``MNNBUILD_CACHE`` names when it is a local one that is (or may become) an
    mnnbuild cache, else None (off, remote, unusable or someone else's directory)."""
    try:
        url = cache_url(environ)
    except CacheError:
        return None
    if url is None:
        return None
    if url.startswith("file://"):
        url = url[len("file://") :]
    if "://" in url:
        return None
    path = Path(url)
    return path if not path.exists() or cache_problem(path) is None else None


def cache_problem(root: Path) -> str | None:
    """Why the local directory ``root`` is not an mnnbuild cache (None: it is one, or is empty or absent)."""
    try:
        return ArtifactCache(str(root)).not_a_cache()
    except Exception as exc:  # noqa: BLE001 - any backend problem is a reason too
        return f"{_kind(exc)}: {exc}"


class ArtifactCache:
    """Stage outputs by key, in a local directory or any fsspec filesystem."""

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

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ArtifactCache | None:
        """The cache ``MNNBUILD_CACHE`` names (default: the user cache dir), or None when it is off or unusable
        (then with a warning: the cache never fails a build)."""
        try:
            cache = cls.named(environ)
            problem = cache.not_a_cache() if cache is not None else None
        except CacheError as exc:
            warn_once(f"cache: {exc}; building without the cache")
            return None
        if problem is not None:
            warn_once(f"cache: {problem}; not an mnnbuild cache: building without it")
            return None
        return cache

    @classmethod
    def named(cls, environ: Mapping[str, str] | None = None, url: str | None = None) -> ArtifactCache | None:
        """The cache ``url`` (default: the one ``MNNBUILD_CACHE`` names) or None when it is off; a `CacheError`
        says what is wrong with an unusable one."""
        env = os.environ if environ is None else environ
        where = f"--url {url!r}" if url is not None else f"{CACHE_ENV}={env.get(CACHE_ENV, '')!r}"
        if url is None:
            url = cache_url(env)
            if url is None:
                return None
        elif not url.strip():
            raise CacheError("--url is empty; expected a cache directory or fsspec URL")
        try:
            return cls(url)
        except ImportError as exc:  # fsspec knows the scheme; its backend package is not installed
            scheme = url.partition("://")[0]
            missing = f"its {scheme}:// file system needs a package that is not installed ({exc})"
            raise CacheError(f"{where}: {missing}") from None
        except Exception as exc:  # any backend problem means "no cache", never a failed build
            raise CacheError(f"{where} is unusable ({_kind(exc)}: {exc})") from None

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
            return f"cannot list {self.url} ({_kind(exc)}: {exc})"
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
            return f"unreachable ({_kind(exc)}: {str(exc).splitlines()[0] if str(exc) else ''})"
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
        return f"{self.root}/{stage}/{key}.json"

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

    # -- blobs hashed once (local caches): the stamp a blob had when its bytes were checked ----------------------

    def _stamp_file(self, sha: str) -> Path:
        return Path(f"{self._blob(sha)}{STAMP_SUFFIX}")

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
            recorded = json.loads(self._stamp_file(sha).read_text(encoding="utf-8"))
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

    def has(self, stage: str, key: str) -> bool:
        try:
            return bool(self.fs.exists(self._entry(stage, key)))
        except Exception as exc:  # a cache problem is never a build problem
            log.warning("cache: cannot look up %s %s (%s: %s)", stage, key[:12], _kind(exc), exc)
            return False

    def store(
        self,
        stage: str,
        key: str,
        out_dir: Path,
        known: Mapping[str, tuple[int, str]] | None = None,
        *,
        link: bool = True,
        proven: Mapping[str, tuple[list[int], str]] | None = None,
    ) -> int:
        """Add ``out_dir`` under ``key``; returns the bytes of its new blobs (those already present are skipped),
        whether copied or hard-linked to the files of ``out_dir`` (see `_link`; ``link=False``: always copied).

        ``known`` is (size, sha256) by relative path for files the stage has just hashed (its manifest's outputs):
        not hashed again (GBs of context binaries at real size). A wrong one cannot go unnoticed: a
        restored file is checked against its sha256, unless ``proven`` has the stamp the file had while it was
        hashed to that sha256 (`FileRecord.stamp`, with the sha256) and the file still has it: then the blob is vouched
        for (`_vouch`) as it is linked. A blob copied into a local cache is hashed as it is written (beside the copy)
        and vouched for.

        Never raises for a cache problem (read-only, full, unreachable): it is logged and 0 returned.
        """
        if not self.writable:
            return 0
        try:
            return self._store(stage, key, out_dir, known or {}, link, proven or {})
        except Exception as exc:  # a cache is an optimisation: never fail a good build on it
            if not self.local:
                _went_away(self.url, exc)
            else:
                log.warning("cache: could not store %s %s (%s: %s)", stage, key[:12], _kind(exc), exc)
            return 0

    def _store(
        self,
        stage: str,
        key: str,
        out_dir: Path,
        known: Mapping[str, tuple[int, str]],
        link: bool,
        proven: Mapping[str, tuple[list[int], str]],
    ) -> int:
        if not self.has_marker():
            self.ensure_cache()  # a new cache gets its marker before its first blob
        files: list[CachedFile] = []
        moved = linked = 0
        by_inode: dict[tuple[int, int], str] = {}  # hard links (modellib's shared weights) are hashed once
        for path in sorted(p for p in Path(out_dir).rglob("*") if p.is_file() or p.is_symlink()):
            rel = path.relative_to(out_dir).as_posix()
            if rel.endswith(SIDECAR_SUFFIX):
                continue
            st = path.stat()
            size, recorded = known.get(rel, (-1, ""))
            sha = by_inode.get((st.st_dev, st.st_ino)) or (recorded if size == st.st_size else sha256_file(path))
            by_inode[(st.st_dev, st.st_ino)] = sha
            if path.is_symlink():
                files.append(CachedFile(path=rel, size=path.stat().st_size, sha256=sha, link=os.readlink(path)))
                continue
            files.append(CachedFile(path=rel, size=st.st_size, sha256=sha))
            if not self.fs.exists(self._blob(sha)):
                # the file as the stage hashed it (its stamp then, unchanged): its blob needs no hash when restored
                stamp, hashed_to = proven.get(rel, (None, ""))
                hashed = stamp is not None and hashed_to == sha == recorded and file_stamp(path) == stamp
                if link and self._link(path, self._blob(sha)):
                    linked += st.st_size
                    if hashed:
                        self._vouch_linked(sha, stamp)
                elif self.local:
                    self._put_checked(path, sha)
                else:
                    self._put_atomic(path, None, self._blob(sha))
                _LEARNED.bad.get(self.url, set()).discard(sha)  # written again from a good build
                moved += st.st_size
        entry = CacheEntry(stage=stage, key=key, files=files)
        self._put_atomic(None, entry.model_dump_json(indent=1).encode(), self._entry(stage, key))
        log.debug(
            "cache: stored %s %s (%s new, %s of it linked to the artifacts)",
            stage, key[:12], human_bytes(moved), human_bytes(linked),
        )  # fmt: skip
        return moved

    def restore(
        self, stage: str, key: str, out_dir: Path, *, keep: Keep | None = None, link: bool = True
    ) -> int | None:
        """Recreate ``out_dir`` from the entry; returns bytes restored, or None on a miss or a bad entry.

        ``keep``: restore only the entry's files it is true for (a stage dir "without the bytes": its manifest and
        small files), after checking that the blobs of the others are there. ``link``: a local cache may restore by
        hard links.
        Never raises for a cache problem: anything the backend throws is logged and treated as a miss.
        """
        try:
            entry = self.read_entry(stage, key)
        except Exception as exc:  # a cache problem degrades to "no cache", never a failed build
            log.warning("cache: %s %s not restored (%s: %s); building it", stage, key[:12], _kind(exc), exc)
            return None
        return None if entry is None else self.restore_entry(entry, out_dir, keep=keep, link=link)

    def restore_entry(
        self,
        entry: CacheEntry,
        out_dir: Path,
        *,
        keep: Keep | None = None,
        link: bool = True,
        report: Misses | None = None,
    ) -> int | None:
        """`restore` of an entry `read_entry` returned. ``report``: collects what went wrong instead of warning."""
        try:
            return self._restore(entry, out_dir, keep, link, report)
        except Exception as exc:  # a cache problem degrades to "no cache", never a failed build
            if not self.local:  # an object store that fails a read after its retries: left out from now on
                _went_away(self.url, exc)
                if report is not None:
                    report.known = True
                return None
            _say(report, f"cache: {entry.stage} {entry.key[:12]} not restored ({_kind(exc)}: {exc}); building it")
            return None

    def read_entry(self, stage: str, key: str, report: Misses | None = None) -> CacheEntry | None:
        """The entry of ``key``, or None: a miss, or an unreadable entry (then discarded, with a warning). A backend
        problem raises."""
        try:
            raw = self.fs.cat_file(self._entry(stage, key))
        except FileNotFoundError:
            return None
        try:
            entry = CacheEntry.model_validate_json(raw)
        except ValidationError:
            _say(report, f"cache: entry {stage} {key[:12]} is unreadable; {self.discard(stage, key)}")
            return None
        if (entry.stage, entry.key) != (stage, key):
            problem = f"describes {entry.stage} {entry.key[:12]}; {self.discard(stage, key)}"
            _say(report, f"cache: entry {stage} {key[:12]} {problem}")
            return None
        return entry

    def _restore(
        self, entry: CacheEntry, out_dir: Path, keep: Keep | None, link: bool, report: Misses | None = None
    ) -> int | None:
        stage, key = entry.stage, entry.key
        moved = 0
        what = f"cache entry {self._entry(stage, key)}"
        bad = _LEARNED.bad.get(self.url, set())
        known_bad = next((f for f in entry.files if f.link is None and f.sha256 in bad), None)
        if known_bad is not None:
            # said when it was found: not fetched nor said again (a read-only tier keeps it; this run builds)
            outcome = self.discard(stage, key) if self.writable else "skipped"
            log.info("cache: %s %s needs %s's blob, found bad earlier in this run; %s",
                     stage, key[:12], known_bad.path, outcome)  # fmt: skip
            if report is not None:
                report.known = True
            return None
        first: dict[str, tuple[CachedFile, Path]] = {}  # sha256 -> the file restored with it
        again: list[tuple[str, Path]] = []  # later files with the same content: hard links to the first
        try:
            with staged_dir(out_dir) as tmp:
                seen: set[str] = set()
                for rec in entry.files:
                    if rec.path in seen:
                        raise UnsafePathError(f"{what}: path {rec.path!r} is listed twice")
                    seen.add(rec.path)
                    dest = confined(tmp, rec.path, what)
                    if keep is not None and not keep(rec.path):
                        # left in the cache until a task reads it: its blob must be there, or the entry is incomplete
                        if rec.link is None and not self.fs.exists(self._blob(rec.sha256)):
                            raise FileNotFoundError(f"blob {rec.sha256[:12]} of {rec.path}")
                        continue
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    if rec.link is not None:
                        if posixpath.isabs(rec.link):
                            raise UnsafePathError(f"{what}: link {rec.path!r} -> {rec.link!r} is absolute")
                        confined(tmp, posixpath.normpath(posixpath.join(posixpath.dirname(rec.path), rec.link)), what)
                        os.symlink(rec.link, dest)
                        if not dest.exists() or sha256_file(dest) != rec.sha256:
                            # the linked source differs on this machine: rebuild, but keep the entry
                            raise _Miss(f"link {rec.path} -> {rec.link} does not resolve to the cached content")
                        continue
                    if rec.sha256 in first:
                        again.append((rec.sha256, dest))
                    else:
                        first[rec.sha256] = (rec, dest)
                # a local cache restores two blobs at a time: a warm bundle is GBs of kernel copies, which one
                # thread leaves half done (28 layers: 4.3 s instead of 7.0 s, benchmarks/bench_warm_bundle.py);
                # a remote one, one at a time
                pending = list(first.values())
                workers = 2 if self.local and len(pending) > 1 else 1
                pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cache-restore")
                try:
                    digests = list(pool.map(lambda job: self._restore_blob(job[0], job[1], link), pending))
                finally:  # an error or Ctrl-C stops here: the blobs not started are not copied
                    pool.shutdown(wait=True, cancel_futures=True)
                for (rec, _), digest in zip(pending, digests, strict=True):
                    if digest != rec.sha256:
                        _LEARNED.bad.setdefault(self.url, set()).add(rec.sha256)  # not fetched again this run
                        blob_gone = self._remove_blob(rec.sha256) is None
                        outcome = self.discard(stage, key)
                        if not blob_gone and outcome.startswith("entry discarded"):
                            outcome += " (its blob could not be removed)"
                        raise _Miss(f"{rec.path} does not match its sha256; {outcome}")
                    moved += rec.size
                for sha, dest in again:
                    os.link(first[sha][1], dest)
        except _Miss as miss:
            _say(report, f"cache: {stage} {key[:12]} not restored: {miss}")
            return None
        except UnsafePathError as exc:
            outcome = self.discard(stage, key)
            _say(report, f"cache: rejected {stage} {key[:12]}, which writes outside its stage dir: {exc}; {outcome}")
            return None
        except FileNotFoundError as exc:
            _say(report, f"cache: {stage} {key[:12]} is incomplete ({exc}); {self.discard(stage, key)}")
            return None
        self._touch(self._entry(stage, key))
        log.debug("cache: restored %s %s (%s)", stage, key[:12], human_bytes(moved))
        return moved

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

    def _remove_blob(self, sha: str) -> str | None:
        """Delete blob ``sha`` and, first, its stamp record; None when the blob is gone, else why it stays."""
        if self.local:
            self._remove(str(self._stamp_file(sha)))
        return self._remove(self._blob(sha))

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

    def _touch(self, path: str) -> None:
        """Mark an entry as used (least recently used entries are pruned first); local caches only."""
        if self.local:
            try:
                os.utime(path)
            except OSError:
                pass

    def usage(self) -> CacheUsage:
        """Entries (with the bytes of the blobs they reference and when they were last used) and blobs."""
        listing = self.fs.find(self.root, detail=True)
        blobs: dict[str, tuple[int, float]] = {}
        partial: dict[str, tuple[int, float]] = {}
        entries: list[EntryUsage] = []
        stamped: list[str] = []
        shared = 0
        for path, info in listing.items():
            # only names the cache writes count (and may be pruned): anything else in the directory is left alone
            rel = path[len(self.root) :].lstrip("/")
            if PARTIAL_NAME.match(rel):
                partial[rel] = (int(info.get("size") or 0), _mtime(info))
            elif BLOB_NAME.match(rel):
                blobs[rel.rsplit("/", 1)[1]] = (int(info.get("size") or 0), _changed(info))
                # a blob with other names is also an artifact file (`_link`): its bytes are on disk once
                shared += int(info.get("size") or 0) if int(info.get("nlink") or 1) > 1 else 0
            elif STAMP_NAME.match(rel):
                stamped.append(rel.rsplit("/", 1)[1].removesuffix(STAMP_SUFFIX))
            elif ENTRY_NAME.match(rel):
                try:
                    entry = CacheEntry.model_validate_json(self.fs.cat_file(path))
                except (ValidationError, OSError):
                    continue
                if f"{entry.stage}/{entry.key}.json" != rel:
                    continue  # not where the cache would have written it: not an entry of this cache
                shas = frozenset(f.sha256 for f in entry.files if f.link is None)
                entries.append(EntryUsage(stage=entry.stage, key=entry.key, blobs=shas, last_used=_mtime(info)))
        return CacheUsage(entries=entries, blobs=blobs, partial=partial, shared_bytes=shared, stamped=stamped)

    def prune(self, max_bytes: int, *, grace_seconds: float = 3600.0) -> tuple[int, int]:
        """Drop least recently used entries until the blobs still referenced fit in ``max_bytes``, then
        delete unreferenced blobs older than ``grace_seconds`` (younger ones may belong to an entry being
        written right now). Returns (entries removed, bytes freed).

        Only in a directory that proves to be an mnnbuild cache (`ensure_cache`; a `CacheError` otherwise), and only
        names the cache writes (`usage`)."""
        self.ensure_cache()
        usage = self.usage()
        kept = sorted(usage.entries, key=lambda e: e.last_used)

        def referenced(entries: list[EntryUsage]) -> set[str]:
            return set().union(*(e.blobs for e in entries)) if entries else set()

        removed = 0
        refused: list[str] = []  # why files stay (a read-only cache): counted as nothing freed
        while kept and sum(usage.blobs.get(b, (0, 0.0))[0] for b in referenced(kept)) > max_bytes:
            oldest = kept.pop(0)
            problem = self._remove(self._entry(oldest.stage, oldest.key))
            removed += problem is None
            refused += [problem] if problem else []
        live = referenced(kept)
        now = time.time()
        freed = 0
        for sha, (size, mtime) in usage.blobs.items():
            if sha not in live and now - mtime > grace_seconds:
                problem = self._remove_blob(sha)
                freed += size if problem is None else 0
                refused += [problem] if problem else []
        for sha in usage.stamped:
            if sha not in usage.blobs:  # the record of a blob removed since: of no use
                self._remove(str(self._stamp_file(sha)))
        freed += self.sweep_partial(usage, max_age=grace_seconds)
        if refused:
            log.warning("cache: %d files could not be removed (%s)", len(refused), refused[0])
        log.debug("cache: pruned %d entries, freed %s", removed, human_bytes(freed))
        return removed, freed

    def sweep_partial(self, usage: CacheUsage | None = None, *, max_age: float = STALE_PARTIAL_SECONDS) -> int:
        """Delete temp files of writes that died (older than ``max_age``: younger ones may be in progress);
        returns the bytes freed."""
        usage = usage or self.usage()
        now = time.time()
        freed = 0
        for rel, (size, mtime) in usage.partial.items():
            if now - mtime > max_age and self._remove(f"{self.root}/{rel}") is None:
                freed += size
        return freed

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
            log.debug("cache: cannot remove %s (%s: %s)", path, _kind(exc), exc)
            return f"{_kind(exc)}: {getattr(exc, 'strerror', None) or exc}"
        return None


class _Miss(Exception):
    pass


@dataclass
class Misses:
    """Why a restore found nothing it could use, for a caller that says so in a line of its own (`materialize`)
    instead of the cache's warnings: the problems found now, and whether one was said before in this process (a
    blob found bad, a remote tier gone)."""

    found: list[str] = field(default_factory=list)
    known: bool = False


def _say(report: Misses | None, message: str) -> None:
    if report is None:
        log.warning("%s", message)
    else:
        report.found.append(message.removeprefix("cache: "))


@dataclass
class _Learned:
    """What this process learned of its caches, so that one run trips over a problem once: blobs found bad, by cache
    URL (an entry that needs one is a miss from then on; a read-only tier keeps them, so it is skipped), and remote
    tiers that failed a request after their retries (left out from then on: each try would wait for them)."""

    bad: dict[str, set[str]] = field(default_factory=dict)
    dead: dict[str, str] = field(default_factory=dict)


_LEARNED = _Learned()


def _went_away(url: str, exc: BaseException) -> None:
    """A remote tier failed a request: one warning, and the build goes on with the tiers left."""
    if url in _LEARNED.dead:
        return
    why = f"{_kind(exc)}: {str(exc).splitlines()[0] if str(exc) else ''}"
    _LEARNED.dead[url] = why
    log.warning("cache: the remote tier %s stopped answering (%s); building with the local tier only", url, why)


def tier_gone(url: str) -> str | None:
    """Why the remote tier ``url`` stopped answering in this run, or None."""
    return _LEARNED.dead.get(url)


LOCAL, REMOTE = "local", "remote"
"""The tiers, looked up in this order: ``MNNBUILD_CACHE``'s, then ``MNNBUILD_CACHE_REMOTE``'s."""
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Tier:
    name: str
    cache: ArtifactCache


@dataclass(frozen=True)
class Restored:
    """A cache hit: the tier it came from, the bytes restored, and the files left in the cache ("without the
    bytes")."""

    tier: str
    url: str
    bytes: int
    deferred: tuple[str, ...] = ()


def remote_readonly(environ: Mapping[str, str]) -> bool:
    """Whether ``MNNBUILD_CACHE_REMOTE_READONLY`` makes this runner read-only towards the remote (a value that is
    neither yes nor no counts as yes, with a warning: the safe side for an untrusted build)."""
    raw = environ.get(READONLY_ENV, "").strip().lower()
    if raw in _TRUE or raw not in _FALSE:
        if raw not in _TRUE:
            warn_once(f"cache: {READONLY_ENV}={raw!r} is neither 1 nor 0; the remote tier is read-only")
        return True
    return False


def remote_url(environ: Mapping[str, str]) -> str | None:
    """The remote tier ``MNNBUILD_CACHE_REMOTE`` names (an fsspec URL or an absolute path), None when it is unset or
    off; a `CacheError` when the value is no cache."""
    raw = environ.get(REMOTE_ENV)
    if raw is None or raw.strip().lower() in DISABLED:
        return None
    url = raw.strip()
    if "://" in url and not url.startswith("file://"):
        return url
    local = Path(url.removeprefix("file://")).expanduser()
    if not local.is_absolute():
        raise CacheError(f"{REMOTE_ENV}={raw!r} is a relative path; expected an fsspec URL, an absolute path or off")
    return str(local)


@functools.cache
def _remote_problem(url: str) -> str | None:
    """Why the remote tier cannot be used (unreachable, or not an mnnbuild cache), asked once per process: every task
    of a run looks the cache up, and an unreachable endpoint makes each try wait for its retries."""
    try:
        return ArtifactCache(url).probe()
    except Exception as exc:  # noqa: BLE001 - a backend that cannot even be set up
        return f"unusable ({_kind(exc)}: {exc})"


class CacheTiers:
    """The caches a build uses: the local tier (``MNNBUILD_CACHE``) then the remote one (``MNNBUILD_CACHE_REMOTE``).

    Lookups go down the tiers; a hit restored in full from a lower tier is kept in the tiers above it (a remote hit
    is stored locally: hard links to the restored files); new entries go to every writable tier."""

    def __init__(self, tiers: list[Tier]) -> None:
        self.tiers = tiers

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CacheTiers | None:
        """The tiers the environment names, or None when there are none. A remote that is unreachable or no
        mnnbuild cache is left out with one warning: the build goes on with the local tier."""
        env = os.environ if environ is None else environ
        tiers = []
        local = ArtifactCache.from_env(env)
        if local is not None:
            tiers.append(Tier(LOCAL, local))
        try:
            url = remote_url(env)
        except CacheError as exc:
            warn_once(f"cache: {exc}; building without the remote tier")
            url = None
        if url is not None and url not in _LEARNED.dead:  # one that stopped answering was said so once
            problem = _remote_problem(url)
            if problem is None:
                tiers.append(Tier(REMOTE, ArtifactCache(url, writable=not remote_readonly(env))))
            else:
                warn_once(f"cache: the remote tier {url} is {problem}; building with the local tier only")
        return cls(tiers) if tiers else None

    def restore(
        self,
        stage: str,
        key: str,
        out_dir: Path,
        *,
        keep: Keep | None = None,
        link: bool = True,
        report: Misses | None = None,
    ) -> Restored | None:
        """Restore ``out_dir`` from the first tier holding a good entry (``keep``: only the files it is true for, the
        others left in the cache); None on a miss in every tier. ``report``: collects the problems met instead of
        warning (`Misses`)."""
        for i, tier in enumerate(self.tiers):
            if tier.cache.url in _LEARNED.dead:
                continue
            try:
                entry = tier.cache.read_entry(stage, key, report)
            except Exception as exc:  # noqa: BLE001 - a cache problem is a miss in that tier
                if tier.name == REMOTE:
                    _went_away(tier.cache.url, exc)
                else:
                    log.warning("cache: cannot look up %s %s in the %s tier (%s: %s)", stage, key[:12], tier.name,
                                _kind(exc), exc)  # fmt: skip
                continue
            moved = None
            if entry is not None:
                moved = tier.cache.restore_entry(entry, out_dir, keep=keep, link=link, report=report)
            if entry is None or moved is None:
                continue
            left = tuple(f.path for f in entry.files if keep is not None and not keep(f.path))
            if not left:
                known = {f.path: (f.size, f.sha256) for f in entry.files}
                for upper in self.tiers[:i]:
                    upper.cache.store(stage, key, out_dir, known, link=link)
            return Restored(tier.name, tier.cache.url, moved, left)
        return None

    def store(
        self,
        stage: str,
        key: str,
        out_dir: Path,
        known: Mapping[str, tuple[int, str]],
        *,
        link: bool = True,
        proven: Mapping[str, tuple[list[int], str]] | None = None,
    ) -> dict[str, int]:
        """Store ``out_dir`` in every writable tier (`ArtifactCache.store`); returns the new bytes by tier."""
        return {
            t.name: t.cache.store(stage, key, out_dir, known, link=link, proven=proven)
            for t in self.tiers
            if t.cache.writable and t.cache.url not in _LEARNED.dead
        }


class EntryUsage(BaseModel):
    stage: str
    key: str
    blobs: frozenset[str]
    last_used: float


class CacheUsage(BaseModel):
    entries: list[EntryUsage]
    blobs: dict[str, tuple[int, float]]
    """sha256 -> (size, when it entered the cache or last changed)."""
    partial: dict[str, tuple[int, float]] = Field(default_factory=dict)
    """Temp files of unfinished writes, path under the cache root -> (size, mtime)."""
    shared_bytes: int = 0
    """Bytes of the blobs that are hard links to artifact files (a local cache): pruning them frees no disk
    while those artifacts stay."""
    stamped: list[str] = Field(default_factory=list)
    """The blobs (sha256) with a stamp record (`ArtifactCache._vouch`), whether or not the blob is still there."""

    @property
    def total_bytes(self) -> int:
        return sum(size for size, _ in self.blobs.values())

    def bytes_by_stage(self) -> dict[str, int]:
        """What each stage costs in the cache: the bytes of the blobs its entries reference, each blob once per
        stage."""
        shas: dict[str, set[str]] = {}
        for entry in self.entries:
            shas.setdefault(entry.stage, set()).update(entry.blobs)
        return {stage: sum(self.blobs.get(b, (0, 0.0))[0] for b in found) for stage, found in shas.items()}


@functools.cache
def warn_once(message: str) -> None:
    """A misconfigured cache is looked up by every task of a run: say what is wrong once per process."""
    log.warning("%s", message)


def _kind(exc: BaseException) -> str:
    return type(exc).__name__


def _stamps(info: Mapping[str, Any]) -> list[float]:
    """The times in an fsspec ``info`` dict, modification time first (backends name them differently)."""
    stamps = []
    for name in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(name)
        if isinstance(value, (int, float)):
            stamps.append(float(value))
        elif hasattr(value, "timestamp"):
            stamps.append(float(value.timestamp()))
    return stamps


def _mtime(info: Mapping[str, Any]) -> float:
    """Modification time from an fsspec ``info`` dict."""
    return next(iter(_stamps(info)), 0.0)


def _changed(info: Mapping[str, Any]) -> float:
    """When a blob entered the cache: the newest of its times. A hard link keeps the artifact's mtime but sets the
    ctime (a local file's ``created``), so a blob linked just now to an older artifact is young for prune's grace."""
    return max(_stamps(info), default=0.0)


def read_origin(out_dir: Path, stage: str) -> dict[str, Any]:
    """A stage dir's origin record (`write_origin`), or {} when it has none that parses."""
    try:
        origin = json.loads((Path(out_dir) / origin_file(stage)).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return origin if isinstance(origin, dict) else {}


def stamps(out_dir: Path, paths: list[str]) -> dict[str, list[int]]:
    """The `file_stamp` of each output just hashed (built, or restored and checked), for the origin record: a file
    with the same stamp later still has the recorded sha256 (`trusted_hashes`), so verify need not hash it again."""
    found = {}
    for rel in paths:
        stamp = file_stamp(Path(out_dir) / rel)
        if stamp is not None:
            found[rel] = stamp
    return found


def trusted_hashes(out_dir: Path, stage: str) -> dict[str, list[int]]:
    """The stamps the origin record holds: outputs hashed when the stage dir was made (`stamps`)."""
    found = read_origin(out_dir, stage).get("stamps")
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, list) and len(v) == 4}


def write_origin(out_dir: Path, stage: str, origin: dict[str, Any]) -> None:
    """Record how a stage dir came to be (built or restored), beside its manifest, outside its content.

    Written to a temp name and renamed, never in place: the name could be a hard link to a cache blob."""
    atomic_write_text(Path(out_dir) / origin_file(stage), json.dumps(origin, indent=2, sort_keys=True) + "\n")
