"""The partition's graph dirs and what goes into them: each plugin graph's description (``graph.json``) and
reference values, the convolutions split by output channels to bound a plugin's weights, the sample runs that
check the cut (chained subgraphs reproduce the whole graph) and the plugins' attributes per sample shape.

Library code of the partition stage (``mnnbuild.stages.partition``), which knows nothing of stages.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mnnbuild.base.errors import ToleranceError
from mnnbuild.base.fsutil import atomic_write_text
from mnnbuild.cpu import save_vars
from mnnbuild.mnn import MnnModel, enum_name, schema
from mnnbuild.mnn.semantics import CONST_OP_TYPES
from mnnbuild.mnn.split import conv_parameters, split_bounds, split_convolution, unsplittable
from mnnbuild.mnn.weights import WeightFile
from mnnbuild.model.modeldir import ModelPart
from mnnbuild.partition.cut import Cut, Module
from mnnbuild.partition.fold import compute_folded
from mnnbuild.partition.records import (
    INLINE_VALUES_MAX,
    ConstTensor,
    FoldedTensor,
    OpRef,
    SubgraphRecord,
    TensorSpec,
    qnn_name,
)
from mnnbuild.partition.reference import ModuleIO, run_modules
from mnnbuild.partition.rewrite import fuse_attributes, shape_attributes
from mnnbuild.pipeline.layout import (
    FOLDED_VALUES,
    GRAPH_FILE,
    REFERENCE_INPUT,
    REFERENCE_OUTPUT,
    binary_path,
    graph_name,
    testdir,
)

log = logging.getLogger(__name__)

_BLOB_DTYPES = {"DT_FLOAT": "float32", "DT_INT32": "int32", "DT_INT64": "int64", "DT_UINT8": "uint8", "DT_INT8": "int8"}
CHAIN_TOLERANCE = 1e-3
"""Chained subgraphs must reproduce the whole-graph sample outputs this closely (relative to their scale)."""


def graph_description(
    cut: Cut,
    m: Module,
    shape_index: int,
    io: ModuleIO,
    folded: dict[int, np.ndarray],
    folded_file: str | None,
    part: ModelPart,
    split_model: str | None,
) -> SubgraphRecord:
    assert m.graph is not None
    model = cut.model
    ops = [
        OpRef(
            index=i,
            name=model.ops[i].name,
            type=model.ops[i].type,
            inputs=model.ops[i].inputs,
            outputs=model.ops[i].outputs,
        )
        for i in m.ops
    ]
    read = sorted(m.consumed)
    producer = {t: i for i, op in enumerate(model.ops) if op.type in CONST_OP_TYPES for t in op.outputs}
    constants = []
    for t in read:
        if t in producer:
            blob = model.ops[producer[t]].main
            dims = [] if blob is None or blob.dims is None else [int(d) for d in blob.dims]
            dtype = _BLOB_DTYPES.get(enum_name(schema.DataType, blob.dataType), "float32") if blob else "float32"
            constants.append(
                ConstTensor(
                    index=t, name=model.tensor_names[t], qnn_name=qnn_name(t), op=producer[t], shape=dims, dtype=dtype
                )
            )
    folded_specs = []
    for t in read:
        if t in folded:
            value = folded[t]
            folded_specs.append(
                FoldedTensor(
                    index=t,
                    name=model.tensor_names[t],
                    qnn_name=qnn_name(t),
                    shape=list(value.shape),
                    dtype=str(value.dtype),
                    format="NCHW",
                    values=value.reshape(-1).tolist() if value.size <= INLINE_VALUES_MAX else None,
                )
            )
    boundary = set(m.inputs) | set(m.outputs)
    return SubgraphRecord(
        graph=graph_name(shape_index, m.graph, part.graph_prefix),
        plugin=m.graph,
        shape_index=shape_index,
        binary=binary_path(m.graph, part.graph_prefix),
        source_model=part.model_file,
        split_model=split_model,
        ops=ops,
        inputs=[io.specs[t] for t in m.inputs],
        outputs=[io.specs[t] for t in m.outputs],
        internal=[spec for t, spec in sorted(io.specs.items()) if t not in boundary],
        folded=folded_specs,
        constants=constants,
        folded_values=folded_file if folded_specs else None,
    )


def write_graph_dir(
    graph_dir: Path,
    cut: Cut,
    m: Module,
    shape_index: int,
    io: ModuleIO,
    folded: dict[int, np.ndarray],
    part: ModelPart,
    split_model: str | None,
) -> None:
    graph_dir.mkdir(parents=True)
    names = cut.model.tensor_names
    save_vars(graph_dir / REFERENCE_INPUT, {names[t]: io.inputs[t] for t in m.inputs})
    save_vars(graph_dir / REFERENCE_OUTPUT, {names[t]: io.outputs[t] for t in m.outputs})
    mine = {t: folded[t] for t in sorted(m.consumed) if t in folded}
    if mine:
        save_vars(graph_dir / FOLDED_VALUES, {names[t]: v for t, v in mine.items()})
    desc = graph_description(cut, m, shape_index, io, folded, FOLDED_VALUES, part, split_model)
    atomic_write_text(graph_dir / GRAPH_FILE, desc.model_dump_json(indent=1) + "\n")


def chain_error(env: dict[int, np.ndarray], cut: Cut, expected: dict[str, np.ndarray], where: Path) -> float:
    names = cut.model.tensor_names
    worst = 0.0
    for t in cut.outputs:
        want = expected[names[t]]
        got = env[t]
        if got.shape != want.shape:
            raise ToleranceError(
                f"{where}: chained subgraphs give {names[t]!r} shape {list(got.shape)}, "
                f"the sample has {list(want.shape)}; the cut is inconsistent"
            )
        diff = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
        scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
        if diff > CHAIN_TOLERANCE * scale:
            raise ToleranceError(
                f"{where}: chained subgraphs give {names[t]!r} off by {diff:.3g} from the sample "
                f"(allowed {CHAIN_TOLERANCE * scale:.3g}); the cut is inconsistent"
            )
        worst = max(worst, diff)
    return worst


@dataclass(frozen=True)
class Split:
    """The source model with its too-big convolutions split (`mnnbuild.mnn.split`), saved at ``path`` in the
    partition dir: ops before ``first_op`` and tensors below ``tensors`` are the source's as they were."""

    path: str
    first_op: int
    tensors: int

    def model_of(self, m: Module) -> str | None:
        """The split model's path when module ``m`` holds ops or tensors the split changed, else None."""
        changed = any(i >= self.first_op for i in m.ops) or any(t >= self.tensors for t in m.consumed | m.produced)
        return self.path if changed else None


def split_convolutions(model: MnnModel, max_parameters: int, weight_path: Path) -> tuple[int, dict[str, str]]:
    """Split, in place, each Convolution with more than ``max_parameters`` weights into as many parts by output
    channels as it takes (`split_convolution`); returns the first changed op index (-1 when none was split) and,
    by name, the Concat joining each split conv's parts with the reason it stays on the CPU."""
    if max_parameters <= 0:
        return -1, {}
    big = []
    for i, op in enumerate(model.ops):
        if conv_parameters(op) > max_parameters:
            why = unsplittable(op)
            if why is None:
                big.append(i)
            else:  # it still builds, as one plugin: only its context build needs more memory
                log.warning("partition: %s has %d weights but stays whole: %s", op.name, conv_parameters(op), why)
    if not big:
        return -1, {}
    joins: dict[str, str] = {}
    with WeightFile(weight_path) as weights:
        for i in reversed(big):  # later ops first, so the earlier indexes hold
            op = model.ops[i]
            parts = -(-conv_parameters(op) // max_parameters)
            new = split_convolution(model, i, split_bounds(int(op.main.common.outputCount), parts), weights)
            joins[model.ops[new[-1]].name] = (
                f"joins the {len(new) - 1} parts of {op.name!r}, split by output channels "
                f"(more than max_plugin_parameters {max_parameters} weights)"
            )
            log.debug("partition: %s (%d weights) split into %d plugins", op.name, conv_parameters(op), len(new) - 1)
    return big[0], joins


def run_samples(
    model_name: str,
    cut: Cut,
    model_path: Path,
    part: ModelPart,
    rt: Any,
    samples: list[tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]]],
    io_dir: Path,
    qnn: Path,
    split: Split | None,
    distinct: bool = False,
) -> tuple[list[list[ModuleIO]], list[float], dict[int, list[int]]]:
    """Per sample shape: fold the per-shape constants, run every module in order (checking the chain against
    the sample's output) and write each NPU graph's dir; returns each shape's module IO and chain error, and per
    plugin the samples it has a graph for: every one, or (``distinct``) the first of each shape its inputs take
    (a plugin picks its graph by input shape, so a second graph of one shape would never run)."""
    model = cut.model
    frontier_names = [model.tensor_names[t] for t in cut.frontier]
    split_path = qnn.parent / split.path if split else model_path

    def source_of(m: Module) -> Path:  # the small fetched model wherever it serves: MNN parses it per load
        return split_path if split and split.model_of(m) else model_path

    per_shape: list[list[ModuleIO]] = []
    diffs: list[float] = []
    # folded values come from the graph inputs, before any split op unless one reads a split tensor
    folded_source = split_path if split and any(t >= split.tensors for t in cut.frontier) else model_path
    all_values = compute_folded(folded_source, [feeds for _, feeds, _ in samples], frontier_names, model)
    folded_per_shape = [{model.tensor_index(n): v for n, v in values.items()} for values in all_values]
    shapes = [(feeds, folded) for (_, feeds, _), folded in zip(samples, folded_per_shape, strict=True)]
    ran = run_modules(cut, source_of, rt, shapes, model_name)
    graphs: dict[int, list[int]] = {m.graph: [] for m in cut.modules if m.graph is not None}
    seen: dict[int, set[tuple[tuple[int, ...], ...]]] = {g: set() for g in graphs}
    for s, ((seq, _, expected), folded, (ios, env)) in enumerate(zip(samples, folded_per_shape, ran, strict=True)):
        diffs.append(chain_error(env, cut, expected, testdir(io_dir, seq)))
        per_shape.append(ios)
        for m, mio in zip(cut.modules, ios, strict=True):
            if m.graph is None:
                continue
            shape = tuple(tuple(mio.specs[t].shape) for t in m.inputs)
            if distinct and shape in seen[m.graph]:
                continue
            seen[m.graph].add(shape)
            graphs[m.graph].append(s)
            graph_dir = qnn / graph_name(s, m.graph, part.graph_prefix)
            write_graph_dir(graph_dir, cut, m, s, mio, folded, part, split.model_of(m) if split else None)
        log.debug(
            "partition %s: seq %d, chained subgraphs match the sample (max abs diff %.3g)",
            model_name,
            seq,
            diffs[-1],
        )
    return per_shape, diffs, graphs


def plugin_attributes(
    cut: Cut, per_shape: list[list[ModuleIO]], prefix: str, graphs: dict[int, list[int]]
) -> tuple[dict[int, dict[str, Any]], dict[int, tuple[list[list[TensorSpec]], list[list[TensorSpec]]]]]:
    """Per plugin number: its Plugin attributes fused over the samples it has a graph for (``graphs``, from
    :func:`run_samples`), and its boundary specs per graph."""
    plugin_attrs: dict[int, dict[str, Any]] = {}
    boundary: dict[int, tuple[list[list[TensorSpec]], list[list[TensorSpec]]]] = {}
    for pos, m in enumerate(cut.modules):
        if m.graph is None:
            continue
        kept = graphs[m.graph]
        ins = [[per_shape[s][pos].specs[t] for t in m.inputs] for s in kept]
        outs = [[per_shape[s][pos].specs[t] for t in m.outputs] for s in kept]
        attrs = shape_attributes(m, kept[0], 0, ins[0], outs[0], prefix)
        for i in range(1, len(kept)):
            attrs = fuse_attributes(attrs, shape_attributes(m, kept[i], i, ins[i], outs[i], prefix))
        plugin_attrs[m.graph] = attrs
        boundary[m.graph] = (ins, outs)
    return plugin_attrs, boundary
