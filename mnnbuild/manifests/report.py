"""report: the page of what verify found."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.stage import StageInputs


class ReportInputs(StageInputs):
    model: str
    verify_dir: Path
    """verify's output: ``verify.json`` (its manifest only when it passed)."""
    partition_dir: Path
    bundle_dir: Path
    model_dir: Path
    io_dir: Path
    config_dir: Path
    context_dir: Path
    """context outputs, one subdir per plugin."""
    twin_dir: Path
    """twin outputs (verify's unshared twins), one subdir per plugin."""


class ReportParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    target: str


class ReportManifest(Manifest):
    stage = "report"
    params: ReportParams
    verify_passed: bool
    """What the page says: a failed verify gets a page too (with the failures at the top)."""
