"""The client side: which stages run on the cluster, the shared cache tier their inputs are published to, and one
task submitted and waited for (`Cluster`)."""

from __future__ import annotations

import functools
import logging
import math
import os
import pickle
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mnnbuild.base.errors import ClusterError
from mnnbuild.cluster.task import Ref, RemoteTask
from mnnbuild.pipeline.cache import LOCAL, REMOTE, CacheTiers, Tier
from mnnbuild.pipeline.layout import origin_file
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.origin import read_origin
from mnnbuild.pipeline.stage import Stage, StageInputs

log = logging.getLogger(__name__)

SCHEDULER_ENV = "MNNBUILD_SCHEDULER"
"""The Dask scheduler's address (``tcp://host:8786``); unset: every stage runs on this machine."""
TIMEOUT_ENV = "MNNBUILD_SCHEDULER_TIMEOUT"
CONNECT_SECONDS = 10.0
SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
"""The schemes of a Dask scheduler address (``host:port`` alone is tcp)."""
MEMORY = "MEMORY"
"""The Dask worker resource a task asks for, in GiB (``dask worker --resources MEMORY=16``)."""
BASE_MEMORY = 1 << 30
"""What a task's process holds before its stage's own (`Stage.memory`): Python, MNN, QNN's libraries."""
GIB = 1 << 30


def runs_remotely(stage: Stage) -> bool:
    """Whether a stage's runs go to the cluster: one whose outputs the cache stores and which reads nothing but its
    upstream dirs. Not fetch (it reads the model outside the artifact root), verify (its guard checks this machine's
    bundle files, and a failed run leaves its report here) or the page report (it reads the cost records of this
    machine's stage dirs)."""
    return (
        stage.cacheable
        and not stage.reads_source
        and not stage.guards
        and stage.leaves_on_failure is None
        and all(edge.reads != "dir" for edge in stage.edges.values())
    )


def shared_tier(tiers: CacheTiers | None) -> Tier:
    """The tier the workers share with this machine: the remote one (``MNNBUILD_CACHE_REMOTE``), else the local one
    (``MNNBUILD_CACHE``, then a directory every worker mounts); writable, since the workers store into it."""
    found = {t.name: t for t in tiers.tiers} if tiers is not None else {}
    tier = found.get(REMOTE) or found.get(LOCAL)
    if tier is None:
        raise ClusterError(f"{SCHEDULER_ENV} is set but the cache is off: the workers take their inputs from and put "
                           "their outputs in a shared cache; set MNNBUILD_CACHE_REMOTE")  # fmt: skip
    if not tier.cache.writable:
        raise ClusterError(f"{SCHEDULER_ENV} is set but the shared cache {tier.cache.url} is read-only here; the "
                           "workers store their outputs there")  # fmt: skip
    return tier


def _staged_copy(stage: str, src: Path, dest: Path) -> None:
    """``src``'s files (links resolved: fetch links the model's files) without its origin record, in ``dest``:
    hard links where the file system allows, else copies."""
    skip = origin_file(stage)
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if rel.as_posix() == skip or not path.is_file():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        real = path.resolve()
        try:
            os.link(real, target)
        except OSError:
            shutil.copyfile(real, target)


def publish(stage: str, out_dir: Path, root: Path, tiers: CacheTiers, shared: Tier) -> Ref:
    """The cache entry of an upstream dir, in the shared tier: there already (built or restored through it), else
    copied there from the tier that has it, or from the dir itself (built with that tier off, or fetch's links)."""
    origin = read_origin(out_dir, stage)
    key = origin.get("key")
    if not isinstance(key, str):
        raise ClusterError(f"{out_dir}: no origin record with its key; run its task first")
    try:
        rel = out_dir.relative_to(root).as_posix()
    except ValueError:
        raise ClusterError(f"{out_dir} is outside the artifact root {root}") from None
    ref = Ref(stage, key, rel)
    shared.cache.fs.invalidate_cache()
    if shared.cache.has(stage, key):
        return ref
    with tempfile.TemporaryDirectory(prefix=".publish-", dir=root) as tmp:
        staged = Path(tmp) / "dir"
        if origin.get("deferred"):  # its files are in another tier only
            if tiers.restore(stage, key, staged, link=False) is None:
                raise ClusterError(f"{out_dir}: restored without its files, which no cache tier holds now; run "
                                   "the build without the cluster once")  # fmt: skip
            (staged / origin_file(stage)).unlink(missing_ok=True)
        else:
            staged.mkdir()
            _staged_copy(stage, out_dir, staged)
        shared.cache.store(stage, key, staged, link=False)
    if not shared.cache.has(stage, key):
        raise ClusterError(f"{out_dir} could not be stored in the shared cache {shared.cache.url}")
    log.debug("cluster: published %s (%s) to %s", rel, stage, shared.cache.url)
    return ref


def remote_task(
    name: str,
    stage: Stage,
    inputs: StageInputs,
    params: BaseModel,
    out_dir: Path,
    root: Path,
    key_config: str,
    key: str,
    file_dep: list[Path],
    upstream: list[tuple[type[Manifest], Path]],
    tiers: CacheTiers,
    memory: int,
) -> tuple[RemoteTask, Tier]:
    """The task the workers get for one stage run (its upstream dirs published to the shared tier first)."""
    shared = shared_tier(tiers)
    refs = tuple(publish(cls.stage, Path(d), root, tiers, shared) for cls, d in upstream)
    dirs = [root / r.rel for r in refs]
    deps = []
    for f in file_dep:
        if not any(Path(f).is_relative_to(d) for d in dirs):
            raise ClusterError(f"{name}: its input {f} is in no upstream dir; run it without {SCHEDULER_ENV}")
        deps.append(Path(f).relative_to(root).as_posix())
    task = RemoteTask(
        name=name,
        stage_module=stage.entry.__module__,
        key_config=key_config,
        key=key,
        inputs=inputs.model_copy(update={"upstream": {}}),
        params=params,
        root=str(root),
        out=Path(out_dir).relative_to(root).as_posix(),
        file_dep=tuple(deps),
        upstream=tuple((cls, Path(d).relative_to(root).as_posix()) for cls, d in upstream),
        refs=refs,
        cache=shared.cache.url,
        memory=memory,
    )
    return task, shared


def check_address(address: str) -> None:
    """``address`` must read as a scheduler address, ``[scheme://]host:port``: Dask's Client takes ``junk`` apart
    only after it started, then waits 20 s to close and prints a traceback."""
    scheme, sep, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":")
    bracketed = host.startswith("[") == host.endswith("]")  # an IPv6 host is [::1]
    if (sep and scheme not in SCHEMES) or not host or not bracketed or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(
            f"{SCHEDULER_ENV}={address!r}: expected a Dask scheduler address, [scheme://]host:port such as "
            f"tcp://10.0.0.5:8786 (scheme {', '.join(SCHEMES)}; port 1-65535), or unset it to build on this machine"
        )


_CLIENTS: dict[tuple[int, str], Any] = {}
"""One Dask client per process and scheduler (``doit -n`` forks: a client is not shared across a fork)."""


class Cluster:
    """The Dask scheduler ``MNNBUILD_SCHEDULER`` names."""

    def __init__(self, address: str, timeout: float = CONNECT_SECONDS) -> None:
        self.address = address
        self.timeout = timeout

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Cluster | None:
        env = os.environ if environ is None else environ
        address = env.get(SCHEDULER_ENV, "").strip()
        if not address or address.lower() in ("off", "0", "none"):
            return None
        check_address(address)
        raw = env.get(TIMEOUT_ENV, "").strip()
        try:
            timeout = float(raw) if raw else CONNECT_SECONDS
        except ValueError:
            timeout = math.nan
        if not math.isfinite(timeout) or timeout <= 0:  # Dask takes inf or nan for a unit (KeyError), -5 as '1-5.0'
            raise ClusterError(f"{TIMEOUT_ENV}={raw!r}: expected a number of seconds above 0") from None
        return cls(address, timeout)

    def client(self) -> Any:
        """This process's client of the scheduler; a `ClusterError` in one line when it does not answer: the build
        stops (a 2-core runner quietly taking over a cluster's work could take hours)."""
        found = _CLIENTS.get((os.getpid(), self.address))
        if found is not None:
            return found
        try:
            from distributed import Client
        except ImportError:
            raise ClusterError(f"{SCHEDULER_ENV} is set but Dask's distributed is not installed; "
                               "pip install 'mnnbuild[cluster]'") from None  # fmt: skip
        quiet = logging.getLogger("distributed")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # its own retries' tracebacks; the failure is said below in one line
        try:
            client = Client(self.address, timeout=self.timeout, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ClusterError(
                f"{SCHEDULER_ENV}={self.address}: the scheduler does not answer within {self.timeout:g} s ({first}); "
                f"the build stops: start it, or unset {SCHEDULER_ENV} to build on this machine"
            ) from None
        finally:
            quiet.setLevel(level)
        _CLIENTS[(os.getpid(), self.address)] = client
        return client

    def resources(self, task: RemoteTask) -> dict[str, float] | None:
        """The worker resources a task asks for: its memory in GiB when the workers declare theirs (`MEMORY`)."""
        workers = self.client().scheduler_info(n_workers=-1).get("workers", {})
        have = [float(w.get("resources", {}).get(MEMORY, 0)) for w in workers.values()]
        if not any(have):
            _no_memory_declared(self.address)
            return None
        need = round((BASE_MEMORY + task.memory) / GIB, 2)
        if need > max(have):
            raise ClusterError(f"{task.name} needs {need:g} GiB and the largest worker of {self.address} declares "
                               f"{max(have):g} ({MEMORY}); add a bigger worker or build it here")  # fmt: skip
        return {MEMORY: need}

    def run(self, task: RemoteTask) -> dict[str, Any]:
        """Submit ``task`` and wait for it; Ctrl-C cancels it on the cluster. A `ClusterError` when it failed there."""
        from mnnbuild.cluster.worker import run_task

        client = self.client()
        payload = pickle.dumps(task)
        key = f"mnnbuild-{task.name}-{uuid.uuid4().hex[:8]}"
        future = client.submit(run_task, payload, key=key, pure=False, resources=self.resources(task))
        try:
            result = future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - lost scheduler, a worker that died too often
            raise ClusterError(f"{task.name} on {self.address}: {type(exc).__name__}: {exc}") from None
        if "error" in result:
            raise ClusterError(str(result["error"]))
        return dict(result)


@functools.cache
def _no_memory_declared(address: str) -> None:
    log.warning("cluster: the workers of %s declare no %s resource; tasks are not placed by the memory they need",
                address, MEMORY)  # fmt: skip
