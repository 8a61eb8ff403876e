"""Turning stages into doit tasks: the only package that knows about doit.

- ``project``: the specs and settings tasks are declared from, and doit's configuration.
- ``tasks``: every stage's tasks, derived from its declaration (`mnnbuild.pipeline.stage.Stage`) in one loop.
- ``keys``: what a task's result depends on besides its input files (code, schema, params, tools).
- ``actions``: run or restore a stage, store its outputs in the cache.
- ``uptodate``: checks beyond file_dep and the key (a pinned HF commit, bundle files untouched).
- ``reporter``: the closing build summary.
- ``interrupts``: SIGTERM handled as Ctrl-C, workers that die with their parent.

`skip_final_collection` (from `mnnbuild.base.child`): the doit process ends without a last garbage collection.

Every stage task: its action calls the stage's entry ``(inputs, params, out_dir) -> Manifest``; its
target is the manifest the stage writes; it depends on the files it reads by content, and is up to
date while its parameters, the tools it calls, its own code (the stage module and the library code it
imports; stages never import each other) and its manifest schema are unchanged. A stage whose
re-run leaves its manifest byte-identical leaves the stages after it up to date.
"""

from mnnbuild.base.child import skip_final_collection
from mnnbuild.dag.interrupts import handle_interrupts
from mnnbuild.dag.project import DEFAULT_MODEL, Project, configure_logging, doit_runs_tasks
from mnnbuild.dag.tasks import stage_runs, stage_tasks, task_creators
from mnnbuild.pipeline.chain import Chain

__all__ = [
    "DEFAULT_MODEL",
    "Chain",
    "Project",
    "configure_logging",
    "doit_runs_tasks",
    "handle_interrupts",
    "skip_final_collection",
    "stage_runs",
    "stage_tasks",
    "task_creators",
]
