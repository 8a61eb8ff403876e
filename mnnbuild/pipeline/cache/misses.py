"""What went wrong in a restore, and what this process learned of its caches so one run trips over a problem once."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mnnbuild.pipeline.cache.env import kind

log = logging.getLogger(__name__)


class Miss(Exception):
    pass


@dataclass
class Misses:
    """Why a restore found nothing it could use, for a caller that says so in a line of its own (`materialize`)
    instead of the cache's warnings: the problems found now, and whether one was said before in this process (a
    blob found bad, a remote tier gone)."""

    found: list[str] = field(default_factory=list)
    known: bool = False


def say(report: Misses | None, message: str) -> None:
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


LEARNED = _Learned()


def went_away(url: str, exc: BaseException) -> None:
    """A remote tier failed a request: one warning, and the build goes on with the tiers left."""
    if url in LEARNED.dead:
        return
    why = f"{kind(exc)}: {str(exc).splitlines()[0] if str(exc) else ''}"
    LEARNED.dead[url] = why
    log.warning("cache: the remote tier %s stopped answering (%s); building with the local tier only", url, why)


def tier_gone(url: str) -> str | None:
    """Why the remote tier ``url`` stopped answering in this run, or None."""
    return LEARNED.dead.get(url)
