"""twin: the unshared twin of each plugin's context binary, which verify runs in the x86 simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict

from mnnbuild.model.npu_weights import DEFAULT_NPU_WEIGHTS, NpuWeights, WeightNote
from mnnbuild.model.targets import Soc
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.stage import From, StageInputs


class TwinInputs(StageInputs):
    """ContextInputs' fields, declared again rather than inherited: the twin's key then does not follow the
    context manifest's code (a new context manifest field rebuilds no twin)."""

    model: str
    model_dir: Annotated[Path, From("fetch", reads="files")]
    partition_dir: Annotated[Path, From("partition", reads="files")]
    binary: str
    """The shipped binary it stands in for (the merge entry's key, e.g. ``qnn/graphllm0.bin``)."""
    graphs: list[str]
    """Its graph dirs in allGraphName order, e.g. ``["qnn/graphllm0", "qnn/graphllm1_0"]``."""


class TwinParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    soc: Soc
    npu_weights: NpuWeights = DEFAULT_NPU_WEIGHTS
    """How conv weights are stored (spec field ``npu_weights``): context, twin and modellib store the same."""


class TwinManifest(Manifest):
    stage = "twin"
    params: TwinParams
    binary: str
    """The shipped binary (in the context stage's dir) this twin stands in for."""
    twin: str
    """The twin, relative to this dir (in ``outputs`` with its sha256)."""
    graphs: list[str]
    """Its graph names, in order."""
    soc_type: str | None
    weights: list[WeightNote] = []
    """How the binary stores each conv weight (encoding, exactness, requantization error, why float16)."""
