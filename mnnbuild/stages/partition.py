"""partition: cut the model's graph (``llm.mnn``, ``embedding.mnn``) into CPU ops and QNN Plugin ops (upstream
``compilefornpu``).

A VL model's encoder is partitioned the same way on its own (the ``visual`` chain, ``params.part``):
``visual.mnn`` into ``qnn/visual.mnn`` and ``qnn/graphvisual<k>`` / ``graphvisual<s>_<k>`` dirs, one graph per
image size.

Reads the model (fetch output; its part names the graph) and the io samples (decode first, then each prefill
length), and writes::

    qnn/llm.mnn                 the model with one Plugin(type="QNN") op per NPU subgraph (qnn/<graph file>)
    qnn/graphllm<k>/               decode graph of plugin k: graph.json, input.mnn, output.mnn, folded.mnn
    qnn/graphllm<s>_<k>/           the same at prefill length s (1: the longest, 2: the next, ...)
    npu_postreat.json           {"type": "QNN", "merge": {"qnn/graphllm<k>.bin": [...]}, "cache": "qnn"}
    llm.mnn.weight              what the bundle ships of the model's weight file (its part's): only the bytes the
                                CPU ops of qnn/llm.mnn and the tied embeddings read (`mnnbuild.partition.strip`);
                                a VL encoder's is qnn/visual.mnn.weight
    llm_config.json             the model's, ``tie_embeddings`` pointing into that file (not for a VL encoder)
    partition.json, partition.txt, partition.manifest.json
    split/llm.mnn               only when a convolution holds more than ``max_plugin_parameters`` weights: the
                                source model with it split by output channels (`mnnbuild.mnn.split`); the graphs
                                holding its parts index this model (their ``split_model``), the others the source

The cut is in ``mnnbuild.partition.cut``; see ``mnnbuild.partition.records`` for tensor naming.
``qnn/llm.mnn``'s CPU ops are the source ops, their external weight offsets moved into the partition's weight file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mnnbuild.base.errors import MNNFormatError, StageError
from mnnbuild.base.fsutil import atomic_write_text, staged_dir
from mnnbuild.cpu import load_vars, save_vars
from mnnbuild.lowering.support import SupportCheck, unsupported_reason
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.partition import PartitionInputs, PartitionManifest, PartitionParams, PluginRecord
from mnnbuild.mnn import MnnModel, enum_name, load_model, save_model, schema
from mnnbuild.mnn.semantics import CONST_OP_TYPES
from mnnbuild.mnn.split import conv_parameters, split_bounds, split_convolution, unsplittable
from mnnbuild.mnn.weights import WeightFile
from mnnbuild.model.modeldir import ModelPart, chain_part
from mnnbuild.partition.cut import Cut, Module, plan_cut
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
from mnnbuild.partition.report import build_report, format_report
from mnnbuild.partition.rewrite import fuse_attributes, rewrite_model, shape_attributes
from mnnbuild.partition.strip import strip_weights
from mnnbuild.pipeline.layout import (
    FOLDED_VALUES,
    GRAPH_FILE,
    LOWERING_SOURCE,
    PARTITION_REPORT_JSON,
    PARTITION_REPORT_TEXT,
    POSTREAT_FILE,
    QNN_DIR,
    REFERENCE_INPUT,
    REFERENCE_OUTPUT,
    SPLIT_DIR,
    binary_path,
    graph_name,
    testdir,
)
from mnnbuild.pipeline.manifest import FileRecord, record_outputs, tool_versions
from mnnbuild.pipeline.stage import Stage

log = logging.getLogger(__name__)

_BLOB_DTYPES = {"DT_FLOAT": "float32", "DT_INT32": "int32", "DT_INT64": "int64", "DT_UINT8": "uint8", "DT_INT8": "int8"}
CHAIN_TOLERANCE = 1e-3
"""Chained subgraphs must reproduce the whole-graph sample outputs this closely (relative to their scale)."""


def _read_samples(io_dir: Path, io: IoManifest) -> list[tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    samples = []
    for sample, sample_dir in zip(io.samples, io.sample_dirs(io_dir), strict=True):
        values = []
        for file in (REFERENCE_INPUT, REFERENCE_OUTPUT):
            path = sample_dir / file
            if not path.is_file():
                raise StageError(
                    f"{path}: sample file missing; expected the io stage's testdir/{sample.seq_len}/{file}"
                )
            try:
                arrays = load_vars(path)
            except Exception as exc:  # MNN raises plain RuntimeError/SystemError on a bad file
                raise StageError(f"{path}: not an MNN variable file: {exc}") from None
            if not arrays:
                raise StageError(f"{path}: holds no variables; expected the sample's {file.split('.')[0]}s")
            values.append(arrays)
        samples.append((sample.seq_len, values[0], values[1]))
    if not samples:
        raise StageError(f"{io_dir / IoManifest.filename()}: field 'samples' is empty; expected decode and prefill")
    return samples


def _check_names(model: MnnModel, model_path: Path, io_dir: Path, samples: list[Any], skips: tuple[str, ...]) -> None:
    expected_inputs = set(model.input_names)
    tensors = set(model.tensor_names)
    for seq, feeds, outputs in samples:
        where = testdir(io_dir, seq)
        got = set(feeds)
        if got != expected_inputs:
            extra = sorted(got - expected_inputs)
            missing = sorted(expected_inputs - got)
            detail = f"unknown {extra}" if extra else f"missing {missing}"
            raise StageError(
                f"{where / REFERENCE_INPUT}: input names do not match {model_path} ({detail}); "
                f"expected {sorted(expected_inputs)}"
            )
        unknown = sorted(set(outputs) - tensors)
        if unknown:
            raise StageError(
                f"{where / REFERENCE_OUTPUT}: output {unknown[0]!r} is not a tensor of {model_path}; "
                f"expected outputs such as {model.output_names}"
            )
    names = [s[1] for s in samples]
    if any(list(n) != list(names[0]) for n in names):
        raise StageError(f"{io_dir}: samples list their inputs in different orders; expected one order")
    op_names = {op.name for op in model.ops}
    bad = [s for s in skips if s not in op_names]
    if bad:
        raise StageError(f"partition params: field 'skips' names {bad[0]!r}, which is not an op of {model_path}")


def _graph_description(
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


def _write_graph_dir(
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
    desc = _graph_description(cut, m, shape_index, io, folded, FOLDED_VALUES, part, split_model)
    atomic_write_text(graph_dir / GRAPH_FILE, desc.model_dump_json(indent=1) + "\n")


def _chain_error(env: dict[int, np.ndarray], cut: Cut, expected: dict[str, np.ndarray], where: Path) -> float:
    names = cut.model.tensor_names
    worst = 0.0
    for t in cut.outputs:
        want = expected[names[t]]
        got = env[t]
        if got.shape != want.shape:
            raise StageError(
                f"{where}: chained subgraphs give {names[t]!r} shape {list(got.shape)}, "
                f"the sample has {list(want.shape)}; the cut is inconsistent"
            )
        diff = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
        scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
        if diff > CHAIN_TOLERANCE * scale:
            raise StageError(
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


def _split_convolutions(model: MnnModel, max_parameters: int, weight_path: Path) -> tuple[int, dict[str, str]]:
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


def _run_samples(
    model_name: str,
    cut: Cut,
    model_path: Path,
    part: ModelPart,
    rt: Any,
    samples: list[tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]]],
    io_dir: Path,
    qnn: Path,
    split: Split | None,
) -> tuple[list[list[ModuleIO]], list[float]]:
    """Per sample shape: fold the per-shape constants, run every module in order (checking the chain against
    the sample's output) and write each NPU graph's dir; returns each shape's module IO and chain error."""
    model = cut.model
    frontier_names = [model.tensor_names[t] for t in cut.frontier]
    split_path = qnn.parent / split.path if split else model_path

    def source_of(m: Module) -> Path:  # the small fetched model wherever it serves: MNN parses it per load
        return split_path if split and split.model_of(m) else model_path

    per_shape: list[list[ModuleIO]] = []
    diffs: list[float] = []
    # folded values come from the graph inputs, before any split op unless one reads a split tensor
    folded_source = split_path if split and any(t >= split.tensors for t in cut.frontier) else model_path
    all_values = compute_folded(folded_source, [feeds for _, feeds, _ in samples], frontier_names)
    folded_per_shape = [{model.tensor_index(n): v for n, v in values.items()} for values in all_values]
    shapes = [(feeds, folded) for (_, feeds, _), folded in zip(samples, folded_per_shape, strict=True)]
    ran = run_modules(cut, source_of, rt, shapes, model_name)
    for s, ((seq, _, expected), folded, (ios, env)) in enumerate(zip(samples, folded_per_shape, ran, strict=True)):
        diffs.append(_chain_error(env, cut, expected, testdir(io_dir, seq)))
        per_shape.append(ios)
        for m, mio in zip(cut.modules, ios, strict=True):
            if m.graph is not None:
                graph_dir = qnn / graph_name(s, m.graph, part.graph_prefix)
                _write_graph_dir(graph_dir, cut, m, s, mio, folded, part, split.model_of(m) if split else None)
        log.debug(
            "partition %s: seq %d, chained subgraphs match the sample (max abs diff %.3g)",
            model_name,
            seq,
            diffs[-1],
        )
    return per_shape, diffs


def _plugin_attributes(
    cut: Cut, per_shape: list[list[ModuleIO]], prefix: str
) -> tuple[dict[int, dict[str, Any]], dict[int, tuple[list[list[TensorSpec]], list[list[TensorSpec]]]]]:
    """Per plugin number: its Plugin attributes fused over the shapes, and its boundary specs per shape."""
    plugin_attrs: dict[int, dict[str, Any]] = {}
    boundary: dict[int, tuple[list[list[TensorSpec]], list[list[TensorSpec]]]] = {}
    for pos, m in enumerate(cut.modules):
        if m.graph is None:
            continue
        ins = [[shape[pos].specs[t] for t in m.inputs] for shape in per_shape]
        outs = [[shape[pos].specs[t] for t in m.outputs] for shape in per_shape]
        attrs = shape_attributes(m, 0, ins[0], outs[0], prefix)
        for s in range(1, len(per_shape)):
            attrs = fuse_attributes(attrs, shape_attributes(m, s, ins[s], outs[s], prefix))
        plugin_attrs[m.graph] = attrs
        boundary[m.graph] = (ins, outs)
    return plugin_attrs, boundary


def partition(
    inputs: PartitionInputs,
    params: PartitionParams,
    out_dir: Path,
    *,
    support: SupportCheck = unsupported_reason,
) -> PartitionManifest:
    """Cut the model, run every subgraph on both samples, write the Plugin model and graph dirs.

    ``support`` is the QNN lowering's op check (replaceable in tests)."""
    model_dir, io_dir = Path(inputs.model_dir), Path(inputs.io_dir)
    fetched = inputs.manifest(FetchManifest, model_dir)
    io = inputs.manifest(IoManifest, io_dir)
    for field in ("part", "chunk_sizes", "image_sizes"):
        got, want = getattr(io.params, field), getattr(params, field)
        if got != want:
            shown = (lambda v: v) if isinstance(want, str) else list
            raise StageError(
                f"{io_dir / IoManifest.filename()}: field 'params.{field}' is {shown(got)}, "
                f"the partition expects {shown(want)}; re-run the io stage"
            )
    part = chain_part(fetched.part, params.part)
    model_path, weight_path = model_dir / part.model_file, model_dir / part.weight_file
    try:
        model = load_model(model_path)
    except MNNFormatError as exc:
        raise StageError(str(exc)) from None
    samples = _read_samples(io_dir, io)
    _check_names(model, model_path, io_dir, samples, params.skips)
    tensors = len(model.tensor_names)
    try:
        first_split, joins = _split_convolutions(model, params.max_plugin_parameters, weight_path)
    except MNNFormatError as exc:
        raise StageError(f"{model_path}: {exc}") from None
    cut = plan_cut(
        model,
        list(samples[0][1]),
        list(samples[0][2]),
        skips=params.skips,
        max_kv_size=params.max_kv_size,
        max_plugin_parameters=params.max_plugin_parameters,
        cpu_ops=joins,
        support=support,
    )
    if not cut.plugins:
        log.warning(
            "partition %s: no subgraph qualifies for the NPU; %s equals the CPU graph", inputs.model, part.result_model
        )
    rt = params.runtime.create(weight_path)
    with staged_dir(out_dir) as tmp:
        qnn = tmp / QNN_DIR
        qnn.mkdir()
        split = None
        if first_split >= 0:
            split = Split(f"{SPLIT_DIR}/{part.model_file}", first_split, tensors)
            save_model(model, tmp / split.path)  # MNN runs it below, its unsplit ops' weights from weight_path
        per_shape, diffs = _run_samples(inputs.model, cut, model_path, part, rt, samples, io_dir, qnn, split)
        plugin_attrs, boundary = _plugin_attributes(cut, per_shape, part.graph_prefix)
        result, shipped = strip_weights(rewrite_model(cut, plugin_attrs, part.graph_prefix), model_dir, part, tmp)
        save_model(result, tmp / part.result_model)

        merge = {
            binary_path(m.graph, part.graph_prefix): [
                f"{QNN_DIR}/{graph_name(s, m.graph, part.graph_prefix)}" for s in range(len(samples))
            ]
            for m in cut.plugins
            if m.graph is not None
        }
        postreat = {"type": "QNN", "merge": merge, "cache": QNN_DIR}
        atomic_write_text(tmp / POSTREAT_FILE, json.dumps(postreat, indent=4) + "\n")

        seq_lens = [s[0] for s in samples]
        report = build_report(inputs.model, cut, seq_lens, boundary, len(result.ops), diffs, part.graph_prefix)
        atomic_write_text(tmp / PARTITION_REPORT_JSON, report.model_dump_json(indent=2) + "\n")
        atomic_write_text(tmp / PARTITION_REPORT_TEXT, format_report(report, part.result_model, shipped))

        used = {part.model_file, part.weight_file}
        lowered_from = [r for r in fetched.outputs if r.path in used]
        source = json.dumps([r.model_dump() for r in lowered_from], indent=2)
        atomic_write_text(tmp / LOWERING_SOURCE, source + "\n")
        by_plugin = {m.graph: m for m in cut.plugins}
        manifest = PartitionManifest(
            model=inputs.model,
            inputs=[
                *(FileRecord(path=f"model/{r.path}", size=r.size, sha256=r.sha256) for r in lowered_from),
                *(
                    FileRecord(path=f"io/{r.path}", size=r.size, sha256=r.sha256)
                    for r in io.outputs
                    if r.path.endswith(".mnn")
                ),
            ],
            params=params,
            tools=tool_versions(mnn=True),
            outputs=record_outputs(tmp),
            seq_lens=seq_lens,
            plugins=[
                PluginRecord(
                    plugin=p.plugin,
                    path=p.name,
                    graphs=p.graphs,
                    ops=p.op_count,
                    parameters=p.parameters,
                    split_model=split.model_of(by_plugin[p.plugin]) if split else None,
                )
                for p in report.plugins
            ],
            cpu_ops=len(report.cpu_ops),
            weights=shipped,
        )
        manifest.write(tmp)
    log.debug(
        "partition %s: %d plugins (%d ops on the NPU), %d ops on the CPU",
        inputs.model,
        len(report.plugins),
        report.npu_op_count,
        len(report.cpu_ops),
    )
    return manifest


STAGE = Stage(
    name="partition",
    entry=partition,
    inputs=PartitionInputs,
    params=PartitionParams,
    manifest=PartitionManifest,
    upstream=("fetch", "io"),
    outputs=(
        f"{QNN_DIR}/<model>.mnn",
        f"{QNN_DIR}/graph*/",
        "<weight file>",
        POSTREAT_FILE,
        LOWERING_SOURCE,
        PARTITION_REPORT_JSON,
        PARTITION_REPORT_TEXT,
    ),
    # the weight file: only the bundle and verify read it (the plugins' tasks depend on the graph files, and read the
    # postreat file to be declared)
    defer=("*.weight",),
    tools=frozenset({"MNN"}),
    doc="Cut each model into CPU ops and QNN Plugin ops (qnn/<model>.mnn, graph dirs, npu_postreat.json).",
)
