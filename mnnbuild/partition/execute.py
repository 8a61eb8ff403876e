"""Run a partitioned model (``qnn/llm.mnn``) on the CPU, one segment at a time.

PyPI MNN has no Plugin support, so the model runs as alternating steps: each maximal run of
ordinary ops is loaded from the partitioned model itself between named tensors and run by MNN;
each Plugin op is handed to a ``PluginRunner`` callback. ``SourceSubgraphRunner`` is the CPU
reference (the plugin's original ops, run from the source model); the QNN stage and ``verify``
plug in a runner that executes the plugin's QNN graph instead.

The callback gets the shape index the device runtime would pick (the block of ``allInputShape``
matching the actual input dims) and must return the outputs in the plugin's ``outputs`` order.

Layouts at the boundaries follow the device (see ``layout``; ``runtime/mnnbuild_runtime/hybrid.py``
does the same): a plugin reads and writes dense arrays in MNN's logical NCHW order, whatever layout
MNN keeps the tensor in; an output is converted into the layout its ``o_<shape>_<j>`` Blob names
(NC4HW4 for a Convolution output) before CPU ops read it. Values passed between CPU segments keep
MNN's own layout.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mnnbuild.cpu import CpuRuntime, load_module
from mnnbuild.errors import StageError
from mnnbuild.mnn import MnnModel, Op, load_model, plugin_attributes
from mnnbuild.mnn.semantics import CONST_OP_TYPES
from mnnbuild.partition.fold import forward, forward_vars, write_folded_model
from mnnbuild.partition.layout import NHWC, BoundaryValue, blob_format
from mnnbuild.partition.records import SubgraphRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginCall:
    """One Plugin op to execute, with its inputs."""

    op_index: int
    """Index of the Plugin op in the partitioned model."""
    name: str
    attrs: dict[str, Any]
    shape_index: int
    input_names: list[str]
    """MNN tensor names of the inputs (the same names as in the source model)."""
    output_names: list[str]
    inputs: list[np.ndarray]
    """In the op's input order, which is the order of ``attrs["inputs"]`` (QNN names)."""

    @property
    def graph_name(self) -> str:
        return str(self.attrs["allGraphName"][self.shape_index])

    @property
    def qnn_inputs(self) -> list[str]:
        return list(self.attrs["inputs"])

    @property
    def qnn_outputs(self) -> list[str]:
        return list(self.attrs["outputs"])


PluginRunner = Callable[[PluginCall], Sequence[np.ndarray]]
"""Returns the plugin's outputs as dense arrays in logical NCHW order, as a QNN graph writes them."""


def shape_index(all_input_shape: Sequence[int], input_shapes: Sequence[Sequence[int]]) -> int:
    """The shape block of ``allInputShape`` equal to the inputs' dims, as the device runtime picks it.
    All-scalar inputs select block 0."""
    flat = [int(d) for shape in input_shapes for d in shape]
    if not flat:
        return 0
    blocks = len(all_input_shape) // len(flat)
    for s in range(blocks):
        if list(all_input_shape[s * len(flat) : (s + 1) * len(flat)]) == flat:
            return s
    raise StageError(
        f"plugin inputs of shapes {[list(s) for s in input_shapes]} match no block of allInputShape "
        f"{list(all_input_shape)}"
    )


@dataclass
class _Segment:
    ops: list[int]
    inputs: list[int]
    outputs: list[int]
    plugin: Op | None = None
    module: Any = field(default=None, repr=False)


def _plan_segments(model: MnnModel) -> list[_Segment]:
    """Group ops (in model order) into CPU runs and single plugins, with their boundary tensors."""
    const_made = {t for op in model.ops if op.type in CONST_OP_TYPES for t in op.outputs}
    steps: list[list[int]] = []
    current: list[int] = []
    for i, op in enumerate(model.ops):
        if op.type == "Input" or op.type in CONST_OP_TYPES:
            continue  # inputs come from the caller; MNN pulls Const ops into each segment itself
        if op.type == "Plugin":
            if current:
                steps.append(current)
                current = []
            steps.append([i])
        else:
            current.append(i)
    if current:
        steps.append(current)
    readers: dict[int, set[int]] = {}
    for pos, ops in enumerate(steps):
        for i in ops:
            for t in model.ops[i].inputs:
                readers.setdefault(t, set()).add(pos)
    graph_outputs = set(model.output_indexes)
    segments = []
    for pos, ops in enumerate(steps):
        made = {t for i in ops for t in model.ops[i].outputs}
        read = [t for i in ops for t in model.ops[i].inputs if t >= 0]
        inputs = sorted({t for t in read if t not in made and t not in const_made})
        outputs = sorted(t for t in made if t in graph_outputs or readers.get(t, set()) - {pos})
        plugin = model.ops[ops[0]] if model.ops[ops[0]].type == "Plugin" else None
        if plugin is not None:
            inputs, outputs = list(plugin.inputs), list(plugin.outputs)
        segments.append(_Segment(ops=ops, inputs=inputs, outputs=outputs, plugin=plugin))
    return segments


class HybridExecutor:
    """Runs a partitioned model: CPU segments with MNN, Plugin ops with ``run_plugin``."""

    def __init__(
        self,
        model_path: Path,
        weight_path: Path,
        run_plugin: PluginRunner,
        runtime: CpuRuntime | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.model = load_model(self.model_path)
        self.run_plugin = run_plugin
        self.rt = (runtime or CpuRuntime()).create(weight_path)
        self.segments = _plan_segments(self.model)

    @property
    def plugin_count(self) -> int:
        return sum(1 for s in self.segments if s.plugin is not None)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the whole graph on ``feeds`` (graph input name -> array); returns the graph outputs."""
        names = self.model.tensor_names
        missing = [n for n in self.model.input_names if n not in feeds]
        if missing:
            raise StageError(f"{self.model_path}: input {missing[0]!r} not given; expected {self.model.input_names}")
        env: dict[int, BoundaryValue] = {
            self.model.tensor_index(n): BoundaryValue(array=np.asarray(feeds[n])) for n in self.model.input_names
        }
        for seg in self.segments:
            if seg.plugin is not None:
                outs = self._plugin(seg, [env[t].as_array() for t in seg.inputs])
                for t, (array, fmt) in zip(seg.outputs, outs, strict=True):
                    env[t] = BoundaryValue(array=array, fmt=fmt)
                continue
            if seg.module is None:
                seg.module = load_module(
                    self.model_path, self.rt, [names[t] for t in seg.inputs], [names[t] for t in seg.outputs]
                )
            out_vars = forward_vars(seg.module, [env[t].as_var() for t in seg.inputs])
            for t, var in zip(seg.outputs, out_vars, strict=True):
                env[t] = BoundaryValue(var=var)
        return {n: env[self.model.tensor_index(n)].as_array() for n in self.model.output_names}

    def _plugin(self, seg: _Segment, values: list[np.ndarray]) -> list[tuple[np.ndarray, str]]:
        """Run one plugin; returns each output's dense array and the layout its ``o_*`` Blob names."""
        op = seg.plugin
        assert op is not None
        attrs = plugin_attributes(op)
        names = self.model.tensor_names
        call = PluginCall(
            op_index=seg.ops[0],
            name=op.name,
            attrs=attrs,
            shape_index=shape_index(attrs["allInputShape"], [v.shape for v in values]),
            input_names=[names[t] for t in seg.inputs],
            output_names=[names[t] for t in seg.outputs],
            inputs=values,
        )
        outs = [np.asarray(o) for o in self.run_plugin(call)]
        if len(outs) != len(seg.outputs):
            raise StageError(f"plugin {op.name}: runner returned {len(outs)} outputs, expected {len(seg.outputs)}")
        result = []
        for j, out in enumerate(outs):
            key = f"o_{call.shape_index}_{j}"
            blob = attrs.get(key)
            if blob is None:
                raise StageError(f"plugin {op.name}: attribute {key} missing; expected the Blob of output {j}")
            want = [] if blob.dims is None else [int(d) for d in blob.dims]
            fmt = blob_format(blob)
            # an NHWC Blob lists MNN's NHWC dims while the graph writes NCHW order: only sizes compare
            same = out.size == int(np.prod(want)) if fmt == NHWC else list(out.shape) == want
            if not same:
                raise StageError(
                    f"plugin {op.name}: output {j} ({call.qnn_outputs[j]}) has shape {list(out.shape)}, "
                    f"attribute {key} says {want}"
                )
            result.append((out, fmt))
        return result


class SourceSubgraphRunner:
    """The CPU reference for a plugin: its original ops, run by MNN from the source model between
    the plugin's boundary tensor names, with that graph's folded per-shape constants in place."""

    def __init__(self, source_model: Path, weight_path: Path, qnn_dir: Path, runtime: CpuRuntime | None = None) -> None:
        self.source = load_model(source_model)
        self.qnn_dir = Path(qnn_dir)
        self.rt = (runtime or CpuRuntime()).create(weight_path)
        self._work = tempfile.TemporaryDirectory(prefix="mnnbuild-ref-")
        self._modules: dict[str, Any] = {}

    def close(self) -> None:
        self._work.cleanup()

    def __enter__(self) -> SourceSubgraphRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _module(self, call: PluginCall) -> Any:
        graph = call.graph_name
        if graph not in self._modules:
            graph_dir = self.qnn_dir / graph
            desc = SubgraphRecord.read(graph_dir)
            folded = desc.load_folded(graph_dir)
            path = write_folded_model(self.source, folded, Path(self._work.name) / f"{graph}.mnn")
            self._modules[graph] = load_module(path, self.rt, call.input_names, call.output_names)
        return self._modules[graph]

    def __call__(self, call: PluginCall) -> list[np.ndarray]:
        # dense logical NCHW, what the plugin's QNN graph writes whatever layout MNN keeps the tensor in
        return [BoundaryValue(var=v).as_array() for v in forward(self._module(call), call.inputs)]
