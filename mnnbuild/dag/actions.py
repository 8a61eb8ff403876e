"""The doit actions of stage tasks: restore from the cache or run the stage, and store the result."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from doit.exceptions import TaskFailed
from pydantic import BaseModel, ValidationError

from mnnbuild.cache import ArtifactCache, cache_key, write_origin
from mnnbuild.errors import MnnbuildError
from mnnbuild.layout import VERIFY_REPORT_JSON
from mnnbuild.manifest import Manifest
from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.verify import VerifyInputs, VerifyManifest, VerifyParams
from mnnbuild.resources import peak_rss, reset_peak_rss, run_id
from mnnbuild.spec import HfSource
from mnnbuild.stage import Stage, StageInputs
from mnnbuild.stages.fetch import update_lock

log = logging.getLogger(__name__)


def read_upstream(upstream: list[tuple[type[Manifest], Path]]) -> dict[str, Manifest]:
    """The upstream manifests a stage reads, read and validated once here, by directory."""
    return {str(Path(d)): cls.read(Path(d)) for cls, d in upstream}


def run_stage(
    stage: Stage,
    inputs: StageInputs,
    params: BaseModel,
    out_dir: Path,
    key_config: str,
    file_dep: list[Path],
    upstream: list[tuple[type[Manifest], Path]],
) -> TaskFailed | dict[str, Any]:
    """doit action: restore the stage's outputs from the cache, or run the stage and store them.

    The stage gets its upstream manifests already read and validated (in ``inputs.upstream``). Bad
    input becomes a one-line task failure, not a traceback. The returned values tell the build
    summary whether the outputs were built or restored.
    """
    cache = ArtifactCache.from_env() if stage.cacheable else None
    key = cache_key(stage.name, key_config, file_dep) if cache else None
    if cache and key:
        restored = cache.restore(stage.name, key, out_dir)
        if restored is not None:
            write_origin(out_dir, stage.name, {"origin": "cache", "key": key, "cache": cache.url, **run_stamp()})
            return {"origin": "cache", "bytes": restored}
    reset_peak_rss()
    started = time.perf_counter()
    try:
        manifest = stage.entry(inputs.model_copy(update={"upstream": read_upstream(upstream)}), params, out_dir)
    except (MnnbuildError, ValidationError) as exc:
        return TaskFailed(f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - started
    peak = peak_rss()
    moved = 0
    if cache and key:
        try:
            hashed = {r.path: (r.size, r.sha256) for r in manifest.outputs}  # hashed by the stage a moment ago
            moved = cache.store(stage.name, key, out_dir, hashed)
        except OSError as exc:  # a cache is an optimisation: never fail a good build on it
            log.warning("cache: could not store %s: %s", stage.name, exc)
    origin = {"origin": "built", "key": key, "seconds": round(seconds, 3), "peak_rss": peak, **run_stamp()}
    write_origin(out_dir, stage.name, origin)
    return {"origin": "built", "bytes": moved, "seconds": round(seconds, 3)}


def run_stamp() -> dict[str, str]:
    """Origin record fields saying when and in which doit run a stage dir was made (the report's cost table)."""
    return {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "run": run_id()}


def run_verify(
    stage: Stage, inputs: VerifyInputs, params: VerifyParams, out_dir: Path, *rest: Any
) -> TaskFailed | dict[str, Any]:
    """doit action of verify: `run_stage`, except that a bundle whose files no longer match its manifest is
    verified for real instead of restored from the cache (the cache key only sees the manifests).

    A failed verify leaves its report without a manifest; its origin record says so (for the page report)."""
    result = _run_verify(stage, inputs, params, out_dir, *rest)
    if isinstance(result, TaskFailed) and (out_dir / VERIFY_REPORT_JSON).is_file():
        if not (out_dir / VerifyManifest.filename()).exists():
            write_origin(out_dir, stage.name, {"origin": "failed", **run_stamp()})
    return result


def report_failed_verify(
    stage: Stage, inputs: StageInputs, params: BaseModel, out_dir: Path, verify_dir: Path
) -> TaskFailed | dict[str, Any]:
    """verify's teardown: when verify left a report but no manifest (it failed), write that run's page.

    doit runs no task whose dependency failed, but runs a failed task's teardown; the page of a failed verify
    opens with its failures."""
    if not (verify_dir / VERIFY_REPORT_JSON).is_file() or (verify_dir / VerifyManifest.filename()).exists():
        return {}
    try:
        stage.entry(inputs, params, out_dir)
    except (MnnbuildError, ValidationError) as exc:
        return TaskFailed(f"{type(exc).__name__}: {exc}")
    log.warning("verify of %s failed; its page report: %s", verify_dir.parent, out_dir)
    return {}


def _run_verify(
    stage: Stage, inputs: VerifyInputs, params: VerifyParams, out_dir: Path, *rest: Any
) -> TaskFailed | dict[str, Any]:
    from mnnbuild.verify.checks import check_integrity

    if ArtifactCache.from_env() is not None:
        try:
            bundle = BundleManifest.read(inputs.bundle_dir)
        except MnnbuildError as exc:
            return TaskFailed(f"{type(exc).__name__}: {exc}")
        if not check_integrity(Path(inputs.bundle_dir), bundle.outputs).passed:
            try:
                stage.entry(inputs, params, out_dir)
            except (MnnbuildError, ValidationError) as exc:
                return TaskFailed(f"{type(exc).__name__}: {exc}")
    return run_stage(stage, inputs, params, out_dir, *rest)


def run_update(source: HfSource, lock_path: Path, files: tuple[str, ...]) -> TaskFailed | None:
    try:
        update_lock(source, lock_path, files)
    except MnnbuildError as exc:
        return TaskFailed(f"{type(exc).__name__}: {exc}")
    return None
