"""mnnbuild's task DAG: `doit list` shows the tasks, `doit bundle:<model>-<arch>` builds one.

This file only declares tasks; the stages live in `mnnbuild/`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mnnbuild import dag
from mnnbuild.logs import configure_logging

configure_logging()
PROJECT = dag.Project.load(Path(__file__).resolve().parent)
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
    """Cut each model into CPU ops and QNN Plugin ops (qnn/llm.mnn, graph dirs, npu_postreat.json)."""
    yield from dag.stage_tasks(PROJECT, "partition")


def task_modellib() -> Iterator[dict[str, Any]]:
    """Lower each model's graphs to QNN graph descriptions and static tensors."""
    yield from dag.stage_tasks(PROJECT, "modellib")


def task_config() -> Iterator[dict[str, Any]]:
    """Write each model's config_qnn.json per target."""
    yield from dag.stage_tasks(PROJECT, "config")


def task_verify() -> dict[str, Any]:
    """Build and verify the default bundles (the shipped tiny model): what a bare `doit` runs."""
    return dag.verify_all_task(PROJECT)


# context:<model>-<arch> (one subtask per plugin), bundle:<model>-<arch> and verify:<model>-<arch> are
# created once partition:<model> has run, since the plugins are only known then.
globals().update(dag.npu_task_creators(PROJECT))
