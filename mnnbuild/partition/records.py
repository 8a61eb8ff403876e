"""The JSON files the partition writes: ``qnn/<graph>/graph.json`` and ``partition.json``.

Tensor indexes are those of the *source* model (``llm.mnn``); a tensor's QNN name is
``t<source index>``, as MNN's QNN backend names graph tensors and as the Plugin op's ``inputs``
and ``outputs`` attributes list them (the Plugin's own tensor indexes in ``qnn/llm.mnn`` are
re-numbered; the runtime binds the i-th input of the op to the graph tensor named ``inputs[i]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

from mnnbuild.base.errors import ForeignModelError, UpstreamError, field_problems
from mnnbuild.base.fsutil import confined
from mnnbuild.cpu import load_vars

# the naming rules live in the artifact layout; re-exported for the partition's modules
from mnnbuild.pipeline.layout import FOLDED_VALUES as FOLDED_VALUES
from mnnbuild.pipeline.layout import GRAPH_FILE as GRAPH_FILE
from mnnbuild.pipeline.layout import REFERENCE_INPUT as REFERENCE_INPUT
from mnnbuild.pipeline.layout import REFERENCE_OUTPUT as REFERENCE_OUTPUT
from mnnbuild.pipeline.layout import binary_path as binary_path
from mnnbuild.pipeline.layout import graph_name as graph_name
from mnnbuild.pipeline.layout import plugin_name

if TYPE_CHECKING:
    import numpy as np

    from mnnbuild.mnn import MnnModel

INLINE_VALUES_MAX = 256
"""Folded values up to this many elements are written into graph.json too (all are in folded.mnn)."""


def qnn_name(index: int) -> str:
    """QNN tensor name of source tensor ``index``."""
    return f"t{index}"


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    """Tensor index in the source model."""
    name: str
    """MNN tensor name (the same in the source model and in qnn/llm.mnn)."""
    qnn_name: str
    shape: list[int]
    dtype: str
    """numpy dtype of the values (float32, int32 ...)."""
    format: str
    """The layout MNN keeps the tensor in within the whole source graph (NCHW, NC4HW4 ...). ``shape`` and
    the stored values are always in logical NCHW order, which is what the QNN graph reads and writes."""


class FoldedTensor(TensorSpec):
    values: list[Any] | None = None
    """Flattened values when small; always in folded.mnn under ``name``."""


class ConstTensor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    name: str
    qnn_name: str
    op: int
    """Index of the Const op in the source model that holds the data."""
    shape: list[int]
    dtype: str


class OpRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    """Op index in the source model."""
    name: str
    type: str
    inputs: list[int]
    outputs: list[int]


class SubgraphRecord(BaseModel):
    """What the QNN stage needs to build one graph (one plugin at one shape)."""

    model_config = ConfigDict(extra="forbid")

    graph: str
    plugin: int
    shape_index: int
    binary: str
    source_model: str
    """The source model file name (in the model dir); op and tensor indexes refer to it."""
    split_model: str | None = None
    """When the partition split a convolution and this graph holds ops the split changed or moved: the split
    model's path in the partition dir (``split/llm.mnn``), which the indexes then refer to."""
    ops: list[OpRef]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    internal: list[TensorSpec]
    """Every other tensor the ops make, with its shape at this graph's shape."""
    folded: list[FoldedTensor]
    """Per-shape constants the ops read (shape arithmetic folded for this shape)."""
    constants: list[ConstTensor]
    """Const-op tensors the ops read (weights other than convolution parameters, tables)."""
    reference_input: str = REFERENCE_INPUT
    reference_output: str = REFERENCE_OUTPUT
    folded_values: str | None = None

    def _file(self, graph_dir: Path, field: str) -> Path:
        """The file of ``graph_dir`` that ``field`` names (`confined` to it)."""
        return confined(Path(graph_dir), getattr(self, field), f"{Path(graph_dir) / GRAPH_FILE}: field {field!r}")

    def load_reference(self, graph_dir: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The reference inputs and outputs, in boundary order and with their exact shapes."""
        inputs, outputs = self._file(graph_dir, "reference_input"), self._file(graph_dir, "reference_output")
        return _load_tensors(inputs, self.inputs), _load_tensors(outputs, self.outputs)

    def load_folded(self, graph_dir: Path) -> dict[int, np.ndarray]:
        """Folded values by source tensor index, with their exact shapes."""
        if not self.folded_values:
            return {}
        arrays = _load_tensors(self._file(graph_dir, "folded_values"), self.folded)
        return {f.index: a for f, a in zip(self.folded, arrays, strict=True)}

    def check_model(self, model: MnnModel, graph_dir: Path) -> None:
        """That the ops and tensors named here are ``model``'s (same index, name and type): a graph dir copied from
        another model's partition, or edited, is a ``ForeignModelError`` naming the file and field, not an
        IndexError."""
        path = Path(graph_dir) / GRAPH_FILE
        where = model.path.name if model.path is not None else "the source model"

        def fail(field: str, what: str) -> ForeignModelError:
            return ForeignModelError(f"{path}: field {field!r}: {what}; run the partition stage again")

        for ref in self.ops:
            if not 0 <= ref.index < len(model.ops):
                raise fail("ops", f"op index {ref.index} is not below {where}'s {len(model.ops)} ops")
            op = model.ops[ref.index]
            if (op.name, op.type, op.inputs, op.outputs) != (ref.name, ref.type, ref.inputs, ref.outputs):
                raise fail(
                    "ops", f"op {ref.index} is {ref.name!r} ({ref.type}) here but {op.name!r} ({op.type}) in {where}"
                )
        for field in ("inputs", "outputs", "internal", "folded", "constants"):
            for t in getattr(self, field):
                if not 0 <= t.index < len(model.tensor_names) or model.tensor_names[t.index] != t.name:
                    raise fail(field, f"tensor {t.index} {t.name!r} is not {where}'s tensor {t.index}")

    def model_file(self, fetched: Path, partition_dir: Path, graph_dir: Path) -> Path:
        """The model this graph's indexes refer to: ``fetched`` (the model dir's), or the partition's split model."""
        if self.split_model is None:
            return Path(fetched)
        return confined(partition_dir, self.split_model, f"{Path(graph_dir) / GRAPH_FILE}: field 'split_model'")

    @classmethod
    def read(cls, graph_dir: Path) -> SubgraphRecord:
        path = Path(graph_dir) / GRAPH_FILE
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UpstreamError(f"{path}: graph description missing; run the partition stage") from None
        except ValueError as exc:
            raise UpstreamError(f"{path}: invalid graph description: {field_problems(exc)}") from None


def _load_tensors(path: Path, specs: Sequence[TensorSpec]) -> list[np.ndarray]:
    """The arrays of ``specs`` from an MNN variable file the partition wrote, with their exact shapes (an older
    file stores a scalar as shape [1]); a missing or misshaped one is an ``UpstreamError`` naming the file."""
    import numpy as np

    arrays = load_vars(path) if path.is_file() else None
    if arrays is None:
        raise UpstreamError(f"{path}: missing; run the partition stage")
    found = []
    for t in specs:
        a = arrays.get(t.name)
        if a is None or a.size != int(np.prod(t.shape, dtype=np.int64)):
            got = "no such tensor" if a is None else f"shape {list(a.shape)}"
            raise UpstreamError(
                f"{path}: tensor {t.name!r} expected with shape {t.shape}, found {got}; run the partition stage again"
            )
        found.append(a.reshape(t.shape))
    return found


class BoundaryShapes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    qnn_name: str
    shapes: list[list[int]]
    """Shape per sample shape index (logical NCHW, as the QNN graph has it)."""
    dtype: str
    format: str = "NCHW"
    """The layout MNN keeps the tensor in (an output's ``o_*`` format)."""


def _plugin_binary(binary: str) -> str:
    plugin_name(binary)
    return binary


class PluginReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plugin: int
    name: Annotated[str, AfterValidator(_plugin_binary)]
    """The binary's path (``qnn/graphllm0.bin``): the page report reads its context and twin dirs by its stem."""
    graphs: list[str]
    op_count: int
    op_types: dict[str, int]
    first_op: str
    last_op: str
    inputs: list[BoundaryShapes]
    outputs: list[BoundaryShapes]
    weight_bytes: int
    parameters: int


class CpuOpReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    name: str
    type: str
    reason: str


class PartitionReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    sample_shapes: list[int]
    """Sequence length of each sample (decode first)."""
    source_ops: int
    needed_ops: int
    folded_ops: int
    plugins: list[PluginReport]
    cpu_ops: list[CpuOpReport]
    npu_op_count: int
    npu_weight_bytes: int
    total_weight_bytes: int
    result_ops: int
    """Ops in qnn/llm.mnn."""
    max_abs_diff: list[float]
    """Per sample: largest difference between the chained subgraph outputs and the sample output.mnn."""
    moved_ops: int = 0
    """Ops the cut's schedule runs ahead of an op before them in the source (CPU ops as early as possible)."""
    subgraph_weight_bytes: int = 0
    """Weight bytes in the model's subgraphs (MoE experts), always run by the CPU op that holds them."""
    cpu_weight_bytes: dict[str, int] = {}
    """Weight bytes the CPU keeps, by the op type that keeps them (subgraphs under their holding op types)."""

    def cpu_weight_share(self) -> float:
        """Share of all the model's weight bytes (subgraphs included) the CPU keeps."""
        total = self.total_weight_bytes + self.subgraph_weight_bytes
        return sum(self.cpu_weight_bytes.values()) / total if total else 0.0

    def cpu_summary(self) -> str:
        """What runs where, in one line: plugins, and the CPU's share of the weights with the op types holding it."""
        share = self.cpu_weight_share()
        top = sorted(self.cpu_weight_bytes.items(), key=lambda kv: -kv[1])
        total = max(1, self.total_weight_bytes + self.subgraph_weight_bytes)
        kept = ", ".join(f"{t} {b / total:.1%}" for t, b in top[:4] if b)
        return (
            f"{len(self.plugins)} plugins, {len(self.cpu_ops)} ops on the CPU; the CPU keeps {share:.1%} of the "
            f"weights" + (f" ({kept})" if kept else "")
        )
