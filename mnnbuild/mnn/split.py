"""Split one 1x1 Convolution of a model into convolutions over ranges of its output channels, joined by a Concat.

An lm_head of 151936 x 2048 is one op, and QNN holds every graph's copy of a context's weights while it
serializes it: such a context's peak memory is set by that op whatever the lowering does (docs/benchmarks.md).
Split into row ranges, each range can go into a plugin of its own. The parts keep the op's exact encoding: IDST
type-1 codes are sliced by whole output channels (their header rewritten for the new row count), scales and bias
likewise, and stored inline, so the split model computes the same numbers as the source and reads the rest from
the source's weight file.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.mnn._generated import mnn_fb as fb
from mnnbuild.mnn.model import MnnModel, Op
from mnnbuild.mnn.weights import QUANT_IDST, WeightFile

CONCAT_AXIS = 1  # output channels of an NCHW / NC4HW4 conv output


def conv_parameters(op: Op) -> int:
    """Weights of a Convolution op (output x input channels x kernel), from its common parameters; 0 for any
    other op."""
    if op.type != "Convolution" or op.param_type != "Convolution2D":
        return 0
    common = op.main.common
    return int(common.outputCount) * int(common.inputCount) * int(common.kernelX or 1) * int(common.kernelY or 1)


def split_bounds(channels: int, parts: int, align: int = 32) -> list[int]:
    """``parts + 1`` increasing boundaries from 0 to ``channels``, each inner one a multiple of ``align``."""
    step = -(-channels // parts)
    step = -(-step // align) * align
    return sorted({0, *(min(channels, i * step) for i in range(1, parts)), channels})


def _idst_rows(raw: np.ndarray, shape_int32: bool, first: int, last: int, where: str) -> np.ndarray:
    """The IDST type-1 block of output channels ``[first, last)`` of ``raw`` (same code table, sliced codes)."""
    dim_dtype = np.dtype("<i4" if shape_int32 else "<u2")
    ndim = int(raw[0])
    head = 1 + ndim * dim_dtype.itemsize
    dims = raw[1:head].view(dim_dtype).astype(np.int64)
    n_codes = int(raw[head]) or 256
    table_end = head + 1 + n_codes
    bits = max(1, int(np.ceil(np.log2(n_codes)))) if n_codes > 1 else 1
    per_row = int(np.prod(dims[1:])) * bits
    if per_row % 8:
        raise MNNFormatError(f"{where}: {per_row} code bits per output channel do not split on a byte")
    row_bytes = per_row // 8
    new_dims = dims.copy()
    new_dims[0] = last - first
    header = np.concatenate([raw[:1], new_dims.astype(dim_dtype).view(np.uint8), raw[head:table_end]])
    codes = raw[table_end + first * row_bytes : table_end + last * row_bytes]
    return np.concatenate([header, codes]).view(np.int8)


def unsplittable(op: Op) -> str | None:
    """Why `split_convolution` cannot split ``op``, or None: it takes llmexport's layout, a one-output
    Convolution whose IDST-quantized weights and scales are in the external weight file."""
    c = op.main if op.type == "Convolution" and op.param_type == "Convolution2D" else None
    if c is None or len(op.outputs) != 1:
        return "not a one-output Convolution"
    ext = list(c.external) if c.external is not None else []
    q = c.quanParameter
    if q is None or int(q.type) != QUANT_IDST or len(ext) < 3 or int(c.common.group or 1) != 1:
        return "only convolutions with external IDST-quantized weights (llmexport's layout) are split"
    return None


def _part(op: Op, weights: WeightFile, first: int, last: int) -> Any:
    """Convolution2DT of output channels ``[first, last)`` of ``op``, everything inline."""
    c = op.main
    where = f"op {op.name!r}"
    out_ch = int(c.common.outputCount)
    ext = [int(v) for v in c.external]
    q = c.quanParameter
    raw = weights.read(ext[0], ext[1], f"{where} quantized weight")
    fp16 = int(q.scaleStorage) == fb.ScaleStorageType.FP16
    alpha = weights.read(ext[0] + ext[1], ext[2], f"{where} scales").view("<f2" if fp16 else "<f4")
    if alpha.size % out_ch:
        raise MNNFormatError(f"{where}: {alpha.size} scales do not split into {out_ch} output channels")
    per_row = alpha.size // out_ch
    bias = (
        weights.read(ext[0] + ext[1] + ext[2], ext[3], f"{where} bias").view("<f4")
        if len(ext) > 3 and ext[3]
        else np.zeros(out_ch, dtype="<f4")
    )
    part = copy.deepcopy(c)
    part.external = None
    part.common.outputCount = last - first
    part.bias = np.array(bias[first:last], dtype=np.float32)
    pq = part.quanParameter
    pq.buffer = _idst_rows(np.asarray(raw), bool(q.shapeInt32), first, last, where)
    # fp16 scales widen exactly; inline they are stored as float32
    pq.alpha = np.array(alpha[first * per_row : last * per_row], dtype=np.float32)
    pq.alphaFp16 = None
    pq.scaleStorage = fb.ScaleStorageType.FP32
    if int(q.readType):
        pq.readType = (last - first) * (per_row // 2)
    return part


def split_convolution(model: MnnModel, op_index: int, bounds: Sequence[int], weights: WeightFile) -> list[int]:
    """Replace the Convolution at ``op_index`` by one conv per range ``bounds[i]:bounds[i + 1]`` of its output
    channels and a Concat writing its output tensor, in place; returns the new ops' indexes (the parts, then the
    Concat, from ``op_index`` on). Ops before ``op_index`` and every existing tensor keep their index."""
    op = model.ops[op_index]
    why = unsplittable(op)
    if why is not None:
        raise MNNFormatError(f"op {op.name!r}: cannot split it: {why}")
    out_ch = int(op.main.common.outputCount)
    if list(bounds) != sorted(set(bounds)) or bounds[0] != 0 or bounds[-1] != out_ch or len(bounds) < 3:
        raise ValueError(f"op {op.name!r}: bounds {list(bounds)} do not split {out_ch} channels in two or more")
    new_ops: list[Op] = []
    outputs: list[int] = []
    for first, last in zip(bounds, bounds[1:], strict=False):
        name = f"{op.name}#rows{first}-{last}"
        tensor = model.add_tensor(name)
        outputs.append(tensor)
        new_ops.append(
            Op(
                type=op.type,
                name=name,
                inputs=list(op.inputs),
                outputs=[tensor],
                main=_part(op, weights, first, last),
                default_dimension_format=op.default_dimension_format,
            )
        )
    axis = fb.AxisT()
    axis.axis = CONCAT_AXIS
    new_ops.append(
        Op(
            type="Concat",
            name=f"{op.name}#concat",
            inputs=outputs,
            outputs=list(op.outputs),
            main=axis,
            default_dimension_format=op.default_dimension_format,
        )
    )
    model.ops[op_index : op_index + 1] = new_ops
    return list(range(op_index, op_index + len(new_ops)))
