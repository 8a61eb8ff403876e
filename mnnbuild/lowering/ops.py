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
from mnnbuild.mnn import MnnModel, Op, enum_name, schema
from mnnbuild.mnn.semantics import CONST_OP_TYPES
from mnnbuild.mnn.weights import WeightFile, decode_conv

Check = Callable[[Op, MnnModel], "str | None"]
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


def blob_value(blob: object) -> np.ndarray:
    """The content of an MNN ``Blob`` (a Const op's parameter) as a numpy array."""
    dims = tuple(int(d) for d in (getattr(blob, "dims", None) if getattr(blob, "dims", None) is not None else []))
    dtype = enum_name(schema.DataType, int(getattr(blob, "dataType", 1)))
    fields = {
        "DT_FLOAT": ("float32s", np.float32),
        "DT_INT32": ("int32s", np.int32),
        "DT_INT64": ("int64s", np.int64),
        "DT_UINT8": ("uint8s", np.uint8),
        "DT_INT8": ("int8s", np.int8),
        "DT_BOOL": ("int32s", np.int32),
    }
    if dtype not in fields:
        raise ValueError(f"Const blob of type {dtype} is not supported")
    attr, np_type = fields[dtype]
    data = getattr(blob, attr, None)
    if data is None:
        if int(np.prod(dims, dtype=np.int64)) == 0:
            return np.zeros(dims, dtype=np_type)
        raise ValueError(f"Const blob of type {dtype} keeps its data outside the model (external)")
    arr = np.asarray(data, dtype=np_type)
    return arr.reshape(dims) if dims else arr.reshape(())


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


def _ok(op: Op, model: MnnModel) -> str | None:
    return None


def _check_conv(op: Op, model: MnnModel) -> str | None:
    if op.param_type != "Convolution2D" or op.main.common is None:
        return "Convolution without Convolution2D parameters"
    c = op.main.common
    if (c.kernelX, c.kernelY) != (1, 1):
        return f"kernel {c.kernelX}x{c.kernelY}; only 1x1 convolutions (linear layers) are lowered"
    if c.group != 1:
        return f"group {c.group}; only group 1 is lowered"
    if (c.strideX, c.strideY, c.dilateX, c.dilateY) != (1, 1, 1, 1):
        return "stride or dilation other than 1"
    if c.padX or c.padY or (c.pads is not None and any(int(p) for p in c.pads)):
        return "padding"
    if len(op.inputs) != 1:
        return f"{len(op.inputs)} inputs; only a convolution carrying its weights (one input) is lowered"
    q = op.main.quanParameter
    if q is not None and int(q.type) not in (1, 3, 4, 8):
        return f"weight quantization type {int(q.type)} cannot be decoded"
    return None


def _check_layer_norm(op: Op, model: MnnModel) -> str | None:
    p = op.main
    if op.param_type != "LayerNorm" or p is None:
        return "LayerNorm without parameters"
    if p.group not in (0, 1):
        return f"group {p.group}; only group 1 is lowered"
    if p.axis is None or len(p.axis) == 0:
        return "LayerNorm without axes"
    return None


BINARY_QNN: Mapping[str, str] = MappingProxyType(
    {
        "ADD": "ElementWiseAdd",
        "SUB": "ElementWiseSubtract",
        "MUL": "ElementWiseMultiply",
        "REALDIV": "ElementWiseDivide",
        "MAXIMUM": "ElementWiseMaximum",
        "MINIMUM": "ElementWiseMinimum",
        "POW": "ElementWisePower",
        "SquaredDifference": "ElementWiseSquaredDifference",
        "FLOORDIV": "",  # Divide + Floor: the simulator's ElementWiseFloorDiv is far off in fp16
        "MUL_SILU": "",  # x * silu(y): Sigmoid + two multiplies
    }
)
"""MNN BinaryOp kinds -> QNN element-wise op. MOD is left to the constant folder (MNN's integer and
float modulo conventions do not match one QNN op); DIV (integer division) crashes MNN's own CPU
backend on float tensors, so there is no reference to check a lowering against."""

UNARY_QNN: Mapping[str, tuple[str, int | None]] = MappingProxyType(
    {
        "NEG": ("ElementWiseNeg", None),
        "SIN": ("ElementWiseSin", None),
        "COS": ("ElementWiseCos", None),
        "EXP": ("ElementWiseExp", None),
        "LOG": ("ElementWiseLog", None),
        "SQRT": ("ElementWiseSquareRoot", None),
        "RSQRT": ("ElementWiseRsqrt", None),
        "ABS": ("ElementWiseAbs", None),
        "FLOOR": ("ElementWiseFloor", None),
        "CEIL": ("ElementWiseCeil", None),
        "SIGN": ("ElementWiseSign", None),
        "SIGMOID": ("Sigmoid", None),
        "TANH": ("Tanh", None),
        "RECIPROCAL": ("ElementWiseUnary", 10),  # QNN_OP_ELEMENT_WISE_UNARY_OPERATION_RECIPROCAL
        "SQUARE": ("", None),  # x * x
        "SILU": ("", None),  # x * sigmoid(x)
        "GELU": ("Gelu", None),
        "GELU_STANDARD": ("Gelu", None),
    }
)
"""MNN UnaryOp kinds -> (QNN op, ElementWiseUnary operation code or None)."""


def _binary_kind(op: Op) -> str:
    return enum_name(schema.BinaryOpOperation, op.main.opType) if op.main is not None else "?"


def _unary_kind(op: Op) -> str:
    return enum_name(schema.UnaryOpOperation, op.main.opType) if op.main is not None else "?"


def _check_binary(op: Op, model: MnnModel) -> str | None:
    kind = _binary_kind(op)
    if kind not in BINARY_QNN:
        return f"BinaryOp {kind} has no QNN lowering (lowered: {', '.join(sorted(BINARY_QNN))})"
    if int(getattr(op.main, "activationType", 0) or 0) not in (0, 1):
        return f"BinaryOp with fused activation {op.main.activationType}"
    return None


_PERIODIC = frozenset({"SIN", "COS"})
# Ops a rotary phase never flows through; the walk back stops there (keeps it short on big graphs).
_PHASE_STOPS = CONST_OP_TYPES | {"Convolution", "LayerNorm", "Attention", "Plugin"}


def _is_periodic(op: Op) -> bool:
    return op.type == "UnaryOp" and _unary_kind(op) in _PERIODIC


def _casts_to_float(op: Op) -> bool:
    return op.type == "Cast" and op.main is not None and int(op.main.dstT) == schema.DataType.DT_FLOAT


def position_phase_source(op: Op, model: MnnModel) -> str | None:
    """The integer graph input (``position_ids``) whose value ``op`` handles as an unbounded float.

    That is: ``op`` is a Sin/Cos of such a value, or its output is one (computed from an integer graph
    input through a Cast to float, and not yet through a Sin/Cos). None otherwise.
    """
    producers = model.producers()
    start = list(op.inputs) if _is_periodic(op) else list(op.outputs)
    stack = [(t, False) for t in start]
    seen: set[tuple[int, bool]] = set()
    while stack:
        t, cast = stack.pop()
        if (t, cast) in seen or t not in producers:
            continue
        seen.add((t, cast))
        src = model.ops[producers[t]]
        if src.type == "Input":
            dtype = int(getattr(src.main, "dtype", schema.DataType.DT_FLOAT)) if src.main is not None else 1
            if cast and dtype != schema.DataType.DT_FLOAT:
                return model.tensor_names[t]
            continue
        if src.type in _PHASE_STOPS or _is_periodic(src):
            continue
        stack.extend((u, cast or _casts_to_float(src)) for u in src.inputs)
    return None


def precision_reason(op: Op, model: MnnModel) -> str | None:
    """Why ``op``, although lowerable, should stay on the CPU because fp16 on the HTP would make it wrong."""
    source = position_phase_source(op, model)
    if source is None:
        return None
    # fp16 keeps 11 bits: position 4000 is off by up to 2, position * inv_freq by as much, and the rotary
    # sin/cos by 15-75% at positions 1000-4000 (measured in the simulator).
    return (
        f"computes with the rotary phase of integer input {source!r} as a float: fp16 on the HTP loses it "
        "beyond a few hundred tokens, so it stays on the CPU"
    )


def _check_unary(op: Op, model: MnnModel) -> str | None:
    kind = _unary_kind(op)
    if kind not in UNARY_QNN:
        return f"UnaryOp {kind} has no QNN lowering (lowered: {', '.join(sorted(UNARY_QNN))})"
    return None


_NCHW, _NHWC, _NC4HW4 = 0, 1, 2


def _check_convert(op: Op, model: MnnModel) -> str | None:
    if op.main is None:
        return None
    src, dst = int(op.main.source), int(op.main.dest)
    # NCHW <-> NC4HW4 keeps the logical shape; NHWC <-> NCHW would be a transpose of the data.
    if {src, dst} <= {_NCHW, _NC4HW4} or src == dst:
        return None
    return f"ConvertTensor {src} -> {dst} changes the logical layout; only NCHW <-> NC4HW4 is lowered"


def _check_strided_slice(op: Op, model: MnnModel) -> str | None:
    p = op.main
    if op.type == "StridedSlice":
        if p is None:
            return "StridedSlice without parameters"
        if p.ellipsisMask or p.newAxisMask:
            return "StridedSlice with ellipsis or new-axis masks"
        if int(p.fromType) == 0 and len(op.inputs) == 5:
            return "StridedSlice writing into its input (5-input form)"
    return None


def _check_slice(op: Op, model: MnnModel) -> str | None:
    if op.param_type != "Slice" or op.main is None:
        return "Slice without parameters"
    if len(op.inputs) != 1:
        return "Slice with run-time slice points"
    return None


def _check_cast(op: Op, model: MnnModel) -> str | None:
    if op.main is None:
        return "Cast without parameters"
    target = enum_name(schema.DataType, op.main.dstT)
    if target not in ("DT_FLOAT", "DT_INT32"):
        return f"Cast to {target}; only DT_FLOAT and DT_INT32 are lowered"
    return None


def _check_matmul(op: Op, model: MnnModel) -> str | None:
    if len(op.inputs) not in (2, 3):
        return f"MatMul with {len(op.inputs)} inputs"
    return None


def _check_const(op: Op, model: MnnModel) -> str | None:
    try:
        blob_value(op.main)
    except ValueError as exc:
        return str(exc)
    return None


# -- lowerings -------------------------------------------------------------------------------------


def _lower_reshape(ctx: LoweringContext, op: Op) -> None:
    ctx.node("Reshape", [ctx.input(op.inputs[0])], [ctx.output(op.outputs[0])])


def _lower_conv(ctx: LoweringContext, op: Op) -> None:
    cw = decode_conv(op, ctx.weights)
    src, dst = op.inputs[0], op.outputs[0]
    in_shape, out_shape = ctx.shape(src), ctx.shape(dst)
    if len(in_shape) != 4:
        raise ctx.error(f"convolution input has shape {in_shape}; expected NCHW")
    n, c, h, w = in_shape
    o = cw.weight.shape[0]
    if cw.weight.shape[1] != c:
        raise ctx.error(f"weight is {list(cw.weight.shape)} but the input has {c} channels")
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
    weight = ctx.static(f"{op.name}.weight", np.ascontiguousarray(cw.weight.T.reshape(1, 1, c, o), np.float32))
    bias = ctx.static(f"{op.name}.bias", cw.bias.astype(np.float32))
    y_shape = (*nhwc[:3], o)
    y = ctx.temp("conv", y_shape)
    conv_params = {"stride": tensor_param([1, 1]), "pad_amount": tensor_param(np.zeros((2, 2), np.uint32))}
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
    # MNN normalizes over the last len(axis) dimensions
    count = len(p.axis)
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
    flat = ctx.reshape(ctx.input(src), (rows, size), "float32", "rows")
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


REGISTRY: Mapping[str, OpLowering] = MappingProxyType(
    {
        "Convolution": OpLowering(_check_conv, _lower_conv, ("Conv2d", "Reshape", "Transpose", "Relu", "ReluMinMax")),
        "LayerNorm": OpLowering(_check_layer_norm, _lower_layer_norm, ("RmsNorm", "LayerNorm")),
        "BinaryOp": OpLowering(_check_binary, _lower_binary, tuple(sorted({*BINARY_QNN.values()} - {""}))),
        "UnaryOp": OpLowering(_check_unary, _lower_unary, tuple(sorted({q for q, _ in UNARY_QNN.values()} - {""}))),
        "Reshape": OpLowering(_ok, _lower_reshape, ("Reshape",)),
        "Squeeze": OpLowering(_ok, _lower_reshape, ("Reshape",)),
        "Unsqueeze": OpLowering(_ok, _lower_reshape, ("Reshape",)),
        "ExpandDims": OpLowering(_ok, _lower_reshape, ("Reshape",)),
        "Flatten": OpLowering(_ok, _lower_reshape, ("Reshape",)),
        "ConvertTensor": OpLowering(_check_convert, _lower_reshape, ("Reshape",)),
        "Permute": OpLowering(_ok, _lower_permute, ("Transpose",)),
        "Transpose": OpLowering(_ok, _lower_permute, ("Transpose",)),
        "Concat": OpLowering(_ok, _lower_concat, ("Concat",)),
        "StridedSlice": OpLowering(_check_strided_slice, _lower_strided_slice, ("StridedSlice", "Reshape")),
        "Slice": OpLowering(_check_slice, _lower_slice, ("StridedSlice",)),
        "GatherV2": OpLowering(_ok, _lower_gather, ("Gather", "Reshape")),
        "Cast": OpLowering(_check_cast, _lower_cast, ("Cast",)),
        "Softmax": OpLowering(_ok, _lower_softmax, ("Softmax", "Transpose")),
        "MatMul": OpLowering(_check_matmul, _lower_matmul, ("MatMul", "ElementWiseAdd")),
        "Const": OpLowering(_check_const, _lower_const_like, ("Reshape",)),
    }
)
"""MNN op kind -> lowering. Built once, read-only."""

FOLDED_OP_TYPES = frozenset({"Shape", "Rank", "Size"})
"""Kinds that are never lowered: their outputs depend only on shapes, so they fold to constants."""
