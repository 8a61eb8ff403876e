"""bundle: the device directory and its scripts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, field_validator

from mnnbuild.manifests.config import ConfigManifest
from mnnbuild.manifests.context import ContextManifest
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.model.modeldir import DEFAULT_PROMPT
from mnnbuild.model.spec import DEVICE_NAME_PATTERN
from mnnbuild.model.targets import Soc
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.stage import From, StageInputs


class BundleInputs(StageInputs):
    model: str
    model_name: str
    """Directory name on the device, e.g. ``Qwen3-1.7B-MNN``."""
    model_dir: Annotated[Path, From(FetchManifest)]
    """fetch output."""
    config_dir: Annotated[Path, From(ConfigManifest)]
    """config output (``config_qnn.json``)."""
    partition_dir: Annotated[Path, From(PartitionManifest)]
    """partition output (the partitioned model ``qnn/<graph file>``, named by the fetch manifest's part)."""
    visual_partition_dir: Annotated[Path | None, From(PartitionManifest, part="visual")] = None
    """A VL model's encoder partition output (``qnn/visual.mnn``; None: no encoder)."""
    context_dir: Annotated[Path, From(ContextManifest)]
    """context outputs, one subdir per plugin: ``<plugin>/qnn/graphllm<k>.bin`` (and a VL encoder's
    ``qnn/graphvisual<k>.bin``), one for each entry of the partitions' ``merge``."""


class BundleParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    soc: Soc
    prompt: str = DEFAULT_PROMPT
    image_sizes: tuple[str, ...] = ()
    """A VL model's image sizes (the spec's): its encoder ships too, and the bundle's README says where it runs."""


class BundleManifest(Manifest):
    stage = "bundle"
    params: BundleParams
    model_name: str
    """The bundle's model dir, ``model/<model_name>/``: a plain directory name (verify and conform open it)."""
    qnn_build: str
    """QNN build the context binaries were made with; the device's QNN runtime must not be older."""

    @field_validator("model_name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not re.fullmatch(DEVICE_NAME_PATTERN, name):
            raise ValueError(
                "expected a plain directory name (letters, digits, '.', '_' and '-', starting with a letter or digit): "
                "the bundle's model dir is model/<model_name>"
            )
        return name
