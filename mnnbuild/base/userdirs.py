"""Where mnnbuild keeps per-user data: platformdirs' user cache dir (``~/.cache/mnnbuild`` on Linux)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import platformdirs


def user_cache_dir(environ: Mapping[str, str]) -> Path:
    """mnnbuild's user cache dir. ``XDG_CACHE_HOME`` is taken from ``environ`` (the caller's environment, which
    platformdirs, reading the process's, cannot be handed); otherwise platformdirs decides for the platform."""
    xdg = environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "mnnbuild"
    return Path(platformdirs.user_cache_dir("mnnbuild", appauthor=False))
