"""partition: the model cut into CPU ops and QNN plugins."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mnnbuild.cpu import CpuRuntime
from mnnbuild.errors import StageError
from mnnbuild.layout import LOWERING_SOURCE, POSTREAT_FILE
from mnnbuild.manifest import FileRecord, Manifest
from mnnbuild.manifests.io import PrefillLengths
from mnnbuild.modeldir import ChainPart
from mnnbuild.stage import StageInputs


class PartitionInputs(StageInputs):
    model: str
    model_dir: Path
    """The fetch stage's output directory."""
    io_dir: Path
    """The io stage's output directory."""


class PartitionParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    chunk_sizes: PrefillLengths | tuple[()] = ()
    """Prefill lengths (the llm part); must be the io stage's."""
    part: ChainPart = "llm"
    """Which model file the partition cuts (``llm.mnn`` or a VL model's ``visual.mnn``)."""
    image_sizes: tuple[str, ...] = ()
    """The visual part's image sizes, one graph per size; must be the io stage's."""
    skips: tuple[str, ...] = ()
    """Op names forced to stay on the CPU."""
    max_kv_size: int = Field(default=0, ge=0)
    """0 keeps Attention with a KV cache on the CPU (upstream KVCACHE_SIZE_LIMIT)."""
    max_plugin_parameters: int = Field(default=0, ge=0)
    """Most convolution weights one plugin holds (0: no limit); a bigger convolution is split by output channels
    into plugins of its own, joined by a Concat on the CPU."""
    runtime: CpuRuntime = CpuRuntime()


class PluginRecord(BaseModel):
    plugin: int
    path: str
    graphs: list[str]
    ops: int
    parameters: int
    """Elements of the weights and constants it holds: what its binary costs to prepare (a Qwen3-1.7B lm_head,
    311M, takes ~10x a layer's time), so the DAG starts the biggest plugins first."""
    split_model: str | None = None
    """The split model its graphs index (`SubgraphRecord.split_model`), None for the fetched one."""


class PartitionManifest(Manifest):
    stage = "partition"
    params: PartitionParams
    seq_lens: list[int]
    """Sample shapes, in graph-name order (decode first)."""
    plugins: list[PluginRecord]
    cpu_ops: int

    def plugin_files(self, graphs: Collection[str]) -> list[FileRecord]:
        """The output records a plugin's binary is built from: the files of its graph dirs (``qnn/graphllm0`` ...),
        the split model when they index it, and the hashes of the fetched model they are lowered from
        (:data:`~mnnbuild.layout.LOWERING_SOURCE`)."""
        names = {Path(g).name for g in graphs}
        extra = {LOWERING_SOURCE} | {p.split_model for p in self.plugins if p.split_model and names & set(p.graphs)}
        files = self.outputs_in(graphs)
        return files + [r for r in self.outputs if r.path in extra]


def read_merge(partition_dir: Path) -> dict[str, list[str]]:
    """The ``merge`` map of ``npu_postreat.json``: binary path -> graph dirs."""
    path = Path(partition_dir) / POSTREAT_FILE
    try:
        merge = json.loads(path.read_text(encoding="utf-8"))["merge"]
    except (OSError, ValueError, KeyError) as exc:
        raise StageError(f"{path}: cannot read field 'merge': {exc}") from None
    if not isinstance(merge, dict) or not all(isinstance(v, list) for v in merge.values()):
        raise StageError(f"{path}: field 'merge' must map a binary path to a list of graph dirs")
    return merge
