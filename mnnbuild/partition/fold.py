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

from mnnbuild.base.errors import StageError
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
    model_path: Path, samples: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]
) -> list[dict[str, np.ndarray]]:
    """Per sample (graph input name -> array), the values of the named folded tensors.

    A folded tensor reads the graph's data only for its shape (``cut.fold_ops``), so it needs no layer run: MNN's
    expression API computes a tensor's content only where an op reads it, and a ``Shape`` op reads its input's
    shape only. A reshape target deep in the last layer of a Qwen3-1.7B-sized model needs no forward through the
    27 layers before it that way (values bit for bit the same; the time saved: docs/benchmarks.md), and no
    weight is decoded."""
    if not names:
        return [{} for _ in samples]
    expr = import_mnn().expr
    per_sample = []
    for sample in samples:
        graph = expr.load_as_dict(str(model_path))  # fresh per sample: its inputs are written in place
        for name, array in sample.items():
            if name not in graph:
                raise StageError(f"{model_path}: the graph has no input {name!r} of the sample")
            value = np.ascontiguousarray(array)
            graph[name].resize(list(value.shape))
            graph[name].write(value)
        values = {}
        for n in names:
            if n not in graph:
                raise StageError(f"{model_path}: MNN does not expose the folded tensor {n!r}")
            values[n] = to_numpy(graph[n])
            if values[n].dtype not in _BLOB_FIELDS:
                raise StageError(
                    f"{model_path}: folded tensor {n!r} has type {values[n].dtype}; expected one of "
                    f"{', '.join(str(d) for d in _BLOB_FIELDS)}"
                )
        per_sample.append(values)
    return per_sample


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
