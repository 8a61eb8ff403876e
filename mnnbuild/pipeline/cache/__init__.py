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

The modules, by role: `env` (which caches the environment names), `entries` (the names and records a cache
holds), `files` (a cache's root on a file system), `blobs` (blobs hashed once), `store` (`ArtifactCache`: store and
restore a stage dir), `prune` (usage and pruning), `tiers` (the local then the remote tier), `misses` (what went
wrong, said once per run). This package re-exports what the rest of mnnbuild uses.
"""

from mnnbuild.pipeline.cache.entries import MARKER, CachedFile, CacheEntry, Keep, cache_key
from mnnbuild.pipeline.cache.env import (
    CACHE_ENV,
    READONLY_ENV,
    REMOTE_ENV,
    CacheError,
    cache_url,
    default_cache_url,
    remote_readonly,
    remote_url,
    warn_once,
)
from mnnbuild.pipeline.cache.misses import Misses, tier_gone
from mnnbuild.pipeline.cache.prune import CacheUsage, EntryUsage
from mnnbuild.pipeline.cache.store import ArtifactCache, cache_problem, local_cache_dir
from mnnbuild.pipeline.cache.tiers import LOCAL, REMOTE, CacheTiers, Restored, Tier

__all__ = [
    "CACHE_ENV",
    "LOCAL",
    "MARKER",
    "READONLY_ENV",
    "REMOTE",
    "REMOTE_ENV",
    "ArtifactCache",
    "CacheEntry",
    "CacheError",
    "CacheTiers",
    "CacheUsage",
    "CachedFile",
    "EntryUsage",
    "Keep",
    "Misses",
    "Restored",
    "Tier",
    "cache_key",
    "cache_problem",
    "cache_url",
    "default_cache_url",
    "local_cache_dir",
    "remote_readonly",
    "remote_url",
    "tier_gone",
    "warn_once",
]
