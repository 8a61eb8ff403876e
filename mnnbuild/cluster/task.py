"""One stage run on a worker (`execute`, in the child process `mnnbuild.cluster.child` starts): check the worker
computes the client's key, restore the inputs from the shared cache, run the entry, store the outputs under the key."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from mnnbuild.base.errors import ClusterError, MnnbuildError, error_line
from mnnbuild.base.fsutil import KnownHashes, file_stamp
from mnnbuild.pipeline.cache import LOCAL, REMOTE, ArtifactCache, CacheTiers, Tier, cache_key
from mnnbuild.pipeline.fingerprint import DigestMemo, code_fingerprint
from mnnbuild.pipeline.layout import CODE_DIGESTS
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.resources import peak_rss, reset_peak_rss
from mnnbuild.pipeline.stage import Stage, StageInputs

SCRATCH_ENV = "MNNBUILD_WORKER_DIR"
"""Where a worker makes the scratch artifact root of each task (default: ``mnnbuild-worker`` in the temp dir)."""


@dataclass(frozen=True)
class Ref:
    """An upstream dir a task reads: its stage, its cache key and where it sits under the artifact root."""

    stage: str
    key: str
    rel: str


@dataclass(frozen=True)
class RemoteTask:
    """What the client sends for one stage run: small (keys, params, relative paths), never an artifact."""

    name: str
    """The doit task, for messages."""
    stage_module: str
    """The stage's module (it declares ``STAGE``)."""
    key_config: str
    """The client's `mnnbuild.dag.keys.stage_key`: code, schema, inputs, params, tools."""
    key: str
    """The cache key the client computed (key_config + the content of its file_dep)."""
    inputs: StageInputs
    params: BaseModel
    root: str
    """The client's artifact root: the inputs' paths under it are the worker's scratch root's."""
    out: str
    file_dep: tuple[str, ...]
    upstream: tuple[tuple[type[Manifest], str], ...]
    refs: tuple[Ref, ...]
    cache: str
    """The shared cache tier's URL: where the inputs are and the outputs go."""
    memory: int = 0
    """Bytes the run holds beyond its process's own (`Stage.memory`)."""


def load_stage(module: str) -> Stage:
    """The stage a module declares (``STAGE``), imported by name: the worker runs what the client names."""
    found = getattr(importlib.import_module(module), "STAGE", None)
    if not isinstance(found, Stage):
        raise ClusterError(f"{module} declares no STAGE")
    return found


def scratch_base() -> Path:
    """Where this worker's tasks make their scratch roots, and keep the code digests they computed."""
    base = Path(os.environ.get(SCRATCH_ENV) or Path(tempfile.gettempdir(), "mnnbuild-worker"))
    base.mkdir(parents=True, exist_ok=True)
    return base


def environment_difference(stage: Stage, client_config: str) -> tuple[str | None, str]:
    """What of the task key's environment part differs on this machine (its stage code, manifest schema, tool
    versions), one phrase, or None; and this machine's key config."""
    theirs = json.loads(client_config)
    memo = DigestMemo(scratch_base() / CODE_DIGESTS)  # by content: the next task parses no source again
    code = code_fingerprint(stage.entry.__module__, memo)
    schema = stage.manifest.schema_hash(memo)
    memo.save()
    ours = {
        **theirs,
        "code": code,
        "schema": schema,
        "tools": stage.key_tools(),
    }
    mine = json.dumps(ours, sort_keys=True)
    diffs = []
    if ours["code"] != theirs.get("code"):
        diffs.append(f"mnnbuild code of {stage.entry.__module__} {ours['code']} (client {theirs.get('code')})")
    if ours["schema"] != theirs.get("schema"):
        client_schema = str(theirs.get("schema"))[:12]
        diffs.append(f"{stage.manifest.__name__} schema {ours['schema'][:12]} (client {client_schema})")
    tools, client_tools = ours["tools"], theirs.get("tools", {})
    for name in sorted(set(tools) | set(client_tools)):
        if tools.get(name) != client_tools.get(name):
            diffs.append(f"{name} {tools.get(name)!r} (client {client_tools.get(name)!r})")
    return ("; ".join(diffs) or None), mine


def _moved(value: Any, root: Path, scratch: Path) -> Any:
    """A Path (or list of Paths) under the client's artifact root, the same under the scratch root."""
    if isinstance(value, Path):
        try:
            return scratch / value.relative_to(root)
        except ValueError:
            raise ClusterError(f"input {value} is outside the artifact root {root}; run it locally") from None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Path) for v in value):
        return type(value)(_moved(v, root, scratch) for v in value)
    return value


def execute(task: RemoteTask, worker: str) -> dict[str, Any]:
    """Run ``task`` here (``worker``: this worker's address, for messages); the outcome, or ``{"error": line}``."""
    try:
        return _execute(task, worker)
    except (MnnbuildError, ValidationError) as exc:
        return {"error": error_line(exc)}


def _execute(task: RemoteTask, worker: str) -> dict[str, Any]:
    started = time.perf_counter()
    stage = load_stage(task.stage_module)
    differs, key_config = environment_difference(stage, task.key_config)
    if differs:
        raise ClusterError(f"worker {worker} refuses {task.name}: its {differs} differs from the client's")
    try:
        cache = ArtifactCache(task.cache)
        problem = cache.probe()
    except Exception as exc:  # noqa: BLE001 - a backend that cannot even be set up
        problem = f"unusable ({type(exc).__name__}: {exc})"
    if problem is not None:
        raise ClusterError(f"worker {worker} cannot use the shared cache {task.cache}: {problem}")
    checked = time.perf_counter()
    scratch = worker_root()
    out_dir = scratch / task.out
    _evict([rel for rel in _PLACED if _overlaps(rel, task.out)])  # a stale input where the output goes
    shutil.rmtree(out_dir, ignore_errors=True)
    try:
        return _run_in(task, stage, key_config, worker_tiers(cache), scratch, worker, (started, checked))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)  # stored, or failed: the inputs stay for the next task


def worker_tiers(shared: ArtifactCache) -> CacheTiers:
    """The worker's own cache (its ``MNNBUILD_CACHE``, default ``~/.cache/mnnbuild``; ``off``: none) in front of the
    shared one: an input many tasks read (the model's weight file) is fetched once per worker machine."""
    own = ArtifactCache.from_env()
    tiers = [Tier(LOCAL, own)] if own is not None and own.url != shared.url else []
    return CacheTiers([*tiers, Tier(REMOTE, shared)])


KEEP_INPUTS = 8
"""Upstream dirs a task process keeps restored between its tasks (besides the current task's)."""
_PLACED: dict[str, str] = {}
"""This process's restored upstream dirs: their path under its root -> their cache key, least recently used first."""
_HASHES = KnownHashes()
"""The sha256 of those dirs' files by their stamps (`known_restored`): a file changed since is hashed again."""


def worker_root() -> Path:
    """This task process's scratch artifact root: the upstream dirs its tasks restored stay in it, so the next task
    reading them (every plugin reads the model and the partition) neither restores nor hashes GBs again: removing
    a scratch's hard links to the cache's blobs would move their ctime, and a blob not vouched for is hashed on its
    next restore. The roots of task processes gone (killed) are removed."""
    base = scratch_base()
    root = base / f"worker-{os.getpid()}"
    if not root.is_dir():
        for old in base.glob("worker-*"):
            pid = old.name.removeprefix("worker-")
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    return root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(f"{b}/") or b.startswith(f"{a}/")


def _evict(rels: list[str]) -> None:
    for rel in rels:
        _PLACED.pop(rel, None)
        shutil.rmtree(worker_root() / rel, ignore_errors=True)


def place_input(tiers: CacheTiers, ref: Ref, scratch: Path) -> int | None:
    """``ref``'s dir at its path under ``scratch``: kept from an earlier task when it has ``ref``'s key, else restored
    (its digests taken, `known_restored`); the bytes restored, None when no tier holds it."""
    dest = scratch / ref.rel
    if _PLACED.get(ref.rel) == ref.key and dest.is_dir():
        _PLACED[ref.rel] = _PLACED.pop(ref.rel)  # the most recently used last
        return 0
    _evict([rel for rel in _PLACED if _overlaps(rel, ref.rel)])
    hit = tiers.restore(ref.stage, ref.key, dest)
    if hit is None:
        return None
    known_restored(tiers, hit.tier, ref, scratch, _HASHES)
    _PLACED[ref.rel] = ref.key
    return hit.bytes


def known_restored(tiers: CacheTiers, tier: str, ref: Ref, scratch: Path, hashes: KnownHashes) -> None:
    """The sha256 of the files just restored for ``ref``, by their stamps: the restore checked each against its entry
    (hashed, or a blob the cache vouches for), so the key check need not read a model's GB again. A file whose stamp
    moves before the check (another link made to its blob) is hashed there."""
    cache = next(t.cache for t in tiers.tiers if t.name == tier)
    entry = cache.read_entry(ref.stage, ref.key)
    if entry is None:
        return
    for rec in entry.files:
        if rec.link is None:
            hashes.add(file_stamp(scratch / ref.rel / rec.path), rec.sha256)


def _run_in(
    task: RemoteTask,
    stage: Stage,
    key_config: str,
    tiers: CacheTiers,
    scratch: Path,
    worker: str,
    times: tuple[float, float],
) -> dict[str, Any]:
    started, checked = times
    root = Path(task.root)
    cache = tiers.tiers[-1].cache
    fetched = 0
    for ref in task.refs:
        placed = place_input(tiers, ref, scratch)
        if placed is None:
            raise ClusterError(
                f"worker {worker}: the shared cache {task.cache} holds no intact {ref.stage} {ref.key[:12]} "
                f"({ref.rel}), an input of {task.name}"
            )
        fetched += placed
    now = {ref.rel for ref in task.refs}
    _evict([rel for rel in _PLACED if rel not in now][: max(0, len(_PLACED) - len(now) - KEEP_INPUTS)])
    fetched_at = time.perf_counter()
    # a kept file changed since its restore has another stamp: hashed again here, and refused below
    key = cache_key(stage.name, key_config, [scratch / f for f in task.file_dep], _HASHES)
    if key != task.key:
        raise ClusterError(f"worker {worker} refuses {task.name}: its inputs hash to key {key[:12]}, not the "
                           f"client's {task.key[:12]}")  # fmt: skip
    fields = {n: _moved(getattr(task.inputs, n), root, scratch) for n in type(task.inputs).model_fields}
    upstream = {str(scratch / rel): cls.read(scratch / rel) for cls, rel in task.upstream}
    inputs = task.inputs.model_copy(update={**fields, "upstream": upstream})
    out_dir = scratch / task.out
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    restored = time.perf_counter()
    reset_peak_rss()
    manifest = stage.entry(inputs, task.params, out_dir)
    ran = time.perf_counter()
    peak = peak_rss()
    hashed = {r.path: (r.size, r.sha256) for r in manifest.outputs}
    proven = {r.path: (r.stamp, r.sha256) for r in manifest.outputs if r.stamp is not None}
    stored = tiers.store(stage.name, key, out_dir, hashed, link=stage.links, proven=proven).get(REMOTE, 0)
    if not cache.has(stage.name, key):
        raise ClusterError(f"worker {worker}: {task.name} ran but could not be stored in the shared cache {task.cache}")
    done = time.perf_counter()
    return {
        "worker": worker,
        "stored": stored,
        "fetched": fetched,
        "seconds": round(ran - restored, 3),
        "peak_rss": peak,
        "timings": {
            "check": round(checked - started, 3),
            "restore": round(restored - checked, 3),
            "key": round(restored - fetched_at, 3),
            "run": round(ran - restored, 3),
            "store": round(done - ran, 3),
        },
    }
