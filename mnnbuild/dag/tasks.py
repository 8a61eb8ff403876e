"""The doit tasks of every stage, derived from the stage declarations in one loop (`stage_task`).

A stage declares where it sits, what it reads (its Inputs' ``From`` fields), what it calls and whether it is
cacheable (`mnnbuild.pipeline.stage.Stage`); the chain lists the stages (`mnnbuild.stages.chain`); the layout says
where each stage writes. What is left here is the loop over the specs, their parts, targets and plugins (the
per-plugin fan-out is the one the chain's `Stage.fan_out` declares).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doit import create_after
from doit.exceptions import InvalidDodoFile
from doit.tools import config_changed
from pydantic import BaseModel

from mnnbuild.base.errors import MnnbuildError
from mnnbuild.base.fsutil import remove_stage_dir, remove_stage_dirs
from mnnbuild.dag.actions import Remote, run_after_failure, run_stage, run_update, task_identity
from mnnbuild.dag.keys import stage_key
from mnnbuild.dag.project import DEFAULT_MODEL, Project
from mnnbuild.dag.status import code_record, group
from mnnbuild.dag.uptodate import files_unchanged, hf_pinned, origin_matches, outputs_intact
from mnnbuild.pipeline.layout import plugin_context_dir, plugin_dir
from mnnbuild.pipeline.models import Model
from mnnbuild.pipeline.stage import UPDATE_DOC, At, FanOut, From, Stage, StageInputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Run:
    """One task of a stage: one model (and target, part and plugin), from which inputs, with which params."""

    spec: Model
    inputs: StageInputs
    params: BaseModel
    doc: str
    at: At = At()
    file_dep: tuple[Path, ...] = ()
    """Files read besides the upstream manifests (a local model's source files)."""
    recorded: tuple[tuple[str, str], ...] = ()
    """Upstream files read by their manifest's record, (``<stage>/<path>``, sha256): a plugin's partition files. They
    enter the task key, not the file_dep, so a warm cache can leave them in the cache until the plugin must run."""
    checks: tuple[Callable[[], bool], ...] = ()
    """Stateless up-to-date checks (an HF fetch's pinned commit): also what must still hold for outputs on record
    to count when doit has lost its state (`mnnbuild.dag.actions.recorded`)."""

    @property
    def arch(self) -> str | None:
        return self.at.arch

    @property
    def binary(self) -> str | None:
        return self.at.binary


def out_dir(project: Project, stage: Stage, at: At, spec: Model) -> Path:
    if at.binary is not None:
        return plugin_dir(project.settings.artifact_root, stage, spec.name, str(at.arch), at.binary)
    return project.stage_dir(stage.name, spec, at.arch, at.part if stage.placement == "part" else None)


def fan_out(project: Project) -> tuple[Stage, FanOut]:
    """The stage whose output says which plugins a model part has, and how (`Stage.fan_out`)."""
    (found,) = [(s, s.fan_out) for s in project.chain if s.fan_out is not None]
    return found


def plugin_binaries(project: Project, spec: Model, part: str) -> Mapping[str, list[str]]:
    """A model part's plugins (binary -> graph dirs); an `MnnbuildError` while its fan-out stage has not run."""
    stage, out = fan_out(project)
    return out.binaries(project.stage_dir(stage.name, spec, part=part))


def _plugins(project: Project, spec: Model) -> Iterator[tuple[At, tuple[tuple[str, str], ...]]]:
    """Every (target, plugin) of a model, every part's, with the fan-out stage's records of the files its runs read
    (`FanOut.plugins`), by path (under that stage's dir name) and sha256."""
    stage, out = fan_out(project)
    for part in spec.parts:
        plugins = out.plugins(project.stage_dir(stage.name, spec, part=part))
        # the biggest first: with `doit -n 2` the lm_head (many layers' worth) overlaps the layers instead of trailing
        by_cost = sorted(plugins, key=lambda p: -p.cost)
        for arch in spec.targets:
            for plugin in by_cost:
                read = tuple((r.under(stage.dir).path, r.sha256) for r in plugin.reads)
                yield At(arch=arch, part=part, binary=plugin.binary, graphs=plugin.graphs, cost=plugin.cost), read


def placements(project: Project, stage: Stage, spec: Model) -> Iterator[tuple[At, tuple[tuple[str, str], ...]]]:
    """Where a stage's runs sit for ``spec`` (with the upstream file records a per-plugin run reads)."""
    if stage.placement == "model":
        yield At(), ()
    elif stage.placement == "part":
        yield from ((At(part=part), ()) for part in spec.parts)
    elif stage.placement == "target":
        yield from ((At(arch=arch), ()) for arch in spec.targets)
    else:
        yield from _plugins(project, spec)


def edge_dir(project: Project, edge: From, spec: Model, at: At) -> Path | None:
    """An Inputs field's directory for a run at ``at``: the upstream stage's, placed as that stage is (per model,
    per part: the run's own or the edge's; per target: the run's; per plugin: the target's group dir). None: a
    part the model does not have."""
    up = project.chain[edge.stage]
    if up.placement == "part":
        part = edge.part or at.part or "llm"
        return project.stage_dir(up.name, spec, part=part) if part in spec.parts else None
    return project.stage_dir(up.name, spec, at.arch if up.per_target else None)


def edge_deps(project: Project, edge: From, spec: Model, at: At) -> list[Path]:
    """The upstream directories whose manifests stand behind an Inputs field: its directory, or of a per-plugin
    stage one per plugin (of the run's part, or of every part)."""
    found = edge_dir(project, edge, spec, at)
    if found is None:
        return []
    if project.chain[edge.stage].placement != "plugin":
        return [found]
    parts = (at.part,) if at.part else spec.parts
    binaries = [b for p in parts for b in plugin_binaries(project, spec, p)]
    return [plugin_context_dir(found, b) for b in binaries]


def source_deps(
    stage: Stage, spec: Model, params: BaseModel, dest: Path
) -> tuple[tuple[Path, ...], tuple[Callable[[], bool], ...]]:
    """What a stage reading the model from outside the artifact root depends on there: a local source's files (the
    ones it takes), or an HF source's lock."""
    if spec.source.kind == "hf":
        return (), () if stage.pinned is None else (hf_pinned(stage.pinned, spec.lock_path, dest),)
    source_dir = spec.local_dir()
    files: tuple[str, ...] = getattr(params, "files", ())
    return tuple(source_dir / n for n in files if (source_dir / n).is_file()), ()


def stage_runs(project: Project, name: str, spec: Model) -> Iterator[Run]:
    """The runs of stage ``name`` for ``spec``: Inputs from where each sits and what it reads, Params from the spec."""
    stage = project.chain[name]
    fields = stage.inputs.model_fields
    for at, recorded in placements(project, stage, spec):
        values: dict[str, Any] = {"model": spec.name}
        if "target" in fields:
            values["target"] = at.arch
        if stage.placement == "plugin":
            values.update(binary=at.binary, graphs=list(at.graphs))
        for field, edge in stage.edges.items():
            values[field] = edge_dir(project, edge, spec, at)
        if stage.fields_of is not None:
            values.update(stage.fields_of(spec, at))
        params = stage.params_of(spec, at)
        checks: tuple[Callable[[], bool], ...] = ()
        files: tuple[Path, ...] = ()
        if stage.reads_source:
            files, checks = source_deps(stage, spec, params, out_dir(project, stage, at, spec))
        inputs = stage.inputs(**values)
        doc = stage.describe(spec, at)
        yield Run(spec, inputs, params, doc=doc, at=at, file_dep=files, recorded=recorded, checks=checks)


def task_name(project: Project, name: str, spec: Model, at: At) -> str:
    """The doit task of stage ``name`` at ``at``: ``io:<model>``, a VL encoder's ``io:<model>:visual``,
    ``config:<model>-<arch>``, a plugin's ``twin:<model>-<arch>:graphllm0``."""
    stage = project.chain[name]
    target = spec.name if not stage.per_target else f"{spec.name}-{at.arch}"
    if stage.placement == "plugin" and at.binary is not None:
        return f"{name}:{target}:{Path(at.binary).stem}"
    suffix = f":{at.part}" if stage.placement == "part" and at.part not in (None, "llm") else ""
    return f"{name}:{target}{suffix}"


def stage_task(project: Project, stage: Stage, run: Run) -> dict[str, Any]:
    """The doit task of one run: file_dep, target, key and cacheability all follow from the declaration."""
    chain = project.chain
    upstream: list[tuple[type[Any], Path]] = []
    manifests: list[Path] = []
    extra: list[Path] = []
    read_dirs: list[tuple[str, Path]] = []
    for edge in stage.edges.values():
        found = edge_dir(project, edge, run.spec, run.at)
        behind = edge_deps(project, edge, run.spec, run.at) if edge.reads != "dir" else []
        upstream += [(chain[edge.stage].manifest, d) for d in behind]
        read_dirs += [(edge.stage, d) for d in behind]
        # of a "files" edge the run lists the files read: its manifest is read, not depended on
        if edge.reads == "manifest":
            manifests += [d / chain[edge.stage].manifest.filename() for d in behind]
        if found is not None:
            extra += [found / f for f in edge.files]
    upstream = list(dict.fromkeys(upstream))
    file_dep = list(dict.fromkeys([*run.file_dep, *extra, *manifests]))
    tools = stage.key_tools()
    key = stage_key(
        stage.entry.__module__, stage.manifest, run.inputs, run.params, tools, project.memo, dict(run.recorded)
    )
    dest = out_dir(project, stage, run.at, run.spec)
    guards = [
        (Path(getattr(run.inputs, field)), chain[stage.edges[field].stage].manifest, sub)
        for field, sub in stage.guards.items()
    ]
    # the upstream dirs whose files its entry reads: fetched first if restored without them, else built again by
    # their tasks' actions
    reads = tuple((chain[u], d, project.runs.get(d)) for u, d in dict.fromkeys(read_dirs) if u in stage.reads)
    name = task_name(project, stage.name, run.spec, run.at)
    wanted = project.wants(name)  # named on the command line: its files, not only its manifest
    call = {
        "stage": stage,
        "inputs": run.inputs,
        "params": run.params,
        "out_dir": dest,
        "key_config": key,
        "file_dep": file_dep,
        "upstream": upstream,
        "checks": run.checks,
        "guards": guards,
        "reads": reads,
        "wanted": wanted,
        "hashes": project.hashes,
        "remote": Remote(name, project.settings.artifact_root, stage.memory(run.at) if stage.memory else 0),
    }
    args = list(call.values())  # run_stage's parameters in order
    if stage.defer and stage.cacheable:  # its dir may be restored without its files, which a later task may need
        project.runs[dest] = call
    task: dict[str, Any] = {
        "doc": run.doc,
        "actions": [(run_stage, args)],
        "file_dep": [str(p) for p in file_dep],
        "targets": [str(dest / stage.manifest.filename())],
        # outputs deleted, edited, or made by another task (swapped plugin dirs) make the task run (or restore) again
        "uptodate": [
            config_changed(key),
            outputs_intact(dest, stage.manifest, stage.symlinks, deferred_ok=not wanted),
            origin_matches(dest, stage.name, task_identity(key)),
            *run.checks,
            # a guarded file replaced after its stage wrote it must not pass as checked
            *(files_unchanged(d / sub, (d, cls)) for d, cls, sub in guards),
            code_record(stage.entry.__module__, project.memo),  # decides nothing: what `status` names
        ],
        "clean": [(remove_stage_dir, [dest])],
    }
    task_dep = [task_name(project, u, run.spec, run.at) for u in stage.upstream_files]  # no manifest in file_dep
    if run.arch is not None:
        # the plugin tasks read as a group, whose order is the creation order (biggest first); doit would take
        # those implied by the file_dep in set order
        task_dep += [f"{u}:{run.spec.name}-{run.arch}" for u in stage.upstream if chain[u].placement == "plugin"]
    if task_dep:
        task["task_dep"] = list(dict.fromkeys(task_dep))
    teardown = [after_failure(project, later, stage, run) for later in chain if later.after_failure_of == stage.name]
    if teardown:
        task["teardown"] = teardown
    if not chain.plugin_dependent(stage.name):
        task["name"] = name.partition(":")[2]  # a subtask of its stage: io:<model>, config:<model>-<arch>
    elif run.binary is not None:
        basename, _, plugin = name.rpartition(":")
        task.update(basename=basename, name=plugin)  # twin:<model>-<arch>:graphllm0
    else:
        task["basename"] = name  # bundle:<model>-<arch>
    return task


def after_failure(project: Project, later: Stage, failed: Stage, run: Run) -> tuple[Any, list[Any]]:
    """The teardown that runs ``later`` (the page report) at ``run``'s place when ``failed`` (verify) failed."""
    (late,) = [r for r in stage_runs(project, later.name, run.spec) if r.at == run.at]
    dest = out_dir(project, later, late.at, late.spec)
    return (
        run_after_failure,
        [later, late.inputs, late.params, dest, failed, out_dir(project, failed, run.at, run.spec)],
    )


def stage_tasks(project: Project, name: str, spec: Model | None = None) -> Iterator[dict[str, Any]]:
    """The tasks of stage ``name`` for every model (or one)."""
    stage = project.chain[name]
    yield from group_tasks(project, stage, spec)
    for s in [spec] if spec else project.specs.values():
        for run in stage_runs(project, name, s):
            yield stage_task(project, stage, run)
    if stage.fan_out is not None and spec is None:
        yield from parts_group_tasks(project)


def group_tasks(project: Project, stage: Stage, spec: Model | None) -> Iterator[dict[str, Any]]:
    """The group tasks of a stage's tasks, before them (doit would make them without an up-to-date check): the
    stage's (``io``) for every model, or the plugins' of one model and target (``context:<model>-<arch>``)."""
    if spec is None:
        yield group({"name": None, "doc": stage.doc})
    elif stage.placement == "plugin":
        for arch in spec.targets:
            doc = f"{spec.name} {arch}: {stage.doc.split(',')[0]}, a subtask per plugin"
            yield group({"basename": f"{stage.name}:{spec.name}-{arch}", "name": None, "doc": doc})


def task_full_name(task: dict[str, Any]) -> str:
    """A task dict's name as doit knows it: ``basename:name`` for a subtask, else its basename."""
    return f"{task['basename']}:{task['name']}" if task.get("name") else str(task["basename"])


def npu_task_creators(
    project: Project, delayed: bool = True, requested: Sequence[str] = ()
) -> dict[str, Callable[[], Iterator[dict[str, Any]]]]:
    """One task creator per model (``task_npu_<model>``) for its context, twin, bundle, verify and report tasks.

    These tasks exist once the partition has said how many plugins there are. When doit runs tasks (``delayed``),
    each creator runs after ``partition:<model>`` (one per model keeps building one model from running every
    model's partition). When it only reads the task list (``doit list``, ``doit clean``: see `doit_runs_tasks`),
    a model whose partition is on disk gets its tasks right away, so they can be listed and cleaned by name.
    """
    late = [s.name for s in project.chain if project.chain.plugin_dependent(s.name)]
    creators = {}
    for spec in project.specs.values():
        creates = [f"{name}:{spec.name}-{arch}" for arch in spec.targets for name in late]

        def creator(spec: Model = spec) -> Iterator[dict[str, Any]]:
            for name in late:
                yield from stage_tasks(project, name, spec)

        creator.__doc__ = f"{spec.name}: {' / '.join(late)} tasks, created after its partition"
        if delayed or not partitioned(project, spec):
            # doit resolves a named subtask of a delayed task by the part of its name before the first ':'
            # ('context'), so a subtask `doit list` shows (context:<model>-<arch>:graphllm0) is named here too
            subtasks = [n for n in requested if n.count(":") > 1 and n.rsplit(":", 1)[0] in creates]
            if subtasks and partitioned(project, spec):
                known = {task_full_name(t) for t in creator() if "basename" in t}
                creates += [n for n in subtasks if n in known]
            creator = create_after(executed=partitions_task(project, spec), creates=creates)(creator)
        creators[f"task_npu_{spec.name}"] = creator
    return creators


def partitions_task(project: Project, spec: Model) -> str:
    """The task after which a model's plugins are known: its partition, or for a VL model the group of both
    parts' partitions (:func:`parts_group_tasks`)."""
    name = fan_out(project)[0].name
    return f"{name}:{spec.name}" if spec.parts == ("llm",) else f"{name}:{spec.name}:parts"


def parts_group_tasks(project: Project) -> Iterator[dict[str, Any]]:
    """``partition:<model>:parts`` per VL model: both parts' partitions (the plugin tasks are created after it)."""
    name = fan_out(project)[0].name
    for spec in project.specs.values():
        if spec.parts != ("llm",):
            yield group(
                {
                    "name": f"{spec.name}:parts",
                    "doc": f"the {spec.name} language model's and visual encoder's partitions",
                    "actions": None,
                    "task_dep": [
                        f"{name}:{spec.name}",
                        *(f"{name}:{spec.name}:{p}" for p in spec.parts[1:]),
                    ],
                }
            )


def partitioned(project: Project, spec: Model) -> bool:
    """Whether the model's partition is on disk (its plugins are known)."""
    try:
        for part in spec.parts:
            plugin_binaries(project, spec, part)
    except MnnbuildError:
        return False
    return True


def late_stage_group(project: Project, name: str) -> dict[str, Any]:
    """``doit context`` / ``doit twin`` / ``doit bundle``: every model's tasks of a stage created after its partition.

    ``doit clean context`` removes what they built (as ``doit clean io`` does for its subtasks), also for a model
    whose tasks are not created yet."""
    dirs = [project.stage_dir(name, s, arch) for s in project.specs.values() for arch in s.targets]
    members = [f"{name}:{s.name}-{arch}" for s in project.specs.values() for arch in s.targets]
    # unlike `doit verify` (the default bundles), the group is every model's: say so where `doit list` shows it
    doc = project.chain[name].doc.rstrip(".")
    return group(
        {
            "doc": f"{doc}; every model's: {', '.join(members)} (`doit verify`: the default bundles only)",
            "actions": None,
            "task_dep": members,
            "clean": [
                (remove_stage_dirs if project.chain[name].placement == "plugin" else remove_stage_dir, [d])
                for d in dirs
            ],
        }
    )


def update_tasks(project: Project, stage: Stage) -> Iterator[dict[str, Any]]:
    """``update:<model>`` per HF model: re-resolve its revision for the stage that reads the source (fetch)."""
    for spec in project.specs.values():
        if spec.source.kind != "hf":
            continue
        files: tuple[str, ...] = getattr(stage.params_of(spec, At()), "files", ())
        yield {
            "name": spec.name,
            "doc": f"re-resolve {spec.source.where} and pin it in {spec.lock_path.name}",
            "actions": [(run_update, [stage, spec.source, spec.lock_path, files])],
            "uptodate": [False],  # an update is always asked for explicitly
        }


def update_creator(project: Project, stage: Stage) -> Callable[[], Iterator[dict[str, Any]]]:
    def task_update() -> Iterator[dict[str, Any]]:
        yield from update_tasks(project, stage)

    task_update.__doc__ = UPDATE_DOC
    return task_update


def default_group_task(project: Project, name: str) -> dict[str, Any]:
    """``doit verify``: the stage's tasks of the default bundles (each builds its bundle first)."""
    tasks = [t for t in project.default_tasks() if t.startswith(f"{name}:")]
    spec = project.specs.get(DEFAULT_MODEL)
    dirs = [project.stage_dir(name, spec, arch) for arch in spec.targets] if spec else []
    return group(
        {
            "doc": f"{project.chain[name].doc} ({', '.join(tasks) or 'none'})",
            "actions": None,
            "task_dep": tasks,
            "clean": [(remove_stage_dir, [d]) for d in dirs],
        }
    )


def stage_group(project: Project, name: str) -> Iterator[dict[str, Any]] | dict[str, Any]:
    """What ``task_<stage>`` declares: the stage's tasks (a stage whose tasks exist before any partition ran), or
    the group of its tasks created later (`late_stage_group`, `default_group_task`)."""
    stage = project.chain[name]
    if not project.chain.plugin_dependent(name):
        return stage_tasks(project, name)
    return default_group_task(project, name) if stage.group_default_only else late_stage_group(project, name)


def group_creator(project: Project, stage: Stage) -> Callable[[], Any]:
    """``task_<stage>`` for dodo.py, showing the stage's doc (one line of code for every stage, so doit, which
    orders task creators by their line, keeps the chain's order)."""

    def creator() -> Iterator[dict[str, Any]] | dict[str, Any]:
        return stage_group(project, stage.name)

    creator.__doc__ = stage.doc
    return creator


def task_creators(project: Project, argv: list[str]) -> dict[str, Callable[[], Any]]:
    """Everything dodo.py declares: ``task_<stage>`` per stage of the chain, ``task_update``, and one
    ``task_npu_<model>`` per model for the tasks that exist once its partition has said how many plugins it has.

    doit creates those after ``partition:<model>`` (one creator per model, since create_after waits for one task
    and building one model must not partition the others); ``doit list`` and ``doit clean``, which run nothing,
    get them right away from a partition on disk (`mnnbuild.dag.project.doit_runs_tasks`)."""
    from mnnbuild.dag.project import doit_runs_tasks, requested_tasks

    found: dict[str, Callable[[], Any]] = {}
    for stage in project.chain:
        found[f"task_{stage.name}"] = group_creator(project, stage)
        if stage.reads_source:
            found["task_update"] = update_creator(project, stage)
    found.update(npu_task_creators(project, delayed=doit_runs_tasks(argv), requested=requested_tasks(argv)))
    for name in requested_tasks(argv):
        check_task_name(project, name)
    return found


def check_task_name(project: Project, name: str) -> None:
    """A task named on the command line that no model's tasks can be: one line with the nearest name, instead of
    doit's "Invalid parameter". A name under a task (a plugin's subtask, a VL model's part) is left to doit, and so
    is a path (doit also takes a target file)."""
    known = {"update", *(s.name for s in project.chain)}
    for spec in project.specs.values():
        known.add(f"update:{spec.name}")
        for stage in project.chain:
            if stage.per_target:
                known |= {f"{stage.name}:{spec.name}-{arch}" for arch in spec.targets}
            else:
                known.add(f"{stage.name}:{spec.name}")
    under = any(name.startswith(f"{k}:") for k in known if ":" in k)  # a subtask or part of a model's task
    if name in known or under or "/" in name or "*" in name:
        return
    if Path(name).exists():
        return
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise InvalidDodoFile(f"no task {name!r}; {hint}(`doit list` shows every task, `doit list --all` their subtasks)")


__all__ = [
    "Run",
    "default_group_task",
    "late_stage_group",
    "npu_task_creators",
    "stage_runs",
    "stage_task",
    "stage_tasks",
    "task_creators",
    "update_tasks",
]
