"""The cache of stage outputs by key (`ArtifactCache`): storing a stage dir, restoring it checked, in one cache."""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import ValidationError

from mnnbuild.base.errors import CacheError, UnsafePathError
from mnnbuild.base.fsutil import (
    confined,
    file_stamp,
    sha256_file,
    staged_dir,
)
from mnnbuild.base.sizes import human_bytes
from mnnbuild.pipeline.cache.blobs import VouchedBlobs
from mnnbuild.pipeline.cache.entries import SIDECAR_SUFFIX, CachedFile, CacheEntry, Keep
from mnnbuild.pipeline.cache.env import CACHE_ENV, cache_url, kind, warn_once
from mnnbuild.pipeline.cache.misses import LEARNED, Miss, Misses, say, went_away
from mnnbuild.pipeline.cache.prune import Pruning

log = logging.getLogger(__name__)


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
        return f"{kind(exc)}: {exc}"


class ArtifactCache(VouchedBlobs, Pruning):
    """Stage outputs by key, in a local directory or any fsspec filesystem."""

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
            raise CacheError(f"{where} is unusable ({kind(exc)}: {exc})") from None

    def has(self, stage: str, key: str) -> bool:
        try:
            return bool(self.fs.exists(self._entry(stage, key)))
        except Exception as exc:  # a cache problem is never a build problem
            log.warning("cache: cannot look up %s %s (%s: %s)", stage, key[:12], kind(exc), exc)
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
                went_away(self.url, exc)
            else:
                log.warning("cache: could not store %s %s (%s: %s)", stage, key[:12], kind(exc), exc)
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
                LEARNED.bad.get(self.url, set()).discard(sha)  # written again from a good build
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
            log.warning("cache: %s %s not restored (%s: %s); building it", stage, key[:12], kind(exc), exc)
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
                went_away(self.url, exc)
                if report is not None:
                    report.known = True
                return None
            say(report, f"cache: {entry.stage} {entry.key[:12]} not restored ({kind(exc)}: {exc}); building it")
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
            say(report, f"cache: entry {stage} {key[:12]} is unreadable; {self.discard(stage, key)}")
            return None
        if (entry.stage, entry.key) != (stage, key):
            problem = f"describes {entry.stage} {entry.key[:12]}; {self.discard(stage, key)}"
            say(report, f"cache: entry {stage} {key[:12]} {problem}")
            return None
        return entry

    def _restore(
        self, entry: CacheEntry, out_dir: Path, keep: Keep | None, link: bool, report: Misses | None = None
    ) -> int | None:
        stage, key = entry.stage, entry.key
        moved = 0
        what = f"cache entry {self._entry(stage, key)}"
        bad = LEARNED.bad.get(self.url, set())
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
                            raise Miss(f"link {rec.path} -> {rec.link} does not resolve to the cached content")
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
                        LEARNED.bad.setdefault(self.url, set()).add(rec.sha256)  # not fetched again this run
                        blob_gone = self._remove_blob(rec.sha256) is None
                        outcome = self.discard(stage, key)
                        if not blob_gone and outcome.startswith("entry discarded"):
                            outcome += " (its blob could not be removed)"
                        raise Miss(f"{rec.path} does not match its sha256; {outcome}")
                    moved += rec.size
                for sha, dest in again:
                    os.link(first[sha][1], dest)
        except Miss as miss:
            say(report, f"cache: {stage} {key[:12]} not restored: {miss}")
            return None
        except UnsafePathError as exc:
            outcome = self.discard(stage, key)
            say(report, f"cache: rejected {stage} {key[:12]}, which writes outside its stage dir: {exc}; {outcome}")
            return None
        except FileNotFoundError as exc:
            say(report, f"cache: {stage} {key[:12]} is incomplete ({exc}); {self.discard(stage, key)}")
            return None
        self._touch(self._entry(stage, key))
        log.debug("cache: restored %s %s (%s)", stage, key[:12], human_bytes(moved))
        return moved
