"""Helpers of the verify stage: numeric comparison, the checks, and the report (see ``mnnbuild.stages.verify``)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.cache
def runtime_fingerprint() -> str:
    """sha256 over the ``mnnbuild_runtime`` sources: verify runs that code, so a change must re-run verify."""
    import mnnbuild_runtime

    digest = hashlib.sha256()
    root = Path(mnnbuild_runtime.__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
