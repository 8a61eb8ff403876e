"""Per-shape constants: the values of folded tensors, and model copies where they are Const ops.

A folded tensor (see ``cut``) is fixed once the input shapes are, so MNN computes it from the
sample inputs; a *folded model* is the source model with the producers of those tensors replaced by
``Const`` ops holding the values. Sub-graphs of a folded model load with just their data inputs,
which is how upstream runs each subgraph, and what a QNN graph for that shape sees as static.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mnnbuild.base.errors import MNNFormatError, UpstreamError
from mnnbuild.cpu import forward_vars, import_mnn, to_numpy, to_var
from mnnbuild.mnn import MnnModel, Op, make_blob, save_model

# numpy dtype -> (MNN DataType name, BlobT field holding the values)
_BLOB_FIELDS: dict[np.dtype, tuple[str, str]] = {
    np.dtype(np.float32): ("DT_FLOAT", "float32s"),
    np.dtype(np.int32): ("DT_INT32", "int32s"),
    np.dtype(np.int64): ("DT_INT64", "int64s"),
    np.dtype(np.uint8): ("DT_UINT8", "uint8s"),
    np.dtype(np.int8): ("DT_INT8", "int8s"),
}


def forward(module: Any, arrays: Sequence[np.ndarray]) -> list[Any]:
    """Run an MNN module on numpy inputs (fed as NCHW Vars); always a list of output Vars."""
    return forward_vars(module, [to_var(a) for a in arrays])


def compute_folded(
    model_path: Path,
    samples: Sequence[Mapping[str, np.ndarray]],
    names: Sequence[str],
    model: MnnModel | None = None,
) -> list[dict[str, np.ndarray]]:
    """Per sample (graph input name -> array), the values of the named folded tensors.

    A folded tensor reads the graph's data only for its shape (``cut.fold_ops``), so it needs no layer run: MNN's
    expression API computes a tensor's content only where an op reads it, and a ``Shape`` op reads its input's
    shape only. A reshape target deep in the last layer of a Qwen3-1.7B-sized model needs no forward through the
    27 layers before it that way (values bit for bit the same; the time saved: docs/benchmarks.md), and no
    weight is decoded.

    ``model`` (the graph of ``model_path``) lets a folded ``Fill`` be made here from its folded shape and value:
    MNN's expression API refuses the 1-element value tensor ONNX's ConstantOfShape gives it (LFM2's zero conv
    state), which its engine accepts."""
    if not names:
        return [{} for _ in samples]
    expr = import_mnn().expr
    fills = _fill_inputs(model, names) if model is not None else {}
    reads = list(dict.fromkeys([n for n in names if n not in fills] + [u for pair in fills.values() for u in pair]))
    per_sample = []
    for sample in samples:
        graph = expr.load_as_dict(str(model_path))  # fresh per sample: its inputs are written in place
        for name, array in sample.items():
            if name not in graph:
                raise UpstreamError(f"{model_path}: the graph has no input {name!r} of the sample")
            value = np.ascontiguousarray(array)
            graph[name].resize(list(value.shape))
            graph[name].write(value)
        values = {}
        for n in reads:
            if n not in graph:
                raise MNNFormatError(f"{model_path}: MNN does not expose the folded tensor {n!r}")
            values[n] = _read_folded(model_path, graph[n], n)
        for n, (shape_name, value_name) in fills.items():
            fill_value = values[value_name].reshape(-1)
            if fill_value.size != 1:
                raise MNNFormatError(f"{model_path}: Fill {n!r}: value {value_name!r} has {fill_value.size} elements")
            values[n] = np.full(tuple(int(d) for d in values[shape_name].reshape(-1)), fill_value[0])
        for n in names:
            if values[n].dtype not in _BLOB_FIELDS:
                raise MNNFormatError(
                    f"{model_path}: folded tensor {n!r} has type {values[n].dtype}; expected one of "
                    f"{', '.join(str(d) for d in _BLOB_FIELDS)}"
                )
        per_sample.append({n: values[n] for n in names})
    return per_sample


def _fill_inputs(model: MnnModel, names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Folded ``Fill`` outputs among ``names`` -> the names of their shape and value inputs."""
    wanted = set(names)
    fills = {}
    for op in model.ops:
        if op.type == "Fill" and len(op.inputs) == 2 and op.outputs:
            out = model.tensor_names[op.outputs[0]]
            if out in wanted:
                fills[out] = (model.tensor_names[op.inputs[0]], model.tensor_names[op.inputs[1]])
    return fills


def _read_folded(model_path: Path, var: Any, name: str) -> np.ndarray:
    """The values of one folded tensor; MNN failing to compute it is one line naming the tensor."""
    try:
        return to_numpy(var)
    except (SystemError, RuntimeError, TypeError) as exc:
        raise UpstreamError(
            f"{model_path}: MNN cannot compute the folded tensor {name!r} from the sample's shapes ({exc})"
        ) from None


def const_op(name: str, tensor: int, value: np.ndarray, dimension_format: int) -> Op:
    """A ``Const`` op writing ``value`` to ``tensor``."""
    type_name, field_name = _BLOB_FIELDS[value.dtype]
    blob = make_blob(list(value.shape), type_name, "NCHW")
    setattr(blob, field_name, np.ascontiguousarray(value).reshape(-1))
    return Op(type="Const", name=name, outputs=[tensor], main=blob, default_dimension_format=dimension_format)


def folded_model(model: MnnModel, values: Mapping[int, np.ndarray]) -> MnnModel:
    """A copy of ``model`` whose ops producing ``values``' tensors are Const ops with those values
    (one Const per folded output). ``model`` itself is not changed."""
    ops: list[Op] = []
    for op in model.ops:
        hit = [t for t in op.outputs if t in values]
        if not hit:
            ops.append(op)
            continue
        for j, t in enumerate(hit):
            suffix = "_Const" if len(hit) == 1 else f"_Const{j}"
            ops.append(const_op(f"{op.name}{suffix}", t, values[t], op.default_dimension_format))
    return dataclasses.replace(model, ops=ops, path=None)


def write_folded_model(model: MnnModel, values: Mapping[int, np.ndarray], path: Path) -> Path:
    return save_model(folded_model(model, values), path)
