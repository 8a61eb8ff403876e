"""The tiers a build uses (local, then remote): lookups down the tiers, a lower hit kept in the tiers above it."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mnnbuild.base.errors import CacheError
from mnnbuild.pipeline.cache.entries import Keep
from mnnbuild.pipeline.cache.env import kind, remote_readonly, remote_url, warn_once
from mnnbuild.pipeline.cache.misses import LEARNED, Misses, went_away
from mnnbuild.pipeline.cache.store import ArtifactCache

log = logging.getLogger(__name__)

LOCAL, REMOTE = "local", "remote"
"""The tiers, looked up in this order: ``MNNBUILD_CACHE``'s, then ``MNNBUILD_CACHE_REMOTE``'s."""


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


@functools.cache
def _remote_problem(url: str) -> str | None:
    """Why the remote tier cannot be used (unreachable, or not an mnnbuild cache), asked once per process: every task
    of a run looks the cache up, and an unreachable endpoint makes each try wait for its retries."""
    try:
        return ArtifactCache(url).probe()
    except Exception as exc:  # noqa: BLE001 - a backend that cannot even be set up
        return f"unusable ({kind(exc)}: {exc})"


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
        if url is not None and url not in LEARNED.dead:  # one that stopped answering was said so once
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
            if tier.cache.url in LEARNED.dead:
                continue
            try:
                entry = tier.cache.read_entry(stage, key, report)
            except Exception as exc:  # noqa: BLE001 - a cache problem is a miss in that tier
                if tier.name == REMOTE:
                    went_away(tier.cache.url, exc)
                else:
                    log.warning("cache: cannot look up %s %s in the %s tier (%s: %s)", stage, key[:12], tier.name,
                                kind(exc), exc)  # fmt: skip
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
            if t.cache.writable and t.cache.url not in LEARNED.dead
        }
