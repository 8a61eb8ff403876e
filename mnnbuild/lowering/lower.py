"""Lowering one MNN subgraph (a set of op indexes between boundary tensors) to a QNN graph description.

Entry points:

- :func:`constant_tensors` — the tensors whose value is fixed once the input shapes are (Const outputs,
  Shape/Rank/Size outputs, and everything computed only from those): these fold into STATIC tensors or
  op parameters and never become QNN nodes.
- :func:`unsupported_reason` — why an op cannot be lowered (None when it can); same signature as the
  partition's ``support.unsupported_reason``.
- :func:`lower_subgraph` — the :class:`LoweredGraph` (description + static data) of one subgraph at one
  shape index.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnnbuild.base.errors import LoweringError, MnnbuildError
from mnnbuild.lowering.channel_last import channel_last
from mnnbuild.lowering.context import LoweringContext, TensorMeta
from mnnbuild.lowering.graph import GraphDescription, write_graph_dir
from mnnbuild.lowering.ops import REGISTRY
from mnnbuild.lowering.quantized import DEFAULT_NPU_WEIGHTS, QuantizedWeight
from mnnbuild.lowering.support import FOLDED_OP_TYPES as FOLDED_OP_TYPES
from mnnbuild.lowering.support import LOWERED_OP_TYPES as LOWERED_OP_TYPES
from mnnbuild.lowering.support import blob_value, precision_reason
from mnnbuild.lowering.support import constant_tensors as constant_tensors
from mnnbuild.lowering.support import unsupported_reason as unsupported_reason
from mnnbuild.mnn import MnnModel
from mnnbuild.mnn.semantics import CONST_OP_TYPES
from mnnbuild.mnn.weights import ConvWeights, WeightFile
from mnnbuild.model.npu_weights import NpuWeights

log = logging.getLogger(__name__)


@dataclass
class LoweredGraph:
    """A lowered subgraph: its QNN description and the data of its STATIC tensors by name."""

    description: GraphDescription
    statics: dict[str, np.ndarray]

    def write(self, directory: Path) -> list[Path]:
        """``graph.json`` + one ``.raw`` per static tensor (see :func:`graph.write_graph_dir`)."""
        return write_graph_dir(directory, self.description, self.statics)


def _constant_values(
    model: MnnModel, const: set[int], needed: Collection[int], tensor_info: Mapping[int, TensorMeta]
) -> dict[int, np.ndarray]:
    """Values of the constant tensors in ``needed``: from ``tensor_info``, else from the Const blob or the
    input shape (Shape/Rank/Size)."""
    producers = model.producers()
    values: dict[int, np.ndarray] = {}
    for t in needed:
        if t not in const:
            continue
        meta = tensor_info.get(t)
        if meta is not None and meta.value is not None:
            values[t] = np.asarray(meta.value)
            continue
        op = model.ops[producers[t]] if t in producers else None
        if op is not None and op.type in CONST_OP_TYPES:
            values[t] = blob_value(op.main)
        elif op is not None and op.type in FOLDED_OP_TYPES and op.inputs and op.inputs[0] in tensor_info:
            shape = tensor_info[op.inputs[0]].shape
            values[t] = {
                "Shape": np.asarray(shape, np.int32),
                "Rank": np.asarray(len(shape), np.int32),
                "Size": np.asarray(int(np.prod(shape)), np.int32),
            }[op.type]
    return values


def lower_subgraph(
    model: MnnModel,
    weights: WeightFile | str | os.PathLike[str] | None,
    op_indexes: Sequence[int],
    tensor_info: Mapping[int, TensorMeta],
    inputs: Sequence[int],
    outputs: Sequence[int],
    conv_weights: MutableMapping[str, ConvWeights | QuantizedWeight] | None = None,
    npu_weights: NpuWeights = DEFAULT_NPU_WEIGHTS,
) -> LoweredGraph:
    """Lower the ops ``op_indexes`` of ``model`` (in that order, topologically sorted) to one QNN graph.

    ``tensor_info`` gives every involved tensor's shape and dtype at this shape index (and values, at
    least for folded constants that are not Const/Shape/Rank outputs). Graph inputs/outputs are the MNN
    tensors ``inputs``/``outputs``, named ``t<index>``, with MNN's logical shape and float32/int32.
    Static tensors are named from MNN op names (``<op>.weight``, ``<op>.gamma``, Const op names), so the
    decode and prefill graphs of one plugin name shared weights the same way. ``conv_weights``: decoded conv
    weights by op name, filled and reused across calls, so the prefill graph of a plugin takes the decode
    graph's instead of decoding the same int4 weights again.
    """
    own_file = weights is not None and not isinstance(weights, WeightFile)
    wf = WeightFile(weights) if own_file else weights  # type: ignore[arg-type]
    try:
        return _lower(model, wf, op_indexes, tensor_info, inputs, outputs, conv_weights, npu_weights)
    finally:
        if own_file and wf is not None:
            wf.close()


def _lower(
    model: MnnModel,
    weights: WeightFile | None,
    op_indexes: Sequence[int],
    tensor_info: Mapping[int, TensorMeta],
    inputs: Sequence[int],
    outputs: Sequence[int],
    conv_weights: MutableMapping[str, ConvWeights | QuantizedWeight] | None = None,
    npu_weights: NpuWeights = DEFAULT_NPU_WEIGHTS,
) -> LoweredGraph:
    const = constant_tensors(model)
    ops = [model.ops[i] for i in op_indexes]
    involved = {t for op in ops for t in (*op.inputs, *op.outputs)} | set(outputs)
    values = _constant_values(model, const, involved, tensor_info)
    ctx = LoweringContext(model, weights, tensor_info, values, inputs, outputs, conv_weights, npu_weights)
    folded = 0
    for op in ops:
        ctx.op = op
        const_out = bool(op.outputs) and all(t in const for t in op.outputs)
        if const_out and not any(t in outputs for t in op.outputs):
            folded += 1
            continue
        reason = unsupported_reason(op, model, const, precision=False) if not const_out else None
        if reason is not None:
            raise ctx.error(f"cannot be lowered: {reason}")
        advice = precision_reason(op, model) if not const_out else None
        if advice is not None:
            log.warning("op %r (%s) lowered although: %s", op.name, op.type, advice)
        entry = REGISTRY["Const"] if const_out else REGISTRY[op.type]
        try:
            entry.lower(ctx, op)
        except LoweringError:
            raise
        except (MnnbuildError, ValueError, KeyError, IndexError) as exc:
            raise ctx.error(f"lowering failed: {exc}") from exc
    ctx.op = None
    missing = [t for t in outputs if t not in ctx.names]
    if missing:
        raise LoweringError(f"graph outputs {[model.tensor_names[t] for t in missing]} are not produced by the ops")
    unused = ctx.unused_inputs()
    if unused:
        log.warning("graph inputs %s are not read by any node", unused)
    desc = GraphDescription(
        inputs=[ctx.names[t] for t in inputs],
        outputs=[ctx.names[t] for t in outputs],
        tensors=list(ctx.tensors.values()),
        nodes=ctx.nodes,
        weights=ctx.weight_notes,
    )
    # op-by-op lowering leaves MNN's [N, C, 1, 1] between ops, which the HTP prepares very slowly
    desc, statics = channel_last(desc, ctx.statics)
    log.debug(
        "lowered %d MNN ops (%d folded) into %d QNN nodes (%d before the layout pass), %d static tensors",
        len(ops),
        folded,
        len(desc.nodes),
        len(ctx.nodes),
        len(statics),
    )
    return LoweredGraph(desc, statics)
