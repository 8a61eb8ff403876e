"""Which MNN ops the QNN lowering can put on the NPU: the question the partition stage asks.

The support decision is data and checks, kept apart from the lowering rules' bodies
(`mnnbuild.lowering.ops`): the partition imports this module only, so editing how an op is lowered
rebuilds the stages that lower (modellib onwards) but not the partition. ``CHECKS`` lists every op kind
the lowering implements with its parameter check; ``ops.REGISTRY`` pairs each with its rule (a test holds
the two equal). Anything refused becomes a break op, stays on the CPU and is listed with the reason in
the partition report.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType

import numpy as np

from mnnbuild.mnn import MnnModel, Op, enum_name, schema
from mnnbuild.mnn.semantics import CONST_OP_TYPES, reads_content, shape_inputs

Check = Callable[[Op, MnnModel], "str | None"]


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
    if len(op.inputs) != 1 or len(op.outputs) != 1:
        # MNN's converter fuses a residual add into the norm (FuseTransformerC4: outputs the sum and its norm); an
        # Add + norm lowering matched the whole model but not MNN's run of the plugin's ops alone at seq 32 (LFM2)
        return f"LayerNorm with a fused residual add ({len(op.inputs)} inputs, {len(op.outputs)} outputs)"
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
_PHASE_STOPS = frozenset({"Convolution", "LayerNorm", "Attention", "Const", "TrainableParam", "Plugin"})


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


# Unary ops the HTP approximates with an absolute error floor (~1e-3 for Tanh on small inputs, measured in the
# simulator): exact enough alone, wrong once a constant factor scales the error up with the output.
_ERROR_FLOOR_UNARY = frozenset({"TANH", "SIGMOID"})


def _const_scalar(t: int, model: MnnModel, producers: Mapping[int, int]) -> float | None:
    """The value of ``t`` when a Const op writes it as one float (a scalar or a one-element tensor)."""
    src = model.ops[producers[t]] if t in producers else None
    if src is None or src.type != "Const" or src.main is None:
        return None
    values = getattr(src.main, "float32s", None)
    return float(values[0]) if values is not None and len(values) == 1 else None


def amplified_error_factor(op: Op, model: MnnModel) -> float | None:
    """The constant factor (|c| > 1) a consumer multiplies ``op``'s output by, when ``op`` is a unary the HTP
    approximates with an absolute error floor (``c * tanh(x / c)``: Gemma 2's logit soft-cap); else None."""
    if op.type != "UnaryOp" or _unary_kind(op) not in _ERROR_FLOOR_UNARY or not op.outputs:
        return None
    producers = model.producers()
    for i in model.consumers().get(op.outputs[0], ()):
        user = model.ops[i]
        if user.type != "BinaryOp" or _binary_kind(user) != "MUL" or len(user.inputs) != 2:
            continue
        other = user.inputs[1] if user.inputs[0] == op.outputs[0] else user.inputs[0]
        c = _const_scalar(other, model, producers)
        if c is not None and abs(c) > 1:
            return c
    return None


def precision_reason(op: Op, model: MnnModel) -> str | None:
    """Why ``op``, although lowerable, should stay on the CPU because fp16 on the HTP would make it wrong."""
    factor = amplified_error_factor(op, model)
    if factor is not None:
        # Gemma 2's 30 * tanh(x / 30): ~1e-3 off on inputs near 0.02 is 3.7% of the logits (bound 2%).
        return (
            f"{_unary_kind(op).lower()} output multiplied by {factor:g}: the HTP's fp16 {_unary_kind(op).lower()} "
            f"is ~1e-3 off in absolute terms, which the factor scales up, so it stays on the CPU"
        )
    source = position_phase_source(op, model)
    if source is None:
        return None
    # fp16 keeps 11 bits: position 4000 is off by up to 2, position * inv_freq by as much, and the rotary
    # sin/cos far off at long positions (measured in the simulator: docs/benchmarks.md).
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


FOLDED_OP_TYPES = frozenset({"Shape", "Rank", "Size"})
"""Kinds that are never lowered: their outputs depend only on shapes, so they fold to constants."""


CHECKS: Mapping[str, Check] = MappingProxyType(
    {
        "Convolution": _check_conv,
        "LayerNorm": _check_layer_norm,
        "BinaryOp": _check_binary,
        "UnaryOp": _check_unary,
        "Reshape": _ok,
        "Squeeze": _ok,
        "Unsqueeze": _ok,
        "ExpandDims": _ok,
        "Flatten": _ok,
        "ConvertTensor": _check_convert,
        "Permute": _ok,
        "Transpose": _ok,
        "Concat": _ok,
        "StridedSlice": _check_strided_slice,
        "Slice": _check_slice,
        "GatherV2": _ok,
        "Cast": _check_cast,
        "Softmax": _ok,
        "MatMul": _check_matmul,
        "Const": _check_const,
    }
)
"""MNN op kind -> its parameter check: the op kinds the lowering implements (`ops.REGISTRY` has one rule
for each, a test holds them equal). Here as data, so the partition can ask without the rule bodies."""


LOWERED_OP_TYPES: frozenset[str] = frozenset(CHECKS) - {"Const"}
"""MNN op kinds with a lowering (Const only matters as a folded graph output)."""


# Ops whose outputs are never constant even with constant inputs (state, randomness, attention).
_NEVER_CONSTANT = frozenset({"Input", "Attention", "Plugin", "RandomUniform", "RandomNormal", "While", "If"})


def constant_tensors(model: MnnModel) -> set[int]:
    """Tensor indexes whose value depends on nothing but the input *shapes*.

    A tensor is constant when its producer is a Const, or reads the content of constant inputs only
    (``Shape(x)`` reads no content, so it is constant for any ``x``). ``model.ops`` must be in
    topological order, as MNN stores them.
    """
    const: set[int] = set()
    for op in model.ops:
        if op.type in _NEVER_CONSTANT or not op.outputs:
            continue
        if op.type in CONST_OP_TYPES or all(t in const for pos, t in enumerate(op.inputs) if reads_content(op, pos)):
            const.update(op.outputs)
    return const


def unsupported_reason(
    op: Op, model: MnnModel, static: Collection[int] | None = None, *, precision: bool = True
) -> str | None:
    """Why the QNN lowering cannot (or should not) take ``op``; None when it can.

    ``static``: tensors known constant at run time (default :func:`constant_tensors`). An op whose
    outputs are all constant folds away and is always accepted; otherwise the op kind must be in the
    registry and pass its parameter check, and inputs the lowering reads as parameters (shapes, axes,
    slice ranges, permutations) must be constant. With ``precision`` (the default, what the partition
    should ask) ops that fp16 on the HTP would get wrong are refused too (the rotary phase computed
    from ``position_ids``: the Cast, its scaling, the Sin/Cos); :func:`lower_subgraph` only refuses what
    it cannot lower (and logs a warning for the others).
    """
    static = constant_tensors(model) if static is None else static
    if op.outputs and all(t in static for t in op.outputs):
        return None
    if op.type in FOLDED_OP_TYPES:
        return f"{op.type} output is not constant"
    check = CHECKS.get(op.type)
    if check is None:
        return f"op kind {op.type} has no QNN lowering"
    reason = check(op, model)
    if reason is not None:
        return reason
    for pos in _param_inputs(op):
        if pos < len(op.inputs) and op.inputs[pos] not in static:
            name = model.tensor_names[op.inputs[pos]]
            return f"input #{pos} ({name!r}) sets a parameter or the output shape and must be constant"
    if precision:
        return precision_reason(op, model)
    return None


def _param_inputs(op: Op) -> tuple[int, ...]:
    """Input positions the lowering reads as parameters or bakes into a fixed output shape (shapes, axes,
    ranges, permutations): they must fold to constants."""
    n = len(op.inputs)
    own: tuple[int, ...] = ()
    if op.type == "StridedSlice":
        own = tuple(range(1, n))
    elif op.type == "Transpose":
        own = (1,)
    elif op.type == "GatherV2":
        own = (2,)
    return tuple(sorted(set(own) | set(shape_inputs(op))))


SupportCheck = Callable[[Op, MnnModel, Collection[int]], "str | None"]
"""The signature of ``unsupported_reason`` (and of test doubles of it)."""
