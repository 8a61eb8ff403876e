"""Which MNN ops the QNN lowering can put on the NPU, with a reason for every refusal.

The partition stage calls ``unsupported_reason`` for each op it would place in a QNN subgraph; an
op that gets a reason becomes a break op, stays on the CPU and is listed with that reason in the
partition report. The table below is the lowering's commitment (issue 5): every op kind it
accepts, with the parameter checks it needs. Ops whose outputs the partition constant-folds per
shape (``Shape``, ``Rank`` and the integer arithmetic on them) never reach the lowering; the
tensors they produce arrive as static inputs, which is what ``static`` tells the checks here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from mnnbuild.mnn import MnnModel, Op, enum_name, schema

SupportCheck = Callable[[Op, MnnModel, Collection[int]], "str | None"]
"""The signature of ``unsupported_reason`` (and of test doubles of it)."""

BINARY_OPS = frozenset({"ADD", "SUB", "MUL", "DIV", "REALDIV", "MAXIMUM", "MINIMUM", "MUL_SILU"})
"""Element-wise binary kinds with a direct QNN ElementWise op (MUL_SILU: x * silu(y), two ops)."""
UNARY_OPS = frozenset(
    {"NEG", "SIN", "COS", "EXP", "SQRT", "RSQRT", "ABS", "SQUARE", "RECIPROCAL", "SIGMOID", "TANH", "SILU", "GELU"}
)
"""Element-wise unary kinds with a QNN ElementWise/activation op."""
CAST_TARGETS = frozenset({"DT_FLOAT", "DT_INT32"})
"""Element types the NPU graphs carry (fp16 on the HTP for float, int32 for indices)."""
SHAPE_OPS = frozenset({"Shape", "Rank", "Size"})

# Layout-only ops: on the NPU every tensor is a plain dense tensor, so these are reshapes or no-ops.
_LAYOUT_OPS = frozenset({"ConvertTensor"})


def static_tensors(model: MnnModel) -> set[int]:
    """Tensors written by ``Const``/``TrainableParam`` ops: the ones static without any folding."""
    return {t for op in model.ops if op.type in ("Const", "TrainableParam") for t in op.outputs}


def _need_static(op: Op, model: MnnModel, static: Collection[int], positions: tuple[int, ...], what: str) -> str | None:
    for pos in positions:
        if pos < len(op.inputs) and op.inputs[pos] not in static:
            name = model.tensor_names[op.inputs[pos]]
            return f"{what} (input #{pos} {name!r}) is not constant"
    return None


def _convolution(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
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
        return f"{len(op.inputs)} inputs; only a weight-carrying convolution with one input is lowered"
    return None


def _layer_norm(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
    p = op.main
    if op.param_type != "LayerNorm" or p is None:
        return "LayerNorm without parameters"
    axes = [int(a) for a in (p.axis if p.axis is not None else [])]
    if axes != [-1]:
        return f"normalizes over axes {axes}; only the last axis is lowered"
    if p.group not in (0, 1):
        return f"group {p.group}; only group 1 is lowered"
    return None


def _binary(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
    kind = enum_name(schema.BinaryOpOperation, op.main.opType) if op.main is not None else "?"
    if kind not in BINARY_OPS:
        return f"BinaryOp {kind} has no QNN lowering (lowered: {', '.join(sorted(BINARY_OPS))})"
    return None


def _unary(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
    kind = enum_name(schema.UnaryOpOperation, op.main.opType) if op.main is not None else "?"
    if kind not in UNARY_OPS:
        return f"UnaryOp {kind} has no QNN lowering (lowered: {', '.join(sorted(UNARY_OPS))})"
    return None


def _reshape(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
    if len(op.inputs) > 1:
        return _need_static(op, model, static, (1,), "target shape")
    if op.main is None or op.main.dims is None:
        return "Reshape without a target shape"
    return None


def _squeeze(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
    return _need_static(op, model, static, (1,), "axes")


def _transpose(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
    if op.type == "Transpose":
        return _need_static(op, model, static, (1,), "permutation")
    return None


def _slice(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
    if op.type == "StridedSlice":
        p = op.main
        if p is not None and (p.ellipsisMask or p.newAxisMask):
            return "StridedSlice with ellipsis or new-axis masks"
        return _need_static(op, model, static, tuple(range(1, len(op.inputs))), "slice range")
    return _need_static(op, model, static, (1,), "slice points")


def _gather(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
    return _need_static(op, model, static, (2,), "axis")


def _cast(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
    if op.main is None:
        return "Cast without parameters"
    target = enum_name(schema.DataType, op.main.dstT)
    if target not in CAST_TARGETS:
        return f"Cast to {target}; only {', '.join(sorted(CAST_TARGETS))} are lowered"
    return None


def _always(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
    return None


def _shape_op(op: Op, model: MnnModel, static: Collection[int]) -> str | None:
    # Reached only when folding failed, e.g. the partition was told not to fold.
    return f"{op.type} must be constant-folded before lowering"


_CHECKS: dict[str, Callable[[Op, MnnModel, Collection[int]], str | None]] = {
    "Convolution": _convolution,
    "LayerNorm": _layer_norm,
    "BinaryOp": _binary,
    "UnaryOp": _unary,
    "Reshape": _reshape,
    "Squeeze": _squeeze,
    "Unsqueeze": _squeeze,
    "ConvertTensor": _always,
    "Permute": _transpose,
    "Transpose": _transpose,
    "Concat": _always,
    "StridedSlice": _slice,
    "Slice": _slice,
    "GatherV2": _gather,
    "Cast": _cast,
    "Softmax": _always,
    "MatMul": _always,
    **{name: _shape_op for name in SHAPE_OPS},
}

LOWERED_OP_TYPES: frozenset[str] = frozenset(_CHECKS) - SHAPE_OPS
"""Op kinds the QNN lowering implements (shape ops only as folded constants)."""


def unsupported_reason(op: Op, model: MnnModel, static: Collection[int] | None = None) -> str | None:
    """Why the QNN lowering cannot take ``op``, or None when it can.

    ``static`` holds the tensor indexes known to be constant when the op runs (Const outputs and the
    partition's per-shape folded tensors); by default only the model's Const outputs.
    """
    check = _CHECKS.get(op.type)
    if check is None:
        return f"op kind {op.type} has no QNN lowering"
    return check(op, model, static_tensors(model) if static is None else static)


def describe() -> dict[str, Any]:
    """The table as data, for reports."""
    return {
        "op_types": sorted(LOWERED_OP_TYPES),
        "binary": sorted(BINARY_OPS),
        "unary": sorted(UNARY_OPS),
        "cast_targets": sorted(CAST_TARGETS),
    }
