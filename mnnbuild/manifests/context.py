"""context: one HTP context binary per plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict

from mnnbuild.model.npu_weights import DEFAULT_NPU_WEIGHTS, NpuWeights, WeightNote
from mnnbuild.model.targets import Soc
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.stage import From, StageInputs


class ContextInputs(StageInputs):
    model: str
    # of the fetch, the lowering source the partition records (`PartitionManifest.plugin_files`)
    model_dir: Annotated[Path, From("fetch", reads="files")]
    """fetch output: the model and weight file the graphs are lowered from."""
    partition_dir: Annotated[Path, From("partition", reads="files")]
    binary: str
    """The merge entry's key, e.g. ``qnn/graphllm0.bin``."""
    graphs: list[str]
    """Its graph dirs in allGraphName order, e.g. ``["qnn/graphllm0", "qnn/graphllm1_0"]``."""


class ContextParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    soc: Soc
    npu_weights: NpuWeights = DEFAULT_NPU_WEIGHTS
    """How conv weights are stored (spec field ``npu_weights``): context, twin and modellib store the same."""
    weight_sharing: bool = True


class GraphIo(BaseModel):
    name: str
    inputs: list[str]
    outputs: list[str]


class ContextManifest(Manifest):
    stage = "context"
    params: ContextParams
    binary: str
    graphs: list[GraphIo]
    weight_shared: bool
    soc_type: str | None
    weights: list[WeightNote] = []
    """How the binary stores each conv weight (encoding, exactness, requantization error, why float16)."""
    qnn: dict[str, str]
    """QNN library versions (build id, API versions)."""
