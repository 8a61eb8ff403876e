"""The doit tasks of every stage, derived from the stage declarations in one loop (`stage_task`).

A stage declares what it reads (its upstream stages), what it calls and whether it is cacheable
(`mnnbuild.pipeline.stage.Stage`); the layout says where each stage writes. What is left per stage is how a
model spec becomes its Inputs and Params (`RUNS`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doit import create_after
from doit.exceptions import TaskFailed
from doit.tools import config_changed
from pydantic import BaseModel

from mnnbuild.base.errors import MnnbuildError
from mnnbuild.base.fsutil import confined, remove_stage_dir, remove_stage_dirs
from mnnbuild.dag.actions import (
    materialize_all,
    report_failed_verify,
    run_stage,
    run_update,
    run_verify,
    task_identity,
)
from mnnbuild.dag.keys import qnn_build_id, stage_key
from mnnbuild.dag.project import DEFAULT_MODEL, Project
from mnnbuild.dag.status import code_record, group
from mnnbuild.dag.uptodate import files_unchanged, hf_pinned, origin_matches, outputs_intact
from mnnbuild.manifests.bundle import BundleInputs, BundleManifest, BundleParams
from mnnbuild.manifests.config import ConfigInputs, ConfigParams
from mnnbuild.manifests.context import ContextInputs, ContextParams
from mnnbuild.manifests.fetch import FetchInputs, FetchParams
from mnnbuild.manifests.io import IoInputs, IoParams
from mnnbuild.manifests.modellib import ModellibInputs, ModellibParams
from mnnbuild.manifests.partition import PartitionInputs, PartitionManifest, PartitionParams, read_merge
from mnnbuild.manifests.report import ReportInputs, ReportParams
from mnnbuild.manifests.twin import TwinInputs, TwinParams
from mnnbuild.manifests.verify import VerifyInputs, VerifyParams
from mnnbuild.model.modeldir import VISUAL_FILES, VISUAL_PART, family_files, prompt_file_text
from mnnbuild.model.npu_weights import DEFAULT_NPU_WEIGHTS, NpuWeights
from mnnbuild.model.spec import HfSource, ModelSpec
from mnnbuild.model.targets import Soc
from mnnbuild.pipeline.layout import (
    BUNDLE_MODEL_DIR,
    PART_STAGES,
    PLUGIN_STAGES,
    REPORT_PAGE,
    VERIFY_REPORT_JSON,
    context_dir,
    plugin_dir,
)
from mnnbuild.pipeline.manifest import tool_versions
from mnnbuild.pipeline.stage import Stage, StageInputs
from mnnbuild.report import renderer_fingerprint
from mnnbuild.stages import bundle, config, context, fetch, io, modellib, partition, report, twin, verify
from mnnbuild.verify import runtime_fingerprint

log = logging.getLogger(__name__)

STAGES: dict[str, Stage] = {
    s.STAGE.name: s.STAGE for s in (fetch, io, partition, modellib, config, context, twin, bundle, verify, report)
}
"""Every stage, in chain order."""


@dataclass(frozen=True)
class Run:
    """One task of a stage: one model (and target, and plugin), from which inputs, with which params."""

    spec: ModelSpec
    inputs: StageInputs
    params: BaseModel
    doc: str
    arch: str | None = None
    binary: str | None = None
    """The context binary this run builds or stands in for (context and twin runs only: a subtask per plugin)."""
    part: str | None = None
    """The model file a part stage (io, partition, modellib) or a plugin's run builds for: ``llm`` or a VL model's
    ``visual``; None: every part of the model (config, bundle, verify, report)."""
    file_dep: tuple[Path, ...] = ()
    """Files read besides the upstream manifests (a local model's source files)."""
    uptodate: tuple[Any, ...] = ()
    checks: tuple[Callable[[], bool], ...] = ()
    """The stateless ones among ``uptodate`` (an HF fetch's pinned commit): what must still hold for outputs on
    record to count when doit has lost its state (`mnnbuild.dag.actions.recorded`)."""
    tools: dict[str, str] = field(default_factory=dict)
    """Versions beyond the declared tools' (verify: the runtime package it runs)."""
    action: Callable[..., TaskFailed | dict[str, Any]] = run_stage
    teardown: tuple[Any, ...] = ()
    """doit teardown actions (verify: the page of a failed verify)."""


@functools.cache
def plugin_dependent(name: str) -> bool:
    """Whether a stage's tasks exist only once the partition has said how many plugins there are."""
    return name in PLUGIN_STAGES or any(plugin_dependent(u) for u in STAGES[name].upstream)


VISUAL = "visual"


def model_parts(spec: ModelSpec) -> tuple[str, ...]:
    """The model files a model is built from, each with its own io, partition and modellib: the language model
    (``llm``) and, for a VL model, its encoder (``visual``)."""
    return ("llm", VISUAL) if spec.family == "vl" else ("llm",)


def out_dir(project: Project, stage: Stage, run: Run) -> Path:
    root = project.settings.artifact_root
    if run.binary is not None:
        return plugin_dir(root, stage.name, run.spec.name, str(run.arch), run.binary)
    return project.stage_dir(stage.name, run.spec, run.arch, run.part if stage.name in PART_STAGES else None)


def upstream_dirs(project: Project, name: str, spec: ModelSpec, arch: str | None, part: str | None) -> list[Path]:
    """Where stage ``name`` wrote for this model (and target, and ``part``; None: every part): one dir per plugin
    for context and twin."""
    parts = model_parts(spec) if part is None else (part,)
    if name in PLUGIN_STAGES:
        assert arch is not None
        root = project.settings.artifact_root
        return [
            plugin_dir(root, name, spec.name, arch, b)
            for p in parts
            for b in read_merge(project.stage_dir("partition", spec, part=p))
        ]
    if name in PART_STAGES:
        return [project.stage_dir(name, spec, part=p) for p in parts]
    return [project.stage_dir(name, spec, arch if STAGES[name].per_target else None)]


def upstream_task(name: str, spec: ModelSpec, part: str | None) -> str:
    """The task of model-level (or part) stage ``name`` that a run of ``spec`` (for ``part``) reads."""
    suffix = f":{part}" if name in PART_STAGES and part not in (None, "llm") else ""
    return f"{name}:{spec.name}{suffix}"


def task_name(stage: Stage, run: Run) -> str:
    """The full doit name of a run's task (`stage_task`): ``io:<model>``, ``twin:<model>-<arch>:graphllm0`` ..."""
    target = run.spec.name if run.arch is None else f"{run.spec.name}-{run.arch}"
    if not plugin_dependent(stage.name):
        return f"{stage.name}:{target}" if run.part in (None, "llm") else f"{stage.name}:{target}:{run.part}"
    if run.binary is not None:
        return f"{stage.name}:{target}:{Path(run.binary).stem}"
    return f"{stage.name}:{target}"


def stage_task(project: Project, stage: Stage, run: Run) -> dict[str, Any]:
    """The doit task of one run: file_dep, target, key and cacheability all follow from the declaration."""
    dirs = [(u, d) for u in stage.upstream for d in upstream_dirs(project, u, run.spec, run.arch, run.part)]
    upstream = [(STAGES[u].manifest, d) for u, d in dirs]
    # of an upstream_files stage the run lists the files read: its manifest is read, not depended on
    manifests = [d / STAGES[u].manifest.filename() for u, d in dirs if u not in stage.upstream_files]
    file_dep = [*run.file_dep, *manifests]
    tools = {
        **tool_versions(mnn="MNN" in stage.tools, qnn=qnn_build_id() if "QNN" in stage.tools else None),
        **run.tools,
    }
    key = stage_key(stage.entry.__module__, stage.manifest, run.inputs, run.params, tools, project.memo)
    dest = out_dir(project, stage, run)
    read = stage.upstream if stage.reads is None else stage.reads
    reads = tuple((STAGES[u], d) for u, d in dirs if u in read)  # fetched first if restored without their files
    name = task_name(stage, run)
    wanted = project.wants(name)  # named on the command line: its files, not only its manifest
    args = [stage, run.inputs, run.params, dest, key, file_dep, upstream, run.checks, reads, wanted]
    task: dict[str, Any] = {
        "doc": run.doc,
        "actions": [(run.action, args)],
        "file_dep": [str(p) for p in file_dep],
        "targets": [str(dest / stage.manifest.filename())],
        # outputs deleted, edited, or made by another task (swapped plugin dirs) make the task run (or restore) again;
        # fetch's outputs are links to the model's files
        "uptodate": [
            config_changed(key),
            outputs_intact(dest, stage.manifest, stage.name == "fetch", deferred_ok=not wanted),
            origin_matches(dest, stage.name, task_identity(key)),
            *run.uptodate,
            code_record(stage.entry.__module__, project.memo),  # decides nothing: what `status` names
        ],
        "clean": [(remove_stage_dir, [dest])],
    }
    task_dep = [upstream_task(u, run.spec, run.part) for u in stage.upstream_files]  # no manifest in file_dep
    if run.arch is not None:
        # the plugin tasks read as a group, whose order is the creation order (biggest first); doit would take
        # those implied by the file_dep in set order
        task_dep += [f"{u}:{run.spec.name}-{run.arch}" for u in stage.upstream if u in PLUGIN_STAGES]
    if task_dep:
        task["task_dep"] = task_dep
    if run.teardown:
        task["teardown"] = list(run.teardown)
    target = run.spec.name if run.arch is None else f"{run.spec.name}-{run.arch}"
    if not plugin_dependent(stage.name):
        # a subtask of its stage: ``io:<model>``, ``config:<model>-<arch>``; a VL encoder's ``io:<model>:visual``
        task["name"] = target if run.part in (None, "llm") else f"{target}:{run.part}"
    elif run.binary is not None:
        task.update(basename=f"{stage.name}:{target}", name=Path(run.binary).stem)  # twin:<model>-<arch>:graphllm0
    else:
        task["basename"] = f"{stage.name}:{target}"  # bundle:<model>-<arch>
    return task


# -- how a spec becomes each stage's inputs and params ------------------------------------------------


def fetch_params(spec: ModelSpec) -> FetchParams:
    """The spec's family and the files its chain takes from the model dir (the only ones an HF fetch downloads;
    a VL model's encoder files too, checked against the spec's ``visual_encoder``)."""
    if spec.family == "vl":
        files = (*family_files("llm"), *VISUAL_FILES)
        return FetchParams(family="llm", files=files, visual_encoder=spec.visual_encoder)
    family = "embedding" if spec.family == "embedding" else "llm"
    return FetchParams(family=family, files=family_files(family))


def fetch_runs(project: Project, spec: ModelSpec) -> Iterator[Run]:
    params = fetch_params(spec)
    if isinstance(spec.source, HfSource):
        where = f"HF {spec.source.hf}@{spec.source.revision}"
        dest = project.stage_dir("fetch", spec)
        yield Run(
            spec,
            FetchInputs(model=spec.name, source=spec.source, lock_path=spec.lock_path),
            params,
            doc=f"link the {spec.name} model files from {where} into {dest}",
            uptodate=(hf_pinned(spec.lock_path, dest),),
            checks=(hf_pinned(spec.lock_path, dest),),
        )
        return
    source_dir = spec.local_dir()
    yield Run(
        spec,
        FetchInputs(model=spec.name, source=spec.source, source_dir=source_dir),
        params,
        doc=f"link the {spec.name} model files from {source_dir} into {project.stage_dir('fetch', spec)}",
        file_dep=tuple(source_dir / n for n in params.files if (source_dir / n).is_file()),
    )


def _lengths(spec: ModelSpec) -> str:
    return "/".join(str(n) for n in spec.prefill_lengths)


def _sizes(spec: ModelSpec) -> str:
    return "/".join(spec.image_sizes)


def io_runs(project: Project, spec: ModelSpec) -> Iterator[Run]:
    inputs = IoInputs(model=spec.name, model_dir=project.stage_dir("fetch", spec))
    yield Run(
        spec,
        inputs,
        IoParams(chunk_sizes=spec.prefill_lengths, seed=spec.seed, prompt=spec.verify.prompt),
        doc=f"decode and prefill-{_lengths(spec)} reference io of {spec.name} (MNN CPU)",
        part="llm",
    )
    if VISUAL in model_parts(spec):
        yield Run(
            spec,
            inputs,
            IoParams(
                part=VISUAL, visual_encoder=spec.visual_encoder, image_sizes=tuple(spec.image_sizes), seed=spec.seed
            ),
            doc=f"reference io of the {spec.name} visual encoder at image sizes {_sizes(spec)} (MNN CPU)",
            part=VISUAL,
        )


def partition_runs(project: Project, spec: ModelSpec) -> Iterator[Run]:
    model_dir = project.stage_dir("fetch", spec)
    yield Run(
        spec,
        PartitionInputs(model=spec.name, model_dir=model_dir, io_dir=project.stage_dir("io", spec)),
        PartitionParams(
            chunk_sizes=spec.prefill_lengths,
            skips=tuple(spec.skips),
            max_kv_size=spec.max_kv_size,
            max_plugin_parameters=spec.max_plugin_parameters,
        ),
        doc=f"cut {spec.name} into CPU ops and QNN plugins (decode and prefill-{_lengths(spec)} graphs)",
        part="llm",
    )
    if VISUAL in model_parts(spec):
        yield Run(
            spec,
            PartitionInputs(model=spec.name, model_dir=model_dir, io_dir=project.stage_dir("io", spec, part=VISUAL)),
            PartitionParams(
                part=VISUAL, image_sizes=tuple(spec.image_sizes), max_plugin_parameters=spec.max_plugin_parameters
            ),
            doc=f"cut the {spec.name} visual encoder into CPU ops and QNN plugins (graphs for {_sizes(spec)})",
            part=VISUAL,
        )


def modellib_runs(project: Project, spec: ModelSpec) -> Iterator[Run]:
    for part in model_parts(spec):
        what = f"{spec.name} graph" if part == "llm" else f"{spec.name} visual encoder graph"
        yield Run(
            spec,
            ModellibInputs(
                model=spec.name,
                model_dir=project.stage_dir("fetch", spec),
                partition_dir=project.stage_dir("partition", spec, part=part),
            ),
            ModellibParams(npu_weights=_npu_weights(spec, part)),
            doc=f"lower every {what} to a QNN graph description + static tensor raws",
            part=part,
        )


def config_runs(project: Project, spec: ModelSpec) -> Iterator[Run]:
    for arch in spec.targets:
        yield Run(
            spec,
            ConfigInputs(model=spec.name, target=arch, model_dir=project.stage_dir("fetch", spec)),
            ConfigParams(
                chunk_sizes=spec.prefill_lengths,
                visual_model=VISUAL_PART.result_model if spec.family == "vl" else None,
            ),
            doc=f"config_qnn.json for {spec.name} on {arch} (chunk limits {[*spec.prefill_lengths, 1]})",
            arch=arch,
        )


def _plugins(
    project: Project, spec: ModelSpec
) -> Iterator[tuple[str, Soc, str, str, tuple[Path, ...], dict[str, Any]]]:
    """Every (target, plugin) of a model, every part's: the arch, its SoC, the part, the plugin's binary, the
    partition files of its graphs and of the split model they index, if any (what context and twin read of the
    partition: their file_dep) and the input fields the context and twin stages share (model, model and partition
    dirs, binary, graphs)."""
    for part in model_parts(spec):
        partition_dir = project.stage_dir("partition", spec, part=part)
        merge = read_merge(partition_dir)
        partition = PartitionManifest.read(partition_dir)
        shared = {"model": spec.name, "model_dir": project.stage_dir("fetch", spec), "partition_dir": partition_dir}
        # the biggest first: with `doit -n 2` the lm_head (many layers' worth) overlaps the layers instead of trailing
        size = {p.path: p.parameters for p in partition.plugins}
        by_cost = sorted(merge.items(), key=lambda item: -size.get(item[0], 0))
        for arch in spec.targets:
            for binary, graphs in by_cost:
                records = partition.plugin_files(graphs)
                files = tuple(confined(partition_dir, r.path, "partition manifest outputs") for r in records)
                if not all(f.exists() for f in files):  # depended on by name: one the cache left out comes now
                    try:
                        materialize_all(((STAGES["partition"], partition_dir),))
                    except MnnbuildError as exc:
                        log.warning("%s", exc)  # doit then names the missing file
                yield arch, spec.soc(arch), part, binary, files, {**shared, "binary": binary, "graphs": graphs}


def _npu_weights(spec: ModelSpec, part: str) -> NpuWeights:
    """How the plugins of ``part`` store conv weights: the spec's ``npu_weights`` for the language model; a VL
    model's vision encoder keeps float16 (quantized weights were measured on linear layers only)."""
    return spec.npu_weights if part == "llm" else DEFAULT_NPU_WEIGHTS


def context_runs(project: Project, spec: ModelSpec) -> Iterator[Run]:
    for arch, soc, part, binary, files, fields in _plugins(project, spec):
        doc = f"HTP context binary {binary} ({', '.join(fields['graphs'])}) for {soc.name}"
        inputs, params = ContextInputs(**fields), ContextParams(soc=soc, npu_weights=_npu_weights(spec, part))
        yield Run(spec, inputs, params, doc=doc, arch=arch, binary=binary, part=part, file_dep=files)


def twin_runs(project: Project, spec: ModelSpec) -> Iterator[Run]:
    for arch, soc, part, binary, files, fields in _plugins(project, spec):
        doc = f"unshared twin of {binary} ({', '.join(fields['graphs'])}) for {soc.name}, which verify runs"
        inputs, params = TwinInputs(**fields), TwinParams(soc=soc, npu_weights=_npu_weights(spec, part))
        yield Run(spec, inputs, params, doc=doc, arch=arch, binary=binary, part=part, file_dep=files)


def model_name(spec: ModelSpec) -> str:
    """The model's directory name on the device: the HF repo's name, or the local directory's."""
    if isinstance(spec.source, HfSource):
        return spec.source.hf.rpartition("/")[2]
    return spec.local_dir().name


def bundle_runs(project: Project, spec: ModelSpec) -> Iterator[Run]:
    parts = model_parts(spec)
    binaries = {p: list(read_merge(project.stage_dir("partition", spec, part=p))) for p in parts}
    root = project.settings.artifact_root
    for arch in spec.targets:
        soc = spec.soc(arch)
        yield Run(
            spec,
            BundleInputs(
                model=spec.name,
                model_name=model_name(spec),
                model_dir=project.stage_dir("fetch", spec),
                config_dir=project.stage_dir("config", spec, arch),
                partition_dir=project.stage_dir("partition", spec),
                visual_partition_dir=project.stage_dir("partition", spec, part=VISUAL) if VISUAL in parts else None,
                context_binaries=[context_dir(root, spec.name, arch, b) / b for p in parts for b in binaries[p]],
            ),
            BundleParams(soc=soc, prompt=prompt_file_text(spec.verify.prompt), image_sizes=tuple(spec.image_sizes)),
            doc=f"device bundle of {spec.name} for {soc.name} (HTP {arch})",
            arch=arch,
        )


def verify_runs(project: Project, spec: ModelSpec) -> Iterator[Run]:
    for arch in spec.targets:
        soc = spec.soc(arch)
        bundle_dir = project.stage_dir("bundle", spec, arch)
        page = report_run(project, spec, arch)
        yield Run(
            spec,
            VerifyInputs(
                model=spec.name,
                bundle_dir=bundle_dir,
                partition_dir=project.stage_dir("partition", spec),
                io_dir=project.stage_dir("io", spec),
                model_dir=project.stage_dir("fetch", spec),
                context_dir=project.stage_dir("context", spec, arch),
                twin_dir=project.stage_dir("twin", spec, arch),
                **(
                    {
                        "visual_io_dir": project.stage_dir("io", spec, part=VISUAL),
                        "visual_partition_dir": project.stage_dir("partition", spec, part=VISUAL),
                    }
                    if VISUAL in model_parts(spec)
                    else {}
                ),
            ),
            VerifyParams(
                soc=soc,
                max_new_tokens=spec.verify.max_new_tokens,
                follow_divergence=spec.verify.follow_divergence,
            ),
            doc=f"check the {spec.name} bundle for {soc.name}: CPU in MNN, plugins in the HTP simulator",
            arch=arch,
            # a bundle file replaced after bundling must not pass as verified
            uptodate=(files_unchanged(bundle_dir / BUNDLE_MODEL_DIR, (bundle_dir, BundleManifest)),),
            # the runtime package is not under mnnbuild's code fingerprint: key it explicitly
            tools={"mnnbuild_runtime": runtime_fingerprint()},
            action=run_verify,
            teardown=(
                (
                    report_failed_verify,
                    [
                        STAGES["report"],
                        page.inputs,
                        page.params,
                        out_dir(project, STAGES["report"], page),
                        project.stage_dir("verify", spec, arch),
                    ],
                ),
            ),
        )


def report_run(project: Project, spec: ModelSpec, arch: str) -> Run:
    verify_dir = project.stage_dir("verify", spec, arch)
    return Run(
        spec,
        ReportInputs(
            model=spec.name,
            verify_dir=verify_dir,
            partition_dir=project.stage_dir("partition", spec),
            bundle_dir=project.stage_dir("bundle", spec, arch),
            model_dir=project.stage_dir("fetch", spec),
            io_dir=project.stage_dir("io", spec),
            config_dir=project.stage_dir("config", spec, arch),
            context_dir=project.stage_dir("context", spec, arch),
            twin_dir=project.stage_dir("twin", spec, arch),
        ),
        ReportParams(target=arch),
        doc=f"the {spec.name} {arch} bundle's page report: verdict, partition, numbers, cost ({REPORT_PAGE})",
        arch=arch,
        # what the page shows: verify's results, also when it failed (then it has no manifest)
        file_dep=(verify_dir / VERIFY_REPORT_JSON,),
        # the template and the libraries that draw the page are not Python modules of ours
        tools={"report_renderer": renderer_fingerprint()},
    )


def report_runs(project: Project, spec: ModelSpec) -> Iterator[Run]:
    for arch in spec.targets:
        yield report_run(project, spec, arch)


RUNS: dict[str, Callable[[Project, ModelSpec], Iterator[Run]]] = {
    "fetch": fetch_runs,
    "io": io_runs,
    "partition": partition_runs,
    "modellib": modellib_runs,
    "config": config_runs,
    "context": context_runs,
    "twin": twin_runs,
    "bundle": bundle_runs,
    "verify": verify_runs,
    "report": report_runs,
}


def stage_tasks(project: Project, name: str, spec: ModelSpec | None = None) -> Iterator[dict[str, Any]]:
    """The tasks of stage ``name`` for every model (or one)."""
    stage = STAGES[name]
    yield from group_tasks(project, stage, spec)
    for s in [spec] if spec else project.specs.values():
        for run in RUNS[name](project, s):
            yield stage_task(project, stage, run)
    if name == "partition" and spec is None:
        yield from parts_group_tasks(project)


def group_tasks(project: Project, stage: Stage, spec: ModelSpec | None) -> Iterator[dict[str, Any]]:
    """The group tasks of a stage's tasks, before them (doit would make them without an up-to-date check): the
    stage's (``io``) for every model, or the plugins' of one model and target (``context:<model>-<arch>``)."""
    if spec is None:
        yield group({"name": None, "doc": stage.doc})
    elif stage.name in PLUGIN_STAGES:
        for arch in spec.targets:
            doc = f"{spec.name} {arch}: {stage.doc.split(',')[0]}, a subtask per plugin"
            yield group({"basename": f"{stage.name}:{spec.name}-{arch}", "name": None, "doc": doc})


def npu_task_creators(project: Project, delayed: bool = True) -> dict[str, Callable[[], Iterator[dict[str, Any]]]]:
    """One task creator per model (``task_npu_<model>``) for its context, twin, bundle, verify and report tasks.

    These tasks exist once the partition has said how many plugins there are. When doit runs tasks (``delayed``),
    each creator runs after ``partition:<model>`` (one per model keeps building one model from running every
    model's partition). When it only reads the task list (``doit list``, ``doit clean``: see `doit_runs_tasks`),
    a model whose partition is on disk gets its tasks right away, so they can be listed and cleaned by name.
    """
    late = [name for name in STAGES if plugin_dependent(name)]
    creators = {}
    for spec in project.specs.values():
        creates = [f"{name}:{spec.name}-{arch}" for arch in spec.targets for name in late]

        def creator(spec: ModelSpec = spec) -> Iterator[dict[str, Any]]:
            for name in late:
                yield from stage_tasks(project, name, spec)

        creator.__doc__ = f"{spec.name}: {' / '.join(late)} tasks, created after its partition"
        if delayed or not partitioned(project, spec):
            creator = create_after(executed=partitions_task(spec), creates=creates)(creator)
        creators[f"task_npu_{spec.name}"] = creator
    return creators


def partitions_task(spec: ModelSpec) -> str:
    """The task after which a model's plugins are known: its partition, or for a VL model the group of both
    parts' partitions (:func:`parts_group_tasks`)."""
    return f"partition:{spec.name}" if model_parts(spec) == ("llm",) else f"partition:{spec.name}:parts"


def parts_group_tasks(project: Project) -> Iterator[dict[str, Any]]:
    """``partition:<model>:parts`` per VL model: both parts' partitions (the plugin tasks are created after it)."""
    for spec in project.specs.values():
        if model_parts(spec) != ("llm",):
            yield group(
                {
                    "name": f"{spec.name}:parts",
                    "doc": f"the {spec.name} language model's and visual encoder's partitions",
                    "actions": None,
                    "task_dep": [f"partition:{spec.name}", f"partition:{spec.name}:{VISUAL}"],
                }
            )


def partitioned(project: Project, spec: ModelSpec) -> bool:
    """Whether the model's partition is on disk (its plugins are known)."""
    try:
        for part in model_parts(spec):
            read_merge(project.stage_dir("partition", spec, part=part))
    except MnnbuildError:
        return False
    return True


def late_stage_group(project: Project, name: str) -> dict[str, Any]:
    """``doit context`` / ``doit twin`` / ``doit bundle``: every model's tasks of a stage created after its partition.

    ``doit clean context`` removes what they built (as ``doit clean io`` does for its subtasks), also for a model
    whose tasks are not created yet."""
    dirs = [project.stage_dir(name, s, arch) for s in project.specs.values() for arch in s.targets]
    return group(
        {
            "actions": None,
            "task_dep": [f"{name}:{s.name}-{arch}" for s in project.specs.values() for arch in s.targets],
            "clean": [(remove_stage_dirs if name in PLUGIN_STAGES else remove_stage_dir, [d]) for d in dirs],
        }
    )


def update_tasks(project: Project) -> Iterator[dict[str, Any]]:
    for spec in project.specs.values():
        if not isinstance(spec.source, HfSource):
            continue
        yield {
            "name": spec.name,
            "doc": f"re-resolve {spec.source.hf}@{spec.source.revision} and pin it in {spec.lock_path.name}",
            "actions": [(run_update, [spec.source, spec.lock_path, fetch_params(spec).files])],
            "uptodate": [False],  # an update is always asked for explicitly
        }


def verify_all_task(project: Project) -> dict[str, Any]:
    """``doit verify``: the verify tasks of the default bundles (each builds its bundle first)."""
    verify_tasks = [t for t in project.default_tasks() if t.startswith("verify:")]
    spec = project.specs.get(DEFAULT_MODEL)
    dirs = [project.stage_dir("verify", spec, arch) for arch in spec.targets] if spec else []
    return group(
        {
            "doc": f"build and verify the default bundles ({', '.join(verify_tasks) or 'none'})",
            "actions": None,
            "task_dep": verify_tasks,
            "clean": [(remove_stage_dir, [d]) for d in dirs],
        }
    )


__all__ = ["STAGES", "Run", "late_stage_group", "npu_task_creators", "stage_task", "stage_tasks", "update_tasks"]
