"""What a cache holds and costs (`CacheUsage`), and keeping it under a size: least recently used entries first,
then blobs no entry references, then the temps of writes that died."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from mnnbuild.base.sizes import human_bytes
from mnnbuild.pipeline.cache.entries import (
    BLOB_NAME,
    ENTRY_NAME,
    PARTIAL_NAME,
    STALE_PARTIAL_SECONDS,
    STAMP_NAME,
    STAMP_SUFFIX,
    CacheEntry,
)
from mnnbuild.pipeline.cache.files import CacheFiles

log = logging.getLogger(__name__)


class Pruning(CacheFiles):
    """Usage and pruning of a cache."""

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
