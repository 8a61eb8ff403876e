"""Which caches the environment names: ``MNNBUILD_CACHE`` (the local tier), ``MNNBUILD_CACHE_REMOTE``, and whether
this runner may write to the remote; a value that is no cache is said once, never fails a build."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from pathlib import Path

from mnnbuild.base.errors import CacheError
from mnnbuild.base.userdirs import user_cache_dir

log = logging.getLogger(__name__)

CACHE_ENV = "MNNBUILD_CACHE"
REMOTE_ENV = "MNNBUILD_CACHE_REMOTE"
READONLY_ENV = "MNNBUILD_CACHE_REMOTE_READONLY"
DISABLED = ("off", "0", "false", "no", "none")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


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


def default_cache_url(environ: Mapping[str, str]) -> str:
    return str(user_cache_dir(environ))


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
def warn_once(message: str) -> None:
    """A misconfigured cache is looked up by every task of a run: say what is wrong once per process."""
    log.warning("%s", message)


def kind(exc: BaseException) -> str:
    return type(exc).__name__
