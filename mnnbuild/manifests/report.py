"""report: the page of what verify found."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict

from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.config import ConfigManifest
from mnnbuild.manifests.context import ContextManifest
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.manifests.twin import TwinManifest
from mnnbuild.manifests.verify import VerifyManifest
from mnnbuild.pipeline.layout import VERIFY_REPORT_JSON
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.stage import From, StageInputs


class ReportInputs(StageInputs):
    model: str
    verify_dir: Annotated[Path, From(VerifyManifest, files=(VERIFY_REPORT_JSON,))]
    """verify's output: ``verify.json`` (its manifest only when it passed)."""
    partition_dir: Annotated[Path, From(PartitionManifest)]
    bundle_dir: Annotated[Path, From(BundleManifest, contents=False)]  # of the bundle, its manifest only
    # the stages whose cost the page shows, and nothing of their outputs: their directories only
    model_dir: Annotated[Path, From(FetchManifest, reads="dir")]
    io_dir: Annotated[Path, From(IoManifest, reads="dir")]
    config_dir: Annotated[Path, From(ConfigManifest, reads="dir")]
    context_dir: Annotated[Path, From(ContextManifest, reads="dir")]
    """context outputs, one subdir per plugin."""
    twin_dir: Annotated[Path, From(TwinManifest, reads="dir")]
    """twin outputs (verify's unshared twins), one subdir per plugin."""


class ReportParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    target: str


class ReportManifest(Manifest):
    stage = "report"
    params: ReportParams
    verify_passed: bool
    """What the page says: a failed verify gets a page too (with the failures at the top)."""
