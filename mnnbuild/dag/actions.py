"""The doit actions of stage tasks: restore from the cache or run the stage, and store the result."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from doit.exceptions import TaskFailed
from pydantic import BaseModel, ValidationError

from mnnbuild.base.errors import MnnbuildError
from mnnbuild.base.fsutil import sha256_bytes
from mnnbuild.dag.uptodate import outputs_intact
from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.verify import VerifyInputs, VerifyManifest, VerifyParams
from mnnbuild.model.spec import HfSource
from mnnbuild.pipeline.cache import ArtifactCache, cache_key, write_origin
from mnnbuild.pipeline.layout import VERIFY_REPORT_JSON, origin_file
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.resources import peak_rss, reset_peak_rss, run_id
from mnnbuild.pipeline.stage import Stage, StageInputs
from mnnbuild.stages.fetch import update_lock

log = logging.getLogger(__name__)


def read_upstream(upstream: list[tuple[type[Manifest], Path]]) -> dict[str, Manifest]:
    """The upstream manifests a stage reads, read and validated once here, by directory."""
    return {str(Path(d)): cls.read(Path(d)) for cls, d in upstream}


def task_identity(key_config: str) -> str:
    """What a stage dir's origin record says it was built as: the digest of its task's key (stage code, schema,
    what it builds (model, target, plugin), params, tools). A dir another task built (swapped plugin dirs) differs."""
    return sha256_bytes(key_config.encode())


def recorded(out_dir: Path, stage: Stage, key: str, links: bool, checks: tuple[Callable[[], bool], ...]) -> bool:
    """Whether ``out_dir`` already holds this run's result by its own records, whatever doit's state file says (it
    is written at the end of a run: a ``kill -9`` loses it): the origin record names this exact key (task key and
    the content of every input file), every output is there with its recorded sha256, and ``checks`` (the
    stateless counterparts of the task's other up-to-date checks) hold. As strict as doit's up-to-date, by hashes."""
    try:
        origin = json.loads((out_dir / origin_file(stage.name)).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(origin, dict) or origin.get("origin") not in ("built", "cache") or origin.get("key") != key:
        return False
    return outputs_intact(out_dir, stage.manifest, links).intact() and all(check() for check in checks)


def run_stage(
    stage: Stage,
    inputs: StageInputs,
    params: BaseModel,
    out_dir: Path,
    key_config: str,
    file_dep: list[Path],
    upstream: list[tuple[type[Manifest], Path]],
    checks: tuple[Callable[[], bool], ...] = (),
) -> TaskFailed | dict[str, Any]:
    """doit action: keep what the stage dir already holds for this key (`recorded`), restore the stage's outputs
    from the cache, or run the stage and store them.

    The stage gets its upstream manifests already read and validated (in ``inputs.upstream``). Bad
    input becomes a one-line task failure, not a traceback. The returned values tell the build
    summary whether the outputs were built, restored or found recorded.
    """
    key = cache_key(stage.name, key_config, file_dep)
    identity = task_identity(key_config)
    links = stage.name == "fetch"  # fetch's outputs are links to the model's files
    if recorded(Path(out_dir), stage, key, links, checks):
        origin = json.loads((Path(out_dir) / origin_file(stage.name)).read_text(encoding="utf-8"))
        if origin.get("task") != identity:  # a record written before it named its task
            write_origin(out_dir, stage.name, {**origin, "task": identity})
        return {"origin": "recorded"}
    cache = ArtifactCache.from_env() if stage.cacheable else None
    if cache:
        restored = cache.restore(stage.name, key, out_dir)
        if restored is not None:
            origin = {"origin": "cache", "key": key, "task": identity, "cache": cache.url, **run_stamp()}
            write_origin(out_dir, stage.name, origin)
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
    if cache:
        try:
            hashed = {r.path: (r.size, r.sha256) for r in manifest.outputs}  # hashed by the stage a moment ago
            moved = cache.store(stage.name, key, out_dir, hashed)
        except OSError as exc:  # a cache is an optimisation: never fail a good build on it
            log.warning("cache: could not store %s: %s", stage.name, exc)
    origin = {"origin": "built", "key": key, "task": identity, "seconds": round(seconds, 3), "peak_rss": peak}
    origin.update(run_stamp())
    write_origin(out_dir, stage.name, origin)
    return {"origin": "built", "bytes": moved, "seconds": round(seconds, 3)}


def run_stamp() -> dict[str, str]:
    """Origin record fields saying when and in which doit run a stage dir was made (the report's cost table)."""
    return {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "run": run_id()}


def run_verify(
    stage: Stage,
    inputs: VerifyInputs,
    params: VerifyParams,
    out_dir: Path,
    key_config: str,
    file_dep: list[Path],
    upstream: list[tuple[type[Manifest], Path]],
    checks: tuple[Callable[[], bool], ...] = (),
) -> TaskFailed | dict[str, Any]:
    """doit action of verify: `run_stage`, except that a bundle whose files no longer match its manifest is
    verified for real instead of restored from the cache (the cache key only sees the manifests), and a verify
    result on record counts only while the bundle's every file is the one it verified.

    A failed verify leaves its report without a manifest; its origin record says so (for the page report)."""
    from mnnbuild.verify.checks import check_integrity

    try:
        bundle = BundleManifest.read(inputs.bundle_dir)
    except MnnbuildError as exc:
        return TaskFailed(f"{type(exc).__name__}: {exc}")

    @functools.cache
    def intact() -> bool:
        return check_integrity(Path(inputs.bundle_dir), bundle.outputs).passed

    result: TaskFailed | dict[str, Any] | None = None
    if ArtifactCache.from_env() is not None and not intact():
        try:
            stage.entry(inputs, params, out_dir)
        except (MnnbuildError, ValidationError) as exc:
            result = TaskFailed(f"{type(exc).__name__}: {exc}")
    if result is None:
        result = run_stage(stage, inputs, params, out_dir, key_config, file_dep, upstream, (*checks, intact))
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


def run_update(source: HfSource, lock_path: Path, files: tuple[str, ...]) -> TaskFailed | None:
    try:
        update_lock(source, lock_path, files)
    except MnnbuildError as exc:
        return TaskFailed(f"{type(exc).__name__}: {exc}")
    return None
