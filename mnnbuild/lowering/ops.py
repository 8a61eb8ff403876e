"""The registry: every MNN op kind the QNN lowering handles, with its parameter check and its lowering.

Layout: every tensor keeps MNN's *logical* shape; NC4HW4 tensors are treated as plain NCHW (a
``ConvertTensor`` between NCHW and NC4HW4 is a reshape to the same shape), because the shapes at the
subgraph boundary are MNN's logical shapes and QNN tensors are dense. Shape-only ops (Reshape, Squeeze,
Unsqueeze, ConvertTensor, Flatten, ExpandDims) become a QNN ``Reshape`` to the output shape MNN computed
for this shape index; their shape inputs are folded constants and never reach QNN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from mnnbuild.lowering.context import LoweringContext, b8, digest, f32, i32, tensor_param, u32
from mnnbuild.lowering.quantized import QuantizedWeight, npu_weight
from mnnbuild.lowering.support import (
    BINARY_QNN,
    CHECKS,
    UNARY_QNN,
    Check,
    _binary_kind,
    _unary_kind,
)
from mnnbuild.mnn import Op
from mnnbuild.mnn.weights import ConvWeights, WeightFile, decode_conv
from mnnbuild.model.npu_weights import WeightNote

Lower = Callable[[LoweringContext, Op], None]


@dataclass(frozen=True)
class OpLowering:
    """How one MNN op kind is lowered: ``check`` says why an op of that kind cannot be (or None)."""

    check: Check
    lower: Lower
    qnn_ops: tuple[str, ...]
    """The QNN op types it may emit (for reports)."""


# -- helpers ---------------------------------------------------------------------------------------


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _same_rank(ctx: LoweringContext, t: int, rank: int, tag: str) -> str:
    """MNN tensor ``t`` as a QNN tensor of ``rank`` (leading 1s added), for explicit broadcasting."""
    shape = ctx.shape(t)
    if len(shape) == rank:
        return ctx.input(t)
    new_shape = (1,) * (rank - len(shape)) + shape
    if ctx.is_const(t) and t not in ctx.names:
        return ctx.const_static(t, new_shape)
    return ctx.reshape(ctx.input(t), new_shape, ctx.dtype(t), f"{tag}_rank")


def layer_norm_params(op: Op, weights: WeightFile | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """gamma and beta of an MNN LayerNorm, inline or in the external weight file
    (``external = [offset, gamma_bytes, beta_bytes]``); None when the op has none."""
    p = op.param("LayerNorm")
    if p.gamma is not None and len(p.gamma):
        gamma = np.asarray(p.gamma, dtype=np.float32)
        beta = np.asarray(p.beta, dtype=np.float32) if p.beta is not None and len(p.beta) else None
        return gamma, beta
    ext = [int(v) for v in p.external] if p.external is not None else []
    if len(ext) > 1 and ext[1] > 0:
        if weights is None:
            raise ValueError(f"LayerNorm {op.name!r} keeps gamma/beta in the weight file but none was given")
        gamma = weights.read(ext[0], ext[1], f"op {op.name!r} gamma").view("<f4").astype(np.float32)
        beta = None
        if len(ext) > 2 and ext[2] > 0:
            beta = weights.read(ext[0] + ext[1], ext[2], f"op {op.name!r} beta").view("<f4").astype(np.float32)
        return gamma, beta
    return None, None


# -- checks ----------------------------------------------------------------------------------------


# -- lowerings -------------------------------------------------------------------------------------


def _lower_reshape(ctx: LoweringContext, op: Op) -> None:
    ctx.node("Reshape", [ctx.input(op.inputs[0])], [ctx.output(op.outputs[0])])


def htp_conv_weights(op: Op, weights: WeightFile | None) -> ConvWeights:
    """A conv's weights as the lowering stores them: ``weight.T`` is the contiguous ``[in, out]`` QNN reads, and it
    is float16. The HTP prepares in fp16 and rounds float32 static weights to fp16 to the nearest even, as numpy
    does, so the context binary is the same bytes (``tests/test_context.py`` composes both) at half the size. A
    weight beyond fp16's range keeps float32 (QNN's overflow handling is not ours to guess)."""
    cw = decode_conv(op, weights, dtype=np.float16, in_major=True)
    io = cw.weight.T
    step = max(1, (16 << 20) // max(1, io.shape[1] * 2))
    if all(np.isfinite(io[i : i + step]).all() for i in range(0, io.shape[0], step)):
        return cw
    return decode_conv(op, weights, in_major=True)


def _conv_weights(ctx: LoweringContext, op: Op) -> tuple[ConvWeights | QuantizedWeight, WeightNote]:
    """The conv's weight as this graph stores it (decoded once per plugin) and the note saying how."""
    cache = ctx.conv_weights
    cw = cache.get(op.name) if cache is not None else None
    reason = ""
    if cw is None:
        quantized, reason = npu_weight(op, ctx.weights, ctx.npu_weights)
        cw = quantized if quantized is not None else htp_conv_weights(op, ctx.weights)
        if cache is not None:
            cache[op.name] = cw
    elif not isinstance(cw, QuantizedWeight) and ctx.npu_weights != "float16":
        reason = "float weights: no codes to keep"
    tensor = f"{op.name}.weight"
    if isinstance(cw, QuantizedWeight):
        note = WeightNote(
            op=op.name,
            tensor=tensor,
            encoding=cw.encoding,
            bitwidth=cw.bitwidth,
            weights=cw.in_channels * cw.codes.shape[3],
            exact=cw.exact,
            error=cw.error,
            centered=cw.block_sums is not None,
            folded=cw.folded * cw.codes.shape[3],
        )
    else:
        note = WeightNote(op=op.name, tensor=tensor, encoding="float16", bitwidth=16, weights=cw.weight.size)
        note = note.model_copy(update={"reason": reason})
    return cw, note


def _lower_conv(ctx: LoweringContext, op: Op) -> None:
    cw, note = _conv_weights(ctx, op)
    ctx.weight_notes.append(note)
    src, dst = op.inputs[0], op.outputs[0]
    in_shape, out_shape = ctx.shape(src), ctx.shape(dst)
    if len(in_shape) != 4:
        raise ctx.error(f"convolution input has shape {in_shape}; expected NCHW")
    n, c, h, w = in_shape
    quantized = isinstance(cw, QuantizedWeight)
    in_ch, o = (cw.in_channels, cw.codes.shape[3]) if quantized else (cw.weight.shape[1], cw.weight.shape[0])
    if in_ch != c:
        raise ctx.error(f"weight is {[o, in_ch]} but the input has {c} channels")
    x = ctx.input(src)
    # QNN Conv2d is NHWC with HWIO weights. A 1x1 conv over [N, C, 1, 1] (every LLM linear layer) runs
    # as one image row [1, 1, N, C]: no transposes. (FullyConnected fed by a Reshape of a 4-D graph input
    # came out wrong in the simulator for square weights, so it is not used.)
    if h * w == 1:
        nhwc = (1, 1, n, c)
        x4 = ctx.reshape(x, nhwc, "float32", "nhwc")
    else:
        nhwc = (n, h, w, c)
        x4 = ctx.temp("nhwc", nhwc)
        ctx.node("Transpose", [x], [x4], {"perm": tensor_param([0, 2, 3, 1])}, suffix="nhwc")
    y_shape = (*nhwc[:3], o)
    y = ctx.temp("conv", y_shape)
    conv_params = {"stride": tensor_param([1, 1]), "pad_amount": tensor_param(np.zeros((2, 2), np.uint32))}
    if isinstance(cw, QuantizedWeight):
        # the HTP takes quantized weights only with fp16 tensors at the op: a Cast before and after it
        weight = ctx.quantized_static(f"{op.name}.weight", cw)
        bias = ctx.static(f"{op.name}.bias", cw.bias.astype(np.float16), "float16")
        x16 = ctx.fp16(x4, nhwc, x)
        y16 = ctx.temp("conv16", y_shape, "float16")
        if cw.block_sums is None:
            ctx.node("Conv2d", [x16, weight, bias], [y16], conv_params, suffix="conv")
        elif cw.folded:
            # asymmetric codes: x @ w = (x - mean) @ (q * scale) + mean @ block_sums, the second term's digits
            # in the same conv, read against the means appended to the centered input (`quantized`: why)
            joined = ctx.block_folded(x16, nhwc, x, cw.block, cw.folded)
            ctx.node("Conv2d", [joined, weight, bias], [y16], conv_params, suffix="conv")
        else:  # per channel: no block to hold the digits
            # asymmetric codes: x @ w = (x - mean) @ (q * scale) + mean @ block_sums (`quantized`: why)
            centered, mean = ctx.block_centered(x16, nhwc, x, cw.block)
            part = ctx.temp("codes16", y_shape, "float16")
            ctx.node("Conv2d", [centered, weight, bias], [part], conv_params, suffix="conv")
            sums = cw.block_sums.reshape(1, 1, *cw.block_sums.shape).astype(np.float16)
            mean_part = ctx.temp("means16", y_shape, "float16")
            ctx.node(
                "Conv2d",
                [mean, ctx.static(f"{op.name}.block_sums", sums, "float16")],
                [mean_part],
                conv_params,
                suffix="means",
            )
            ctx.node("ElementWiseAdd", [part, mean_part], [y16], suffix="add")
        ctx.node("Cast", [y16], [y], suffix="fp32")
    else:
        weight = ctx.static(f"{op.name}.weight", cw.weight.T.reshape(1, 1, c, o), "float32")
        bias = ctx.static(f"{op.name}.bias", cw.bias.astype(np.float32))
        ctx.node("Conv2d", [x4, weight, bias], [y], conv_params, suffix="conv")
    common = op.main.common
    if common.relu6:
        act = ctx.temp("relu6", y_shape)
        ctx.node("ReluMinMax", [y], [act], {"min_value": f32(0.0), "max_value": f32(6.0)}, suffix="relu6")
        y = act
    elif common.relu:
        act = ctx.temp("relu", y_shape)
        ctx.node("Relu", [y], [act], suffix="relu")
        y = act
    out = ctx.output(dst)
    if h * w == 1:
        ctx.node("Reshape", [y], [out])
    else:
        ctx.node("Transpose", [y], [out], {"perm": tensor_param([0, 3, 1, 2])}, suffix="nchw")
    if tuple(out_shape) != (n, o, h, w):
        raise ctx.error(f"output shape {out_shape} != {(n, o, h, w)}")


def _lower_layer_norm(ctx: LoweringContext, op: Op) -> None:
    p = op.main
    src, dst = op.inputs[0], op.outputs[0]
    shape = ctx.shape(src)
    rank = len(shape)
    x = ctx.input(src)
    # MNN normalizes over the last len(axis) dimensions, or over the channels of an NC4HW4 tensor
    count = len(p.axis)
    if ctx.meta(src).format == "NC4HW4":
        if any(d != 1 for d in shape[2:]):
            raise ctx.error(f"LayerNorm over the channels of NC4HW4 {shape}: only [N, C, 1, 1] is lowered")
        count = rank - 1
    norm_shape = shape[rank - count :]
    gamma, beta = layer_norm_params(op, ctx.weights)
    size = int(np.prod(norm_shape))
    if gamma is None:
        gamma = np.ones(size, np.float32)
    if beta is None:
        beta = np.zeros(size, np.float32)
    if gamma.size != size or beta.size != size:
        raise ctx.error(f"gamma/beta have {gamma.size}/{beta.size} values, normalized dims {norm_shape}")
    g = ctx.static(f"{op.name}.gamma", gamma.reshape(size))
    b = ctx.static(f"{op.name}.beta", beta.reshape(size))
    qnn = "RmsNorm" if p.useRmsnorm else "LayerNorm"
    params = {"epsilon": f32(float(p.epsilon)), "axes": tensor_param([1])}
    # Always normalize a 2-D [rows, size] view: the simulator's RmsNorm over the last axis of a 4-D
    # [1, s, heads, 32] tensor (Qwen3's q/k norm) is wrong for s >= 16, while the 2-D form is right.
    rows = int(np.prod(shape[: rank - count], dtype=np.int64))
    flat = ctx.reshape(x, (rows, size), "float32", "rows")
    normed = ctx.temp("normed", (rows, size))
    ctx.node(qnn, [flat, g, b], [normed], params, suffix="norm")
    ctx.node("Reshape", [normed], [ctx.output(dst)])


def _lower_binary(ctx: LoweringContext, op: Op) -> None:
    kind = _binary_kind(op)
    a, b = op.inputs[0], op.inputs[1]
    dst = op.outputs[0]
    rank = len(ctx.shape(dst))
    dtype = ctx.dtype(dst)
    xa, xb = _same_rank(ctx, a, rank, "a"), _same_rank(ctx, b, rank, "b")
    relu = int(getattr(op.main, "activationType", 0) or 0) == 1
    final = ctx.temp("pre_relu", ctx.shape(dst), dtype) if relu else ctx.output(dst)
    if kind == "MUL_SILU":
        shape_b = (1,) * (rank - len(ctx.shape(b))) + ctx.shape(b)
        sig = ctx.temp("sigmoid", shape_b)
        ctx.node("Sigmoid", [xb], [sig], suffix="sigmoid")
        silu = ctx.temp("silu", shape_b)
        ctx.node("ElementWiseMultiply", [xb, sig], [silu], suffix="silu")
        ctx.node("ElementWiseMultiply", [xa, silu], [final])
    elif kind == "FLOORDIV":
        quotient = ctx.temp("quotient", ctx.shape(dst), dtype)
        ctx.node("ElementWiseDivide", [xa, xb], [quotient], suffix="divide")
        ctx.node("ElementWiseFloor", [quotient], [final])
    else:
        ctx.node(BINARY_QNN[kind], [xa, xb], [final])
    if relu:
        ctx.node("Relu", [final], [ctx.output(dst)], suffix="relu")


def _lower_unary(ctx: LoweringContext, op: Op) -> None:
    kind = _unary_kind(op)
    src, dst = op.inputs[0], op.outputs[0]
    x = ctx.input(src)
    qnn, code = UNARY_QNN[kind]
    if kind == "SQUARE":
        ctx.node("ElementWiseMultiply", [x, x], [ctx.output(dst)])
    elif kind == "SILU":
        sig = ctx.temp("sigmoid", ctx.shape(src))
        ctx.node("Sigmoid", [x], [sig], suffix="sigmoid")
        ctx.node("ElementWiseMultiply", [x, sig], [ctx.output(dst)])
    elif code is not None:
        ctx.node(qnn, [x], [ctx.output(dst)], {"operation": u32(code)})
    else:
        ctx.node(qnn, [x], [ctx.output(dst)])


def _lower_permute(ctx: LoweringContext, op: Op) -> None:
    src, dst = op.inputs[0], op.outputs[0]
    rank = len(ctx.shape(src))
    if op.type == "Transpose":
        perm = [int(v) for v in np.asarray(ctx.value(op.inputs[1])).ravel()]
    else:
        perm = [int(v) for v in op.main.dims]
    perm = [_axis(p, rank) for p in perm]
    expected = tuple(ctx.shape(src)[p] for p in perm)
    if expected != ctx.shape(dst):
        raise ctx.error(f"permutation {perm} of {ctx.shape(src)} gives {expected}, MNN says {ctx.shape(dst)}")
    ctx.node("Transpose", [ctx.input(src)], [ctx.output(dst)], {"perm": tensor_param(perm)})


def _lower_concat(ctx: LoweringContext, op: Op) -> None:
    dst = op.outputs[0]
    rank = len(ctx.shape(dst))
    axis = _axis(int(op.main.axis), rank)
    ins = [ctx.input(t) for t in op.inputs]
    ctx.node("Concat", ins, [ctx.output(dst)], {"axis": u32(axis)})


def _slice_ranges(ctx: LoweringContext, op: Op) -> list[tuple[int, int, int]]:
    """Per input axis (begin, end, stride) as Python's ``slice.indices`` gives them, following MNN's
    StridedSlice shape rules (TF form with masks, or the ONNX Slice form with axes and steps)."""
    shape = ctx.shape(op.inputs[0])
    rank = len(shape)
    slices: list[slice] = [slice(None)] * rank
    vals = [np.asarray(ctx.value(t)).astype(np.int64).ravel() for t in op.inputs[1:]]
    p = op.main
    begin, end = vals[0], vals[1]
    if int(p.fromType) == 1:
        axes = vals[2] if len(vals) > 2 else np.arange(len(begin))
        steps = vals[3] if len(vals) > 3 else np.ones(len(begin), np.int64)
        for b, e, a, s in zip(begin, end, axes, steps, strict=True):
            slices[_axis(int(a), rank)] = slice(int(b), int(e), int(s))
    else:
        strides = vals[2] if len(vals) > 2 else np.ones(len(begin), np.int64)
        for i in range(len(begin)):
            if (p.shrinkAxisMask >> i) & 1:
                b = int(begin[i]) + (shape[i] if begin[i] < 0 else 0)
                slices[i] = slice(b, b + 1, 1)
                continue
            b = None if (p.beginMask >> i) & 1 else int(begin[i])
            e = None if (p.endMask >> i) & 1 else int(end[i])
            slices[i] = slice(b, e, int(strides[i]))
    ranges = [s.indices(d) for s, d in zip(slices, shape, strict=True)]
    if any(st <= 0 for _, _, st in ranges):
        raise ctx.error("negative or zero slice steps are not lowered")
    return ranges


def _lower_strided_slice(ctx: LoweringContext, op: Op) -> None:
    src, dst = op.inputs[0], op.outputs[0]
    ranges = _slice_ranges(ctx, op)
    sliced = tuple(len(range(b, e, s)) for b, e, s in ranges)
    out_shape = ctx.shape(dst)
    if int(np.prod(sliced)) != int(np.prod(out_shape)):
        raise ctx.error(f"slice {ranges} of {ctx.shape(src)} gives {sliced}, MNN says {out_shape}")
    params = {
        "ranges": tensor_param(np.asarray(ranges, dtype=np.int32), "int32"),
        "begin_mask": u32(0),
        "end_mask": u32(0),
        "shrink_axes": u32(0),
        "new_axes_mask": u32(0),
    }
    x = ctx.input(src)
    if sliced == out_shape:
        ctx.node("StridedSlice", [x], [ctx.output(dst)], params)
    else:  # shrunk axes: slice, then drop them
        tmp = ctx.temp("sliced", sliced, ctx.dtype(dst))
        ctx.node("StridedSlice", [x], [tmp], params, suffix="slice")
        ctx.node("Reshape", [tmp], [ctx.output(dst)])


def _lower_slice(ctx: LoweringContext, op: Op) -> None:
    """MNN Slice (a split into parts along one axis): one StridedSlice per output, the part sizes taken
    from the output shapes MNN computed (slicePoints are sizes or cut points depending on the source)."""
    src = op.inputs[0]
    shape = ctx.shape(src)
    axis = _axis(int(op.main.axis), len(shape))
    x = ctx.input(src)
    start = 0
    for k, dst in enumerate(op.outputs):
        size = ctx.shape(dst)[axis]
        ranges = [[0, d, 1] for d in shape]
        ranges[axis] = [start, start + size, 1]
        start += size
        params = {
            "ranges": tensor_param(np.asarray(ranges, dtype=np.int32), "int32"),
            "begin_mask": u32(0),
            "end_mask": u32(0),
            "shrink_axes": u32(0),
            "new_axes_mask": u32(0),
        }
        ctx.node("StridedSlice", [x], [ctx.output(dst)], params, suffix=f"part{k}")
    if start > shape[axis]:
        raise ctx.error(f"parts of {start} along axis {axis} exceed the input's {shape[axis]}")


def _lower_gather(ctx: LoweringContext, op: Op) -> None:
    data, idx, dst = op.inputs[0], op.inputs[1], op.outputs[0]
    shape = ctx.shape(data)
    axis = 0
    if len(op.inputs) > 2:
        axis = int(np.asarray(ctx.value(op.inputs[2])).ravel()[0])
    elif op.main is not None and getattr(op.main, "axis", None) is not None:
        axis = int(op.main.axis)
    axis = _axis(axis, len(shape))
    idx_shape = ctx.shape(idx)
    if ctx.is_const(idx) and idx not in ctx.names:
        values = np.asarray(ctx.value(idx)).astype(np.int64)
        values = np.where(values < 0, values + shape[axis], values).astype(np.int32)
        values = values.reshape(idx_shape or (1,))
        indices = ctx.static(f"{op.name}.indices.{digest(values.tobytes(), str(values.shape).encode())}", values)
        idx_shape = tuple(values.shape)
    else:
        indices = ctx.input(idx)
        if not idx_shape:
            indices = ctx.reshape(indices, (1,), ctx.dtype(idx), "idx1")
            idx_shape = (1,)
    gathered = shape[:axis] + tuple(idx_shape) + shape[axis + 1 :]
    params = {"axis": i32(axis)}
    if gathered == ctx.shape(dst):
        ctx.node("Gather", [ctx.input(data), indices], [ctx.output(dst)], params)
    else:  # scalar index: gather one, then drop the axis
        tmp = ctx.temp("gathered", gathered, ctx.dtype(dst))
        ctx.node("Gather", [ctx.input(data), indices], [tmp], params, suffix="gather")
        ctx.node("Reshape", [tmp], [ctx.output(dst)])


def _lower_cast(ctx: LoweringContext, op: Op) -> None:
    src, dst = op.inputs[0], op.outputs[0]
    ctx.node("Cast", [ctx.input(src)], [ctx.output(dst)])


def _lower_softmax(ctx: LoweringContext, op: Op) -> None:
    src, dst = op.inputs[0], op.outputs[0]
    rank = len(ctx.shape(src))
    axis = _axis(int(op.main.axis) if op.main is not None else -1, rank)
    params = {"axis": u32(axis), "beta": f32(1.0)}
    if axis == rank - 1:
        ctx.node("Softmax", [ctx.input(src)], [ctx.output(dst)], params)
        return
    # the HTP runs Softmax over the last axis: move the axis there and back
    perm = [i for i in range(rank) if i != axis] + [axis]
    inverse = list(np.argsort(perm))
    shape = ctx.shape(src)
    moved = tuple(shape[p] for p in perm)
    t0 = ctx.temp("moved", moved)
    ctx.node("Transpose", [ctx.input(src)], [t0], {"perm": tensor_param(perm)}, suffix="to_last")
    t1 = ctx.temp("softmax", moved)
    ctx.node("Softmax", [t0], [t1], {"axis": u32(rank - 1), "beta": f32(1.0)}, suffix="softmax")
    ctx.node("Transpose", [t1], [ctx.output(dst)], {"perm": tensor_param(inverse)}, suffix="back")


def _lower_matmul(ctx: LoweringContext, op: Op) -> None:
    a, b, dst = op.inputs[0], op.inputs[1], op.outputs[0]
    ta = bool(getattr(op.main, "transposeA", False)) if op.main is not None else False
    tb = bool(getattr(op.main, "transposeB", False)) if op.main is not None else False
    rank = len(ctx.shape(dst))
    xa, xb = _same_rank(ctx, a, rank, "a"), _same_rank(ctx, b, rank, "b")
    params = {"transpose_in0": b8(ta), "transpose_in1": b8(tb)}
    if len(op.inputs) == 3:
        tmp = ctx.temp("matmul", ctx.shape(dst))
        ctx.node("MatMul", [xa, xb], [tmp], params, suffix="matmul")
        bias = _same_rank(ctx, op.inputs[2], rank, "bias")
        ctx.node("ElementWiseAdd", [tmp, bias], [ctx.output(dst)])
    else:
        ctx.node("MatMul", [xa, xb], [ctx.output(dst)], params)


def _lower_const_like(ctx: LoweringContext, op: Op) -> None:
    # Reached only when a constant is a graph output: copy the static data out.
    dst = op.outputs[0]
    ctx.node("Reshape", [ctx.const_static(dst)], [ctx.output(dst)])


_RULES: dict[str, tuple[Lower, tuple[str, ...]]] = {
    "Convolution": (_lower_conv, ("Conv2d", "Reshape", "Transpose", "Relu", "ReluMinMax")),
    "LayerNorm": (_lower_layer_norm, ("RmsNorm", "LayerNorm")),
    "BinaryOp": (_lower_binary, tuple(sorted({*BINARY_QNN.values()} - {""}))),
    "UnaryOp": (_lower_unary, tuple(sorted({q for q, _ in UNARY_QNN.values()} - {""}))),
    "Reshape": (_lower_reshape, ("Reshape",)),
    "Squeeze": (_lower_reshape, ("Reshape",)),
    "Unsqueeze": (_lower_reshape, ("Reshape",)),
    "ExpandDims": (_lower_reshape, ("Reshape",)),
    "Flatten": (_lower_reshape, ("Reshape",)),
    "ConvertTensor": (_lower_reshape, ("Reshape",)),
    "Permute": (_lower_permute, ("Transpose",)),
    "Transpose": (_lower_permute, ("Transpose",)),
    "Concat": (_lower_concat, ("Concat",)),
    "StridedSlice": (_lower_strided_slice, ("StridedSlice", "Reshape")),
    "Slice": (_lower_slice, ("StridedSlice",)),
    "GatherV2": (_lower_gather, ("Gather", "Reshape")),
    "Cast": (_lower_cast, ("Cast",)),
    "Softmax": (_lower_softmax, ("Softmax", "Transpose")),
    "MatMul": (_lower_matmul, ("MatMul", "ElementWiseAdd")),
    "Const": (_lower_const_like, ("Reshape",)),
}
REGISTRY: Mapping[str, OpLowering] = MappingProxyType(
    {kind: OpLowering(CHECKS[kind], lower, qnn_ops) for kind, (lower, qnn_ops) in _RULES.items()}
)
"""MNN op kind -> lowering. Built once, read-only; its kinds and checks are `support.CHECKS`."""
