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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mnnbuild.base.errors import MNNFormatError, StageError, UpstreamError
from mnnbuild.base.fsutil import atomic_write_text, staged_dir
from mnnbuild.cpu import load_vars
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.partition import (
    PartitionInputs,
    PartitionManifest,
    PartitionParams,
    PluginRecord,
    partition_plugins,
    read_merge,
)
from mnnbuild.model.modeldir import chain_part
from mnnbuild.model.spec import VISUAL, ModelSpec
from mnnbuild.pipeline.layout import (
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
from mnnbuild.pipeline.manifest import record_outputs, tool_versions
from mnnbuild.pipeline.stage import At, Ending, FanOut, Stage

if TYPE_CHECKING:
    import numpy as np

    from mnnbuild.lowering.support import SupportCheck
    from mnnbuild.mnn import MnnModel

log = logging.getLogger(__name__)


def _without_decode_graph(fetched: FetchManifest) -> bool:
    """A speculative bundle built without the decode graph: its whole-block samples are graph samples too (an
    unpadded block's last-row forward runs the ops after the ``logits_index`` slice at one row, a shape no other
    sample gives them then), and each plugin gets one graph per distinct input shape."""
    return fetched.speculation is not None and not fetched.speculation.decode_graph


def _graph_sample(io: IoManifest, path: str, whole_blocks: bool) -> bool:
    """Whether the partition reads an io output: every graph sample's, and the whole-block samples' (otherwise
    verify's alone) when ``whole_blocks``."""
    return whole_blocks or not any(path.startswith(f"{s.dir}/") for s in io.whole_block_samples)


def _read_samples(
    io_dir: Path, io: IoManifest, whole_blocks: bool
) -> list[tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    samples = []
    listed = [*io.samples, *(io.whole_block_samples if whole_blocks else ())]
    dirs = [*io.sample_dirs(io_dir), *(io.whole_block_dirs(io_dir) if whole_blocks else ())]
    for sample, sample_dir in zip(listed, dirs, strict=True):
        values = []
        for file in (REFERENCE_INPUT, REFERENCE_OUTPUT):
            path = sample_dir / file
            if not path.is_file():
                raise UpstreamError(
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


def partition(
    inputs: PartitionInputs,
    params: PartitionParams,
    out_dir: Path,
    *,
    support: SupportCheck | None = None,
) -> PartitionManifest:
    """Cut the model, run every subgraph on both samples, write the Plugin model and graph dirs.

    ``support`` is the QNN lowering's op check (replaceable in tests; None: `unsupported_reason`)."""
    from mnnbuild.lowering.support import unsupported_reason
    from mnnbuild.mnn import load_model, save_model
    from mnnbuild.partition.cut import plan_cut
    from mnnbuild.partition.describe import build_report, format_report
    from mnnbuild.partition.graphs import Split, plugin_attributes, run_samples, split_convolutions
    from mnnbuild.partition.rewrite import rewrite_model
    from mnnbuild.partition.strip import strip_weights

    if support is None:
        support = unsupported_reason

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
    model = load_model(model_path)
    whole_blocks = _without_decode_graph(fetched)
    samples = _read_samples(io_dir, io, whole_blocks)
    _check_names(model, model_path, io_dir, samples, params.skips)
    tensors = len(model.tensor_names)
    try:
        first_split, joins = split_convolutions(model, params.max_plugin_parameters, weight_path)
    except MNNFormatError as exc:  # the same type, naming the model whose weights it read
        raise type(exc)(f"{model_path}: {exc}") from None
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
        per_shape, diffs, graphs = run_samples(
            inputs.model, cut, model_path, part, rt, samples, io_dir, qnn, split, distinct=whole_blocks
        )
        plugin_attrs, boundary = plugin_attributes(cut, per_shape, part.graph_prefix, graphs)
        result, shipped = strip_weights(rewrite_model(cut, plugin_attrs, part.graph_prefix), model_dir, part, tmp)
        save_model(result, tmp / part.result_model)

        merge = {
            binary_path(m.graph, part.graph_prefix): [
                f"{QNN_DIR}/{graph_name(s, m.graph, part.graph_prefix)}" for s in graphs[m.graph]
            ]
            for m in cut.plugins
            if m.graph is not None
        }
        postreat = {"type": "QNN", "merge": merge, "cache": QNN_DIR}
        atomic_write_text(tmp / POSTREAT_FILE, json.dumps(postreat, indent=4) + "\n")

        seq_lens = [s[0] for s in samples]
        report = build_report(inputs.model, cut, seq_lens, graphs, boundary, len(result.ops), diffs, part.graph_prefix)
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
                *(r.under("model") for r in lowered_from),
                *(
                    r.under("io")
                    for r in io.outputs
                    if r.path.endswith(".mnn") and _graph_sample(io, r.path, whole_blocks)
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


def partition_params(spec: ModelSpec, at: At) -> PartitionParams:
    """The language model's graphs per prefill length (and its CPU-bound ops); a VL encoder's per image size."""
    if at.part == VISUAL:
        return PartitionParams(
            part=VISUAL, image_sizes=tuple(spec.image_sizes), max_plugin_parameters=spec.max_plugin_parameters
        )
    return PartitionParams(
        chunk_sizes=spec.prefill_lengths,
        skips=tuple(spec.skips),
        max_kv_size=spec.max_kv_size,
        max_plugin_parameters=spec.max_plugin_parameters,
    )


def describe(spec: ModelSpec, at: At) -> str:
    if at.part == VISUAL:
        sizes = "/".join(spec.image_sizes)
        return f"cut the {spec.name} visual encoder into CPU ops and QNN plugins (graphs for {sizes})"
    lengths = "/".join(str(n) for n in spec.prefill_lengths)
    decode = "decode and " if spec.decode_graph else ""
    return f"cut {spec.name} into CPU ops and QNN plugins ({decode}prefill-{lengths} graphs)"


def cpu_summary(out_dir: Path) -> str | None:
    """The run's ending on a partition it touched: its plugins and the CPU's share of the weights."""
    from mnnbuild.partition.records import PartitionReport

    try:
        report = PartitionReport.model_validate_json((out_dir / PARTITION_REPORT_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return report.cpu_summary()


STAGE = Stage(
    entry=partition,
    params_of=partition_params,
    describe=describe,
    placement="part",
    outputs=(
        f"{QNN_DIR}/<model>.mnn",
        f"{QNN_DIR}/graph*/",
        "<weight file>",
        POSTREAT_FILE,
        LOWERING_SOURCE,
        PARTITION_REPORT_JSON,
        PARTITION_REPORT_TEXT,
    ),
    # the graphs, the split model (an lm_head split over plugins) and the weight file are read only by the stages that
    # run on them (the plugins' tasks are keyed on this manifest's records of those files, and read the postreat file
    # to be declared)
    defer=(f"{QNN_DIR}/*", f"{SPLIT_DIR}/*", "*.weight"),
    tools=frozenset({"MNN"}),
    fan_out=FanOut(binaries=read_merge, plugins=partition_plugins),
    ending=Ending(summary=cpu_summary),
    doc=(
        "Cut each model into CPU ops and QNN Plugin ops, with why each CPU op stays (`qnn/<model>.mnn`, graph "
        "dirs, `npu_postreat.json`)."
    ),
    mirrors="compilefornpu",
)
