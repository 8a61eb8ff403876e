"""A plugin's partition graphs lowered to QNN: what the modellib stage writes to disk and what the context and twin
stages compose from directly.

The context and twin stages lower in the fresh process that composes the binary (`PluginGraphs` is the picklable
recipe handed to it), so the device bundle needs no model-lib on disk: at real size the model-lib is GBs of fp16 raws
that the contexts would only read back. The modellib stage lowers the same way and writes the result
(the self-contained model-lib a user hands to QNN tools); both get the same descriptions and the same data.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnnbuild.base.errors import LoweringError, UpstreamError
from mnnbuild.base.fsutil import confined
from mnnbuild.lowering.context import TensorMeta
from mnnbuild.lowering.graph import GraphDescription
from mnnbuild.lowering.lower import LoweredGraph, lower_subgraph
from mnnbuild.lowering.quantized import DEFAULT_NPU_WEIGHTS, QuantizedWeight
from mnnbuild.mnn import MnnModel, load_model
from mnnbuild.mnn.weights import ConvWeights, WeightFile
from mnnbuild.model.modeldir import ModelPart
from mnnbuild.model.npu_weights import NpuWeights
from mnnbuild.partition.records import GRAPH_FILE, SubgraphRecord

MERGE_FIELD = "npu_postreat.json field 'merge'"


def tensor_info(record: SubgraphRecord, graph_dir: Path) -> dict[int, TensorMeta]:
    """Shapes and dtypes of every tensor of one subgraph at its shape, with folded values."""
    folded = record.load_folded(graph_dir)
    info: dict[int, TensorMeta] = {}
    for spec in (*record.inputs, *record.outputs, *record.internal, *record.folded):
        info[spec.index] = TensorMeta(
            shape=tuple(spec.shape), dtype=spec.dtype, value=folded.get(spec.index), format=spec.format
        )
    for const in record.constants:
        info.setdefault(const.index, TensorMeta(shape=tuple(const.shape), dtype=const.dtype))
    return info


def lower_plugin(
    model: MnnModel,
    weights: WeightFile,
    partition_dir: Path,
    graphs: Sequence[str],
    npu_weights: NpuWeights = DEFAULT_NPU_WEIGHTS,
) -> Iterator[tuple[Path, LoweredGraph]]:
    """Lower one plugin's graph dirs (``qnn/graphllm0``, ``qnn/graphllm1_0``: decode, then each prefill length,
    relative to ``partition_dir``), yielding each dir with its lowering. The graphs share the plugin's weights:
    each conv is decoded once, and a later graph's static holds the first graph's very array. ``npu_weights``: how
    their conv weights are stored (`mnnbuild.lowering.quantized.NpuWeights`)."""
    conv_weights: dict[str, ConvWeights | QuantizedWeight] = {}
    for graph in graphs:
        src = confined(Path(partition_dir), graph, MERGE_FIELD)
        record = SubgraphRecord.read(src)
        record.check_model(model, src)
        try:
            lowered = lower_subgraph(
                model,
                weights,
                [op.index for op in record.ops],
                tensor_info(record, src),
                [t.index for t in record.inputs],
                [t.index for t in record.outputs],
                conv_weights,
                npu_weights,
            )
        except LoweringError as exc:
            raise type(exc)(f"{src / GRAPH_FILE}: graph {src.name} cannot be lowered: {exc}") from None
        yield src, lowered


def source_model(model_dir: Path, part: ModelPart, partition_dir: Path, graphs: Sequence[str]) -> Path:
    """The model a plugin's graph dirs index: the fetched one, or the partition's split model (`SPLIT_DIR`)."""
    found = set()
    for g in graphs:
        src = confined(partition_dir, g, MERGE_FIELD)
        found.add(SubgraphRecord.read(src).model_file(model_dir / part.model_file, partition_dir, src))
    if len(found) > 1:
        raise UpstreamError(
            f"{partition_dir}: graphs {list(graphs)} of one plugin index different models; run the partition again"
        )
    return found.pop()


@dataclass(frozen=True)
class PluginGraphs:
    """The recipe for one plugin's lowered graphs, by graph name in order (decode first), for
    `mnnbuild.plugin.compose.compose_checked` to call in the process that composes the binary."""

    model_file: Path
    weight_file: Path
    partition_dir: Path
    graphs: tuple[str, ...]
    """Graph dirs relative to ``partition_dir``, in ``allGraphName`` order (``qnn/graphllm0``, ...)."""
    npu_weights: NpuWeights = DEFAULT_NPU_WEIGHTS

    @classmethod
    def of(
        cls,
        model_dir: Path,
        part: ModelPart,
        partition_dir: Path,
        graphs: Sequence[str],
        npu_weights: NpuWeights = DEFAULT_NPU_WEIGHTS,
    ) -> PluginGraphs:
        """The graphs ``graphs`` of a partition of ``part`` (its model and weight file are in ``model_dir``; the
        graphs index the partition's split model instead when their ``graph.json`` says so)."""
        model_dir, partition_dir = Path(model_dir), Path(partition_dir)
        model = source_model(model_dir, part, partition_dir, graphs)
        return cls(model, model_dir / part.weight_file, partition_dir, tuple(graphs), npu_weights)

    @property
    def names(self) -> list[str]:
        return [Path(g).name for g in self.graphs]

    def __call__(self) -> dict[str, tuple[GraphDescription, dict[str, np.ndarray]]]:
        model = load_model(self.model_file)
        with WeightFile(self.weight_file) as weights:
            return {
                src.name: (lowered.description, lowered.statics)
                for src, lowered in lower_plugin(model, weights, self.partition_dir, self.graphs, self.npu_weights)
            }
