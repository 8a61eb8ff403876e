"""What a plugin's binaries (the shipped context binary and its unshared twin) are built from.

Its own module, not the context manifest's: the twin stage and verify read it, and a change to the context
manifest's fields must not reach the twin's key (nor the twin manifest's the context's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict

from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.model.modeldir import ModelPart, chain_part
from mnnbuild.model.npu_weights import DEFAULT_NPU_WEIGHTS, NpuWeights
from mnnbuild.model.targets import Soc
from mnnbuild.pipeline.manifest import FileRecord
from mnnbuild.pipeline.stage import From, StageInputs


class PluginInputs(StageInputs):
    """What one plugin's binary is built from: the Inputs of the context and of the twin stage."""

    model: str
    # of the fetch, the lowering source the partition records (`PartitionManifest.plugin_files`)
    model_dir: Annotated[Path, From(FetchManifest, reads="files")]
    """fetch output: the model and weight file the graphs are lowered from."""
    partition_dir: Annotated[Path, From(PartitionManifest, reads="files")]
    binary: str
    """The merge entry's key, e.g. ``qnn/graphllm0.bin`` (the shipped binary, or the one a twin stands in for)."""
    graphs: list[str]
    """Its graph dirs in allGraphName order, e.g. ``["qnn/graphllm0", "qnn/graphllm1_0"]``."""


class PluginParams(BaseModel):
    """How one plugin's binary is composed: the Params the context and twin stages share."""

    model_config = ConfigDict(frozen=True)

    soc: Soc
    npu_weights: NpuWeights = DEFAULT_NPU_WEIGHTS
    """How conv weights are stored (spec field ``npu_weights``): context, twin and modellib store the same."""


def plugin_part(fetch: FetchManifest, partition: PartitionManifest) -> ModelPart:
    """The model file and weight file a plugin's graphs are lowered from: the fetched graph, or a VL encoder."""
    return chain_part(fetch.part, partition.params.part)


def plugin_sources(fetch: FetchManifest, partition: PartitionManifest, graphs: list[str]) -> list[FileRecord]:
    """What a plugin's binary is built from, by hash: the partition's files of its graph dirs (and the split model
    they index, if any) and the fetched model and weight file they are lowered from (paths prefixed with the stage
    that made them). The context and twin stages record it as their inputs; verify compares both against the
    current upstream manifests."""
    part = plugin_part(fetch, partition)
    model = [r for r in fetch.outputs if r.path in (part.model_file, part.weight_file)]
    return [
        *(r.under("partition") for r in partition.plugin_files(graphs)),
        *(r.under("fetch") for r in model),
    ]
