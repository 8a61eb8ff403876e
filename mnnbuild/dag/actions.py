"""The doit actions of stage tasks: restore from the cache or run the stage, and store the result."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from doit.exceptions import TaskFailed
from pydantic import BaseModel, ValidationError

from mnnbuild.cache import ArtifactCache, cache_key, write_origin
from mnnbuild.errors import MnnbuildError
from mnnbuild.manifest import Manifest
from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.verify import VerifyInputs, VerifyParams
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
            write_origin(out_dir, stage.name, {"origin": "cache", "key": key, "cache": cache.url})
            return {"origin": "cache", "bytes": restored}
    started = time.perf_counter()
    try:
        stage.entry(inputs.model_copy(update={"upstream": read_upstream(upstream)}), params, out_dir)
    except (MnnbuildError, ValidationError) as exc:
        return TaskFailed(f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - started
    moved = 0
    if cache and key:
        try:
            moved = cache.store(stage.name, key, out_dir)
        except OSError as exc:  # a cache is an optimisation: never fail a good build on it
            log.warning("cache: could not store %s: %s", stage.name, exc)
    write_origin(out_dir, stage.name, {"origin": "built", "key": key, "seconds": round(seconds, 3)})
    return {"origin": "built", "bytes": moved, "seconds": round(seconds, 3)}


def run_verify(
    stage: Stage, inputs: VerifyInputs, params: VerifyParams, out_dir: Path, *rest: Any
) -> TaskFailed | dict[str, Any]:
    """doit action of verify: `run_stage`, except that a bundle whose files no longer match its manifest is
    verified for real instead of restored from the cache (the cache key only sees the manifests)."""
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


def run_update(source: HfSource, lock_path: Path) -> TaskFailed | None:
    try:
        update_lock(source, lock_path)
    except MnnbuildError as exc:
        return TaskFailed(f"{type(exc).__name__}: {exc}")
    return None
