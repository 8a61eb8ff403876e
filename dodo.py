"""mnnbuild's task DAG: `doit list` shows the tasks, `doit bundle:<model>-<arch>` builds one.

This file only declares tasks; the stages live in `mnnbuild/`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mnnbuild import dag

dag.configure_logging()  # MNNBUILD_LOG_LEVEL: a value that is no level is one line
dag.handle_interrupts()  # SIGTERM cleans up like Ctrl-C; `doit -n` workers die with their parent
PROJECT = dag.Project.load(Path(__file__).resolve().parent, sys.argv[1:])  # named tasks: their files
DOIT_CONFIG = PROJECT.doit_config()


def task_fetch() -> Iterator[dict[str, Any]]:
    """Link (local) or download (Hugging Face) each model's files."""
    yield from dag.stage_tasks(PROJECT, "fetch")


def task_update() -> Iterator[dict[str, Any]]:
    """Move a Hugging Face model's lock to what its revision resolves to now (then fetch again)."""
    yield from dag.update_tasks(PROJECT)


def task_io() -> Iterator[dict[str, Any]]:
    """Generate each model's decode/prefill reference inputs and outputs."""
    yield from dag.stage_tasks(PROJECT, "io")


def task_partition() -> Iterator[dict[str, Any]]:
    """Cut each model into CPU ops and QNN Plugin ops (qnn/<model>.mnn, graph dirs, npu_postreat.json)."""
    yield from dag.stage_tasks(PROJECT, "partition")


def task_modellib() -> Iterator[dict[str, Any]]:
    """Lower each model's graphs to QNN graph descriptions and static tensors."""
    yield from dag.stage_tasks(PROJECT, "modellib")


def task_config() -> Iterator[dict[str, Any]]:
    """Write each model's config_qnn.json per target."""
    yield from dag.stage_tasks(PROJECT, "config")


def task_context() -> dict[str, Any]:
    """HTP context binaries: context:<model>-<arch>, a subtask per plugin (created after the model's partition)."""
    return dag.late_stage_group(PROJECT, "context")


def task_twin() -> dict[str, Any]:
    """Unshared twins of the context binaries, which only verify runs: twin:<model>-<arch>, a subtask per plugin."""
    return dag.late_stage_group(PROJECT, "twin")


def task_bundle() -> dict[str, Any]:
    """Device bundles: bundle:<model>-<arch> (created after the model's partition)."""
    return dag.late_stage_group(PROJECT, "bundle")


def task_verify() -> dict[str, Any]:
    """Build and verify the default bundles (the shipped tiny model): what a bare `doit` runs.

    verify:<model>-<arch> verifies any other bundle (created after the model's partition).
    """
    return dag.verify_all_task(PROJECT)


def task_report() -> dict[str, Any]:
    """Page reports: report:<model>-<arch>, one HTML page per verified bundle (created after the model's partition)."""
    return dag.late_stage_group(PROJECT, "report")


# The context, twin, bundle and verify tasks of a model exist once its partition has said how many plugins it has:
# doit creates them after partition:<model> (one task_npu_<model> creator per model, since create_after waits
# for one task and building one model must not partition the others); `doit list` and `doit clean`, which run
# nothing, get them right away from a partition on disk.
globals().update(dag.npu_task_creators(PROJECT, delayed=dag.doit_runs_tasks(sys.argv[1:])))
