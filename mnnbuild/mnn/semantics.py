"""Facts about MNN ops (what the partition and the lowering ask), as MNN's own shape inference defines them.

Two different questions, answered per input position:

- does the op read the *content* of input ``i`` at all (``reads_content``)? ``Shape(x)`` only
  looks at the shape of ``x``; such edges let a value be folded per shape even though ``x`` is
  not constant.
- does the *output shape* depend on the content of input ``i`` (``shape_inputs``)? A ``Reshape``
  whose target shape is computed at run time cannot be compiled into a fixed-shape NPU graph.

Both tables follow MNN's ``OpCommonUtils::opNeedContent`` and ``SizeComputer::needInputContent``
(the ``REGISTER_SHAPE_INPUTS`` registrations) of MNN 3.x.
"""

from __future__ import annotations

from collections.abc import Collection

from mnnbuild.mnn.model import MnnModel, Op

# Ops that never read their inputs' content (only shapes), per input position (None: every input).
_NO_CONTENT: dict[str, tuple[int, ...] | None] = {
    "ZerosLike": None,
    "ZeroGrad": None,
    "Shape": None,
    "Rank": None,
    "Const": None,
    "Size": None,
    "PriorBox": None,
    "Interp": (1,),
    "Crop": (1,),
    "Reshape": (1,),
    "Reduction": (1,),
    "Resize": (1,),
    "GridSample": (2,),
}

# Inputs whose content determines the output shape, per op kind.
_SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "BatchToSpaceND": (1, 2),
    "Col2Im": (1,),
    "CosineSimilarity": (2,),
    "CropAndResize": (3,),
    "ExpandDims": (1,),
    "Fill": (0,),
    "GatherV2": (2,),
    "GridSample": (2,),
    "Interp": (1,),
    "Interp3D": (1,),
    "LinSpace": (2,),
    "NonMaxSuppressionV2": (2, 3),
    "Padding": (1,),
    "RandomNormal": (0,),
    "RandomUniform": (0,),
    "Range": (0, 1, 2),
    "Reduction": (1,),
    "QuantizedReshape": (1,),
    "Reshape": (1,),
    "Segment": (1,),
    "BroadcastTo": (1,),
    "OneHot": (1,),
    "ScatterNd": (2,),
    "SetDiff1D": (0, 1),
    "Unique": (0,),
    "Slice": (1,),
    "SliceTf": (1, 2),
    "SpaceToBatchND": (1, 2),
    "Stft": (1,),
    "TensorArray": (0,),
    "TensorArrayErase": (1,),
    "TensorArrayGather": (1,),
    "TensorArrayInsert": (1,),
    "TensorArrayRead": (1,),
    "TensorArrayScatter": (1,),
    "TensorArraySplit": (2,),
    "TensorArrayWrite": (1,),
    "Tile": (1,),
    "TopKV2": (1, 2),
    "Transpose": (1,),
    "Where": (0,),
    "CumSum": (1,),
}

CONST_OP_TYPES = frozenset({"Const", "TrainableParam"})
"""Ops whose outputs are constant by construction."""
SOURCE_OP_TYPES = CONST_OP_TYPES | {"Input"}
"""Ops that compute nothing (MNN's ``needComputeOp`` is false for them)."""


def reads_content(op: Op, position: int) -> bool:
    """Whether ``op`` reads the values (not just the shape) of its input at ``position``."""
    if op.type not in _NO_CONTENT:
        return True
    positions = _NO_CONTENT[op.type]
    return positions is not None and position not in positions


def shape_inputs(op: Op) -> tuple[int, ...]:
    """Input positions whose content decides ``op``'s output shape."""
    n = len(op.inputs)
    if op.type == "Deconvolution" and op.main is not None and getattr(op.main, "common", None) is not None:
        if op.main.common.hasOutputShape:
            return (n - 1,)
    if op.type in ("Squeeze", "Unsqueeze", "ReverseSequence", "Reverse"):
        return (1,) if n > 1 else ()
    if op.type == "StridedSlice" and op.param_type == "StridedSliceParam":
        if op.main.fromType == 0:
            # MNN: the 5-input TF form is a slice *write*, whose shape is its first input's
            return () if n == 5 else tuple(range(1, n))
        # ONNX Slice form: starts, ends and the optional axes and steps (llmexport's chunk() has no steps)
        return tuple(range(1, n))
    return tuple(i for i in _SHAPE_INPUTS.get(op.type, ()) if i < n)


def needed_ops(model: MnnModel, inputs: Collection[int], outputs: Collection[int]) -> list[int]:
    """Ops that help compute ``outputs`` from ``inputs``, in source order (Input/Const ops excluded)."""
    producers: dict[int, list[int]] = {}
    for i, op in enumerate(model.ops):
        for t in op.outputs:
            producers.setdefault(t, []).append(i)
    stop = set(inputs)
    wanted = [t for t in outputs if t not in stop]
    seen_t = set(wanted)
    chosen: set[int] = set()
    while wanted:
        t = wanted.pop()
        for i in producers.get(t, ()):
            if i in chosen:
                continue
            chosen.add(i)
            for u in model.ops[i].inputs:
                if u >= 0 and u not in stop and u not in seen_t:
                    seen_t.add(u)
                    wanted.append(u)
    return [i for i in sorted(chosen) if model.ops[i].type not in SOURCE_OP_TYPES]
