"""modellib: every partition graph lowered to a QNN graph description with its static tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict

from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.model.npu_weights import DEFAULT_NPU_WEIGHTS, NpuWeights
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.stage import From, StageInputs


class ModellibInputs(StageInputs):
    model: str
    model_dir: Annotated[Path, From(FetchManifest)]
    """fetch output (the source llm.mnn and its weights)."""
    partition_dir: Annotated[Path, From(PartitionManifest)]


class ModellibParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    npu_weights: NpuWeights = DEFAULT_NPU_WEIGHTS
    """How conv weights are stored (spec field ``npu_weights``), as in the context binaries."""


class LoweredRecord(BaseModel):
    graph: str
    plugin: int
    nodes: int
    static_tensors: int
    static_bytes: int


class ModellibManifest(Manifest):
    stage = "modellib"
    params: ModellibParams
    graphs: list[LoweredRecord]
