"""Helpers of the verify stage: numeric comparison, the checks, and the report (see ``mnnbuild.stages.verify``)."""

from __future__ import annotations

import functools
from pathlib import Path

from mnnbuild.base.fsutil import sha256_bytes


@functools.cache
def runtime_fingerprint() -> str:
    """sha256 over the ``mnnbuild_runtime`` sources: verify runs that code, so a change must re-run verify."""
    import mnnbuild_runtime

    root = Path(mnnbuild_runtime.__file__).parent
    sources = sorted(root.rglob("*.py"))
    return sha256_bytes(*(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0" for p in sources))[
        :16
    ]
