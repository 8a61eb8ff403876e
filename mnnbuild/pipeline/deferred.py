"""Stage dirs a cache hit restored without their files ("without the bytes"): what says so, and fetching the files
when something must read them (a task that runs: `mnnbuild.dag.actions`; ``python -m mnnbuild conform``)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mnnbuild.base.errors import MnnbuildError, Unavailable
from mnnbuild.base.fsutil import sha256_file
from mnnbuild.pipeline.cache import CacheTiers, Misses, tier_gone
from mnnbuild.pipeline.origin import read_origin, stamps, write_origin
from mnnbuild.pipeline.resources import run_id
from mnnbuild.pipeline.stage import Stage

log = logging.getLogger(__name__)


def deferred_origin(out_dir: Path, stage: str) -> dict[str, Any] | None:
    """The origin record of a stage dir that a cache hit restored without its files (only its manifest and this
    record: `mnnbuild.dag.actions.run_stage`), or None."""
    origin = read_origin(out_dir, stage)
    if origin.get("origin") != "cache" or origin.get("deferred") is not True:
        return None
    return origin


CACHE_OFF = "the cache is off"


def materialize(stage: Stage, out_dir: Path, tiers: CacheTiers | None) -> tuple[str, int] | None:
    """Fetch the files of a stage dir restored without them (`run_stage`), each checked against its sha256; returns
    (tier, bytes), or None when the dir has its files already. `Unavailable` when the cache no longer holds them
    intact (pruned, unreachable, corrupt, off): the dir is left as it was."""
    origin = deferred_origin(out_dir, stage.name)
    if origin is None:
        return None
    key = str(origin.get("key"))
    manifest_path = Path(out_dir) / stage.manifest.filename()
    report = Misses()
    hit = tiers.restore(stage.name, key, out_dir, link=stage.links, report=report) if tiers else None
    problem, said = None, report.known
    if hit is None:
        gone = tier_gone(str(origin.get("cache"))) if origin.get("tier") == "remote" else None
        if tiers is None:
            problem = CACHE_OFF
        elif report.found:
            problem = "; ".join(report.found)
        elif gone is not None:
            problem, said = f"the remote tier {origin.get('cache')} stopped answering", True
        elif report.known:
            problem = "a blob of it was found bad earlier in this run"
        else:
            problem = "no cache tier holds them any more"
    elif sha256_file(manifest_path) != origin.get("manifest_sha256"):
        problem = "the cache entry now holds another manifest"
    if problem is not None:
        raise Unavailable(out_dir, problem, said)
    assert hit is not None
    fetched = {k: v for k, v in origin.items() if k not in ("deferred", "deferred_files", "manifest_sha256")}
    fetched["fetched"] = {"tier": hit.tier, "bytes": hit.bytes, **run_stamp()}
    write_origin(out_dir, stage.name, {**fetched, "stamps": output_stamps(stage, out_dir)})
    log.debug("cache: fetched the files of %s from the %s tier", out_dir, hit.tier)
    return hit.tier, hit.bytes


def output_stamps(stage: Stage, out_dir: Path) -> dict[str, list[int]]:
    """The stamps of a stage dir's outputs (`mnnbuild.pipeline.origin.stamps`) by its manifest."""
    try:
        outputs = stage.manifest.read(Path(out_dir)).outputs
        return stamps(Path(out_dir), [r.path for r in outputs if (Path(out_dir) / r.path).is_file()])
    except MnnbuildError:
        return {}


def run_stamp() -> dict[str, str]:
    """Origin record fields saying when and in which doit run a stage dir was made (the report's cost table)."""
    return {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "run": run_id()}
