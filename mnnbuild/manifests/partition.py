"""partition: the model cut into CPU ops and QNN plugins."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from mnnbuild.base.errors import UpstreamError
from mnnbuild.base.fsutil import confined, parse_json
from mnnbuild.cpu import CpuRuntime
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import IoManifest, PrefillLengths
from mnnbuild.model.modeldir import ChainPart
from mnnbuild.pipeline.layout import LOWERING_SOURCE, POSTREAT_FILE, plugin_name
from mnnbuild.pipeline.manifest import FileRecord, Manifest
from mnnbuild.pipeline.stage import From, Plugin, StageInputs


class PartitionInputs(StageInputs):
    model: str
    model_dir: Annotated[Path, From(FetchManifest)]
    """The fetch stage's output directory."""
    io_dir: Annotated[Path, From(IoManifest)]
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
    311M, takes many layers' time), so the DAG starts the biggest plugins first."""
    split_model: str | None = None
    """The split model its graphs index (`SubgraphRecord.split_model`), None for the fetched one."""


class KeptBytes(BaseModel):
    """Source weight file bytes ``[source_offset, source_offset + size)``, at ``offset`` in the shipped one."""

    source_offset: int
    offset: int
    size: int


class ShippedWeights(BaseModel):
    """The weight file the bundle ships beside the partitioned model: only the bytes of the source's that its CPU ops
    and (language model) the tied embeddings read, the offsets in the model and ``llm_config.json`` moved to match."""

    file: str
    """Relative to the partition dir, and to the bundle's model dir (`ModelPart.shipped_weight_file`)."""
    source_bytes: int
    bytes: int
    cpu_op_bytes: int
    """Bytes the partitioned model's ops read (their union)."""
    tie_embedding_bytes: int
    """Bytes ``tie_embeddings`` points at (0: untied, or in a separate file)."""
    blocks: list[KeptBytes]
    llm_config: str | None = None
    """The model's ``llm_config.json`` with ``tie_embeddings`` moved (a copy when untied), relative to the partition
    dir; None for a VL model's encoder."""


class PartitionManifest(Manifest):
    stage = "partition"
    params: PartitionParams
    seq_lens: list[int]
    """Sample shapes, in graph-name order (decode first)."""
    plugins: list[PluginRecord]
    cpu_ops: int
    weights: ShippedWeights

    def plugin_files(self, graphs: Collection[str]) -> list[FileRecord]:
        """The output records a plugin's binary is built from: the files of its graph dirs (``qnn/graphllm0`` ...),
        the split model when they index it, and the hashes of the fetched model they are lowered from
        (:data:`~mnnbuild.pipeline.layout.LOWERING_SOURCE`)."""
        names = {Path(g).name for g in graphs}
        extra = {LOWERING_SOURCE} | {p.split_model for p in self.plugins if p.split_model and names & set(p.graphs)}
        files = self.outputs_in(graphs)
        return files + [r for r in self.outputs if r.path in extra]


def partition_plugins(partition_dir: Path) -> list[Plugin]:
    """The plugins a partition dir names (`FanOut.plugins`), with its manifest's records of the files of their graphs
    and of the split model they index, if any (what a per-plugin stage reads of the partition), and their cost.

    By record, not by file: the partition's own up-to-date check holds its files to those records, and a partition
    restored without its weights (`Stage.defer`) needs not fetch them for plugins that are up to date or hit."""
    merge = read_merge(partition_dir)
    partition = PartitionManifest.read(partition_dir)
    size = {p.path: p.parameters for p in partition.plugins}
    found = []
    for binary, graphs in merge.items():
        records = partition.plugin_files(graphs)
        for r in records:
            confined(partition_dir, r.path, "partition manifest outputs")
        found.append(Plugin(binary, tuple(graphs), tuple(records), size.get(binary, 0)))
    return found


def read_merge(partition_dir: Path) -> dict[str, list[str]]:
    """The ``merge`` map of ``npu_postreat.json``: binary path -> graph dirs. Each binary path is a file name inside
    the partition dir's layout (`confined`): it names the plugin's dirs and the bundle's copy of its binary."""
    path = Path(partition_dir) / POSTREAT_FILE
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UpstreamError(f"{path}: cannot read field 'merge': {exc}") from None
    if not isinstance(data, dict):
        raise UpstreamError(f"{path}: expected a JSON object with field 'merge', got {type(data).__name__}")
    if "merge" not in data:
        raise UpstreamError(f"{path}: field 'merge' missing; expected a map of binary paths to graph dirs")
    merge = data["merge"]
    if not isinstance(merge, dict) or not all(
        isinstance(v, list) and all(isinstance(g, str) for g in v) for v in merge.values()
    ):
        raise UpstreamError(f"{path}: field 'merge' must map a binary path to a list of graph dirs")
    for binary in merge:
        confined(partition_dir, binary, f"{path}: field 'merge'")
        try:
            plugin_name(binary)  # its context and twin dirs: <group>/<stem>
        except ValueError as exc:
            raise UpstreamError(f"{path}: field 'merge': {exc}") from None
    return merge
