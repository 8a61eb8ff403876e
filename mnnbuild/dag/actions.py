"""The doit actions of stage tasks: restore from the cache or run the stage, and store the result."""

from __future__ import annotations

import fnmatch
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doit.exceptions import TaskFailed
from pydantic import BaseModel, ValidationError

from mnnbuild.base.errors import MnnbuildError, error_line
from mnnbuild.base.fsutil import KnownHashes, sha256_bytes, sha256_file
from mnnbuild.cluster import Cluster, runs_remotely
from mnnbuild.cluster.client import remote_task, shared_tier
from mnnbuild.dag.uptodate import outputs_intact
from mnnbuild.pipeline.cache import CacheTiers, Restored, cache_key, warn_once
from mnnbuild.pipeline.deferred import (
    CACHE_OFF,
    Unavailable,
    deferred_origin,
    materialize,
    output_stamps,
    run_stamp,
)
from mnnbuild.pipeline.layout import origin_file
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.origin import read_origin, stamps, trusted_hashes, write_origin
from mnnbuild.pipeline.resources import peak_rss, reset_peak_rss
from mnnbuild.pipeline.stage import Stage, StageInputs

log = logging.getLogger(__name__)


def task_failed(exc: BaseException) -> TaskFailed:
    """A failed task's one line (`error_line`: the error's type and message), never a traceback."""
    return TaskFailed(error_line(exc))


def read_upstream(upstream: list[tuple[type[Manifest], Path]]) -> dict[str, Manifest]:
    """The upstream manifests a stage reads, read and validated once here, by directory."""
    return {str(Path(d)): cls.read(Path(d)) for cls, d in upstream}


def task_identity(key_config: str) -> str:
    """What a stage dir's origin record says it was built as: the digest of its task's key (stage code, schema,
    what it builds (model, target, plugin), params, tools). A dir another task built (swapped plugin dirs) differs."""
    return sha256_bytes(key_config.encode())


def recorded(
    out_dir: Path, stage: Stage, key: str, links: bool, checks: tuple[Callable[[], bool], ...], deferred_ok: bool = True
) -> bool:
    """Whether ``out_dir`` already holds this run's result by its own records, whatever doit's state file says (it
    is written at the end of a run: a ``kill -9`` loses it): the origin record names this exact key (task key and
    the content of every input file), every output is there with its recorded sha256 (or, ``deferred_ok``, was
    restored without the bytes: `outputs_intact`), and ``checks`` (the stateless counterparts of the task's other
    up-to-date checks) hold. As strict as doit's up-to-date, by hashes."""
    origin = read_origin(out_dir, stage.name)
    if origin.get("origin") not in ("built", "cache") or origin.get("key") != key:
        return False
    return outputs_intact(out_dir, stage.manifest, links, deferred_ok).intact() and all(check() for check in checks)


@dataclass(frozen=True)
class Remote:
    """What a task's run on the cluster needs besides `run_stage`'s arguments: the task's name, the artifact root its
    dirs sit under, and the memory its run holds (`Stage.memory`)."""

    name: str
    root: Path
    memory: int = 0


Guard = tuple[Path, type[Manifest], str]
"""An upstream dir, its manifest model and the subdir whose files must be as that manifest records (`Stage.guards`)."""

Read = tuple[Stage, Path, "dict[str, Any] | None"]
"""An upstream dir whose files a stage's entry reads: its stage, the dir, and the `run_stage` arguments of the task
that makes it (None: no task can make it again here), which build it again when its files cannot be fetched."""


def _guarded_intact(stage: Stage, guards: list[Guard]) -> Callable[[], bool]:
    """Whether every guarded upstream dir still holds the files its manifest lists, and nothing else (checked once,
    by the stage's `Stage.intact`).

    A dir restored without its files holds the cache's, checked against their sha256 when fetched; files unchanged
    since their stage hashed them (their stamps) are not hashed again."""
    check_integrity = stage.intact
    if check_integrity is None:
        raise MnnbuildError(f"stage {stage.name} guards {len(guards)} dirs but declares no intact check")
    records = [(Path(d), cls.stage, cls.read(Path(d)).outputs) for d, cls, _ in guards]

    @functools.cache
    def intact() -> bool:
        for d, name, outputs in records:
            if deferred_origin(d, name) is None and not check_integrity(d, outputs, trusted_hashes(d, name)):
                return False
        return True

    return intact


def run_stage(
    stage: Stage,
    inputs: StageInputs,
    params: BaseModel,
    out_dir: Path,
    key_config: str,
    file_dep: list[Path],
    upstream: list[tuple[type[Manifest], Path]],
    checks: tuple[Callable[[], bool], ...] = (),
    guards: list[Guard] | None = None,
    reads: tuple[Read, ...] = (),
    wanted: bool = False,
    hashes: KnownHashes | None = None,
    remote: Remote | None = None,
) -> TaskFailed | dict[str, Any]:
    """doit action: keep what the stage dir already holds for this key (`recorded`), restore the stage's outputs
    from the cache, or run the stage and store them (`_run_or_restore`). ``hashes``: the files this run hashed.

    With ``guards`` (`Stage.guards`: verify's bundle), a guarded upstream file that no longer matches its manifest
    is run on for real instead of restored from the cache (the cache key only sees the manifests), and a result on
    record counts only while every guarded file is the one it ran on. A stage that `leaves_on_failure` a file
    without a manifest gets an origin record saying it failed (for the page report).
    """
    result: TaskFailed | dict[str, Any] | None = None
    if guards:
        try:
            intact = _guarded_intact(stage, guards)
        except MnnbuildError as exc:
            return task_failed(exc)
        if CacheTiers.from_env() is not None and not intact():
            try:
                materialize_all(reads)
                stage.entry(inputs, params, out_dir)
            except (MnnbuildError, ValidationError) as exc:
                result = task_failed(exc)
        checks = (*checks, intact)
    if result is None:
        result = _run_or_restore(
            stage,
            inputs,
            params,
            out_dir,
            key_config,
            file_dep,
            upstream,
            checks,
            reads,
            wanted,
            hashes or KnownHashes(),
            remote,
        )
    left = stage.leaves_on_failure
    if isinstance(result, TaskFailed) and left and (Path(out_dir) / left).is_file():
        if not (Path(out_dir) / stage.manifest.filename()).exists():
            write_origin(out_dir, stage.name, {"origin": "failed", **run_stamp()})
    return result


def _run_or_restore(
    stage: Stage,
    inputs: StageInputs,
    params: BaseModel,
    out_dir: Path,
    key_config: str,
    file_dep: list[Path],
    upstream: list[tuple[type[Manifest], Path]],
    checks: tuple[Callable[[], bool], ...],
    reads: tuple[Read, ...],
    wanted: bool,
    hashes: KnownHashes,
    remote: Remote | None = None,
) -> TaskFailed | dict[str, Any]:
    """Keep what the stage dir holds for this key, restore it from the cache, or run the stage and store it.

    A hit of a stage with `Stage.defer` patterns leaves those outputs in the cache ("without the bytes") unless
    the task is ``wanted`` (named on the command line): no task that runs reads its files until one must run, and
    that one fetches them first (``reads``: the upstream dirs whose files its entry reads, `materialize`).

    The stage gets its upstream manifests already read and validated (in ``inputs.upstream``). Bad
    input becomes a one-line task failure, not a traceback. The returned values tell the build
    summary whether the outputs were built, restored (from which tier, how many bytes) or found recorded.
    """
    identity = task_identity(key_config)
    # the key hashes every input file: now when a record or the cache asks for it; else once the stage ran, by the
    # hashes it took (a fresh root's fetch hashes the model's weights once, not twice)
    key = cache_key(stage.name, key_config, file_dep, hashes) if read_origin(out_dir, stage.name).get("key") else None
    if key is not None and recorded(Path(out_dir), stage, key, stage.symlinks, checks, deferred_ok=not wanted):
        origin = json.loads((Path(out_dir) / origin_file(stage.name)).read_text(encoding="utf-8"))
        if origin.get("task") != identity:  # a record written before it named its task
            write_origin(out_dir, stage.name, {**origin, "task": identity})
        return {"origin": "recorded"}
    tiers = CacheTiers.from_env() if stage.cacheable else None
    if tiers:
        key = key or cache_key(stage.name, key_config, file_dep, hashes)
        keep = deferred_keep(stage) if stage.defer and not wanted else None
        hit = tiers.restore(stage.name, key, out_dir, keep=keep, link=stage.links)
        if hit is not None:
            _restored_origin(stage, out_dir, key, identity, hit)
            return {"origin": "cache", "tier": hit.tier, "bytes": hit.bytes, "deferred": bool(hit.deferred)}
    try:
        cluster = Cluster.from_env() if remote is not None and runs_remotely(stage) else None
    except MnnbuildError as exc:
        return task_failed(exc)
    if cluster is not None:
        assert remote is not None
        key = key or cache_key(stage.name, key_config, file_dep, hashes)
        return _run_on_cluster(cluster, remote, stage, inputs, params, out_dir, key_config, key, file_dep, upstream,
                               tiers, wanted)  # fmt: skip
    try:
        fetched = materialize_all(reads)
    except MnnbuildError as exc:
        return task_failed(exc)
    reset_peak_rss()
    started = time.perf_counter()
    try:
        manifest = stage.entry(inputs.model_copy(update={"upstream": read_upstream(upstream)}), params, out_dir)
    except (MnnbuildError, ValidationError) as exc:
        return task_failed(exc)
    seconds = time.perf_counter() - started
    peak = peak_rss()
    for record in (*manifest.inputs, *manifest.outputs):
        hashes.add(record.stamp, record.sha256)
    key = key or cache_key(stage.name, key_config, file_dep, hashes)
    stored: dict[str, int] = {}
    if tiers:
        hashed = {r.path: (r.size, r.sha256) for r in manifest.outputs}  # hashed by the stage a moment ago
        # and the stamps the files had then: those still unchanged need no hash when restored from a local cache
        proven = {r.path: (r.stamp, r.sha256) for r in manifest.outputs if r.stamp is not None}
        stored = tiers.store(stage.name, key, out_dir, hashed, link=stage.links, proven=proven)
    origin = {"origin": "built", "key": key, "task": identity, "seconds": round(seconds, 3), "peak_rss": peak}
    origin.update(run_stamp())
    if not stage.symlinks:  # fetch's outputs are links to the model's files, which it does not hash
        origin["stamps"] = stamps(Path(out_dir), [r.path for r in manifest.outputs])
    write_origin(out_dir, stage.name, origin)
    return {
        "origin": "built",
        "bytes": sum(stored.values()),
        "stored": stored,
        "fetched": fetched,
        "seconds": round(seconds, 3),
    }


def _restored_origin(
    stage: Stage, out_dir: Path, key: str, identity: str, hit: Restored, extra: dict[str, Any] | None = None
) -> None:
    """The origin record of a stage dir restored from the cache (``extra``: where it was built, for a cluster's)."""
    origin = {"origin": "cache", "key": key, "task": identity, "cache": hit.url, "tier": hit.tier}
    origin["bytes"] = hit.bytes
    if hit.deferred:
        manifest_sha = sha256_file(Path(out_dir) / stage.manifest.filename())
        origin |= {"deferred": True, "deferred_files": list(hit.deferred), "manifest_sha256": manifest_sha}
    # the files restored were checked against their sha256 just now
    origin["stamps"] = output_stamps(stage, out_dir)
    write_origin(out_dir, stage.name, {**origin, **(extra or {}), **run_stamp()})


def _run_on_cluster(
    cluster: Cluster,
    remote: Remote,
    stage: Stage,
    inputs: StageInputs,
    params: BaseModel,
    out_dir: Path,
    key_config: str,
    key: str,
    file_dep: list[Path],
    upstream: list[tuple[type[Manifest], Path]],
    tiers: CacheTiers | None,
    wanted: bool,
) -> TaskFailed | dict[str, Any]:
    """Run the stage on a worker of ``cluster`` (`mnnbuild.cluster`), then restore its outputs from the shared tier
    as a cache hit: the upstream dirs' files never come here, only their keys go there."""
    try:
        if tiers is None:
            shared_tier(None)  # the one line saying the cluster needs a shared cache
        assert tiers is not None
        preparing = time.perf_counter()
        task, shared = remote_task(remote.name, stage, inputs, params, Path(out_dir), remote.root, key_config, key,
                                   file_dep, upstream, tiers, remote.memory)  # fmt: skip
        submitted = time.perf_counter()
        done = cluster.run(task)
        waited = time.perf_counter() - submitted
    except MnnbuildError as exc:
        return task_failed(exc)
    restoring = time.perf_counter()
    for tier in tiers.tiers:
        tier.cache.fs.invalidate_cache()  # a worker wrote there: no listing from before
    keep = deferred_keep(stage) if stage.defer and not wanted else None
    hit = tiers.restore(stage.name, key, out_dir, keep=keep, link=stage.links)
    if hit is None:
        return TaskFailed(f"{remote.name} ran on {done['worker']} but its outputs could not be restored from the "
                          f"shared cache {shared.cache.url}")  # fmt: skip
    # where a cluster run's time went: on the worker (check, restore, run, store), in flight (submit: the wait less
    # the worker's part), and restoring here (benchmarks/bench_cluster.py)
    timings = {**done["timings"], "wait": round(waited, 3), "restore_here": round(time.perf_counter() - restoring, 3),
               "publish": round(submitted - preparing, 3)}  # fmt: skip
    # what moved: the inputs the worker fetched (and which upstream dirs they were), its outputs stored, restored here
    moved = {"inputs": [r.rel for r in task.refs], "fetched": done.get("fetched", 0), "stored": done["stored"],
             "restored": hit.bytes}  # fmt: skip
    worker = {"worker": done["worker"], "seconds": done["seconds"], "peak_rss": done["peak_rss"], "cluster": timings,
              "moved": moved}  # fmt: skip
    _restored_origin(stage, out_dir, key, task_identity(key_config), hit, worker)
    log.debug("cluster: %s ran on %s (%s)", remote.name, done["worker"], done["timings"])
    return {
        "origin": "built",
        "worker": done["worker"],
        "bytes": done["stored"],
        "stored": {shared.name: done["stored"]},
        "seconds": done["seconds"],
        "timings": timings,
    }


def build_again(stage: Stage, out_dir: Path, again: dict[str, Any] | None, missing: Unavailable) -> None:
    """Make a stage dir whose files the cache cannot give (`materialize`) whole in this run: its task's action again,
    asking for its files (restored with them from a tier that has them whole, else built, its own reads fetched or
    built the same way; a bad entry is dropped where the tier is writable and skipped where it is not). The tasks of
    this run that read its manifest already read the one it had, which a build gives again (same inputs, same
    bytes): a manifest that came out different is an error, and the next run builds what read it.

    Without ``again`` (no task here makes the dir), the dir's origin record is removed, so the next run builds it,
    and `MnnbuildError` says so."""
    if again is None:
        (Path(out_dir) / origin_file(stage.name)).unlink(missing_ok=True)
        raise MnnbuildError(f"{missing}; run the build again to rebuild it")
    if missing.problem == CACHE_OFF:
        warn_once("cache: the cache is off: stage dirs restored from it without their files are built again where "
                  "a task of this run reads them")  # fmt: skip
    elif not missing.said:
        log.warning("cache: %s; building it again", missing)
    else:
        log.info("cache: %s; building it again", missing)
    manifest = Path(out_dir) / stage.manifest.filename()
    restored = read_origin(out_dir, stage.name).get("manifest_sha256")
    result = run_stage(**{**again, "wanted": True})
    if isinstance(result, TaskFailed):
        raise MnnbuildError(f"{out_dir}: building it again (its files could not be fetched) failed: {result.message}")
    if sha256_file(manifest) != restored:
        raise MnnbuildError(
            f"{out_dir}: built again, its files could not be fetched, and its manifest differs from the one the cache "
            "restored, which tasks of this run read; run the build again"
        )


def deferred_keep(stage: Stage) -> Callable[[str], bool]:
    """Which files of the stage's cache entry a hit restores when nobody reads them: the manifest, and the outputs
    its `Stage.defer` patterns do not name."""
    manifest = stage.manifest.filename()
    return lambda path: path == manifest or not any(fnmatch.fnmatchcase(path, pat) for pat in stage.defer)


def materialize_all(reads: tuple[Read, ...]) -> dict[str, int]:
    """`materialize` every dir in ``reads`` that was restored without its files; the bytes fetched by tier. A dir
    whose files the cache cannot give is built again (`build_again`)."""
    fetched: dict[str, int] = {}
    pending = [r for r in reads if deferred_origin(r[1], r[0].name) is not None]
    tiers = CacheTiers.from_env() if pending else None
    for s, d, again in pending:
        if deferred_origin(d, s.name) is None:
            continue  # made whole meanwhile (by the build of another dir that reads it)
        try:
            got = materialize(s, d, tiers)
        except Unavailable as missing:
            build_again(s, d, again, missing)
            continue
        if got is not None:
            fetched[got[0]] = fetched.get(got[0], 0) + got[1]
    return fetched


def run_after_failure(
    stage: Stage, inputs: StageInputs, params: BaseModel, out_dir: Path, failed: Stage, failed_dir: Path
) -> TaskFailed | dict[str, Any]:
    """A failed stage's teardown (`Stage.after_failure_of`): when ``failed`` left its `leaves_on_failure` file but
    no manifest, run ``stage`` (the page of a failed verify, which opens with its failures).

    doit runs no task whose dependency failed, but runs a failed task's teardown."""
    left = failed.leaves_on_failure
    if left is None or not (failed_dir / left).is_file() or (failed_dir / failed.manifest.filename()).exists():
        return {}
    try:
        stage.entry(inputs, params, out_dir)
    except (MnnbuildError, ValidationError) as exc:
        return task_failed(exc)
    log.warning("%s of %s failed; its %s: %s", failed.name, failed_dir.parent, stage.name, out_dir)
    return {}


def run_update(stage: Stage, source: Any, lock_path: Path, files: tuple[str, ...]) -> TaskFailed | None:
    """``doit update:<model>``: the source stage's `Stage.update` of its lock."""
    if stage.update is None:
        return TaskFailed(f"stage {stage.name} declares no update of its lock")
    try:
        stage.update(source, lock_path, files)
    except MnnbuildError as exc:
        return task_failed(exc)
    return None
