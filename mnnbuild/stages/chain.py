"""The one list of stages: every task, every stage directory and ``dodo.py``'s task groups come from it.

Adding a stage is one new module ending in ``STAGE = Stage(...)`` and one line here. No stage imports this module
(nor another stage): it is the DAG's, and that of the commands that read the DAG's outputs.
"""

from __future__ import annotations

from pathlib import Path

from mnnbuild.model.spec import MODELS
from mnnbuild.pipeline.chain import Chain
from mnnbuild.pipeline.stage import Stage
from mnnbuild.stages import bundle, config, context, fetch, io, modellib, partition, report, twin, verify

STAGES: tuple[Stage, ...] = (
    fetch.STAGE,
    io.STAGE,
    partition.STAGE,
    modellib.STAGE,
    config.STAGE,
    context.STAGE,
    twin.STAGE,
    bundle.STAGE,
    verify.STAGE,
    report.STAGE,
)
"""Every stage, in chain order."""

CHAIN = Chain(STAGES, models=MODELS)
"""mnnbuild's chain."""


def stage_dir(artifact_root: Path, name: str, model: str, arch: str | None = None, part: str | None = None) -> Path:
    """Where mnnbuild's stage ``name`` writes for ``model`` (and ``arch``, ``part``): for commands and scripts."""
    return CHAIN.stage_dir(artifact_root, name, model, arch, part)
