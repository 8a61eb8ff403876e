"""Turning stages into doit tasks. This is the only module that knows about doit.

Every stage task follows one pattern (see `stage_task`): its action calls the stage's entry
function ``(inputs, params, out_dir) -> Manifest``; its target is the manifest the stage
writes; it depends on the files it reads by content, and is up to date only while its
parameters, the versions of the tools it calls, its own code (the stage module and every
mnnbuild module it imports) and its manifest schema are unchanged.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from doit import create_after
from doit.exceptions import InvalidDodoFile, TaskFailed
from doit.reporter import ConsoleReporter
from doit.tools import config_changed
from pydantic import BaseModel, ValidationError

from mnnbuild.cache import ArtifactCache, cache_key, human_bytes, write_origin
from mnnbuild.errors import MnnbuildError
from mnnbuild.fingerprint import code_fingerprint
from mnnbuild.manifest import Manifest, package_version, tool_versions
from mnnbuild.qnn.library import find_qnn_libraries
from mnnbuild.report import renderer_fingerprint
from mnnbuild.resources import peak_rss, reset_peak_rss, run_id
from mnnbuild.settings import Settings
from mnnbuild.spec import HfSource, ModelSpec, discover_specs
from mnnbuild.stages.bundle import BundleInputs, BundleManifest, BundleParams, assemble_bundle
from mnnbuild.stages.config import ConfigInputs, ConfigManifest, ConfigParams, write_config
from mnnbuild.stages.context import ContextInputs, ContextManifest, ContextParams, build_context, read_merge
from mnnbuild.stages.fetch import FetchInputs, FetchManifest, FetchParams, HfLock, fetch, update_lock
from mnnbuild.stages.io import IoInputs, IoManifest, IoParams, generate_io
from mnnbuild.stages.modellib import ModellibInputs, ModellibManifest, ModellibParams, build_modellib
from mnnbuild.stages.partition import PartitionInputs, PartitionManifest, PartitionParams, partition
from mnnbuild.stages.report import PAGE, ReportInputs, ReportManifest, ReportParams, report
from mnnbuild.stages.verify import REPORT_JSON, VerifyInputs, VerifyManifest, VerifyParams, verify
from mnnbuild.verify import runtime_fingerprint

log = logging.getLogger(__name__)

StageFn = Callable[[Any, Any, Path], Manifest]

# What a bare `doit` builds: the shipped tiny model, so a fresh clone proves the whole chain.
DEFAULT_MODEL = "tiny-qwen3"


@dataclass(frozen=True)
class Project:
    """The specs and settings every task is declared from."""

    settings: Settings
    specs: dict[str, ModelSpec]

    @classmethod
    def load(cls, project_root: Path) -> Project:
        settings = Settings.from_env(project_root)
        try:
            specs = discover_specs(list(settings.spec_dirs))
        except MnnbuildError as exc:
            # doit prints InvalidDodoFile as one clean line instead of a traceback
            raise InvalidDodoFile(str(exc)) from None
        return cls(settings=settings, specs=specs)

    def fetch_dir(self, spec: ModelSpec) -> Path:
        return self.settings.model_root(spec.name) / "model"

    def io_dir(self, spec: ModelSpec) -> Path:
        return self.settings.model_root(spec.name) / "io"

    def partition_dir(self, spec: ModelSpec) -> Path:
        return self.settings.model_root(spec.name) / "partition"

    def modellib_dir(self, spec: ModelSpec) -> Path:
        return self.settings.model_root(spec.name) / "modellib"

    def target_dir(self, spec: ModelSpec, arch: str, stage: str) -> Path:
        return self.settings.target_root(spec.name, arch) / stage

    def default_tasks(self) -> list[str]:
        # verifying a bundle builds it first, so a bare `doit` builds, proves and reports the default model
        spec = self.specs.get(DEFAULT_MODEL)
        if spec is None:
            return []
        return [f"{stage}:{spec.name}-{arch}" for arch in spec.targets for stage in ("verify", "report")]

    def doit_config(self) -> dict[str, Any]:
        """DOIT_CONFIG: state under the artifact root, subtasks listed, every failure reported."""
        self.settings.artifact_root.mkdir(parents=True, exist_ok=True)
        return {
            "dep_file": str(self.settings.artifact_root / ".doit.db"),
            "backend": "sqlite3",
            "check_file_uptodate": "md5",
            "subtasks": True,
            "default_tasks": self.default_tasks(),
            "verbosity": 1,
            "reporter": BuildSummaryReporter,
        }


def run_stage(
    stage: StageFn,
    inputs: BaseModel,
    params: BaseModel,
    out_dir: Path,
    key_config: str,
    file_dep: list[Path],
    cacheable: bool = True,
) -> TaskFailed | dict[str, Any]:
    """doit action: restore the stage's outputs from the cache, or run the stage and store them.

    Bad input becomes a one-line task failure, not a traceback. The returned values tell the
    build summary whether the outputs were built or restored.
    """
    name = stage_name(stage)
    cache = ArtifactCache.from_env() if cacheable else None
    key = cache_key(name, key_config, file_dep) if cache else None
    if cache and key:
        restored = cache.restore(name, key, out_dir)
        if restored is not None:
            write_origin(out_dir, name, {"origin": "cache", "key": key, "cache": cache.url, **run_stamp()})
            return {"origin": "cache", "bytes": restored}
    reset_peak_rss()
    started = time.perf_counter()
    try:
        stage(inputs, params, out_dir)
    except (MnnbuildError, ValidationError) as exc:
        return TaskFailed(f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - started
    peak = peak_rss()
    moved = 0
    if cache and key:
        try:
            moved = cache.store(name, key, out_dir)
        except OSError as exc:  # a cache is an optimisation: never fail a good build on it
            log.warning("cache: could not store %s: %s", name, exc)
    origin = {"origin": "built", "key": key, "seconds": round(seconds, 3), "peak_rss": peak, **run_stamp()}
    write_origin(out_dir, name, origin)
    return {"origin": "built", "bytes": moved, "seconds": round(seconds, 3)}


def run_stamp() -> dict[str, str]:
    """Origin record fields saying when and in which doit run a stage dir was made (the report's cost table)."""
    return {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "run": run_id()}


def run_verify(
    stage: StageFn, inputs: VerifyInputs, params: VerifyParams, out_dir: Path, *rest: Any
) -> TaskFailed | dict[str, Any]:
    """doit action of verify: `run_stage`, except that a bundle whose files no longer match its manifest is
    verified for real instead of restored from the cache (the cache key only sees the manifests).

    A failed verify leaves its report without a manifest; its origin record says so (for the page report)."""
    result = _run_verify(stage, inputs, params, out_dir, *rest)
    if isinstance(result, TaskFailed) and (out_dir / REPORT_JSON).is_file():
        if not (out_dir / VerifyManifest.filename()).exists():
            write_origin(out_dir, stage_name(stage), {"origin": "failed", **run_stamp()})
    return result


def _run_verify(
    stage: StageFn, inputs: VerifyInputs, params: VerifyParams, out_dir: Path, *rest: Any
) -> TaskFailed | dict[str, Any]:
    from mnnbuild.verify.checks import check_integrity

    if ArtifactCache.from_env() is not None:
        try:
            bundle = BundleManifest.read(inputs.bundle_dir)
        except MnnbuildError as exc:
            return TaskFailed(f"{type(exc).__name__}: {exc}")
        if not check_integrity(Path(inputs.bundle_dir), bundle.outputs).passed:
            try:
                verify(inputs, params, out_dir)
            except (MnnbuildError, ValidationError) as exc:
                return TaskFailed(f"{type(exc).__name__}: {exc}")
    return run_stage(stage, inputs, params, out_dir, *rest)


def stage_name(stage: StageFn) -> str:
    """A stage's name is its module's name (``mnnbuild.stages.io`` -> ``io``)."""
    return stage.__module__.rpartition(".")[2]


def input_identity(inputs: BaseModel) -> dict[str, Any]:
    """The inputs' fields that say *what* is built (model, binary, graph names), not *where* from.

    Paths are left out: the content behind them enters the key through the input files' hashes,
    and leaving locations out lets a checkout elsewhere hit the same cache entries.
    """

    def is_location(value: Any) -> bool:
        return isinstance(value, Path) or (
            isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, Path) for v in value)
        )

    fields = {name: getattr(inputs, name) for name in type(inputs).model_fields}
    return {name: v for name, v in inputs.model_dump(mode="json").items() if not is_location(fields[name])}


def stage_key(
    stage_module: str,
    manifest: type[Manifest],
    inputs: BaseModel,
    params: BaseModel,
    tools: dict[str, str],
) -> str:
    """What a stage's result depends on besides its input files' content, as one string for doit."""
    return json.dumps(
        {
            "code": code_fingerprint(stage_module),
            "schema": manifest.schema_hash(),
            "inputs": input_identity(inputs),
            "params": params.model_dump(mode="json"),
            "tools": tools,
        },
        sort_keys=True,
    )


def stage_task(
    *,
    name: str | None,
    doc: str,
    stage: StageFn,
    manifest: type[Manifest],
    inputs: BaseModel,
    params: BaseModel,
    out_dir: Path,
    file_dep: list[Path],
    tools: dict[str, str],
    uptodate: list[Any] | None = None,
    task_dep: list[str] | None = None,
    cacheable: bool = True,
    action: Callable[..., TaskFailed | dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The doit task dict of one stage run (a subtask named ``name`` of its stage)."""
    key_config = stage_key(stage.__module__, manifest, inputs, params, tools)
    task = {
        "name": name,
        "doc": doc,
        "actions": [(action or run_stage, [stage, inputs, params, out_dir, key_config, file_dep, cacheable])],
        "file_dep": [str(p) for p in file_dep],
        "targets": [str(out_dir / manifest.filename())],
        "uptodate": [config_changed(key_config), *(uptodate or [])],
        "task_dep": task_dep or [],
        "clean": [(shutil.rmtree, [str(out_dir)], {"ignore_errors": True})],
    }
    if name is None:  # a task of its own rather than a subtask of its stage
        del task["name"]
    return task


def _hf_pinned(lock_path: Path, out_dir: Path) -> Callable[[], bool]:
    """Up to date while the fetched commit is still the one the lock file pins."""

    def check() -> bool:
        try:
            lock = HfLock.model_validate_json(lock_path.read_text(encoding="utf-8"))
            return FetchManifest.read(out_dir).source.commit == lock.commit
        except (OSError, ValueError, MnnbuildError):
            return False

    return check


class files_unchanged:  # noqa: N801 - a doit uptodate checker, named like doit.tools.config_changed
    """doit uptodate: every file under ``root`` has the size and mtime it had after the task's last success.

    For tasks whose file_dep are manifests but which must re-check the files themselves (verify: a bundle
    file replaced after bundling must not pass as verified). Stats are cheap; the task hashes when it runs.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def snapshot(self) -> str:
        if not self.root.is_dir():
            return ""
        stats = sorted(
            (p.relative_to(self.root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.root.rglob("*")
            if p.is_file()
        )
        return json.dumps(stats)

    def __call__(self, task: Any, values: dict[str, Any]) -> bool:
        key = f"files_unchanged:{self.root}"
        task.value_savers.append(lambda: {key: self.snapshot()})
        return values.get(key) == self.snapshot()


def fetch_tasks(project: Project) -> Iterator[dict[str, Any]]:
    for spec in project.specs.values():
        out_dir = project.fetch_dir(spec)
        params = FetchParams()
        if isinstance(spec.source, HfSource):
            inputs = FetchInputs(model=spec.name, source=spec.source, lock_path=spec.lock_path)
            file_dep: list[Path] = []
            uptodate = [_hf_pinned(spec.lock_path, out_dir)]
            where = f"HF {spec.source.hf}@{spec.source.revision}"
        else:
            source_dir = spec.local_dir()
            inputs = FetchInputs(model=spec.name, source=spec.source, source_dir=source_dir)
            file_dep = [source_dir / n for n in params.files if (source_dir / n).is_file()]
            uptodate = []
            where = str(source_dir)
        yield stage_task(
            name=spec.name,
            doc=f"link the {spec.name} model files from {where} into {out_dir}",
            stage=fetch,
            manifest=FetchManifest,
            inputs=inputs,
            params=params,
            out_dir=out_dir,
            file_dep=file_dep,
            tools=tool_versions(),
            uptodate=uptodate,
            # its outputs are links into this machine's source or HF cache: restoring another
            # checkout's links would point there, and relinking is as cheap as a restore
            cacheable=False,
        )


def update_tasks(project: Project) -> Iterator[dict[str, Any]]:
    for spec in project.specs.values():
        if not isinstance(spec.source, HfSource):
            continue
        yield {
            "name": spec.name,
            "doc": f"re-resolve {spec.source.hf}@{spec.source.revision} and pin it in {spec.lock_path.name}",
            "actions": [(run_update, [spec.source, spec.lock_path])],
            "uptodate": [False],  # an update is always asked for explicitly
        }


def run_update(source: HfSource, lock_path: Path) -> TaskFailed | None:
    try:
        update_lock(source, lock_path)
    except MnnbuildError as exc:
        return TaskFailed(f"{type(exc).__name__}: {exc}")
    return None


def io_tasks(project: Project) -> Iterator[dict[str, Any]]:
    for spec in project.specs.values():
        model_dir = project.fetch_dir(spec)
        yield stage_task(
            name=spec.name,
            doc=f"decode and prefill-{spec.chunk_size} reference io of {spec.name} (MNN CPU)",
            stage=generate_io,
            manifest=IoManifest,
            inputs=IoInputs(model=spec.name, model_dir=model_dir),
            params=IoParams(chunk_size=spec.chunk_size, seed=spec.seed),
            out_dir=project.io_dir(spec),
            file_dep=[model_dir / FetchManifest.filename()],
            tools=tool_versions(mnn=True),
        )


class BuildSummaryReporter(ConsoleReporter):
    """doit's console output, plus a closing summary: which tasks were built, restored, up to date."""

    desc = "console output with a build summary (built / from cache / up to date)"

    def __init__(self, outstream: Any, options: dict[str, Any]) -> None:
        super().__init__(outstream, options)
        self.built: list[str] = []
        self.restored: list[str] = []
        self.up_to_date: list[str] = []
        self.bytes_restored = 0
        self.bytes_stored = 0

    def add_success(self, task: Any) -> None:
        super().add_success(task)
        origin = task.values.get("origin")
        if origin == "cache":
            self.restored.append(task.name)
            self.bytes_restored += int(task.values.get("bytes", 0))
        elif origin == "built":
            self.built.append(task.name)
            self.bytes_stored += int(task.values.get("bytes", 0))

    def skip_uptodate(self, task: Any) -> None:
        super().skip_uptodate(task)
        if not task.name.startswith("_"):
            self.up_to_date.append(task.name)

    def complete_run(self) -> None:
        super().complete_run()
        if not (self.built or self.restored or self.up_to_date):
            return
        lines = [
            f"build summary: {len(self.built)} built, {len(self.restored)} from cache "
            f"({human_bytes(self.bytes_restored)}), {len(self.up_to_date)} up to date, "
            f"{human_bytes(self.bytes_stored)} stored in cache"
        ]
        for label, names in (("built", self.built), ("from cache", self.restored), ("up to date", self.up_to_date)):
            if names:
                lines.append(f"  {label + ':':12} {' '.join(names)}")
        self.outstream.write("\n".join(lines) + "\n")


def partition_tasks(project: Project) -> Iterator[dict[str, Any]]:
    for spec in project.specs.values():
        model_dir, io_dir = project.fetch_dir(spec), project.io_dir(spec)
        yield stage_task(
            name=spec.name,
            doc=f"cut {spec.name} into CPU ops and QNN plugins (decode and prefill-{spec.chunk_size} graphs)",
            stage=partition,
            manifest=PartitionManifest,
            inputs=PartitionInputs(model=spec.name, model_dir=model_dir, io_dir=io_dir),
            params=PartitionParams(chunk_size=spec.chunk_size, skips=tuple(spec.skips), max_kv_size=spec.max_kv_size),
            out_dir=project.partition_dir(spec),
            file_dep=[model_dir / FetchManifest.filename(), io_dir / IoManifest.filename()],
            tools=tool_versions(mnn=True),
        )


def modellib_tasks(project: Project) -> Iterator[dict[str, Any]]:
    for spec in project.specs.values():
        model_dir, partition_dir = project.fetch_dir(spec), project.partition_dir(spec)
        yield stage_task(
            name=spec.name,
            doc=f"lower every {spec.name} graph to a QNN graph description + static tensor raws",
            stage=build_modellib,
            manifest=ModellibManifest,
            inputs=ModellibInputs(model=spec.name, model_dir=model_dir, partition_dir=partition_dir),
            params=ModellibParams(),
            out_dir=project.modellib_dir(spec),
            file_dep=[model_dir / FetchManifest.filename(), partition_dir / PartitionManifest.filename()],
            tools=tool_versions(),
        )


def config_tasks(project: Project) -> Iterator[dict[str, Any]]:
    for spec in project.specs.values():
        model_dir = project.fetch_dir(spec)
        for arch in spec.targets:
            yield stage_task(
                name=f"{spec.name}-{arch}",
                doc=f"config_qnn.json for {spec.name} on {arch} (chunk limits {spec.chunk_size}, 1)",
                stage=write_config,
                manifest=ConfigManifest,
                inputs=ConfigInputs(model=spec.name, target=arch, model_dir=model_dir),
                params=ConfigParams(chunk_size=spec.chunk_size),
                out_dir=project.target_dir(spec, arch, "config"),
                file_dep=[model_dir / FetchManifest.filename()],
                tools=tool_versions(),
            )


@functools.cache
def qnn_build_id() -> str:
    """Which QNN libraries the QNN stages would load, without loading them (task keys only).

    The PyPI package's version (or the SDK directory) plus the backend library's size: a new QNN
    changes it, and a checkout elsewhere with the same package keeps its cache hits. Manifests
    record the build id the library itself reports.
    """
    try:
        paths = find_qnn_libraries()
    except MnnbuildError as exc:
        return f"unavailable ({exc})"
    where = package_version("onnxruntime-qnn") if paths.source == "onnxruntime_qnn" else str(paths.lib_dir)
    return f"{paths.source} {where} {paths.backend.stat().st_size}"


def model_name(spec: ModelSpec) -> str:
    """The model's directory name on the device: the HF repo's name, or the local directory's."""
    if isinstance(spec.source, HfSource):
        return spec.source.hf.rpartition("/")[2]
    return spec.local_dir().name


def npu_tasks(project: Project, spec: ModelSpec) -> Iterator[dict[str, Any]]:
    """context and bundle tasks of one model: how many plugins it has is known after its partition."""
    partition_dir, modellib_dir = project.partition_dir(spec), project.modellib_dir(spec)
    merge = read_merge(partition_dir)
    for arch in spec.targets:
        soc = spec.soc(arch)
        target = f"{spec.name}-{arch}"
        context_manifests = []
        binaries = []
        for binary, graphs in merge.items():
            plugin = Path(binary).stem
            out_dir = project.target_dir(spec, arch, "context") / plugin
            context_manifests.append(out_dir / ContextManifest.filename())
            binaries.append(out_dir / binary)
            yield {
                **stage_task(
                    name=plugin,
                    doc=f"HTP context binary {binary} ({', '.join(graphs)}) for {soc.name}",
                    stage=build_context,
                    manifest=ContextManifest,
                    inputs=ContextInputs(model=spec.name, modellib_dir=modellib_dir, binary=binary, graphs=graphs),
                    params=ContextParams(soc=soc),
                    out_dir=out_dir,
                    file_dep=[modellib_dir / ModellibManifest.filename()],
                    tools=tool_versions(qnn=qnn_build_id()),
                ),
                "basename": f"context:{target}",
            }
        config_dir = project.target_dir(spec, arch, "config")
        yield {
            **stage_task(
                name=None,
                doc=f"device bundle of {spec.name} for {soc.name} (HTP {arch})",
                stage=assemble_bundle,
                manifest=BundleManifest,
                inputs=BundleInputs(
                    model=spec.name,
                    model_name=model_name(spec),
                    model_dir=project.fetch_dir(spec),
                    config_dir=config_dir,
                    qnn_model=partition_dir / "qnn" / "llm.mnn",
                    context_binaries=binaries,
                ),
                params=BundleParams(soc=soc),
                out_dir=project.target_dir(spec, arch, "bundle"),
                file_dep=[
                    project.fetch_dir(spec) / FetchManifest.filename(),
                    config_dir / ConfigManifest.filename(),
                    partition_dir / PartitionManifest.filename(),
                    *context_manifests,
                ],
                tools=tool_versions(qnn=qnn_build_id()),
            ),
            "basename": f"bundle:{target}",
        }
        bundle_dir = project.target_dir(spec, arch, "bundle")
        verify_task = stage_task(
            name=None,
            doc=f"check the {spec.name} bundle for {soc.name}: CPU in MNN, plugins in the HTP simulator",
            stage=verify,
            manifest=VerifyManifest,
            inputs=VerifyInputs(
                model=spec.name,
                bundle_dir=bundle_dir,
                modellib_dir=modellib_dir,
                partition_dir=partition_dir,
                io_dir=project.io_dir(spec),
                model_dir=project.fetch_dir(spec),
                context_dir=project.target_dir(spec, arch, "context"),
            ),
            params=VerifyParams(soc=soc),
            out_dir=project.target_dir(spec, arch, "verify"),
            file_dep=[
                bundle_dir / BundleManifest.filename(),
                modellib_dir / ModellibManifest.filename(),
                partition_dir / PartitionManifest.filename(),
                project.io_dir(spec) / IoManifest.filename(),
                project.fetch_dir(spec) / FetchManifest.filename(),
                *context_manifests,
            ],
            # the runtime package is not under mnnbuild's code fingerprint: key it explicitly
            tools={**tool_versions(mnn=True, qnn=qnn_build_id()), "mnnbuild_runtime": runtime_fingerprint()},
            uptodate=[files_unchanged(bundle_dir / "model")],
            action=run_verify,
        )
        report = report_task(project, spec, arch)  # issue 16: the page report, wired beside verify
        yield {**verify_task, "basename": f"verify:{target}", "teardown": report.pop("verify_teardown")}
        yield report


def npu_task_creators(project: Project) -> dict[str, Callable[[], Iterator[dict[str, Any]]]]:
    """One delayed task creator per model (``task_npu_<model>``), run by doit after ``partition:<model>``."""
    creators = {}
    for spec in project.specs.values():
        stages = ("context", "bundle", "verify", "report")
        creates = [f"{stage}:{spec.name}-{arch}" for arch in spec.targets for stage in stages]

        def creator(spec: ModelSpec = spec) -> Iterator[dict[str, Any]]:
            yield from npu_tasks(project, spec)

        creator.__doc__ = (
            f"{spec.name}: HTP context binaries (a subtask per plugin) / device bundle / verify / report, after its "
            "partition"
        )
        creators[f"task_npu_{spec.name}"] = create_after(executed=f"partition:{spec.name}", creates=creates)(creator)
    return creators


def verify_all_task(project: Project) -> dict[str, Any]:
    """``doit verify``: the verify tasks of the default bundles (each builds its bundle first)."""
    verify_tasks = [t for t in project.default_tasks() if t.startswith("verify:")]
    return {
        "doc": f"build and verify the default bundles ({', '.join(verify_tasks) or 'none'})",
        "actions": None,
        "task_dep": verify_tasks,
    }


# ---- issue 16: the page report (report:<model>-<arch>) -------------------------------------------------------


def report_task(project: Project, spec: ModelSpec, arch: str) -> dict[str, Any]:
    """``report:<model>-<arch>``: the page of what verify found, re-made when verify's outputs change.

    Its file_dep are verify's manifest (so it runs after a passing verify) and verify.json (what it shows).
    A failed verify stops doit before any task that depends on it, so the dict also carries
    ``verify_teardown``, for the verify task: doit runs a task's teardown at the end of the run even when the
    task failed, and that teardown writes the page of the failed verify (with the failures at the top).
    """
    verify_dir = project.target_dir(spec, arch, "verify")
    inputs = ReportInputs(
        model=spec.name,
        verify_dir=verify_dir,
        partition_dir=project.partition_dir(spec),
        bundle_dir=project.target_dir(spec, arch, "bundle"),
        model_dir=project.fetch_dir(spec),
        io_dir=project.io_dir(spec),
        modellib_dir=project.modellib_dir(spec),
        config_dir=project.target_dir(spec, arch, "config"),
        context_dir=project.target_dir(spec, arch, "context"),
    )
    params = ReportParams(target=arch)
    out_dir = project.target_dir(spec, arch, "report")
    task = stage_task(
        name=None,
        doc=f"the {spec.name} {arch} bundle's page report: verdict, partition, numbers, cost ({out_dir / PAGE})",
        stage=report,
        manifest=ReportManifest,
        inputs=inputs,
        params=params,
        out_dir=out_dir,
        file_dep=[
            verify_dir / VerifyManifest.filename(),
            verify_dir / REPORT_JSON,
            project.partition_dir(spec) / PartitionManifest.filename(),
            project.target_dir(spec, arch, "bundle") / BundleManifest.filename(),
        ],
        tools={**tool_versions(), "report_renderer": renderer_fingerprint()},
    )
    return {
        **task,
        "basename": f"report:{spec.name}-{arch}",
        "verify_teardown": [(report_failed_verify, [inputs, params, out_dir])],
    }


def report_failed_verify(inputs: ReportInputs, params: ReportParams, out_dir: Path) -> TaskFailed | dict[str, Any]:
    """verify's teardown: when verify left a report but no manifest (it failed), write that run's page."""
    verify_dir = Path(inputs.verify_dir)
    if not (verify_dir / REPORT_JSON).is_file() or (verify_dir / VerifyManifest.filename()).exists():
        return {}
    result = run_stage(report, inputs, params, out_dir, key_config="", file_dep=[], cacheable=False)
    if not isinstance(result, TaskFailed):
        log.warning("verify %s-%s failed; its page report: %s", inputs.model, params.target, out_dir / PAGE)
    return result
