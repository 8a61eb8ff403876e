"""What a cache holds, by name: blobs named by their sha256, entries listing a stage dir's files, the marker that
proves a directory is an mnnbuild cache, and the temp names of writes in progress."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from mnnbuild.base.fsutil import (
    KnownHashes,
    sha256_bytes,
    sha256_file,
)
from mnnbuild.pipeline.layout import ORIGIN_SUFFIX

# Files in a stage dir that describe how it was produced, not what it is: never cached.
SIDECAR_SUFFIX = ORIGIN_SUFFIX
# Temp names of writes in progress; one older than this was left by a writer that died or failed.
PARTIAL_MARK = ".tmp-"
STALE_PARTIAL_SECONDS = 3600.0
SHA256_PATTERN = r"^[0-9a-f]{64}$"
Keep = Callable[[str], bool]
"""Which of an entry's files (by path) a restore writes; the others stay in the cache."""
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
