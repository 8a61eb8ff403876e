"""The doit tasks of every stage, declared from the specs (see `mnnbuild.dag`)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from doit import create_after
from doit.exceptions import TaskFailed
from doit.tools import config_changed
from pydantic import BaseModel

from mnnbuild.dag.actions import run_stage, run_update, run_verify
from mnnbuild.dag.keys import qnn_build_id, stage_key
from mnnbuild.dag.project import Project
from mnnbuild.dag.uptodate import _hf_pinned, files_unchanged
from mnnbuild.fingerprint import DigestMemo
from mnnbuild.layout import BUNDLE_MODEL_DIR, RESULT_MODEL, context_dir
from mnnbuild.manifest import Manifest, tool_versions
from mnnbuild.manifests.partition import read_merge
from mnnbuild.spec import HfSource, ModelSpec
from mnnbuild.stages.bundle import BundleInputs, BundleManifest, BundleParams, assemble_bundle
from mnnbuild.stages.config import ConfigInputs, ConfigManifest, ConfigParams, write_config
from mnnbuild.stages.context import ContextInputs, ContextManifest, ContextParams, build_context
from mnnbuild.stages.fetch import FetchInputs, FetchManifest, FetchParams, fetch
from mnnbuild.stages.io import IoInputs, IoManifest, IoParams, generate_io
from mnnbuild.stages.modellib import ModellibInputs, ModellibManifest, ModellibParams, build_modellib
from mnnbuild.stages.partition import PartitionInputs, PartitionManifest, PartitionParams, partition
from mnnbuild.stages.verify import VerifyInputs, VerifyManifest, VerifyParams, verify
from mnnbuild.verify import runtime_fingerprint

log = logging.getLogger(__name__)

StageFn = Callable[[Any, Any, Path], Manifest]


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
    memo: DigestMemo | None = None,
) -> dict[str, Any]:
    """The doit task dict of one stage run (a subtask named ``name`` of its stage)."""
    key_config = stage_key(stage.__module__, manifest, inputs, params, tools, memo)
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
            memo=project.memo,
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
            memo=project.memo,
            tools=tool_versions(mnn=True),
        )


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
            memo=project.memo,
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
            memo=project.memo,
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
                memo=project.memo,
                tools=tool_versions(),
            )


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
            out_dir = context_dir(project.settings.artifact_root, spec.name, arch, binary)
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
                    memo=project.memo,
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
                    qnn_model=partition_dir / RESULT_MODEL,
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
                memo=project.memo,
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
            uptodate=[files_unchanged(bundle_dir / BUNDLE_MODEL_DIR)],
            memo=project.memo,
            action=run_verify,
        )
        yield {**verify_task, "basename": f"verify:{target}"}


def npu_task_creators(project: Project) -> dict[str, Callable[[], Iterator[dict[str, Any]]]]:
    """One delayed task creator per model (``task_npu_<model>``), run by doit after ``partition:<model>``."""
    creators = {}
    for spec in project.specs.values():
        creates = [f"{stage}:{spec.name}-{arch}" for arch in spec.targets for stage in ("context", "bundle", "verify")]

        def creator(spec: ModelSpec = spec) -> Iterator[dict[str, Any]]:
            yield from npu_tasks(project, spec)

        creator.__doc__ = (
            f"{spec.name}: HTP context binaries (a subtask per plugin) / device bundle / verify, after its partition"
        )
        creators[f"task_npu_{spec.name}"] = create_after(executed=f"partition:{spec.name}", creates=creates)(creator)
    return creators


def verify_all_task(project: Project) -> dict[str, Any]:
    """``doit verify``: the verify tasks of the default bundles (each builds its bundle first)."""
    return {
        "doc": f"build and verify the default bundles ({', '.join(project.default_tasks()) or 'none'})",
        "actions": None,
        "task_dep": project.default_tasks(),
    }
