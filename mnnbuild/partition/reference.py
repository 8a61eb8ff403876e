"""Sub-module IO: run every module of a cut in order on one sample, as upstream does.

Each module is loaded once, between its boundary tensor names, and run at every sample shape, fed the
outputs of the modules before it and that shape's folded values; its inputs and outputs are the
references the QNN stage and ``verify`` compare against. For NPU modules the run also asks MNN for
every tensor the module makes, which gives the shape and type of each internal tensor at each shape.

Each module is fed its inputs in the layout MNN gives them in the whole graph (an NC4HW4 tensor as
an NC4HW4 Var): MNN sub-modules adopt the layout of the Vars they are fed, so a Convolution fed an
NCHW Var would report an NCHW output, and the recorded format (which becomes the plugin's ``o_*``
format) would depend on where the cut fell instead of on the model.

``SourceSubgraphRunner`` is the CPU reference of one plugin graph: its original ops, run from the source
model with that graph's folded per-shape constants. Given to ``mnnbuild_runtime``'s hybrid executor in
place of the HTP simulator, it runs a partitioned ``qnn/llm.mnn`` wholly on the CPU.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mnnbuild.base.errors import StageError
from mnnbuild.base.logs import progress
from mnnbuild.cpu import (
    NCHW,
    BoundaryValue,
    CpuRuntime,
    forward_vars,
    load_module,
    return_freed_memory,
    to_numpy,
    var_format,
)
from mnnbuild.mnn import MnnModel, load_model
from mnnbuild.partition.cut import Cut, Module
from mnnbuild.partition.fold import forward, write_folded_model
from mnnbuild.partition.records import SubgraphRecord, TensorSpec, qnn_name

log = logging.getLogger(__name__)


@dataclass
class ModuleIO:
    """One module's reference values at one shape (source tensor index -> array)."""

    inputs: dict[int, np.ndarray]
    outputs: dict[int, np.ndarray]
    specs: dict[int, TensorSpec] = field(default_factory=dict)
    """Every boundary (and, for NPU modules, internal) tensor with shape, dtype and MNN format."""


def spec_of(cut: Cut, index: int, array: np.ndarray, fmt: str) -> TensorSpec:
    return TensorSpec(
        index=index,
        name=cut.model.tensor_names[index],
        qnn_name=qnn_name(index),
        shape=[int(d) for d in array.shape],
        dtype=str(array.dtype),
        format=fmt,
    )


def _names(cut: Cut, tensors: list[int]) -> list[str]:
    return [cut.model.tensor_names[t] for t in tensors]


def run_modules(
    cut: Cut,
    source_of: Callable[[Module], Path],
    rt: Any,
    shapes: Sequence[tuple[Mapping[str, np.ndarray], Mapping[int, np.ndarray]]],
    label: str,
) -> list[tuple[list[ModuleIO], dict[int, np.ndarray]]]:
    """Run all modules of ``cut`` at each sample shape, given as (graph input name -> array, folded tensor ->
    value). Returns, per shape, each module's IO and the final tensor values.

    Each module is loaded once from its source model (``source_of``: the fetched one, or the split model for the
    modules holding split ops; MNN reads the whole file per load), the folded values it reads fed as inputs next
    to its data inputs, and run at every shape: MNN prepares a module's weights when it first runs it, so loading a
    module per shape (from that shape's folded model) paid for a layer's weights twice."""
    model = cut.model
    names = model.tensor_names
    frontier = set(cut.frontier)
    envs: list[dict[int, np.ndarray]] = [{t: np.asarray(feeds[names[t]]) for t in cut.inputs} for feeds, _ in shapes]
    formats: list[dict[int, str]] = [dict.fromkeys(cut.inputs, NCHW) for _ in shapes]
    results: list[list[ModuleIO]] = [[] for _ in shapes]
    for m in progress(cut.modules, desc=f"partition: subgraphs {label} on the CPU", unit="subgraph"):
        missing = [t for t in m.inputs if t not in envs[0]]
        if missing:
            raise StageError(f"partition: tensor {names[missing[0]]!r} is read before any subgraph makes it")
        if not m.inputs:
            raise StageError(f"partition: subgraph at op {model.ops[m.ops[0]].name!r} has no data input")
        fixed = sorted({t for i in m.ops for t in model.ops[i].inputs if t in frontier} - set(m.inputs))
        # an NPU module's internal tensors need specs too: asked for in the same run (a second run of the module
        # for them was a large share of the stage at real size)
        made = sorted(m.produced - set(m.outputs)) if m.graph is not None else []
        model_path = source_of(m)
        module = load_module(model_path, rt, _names(cut, [*m.inputs, *fixed]), _names(cut, [*m.outputs, *made]))
        if module is None:
            raise StageError(
                f"{model_path}: MNN could not load the sub-graph {_names(cut, m.inputs)} -> {_names(cut, m.outputs)}"
            )
        for (_, folded), env, fmt, res in zip(shapes, envs, formats, results, strict=True):
            fed = [BoundaryValue(array=env[t], fmt=fmt[t]).as_var() for t in m.inputs]
            fed += [BoundaryValue(array=np.asarray(folded[t]), fmt=NCHW).as_var() for t in fixed]
            out_vars = forward_vars(module, fed)
            io = ModuleIO(inputs={t: env[t] for t in m.inputs}, outputs={})
            for t, var in zip(m.outputs, out_vars[: len(m.outputs)], strict=True):
                env[t] = io.outputs[t] = to_numpy(var)
                fmt[t] = var_format(var)
            io.specs = {t: spec_of(cut, t, env[t], fmt[t]) for t in (*m.inputs, *m.outputs)}
            internal = out_vars[len(m.outputs) :]
            io.specs |= {t: spec_of(cut, t, to_numpy(v), var_format(v)) for t, v in zip(made, internal, strict=True)}
            res.append(io)
        del module
    log.debug("ran %d subgraphs at %d shapes for %s", len(cut.modules), len(shapes), label)
    return list(zip(results, envs, strict=True))


class SourceSubgraphRunner:
    """The CPU reference for a plugin graph: its original ops, run by MNN from the source model between
    the plugin's boundary tensor names, with that graph's folded per-shape constants in place."""

    def __init__(self, source_model: Path, weight_path: Path, qnn_dir: Path, runtime: CpuRuntime | None = None) -> None:
        self.source = load_model(source_model)
        self.source_path = Path(source_model)
        self.qnn_dir = Path(qnn_dir)
        self._split: dict[Path, MnnModel] = {}  # the partition's split models, for the graphs that index one
        self.rt = (runtime or CpuRuntime()).create(weight_path)
        self._work = tempfile.TemporaryDirectory(prefix="mnnbuild-ref-")
        self._modules: dict[str, Any] = {}

    def close(self) -> None:
        self._work.cleanup()

    def __enter__(self) -> SourceSubgraphRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _module(self, graph: str, input_names: Sequence[str], output_names: Sequence[str]) -> Any:
        if graph not in self._modules:
            graph_dir = self.qnn_dir / graph
            desc = SubgraphRecord.read(graph_dir)
            folded = desc.load_folded(graph_dir)
            source = self.source
            if desc.split_model:
                split = desc.model_file(self.source_path, self.qnn_dir.parent, graph_dir)
                if split not in self._split:
                    self._split[split] = load_model(split)
                source = self._split[split]
            if folded or source.path is None:
                path = write_folded_model(source, folded, Path(self._work.name) / f"{graph}.mnn")
            else:  # nothing to fold in: MNN reads the source itself (a split model is ~200 MB to copy)
                path = source.path
            self._modules[graph] = load_module(path, self.rt, list(input_names), list(output_names))
        return self._modules[graph]

    def release(self, graph: str) -> None:
        """Free graph ``graph``'s module (a layer's weights in float32), e.g. once it has run every input it will."""
        if self._modules.pop(graph, None) is not None:
            return_freed_memory()

    def run(
        self, graph: str, input_names: Sequence[str], output_names: Sequence[str], inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """Graph ``graph``'s outputs (named ``output_names``) for ``inputs`` (named ``input_names``), as dense
        logical-NCHW arrays: what the plugin's QNN graph writes, whatever layout MNN keeps the tensor in."""
        module = self._module(graph, input_names, output_names)
        return [BoundaryValue(var=v).as_array() for v in forward(module, list(inputs))]
