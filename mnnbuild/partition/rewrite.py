"""The rewrite: each NPU module becomes one ``Plugin(type="QNN")`` op in ``qnn/llm.mnn``.

Attributes of a plugin, per sample shape ``s`` (decode first):

- ``path``: ``qnn/graphllm<k>.bin`` (also the op name, which is how shapes are matched when fusing);
- ``inputs`` / ``outputs``: QNN tensor names ``t<source index>`` in the op's input/output order;
- ``allGraphName``: ``[graphllm<k>, graphllm1_<k>, ...]``, one graph per shape, in shape order;
- ``allInputShape``: the dims of every input, concatenated, one block per shape (the runtime picks
  the shape whose block equals the actual input dims);
- ``o_<s>_<j>``: a Blob for output ``j`` at shape ``s``: ``dims`` and ``dataType`` are those of the QNN
  graph's output tensor, a dense array in MNN's logical NCHW order (an NC4HW4 tensor counts as its
  NCHW dims); ``dataFormat`` is the layout MNN keeps the tensor in (the source graph's: NC4HW4 for a
  Convolution output), into which the device runtime converts the dense output before CPU ops read
  it, as upstream ``compilefornpu`` writes it (see ``layout``).

As upstream, each shape first gets its own attribute set and later shapes are fused into the first
(lists appended, new keys added, ``inputs``/``outputs`` kept from the first). ``state`` (KV cache on
the NPU) is never written: with the QNN lowering refusing Attention, no plugin holds a KV cache.

The CPU side keeps the source ops the cut marked (with their original parameters, so external
weight offsets into ``llm.mnn.weight`` stay valid and shape arithmetic still follows the real
input shapes); then tensors are re-indexed and ops topologically ordered. Ops are laid out in the
cut's schedule (``Cut.order``), each plugin where its first op was, so the device runs the CPU ops
in the order the modules were cut in (the rotary phase before the first plugin, not inside it).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mnnbuild.cpu import BLOB_FORMATS, NCHW
from mnnbuild.mnn import MnnModel, Op, attribute_value, make_blob, make_plugin_op, schema
from mnnbuild.partition.cut import Cut, Module
from mnnbuild.partition.records import TensorSpec, qnn_name
from mnnbuild.pipeline.layout import LLM_GRAPHS, binary_path, graph_name

PLUGIN_TYPE = "QNN"
_DTYPE_NAMES = {"float32": "DT_FLOAT", "int32": "DT_INT32", "int64": "DT_INT64", "uint8": "DT_UINT8", "int8": "DT_INT8"}


def shape_attributes(
    m: Module,
    shape_index: int,
    graph_index: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    prefix: str = LLM_GRAPHS,
) -> dict[str, Any]:
    """The attributes of plugin ``m`` for sample shape ``shape_index`` (which names its graph), its
    ``graph_index``-th graph (which numbers its output blobs, as the engine reads them), before fusing (``prefix``:
    the graph names')."""
    assert m.graph is not None
    attrs: dict[str, Any] = {
        "path": binary_path(m.graph, prefix),
        "inputs": [qnn_name(t) for t in m.inputs],
        "outputs": [qnn_name(t) for t in m.outputs],
        "allGraphName": [graph_name(shape_index, m.graph, prefix)],
        "allInputShape": [d for spec in inputs for d in spec.shape],
    }
    for j, spec in enumerate(outputs):
        if spec.dtype not in _DTYPE_NAMES:
            raise ValueError(f"output {spec.name!r} has type {spec.dtype}, which a plugin output cannot carry")
        fmt = spec.format if spec.format in BLOB_FORMATS else NCHW
        attrs[f"o_{graph_index}_{j}"] = make_blob(spec.shape, _DTYPE_NAMES[spec.dtype], fmt)
    return attrs


def fuse_attributes(first: dict[str, Any], later: Mapping[str, Any]) -> dict[str, Any]:
    """Fuse a later shape's attributes into the first shape's: new keys are added, lists are
    appended, ``inputs``/``outputs`` and other scalars keep the first shape's values."""
    fused = dict(first)
    for key, value in later.items():
        if key in ("inputs", "outputs"):
            continue
        if key not in fused:
            fused[key] = value
        elif isinstance(fused[key], list) and isinstance(value, list):
            fused[key] = [*fused[key], *value]
    return fused


def plugin_op(m: Module, attrs: Mapping[str, Any], prefix: str = LLM_GRAPHS) -> Op:
    assert m.graph is not None
    return make_plugin_op(binary_path(m.graph, prefix), m.inputs, m.outputs, attrs, plugin_type=PLUGIN_TYPE)


def rewrite_model(cut: Cut, plugin_attrs: Mapping[int, Mapping[str, Any]], prefix: str = LLM_GRAPHS) -> MnnModel:
    """``qnn/llm.mnn`` as a new model: CPU ops of the source plus one Plugin per NPU module,
    re-indexed and ordered. ``plugin_attrs`` maps plugin number -> fused attributes."""
    src = cut.model
    first_op = {m.ops[0]: m for m in cut.plugins}
    keep = set(cut.cpu_ops)
    ops: list[Op] = []
    for i in cut.order:
        op = src.ops[i]
        if i in first_op:
            m = first_op[i]
            assert m.graph is not None
            ops.append(plugin_op(m, plugin_attrs[m.graph], prefix))
        elif i in keep:
            # a shallow copy: re-indexing replaces the index lists, parameters are shared read-only
            ops.append(dataclasses.replace(op, inputs=list(op.inputs), outputs=list(op.outputs)))
    model = dataclasses.replace(
        src,
        ops=ops,
        tensor_names=list(src.tensor_names),
        output_names=list(src.output_names),
        extra_tensor_describe=copy.deepcopy(src.extra_tensor_describe),
        path=None,
    )
    # the schedule is topological and a plugin's inputs are made before its first op, so this only
    # guards the invariant (ties keep the schedule)
    model.topological_sort()
    model.reindex_tensors()
    return model


def plugin_attrs_of(op: Op) -> dict[str, Any]:
    """Attributes of a Plugin op as plain Python values (Blobs as dicts), for reports and tests."""
    result: dict[str, Any] = {}
    for attr in op.main.attr or []:
        value = attribute_value(attr)
        if isinstance(value, schema.BlobT):
            dims = [] if value.dims is None else [int(d) for d in np.asarray(value.dims).reshape(-1)]
            value = {"dims": dims, "dataType": int(value.dataType), "dataFormat": int(value.dataFormat)}
        result[attr.key] = value
    return result
