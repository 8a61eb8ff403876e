"""modellib: lower every partition graph to a QNN graph description with its static tensors.

For each ``qnn/<graph>/`` of the partition it writes ``qnn/<graph>/graph.json`` (tensors and
nodes, see `mnnbuild.lowering.graph`) and one ``.raw`` per static tensor: the graph directory is
the model-lib, complete on its own (upstream's ``graph.bin`` is ``tar -cf graph.bin *.raw`` of
it). Every weight is written once: the prefill graphs' raws that equal the decode graph's are hard
links. Conv weights are float32 QNN tensors stored in fp16 raws (``storage`` in ``graph.json``): the HTP
prepares in fp16 and rounds them exactly so, so the context binaries are the same bytes at half the disk
(`mnnbuild.lowering.ops.htp_conv_weights`). The context stage composes QNN graphs from it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tqdm import tqdm

from mnnbuild.errors import StageError
from mnnbuild.fsutil import staged_dir
from mnnbuild.layout import QNN_DIR
from mnnbuild.lowering.context import TensorMeta
from mnnbuild.lowering.graph import GRAPH_JSON, LoweringError, write_graph_dir
from mnnbuild.lowering.lower import lower_subgraph
from mnnbuild.manifest import record_outputs, tool_versions
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.modellib import LoweredRecord, ModellibInputs, ModellibManifest, ModellibParams
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.mnn import load_model
from mnnbuild.mnn.weights import ConvWeights, WeightFile
from mnnbuild.modeldir import chain_part
from mnnbuild.partition.records import SubgraphRecord
from mnnbuild.stage import Stage

log = logging.getLogger(__name__)


def tensor_info(record: SubgraphRecord, graph_dir: Path) -> dict[int, TensorMeta]:
    """Shapes and dtypes of every tensor of one subgraph at its shape, with folded values."""
    folded = record.load_folded(graph_dir)
    info: dict[int, TensorMeta] = {}
    for spec in (*record.inputs, *record.outputs, *record.internal, *record.folded):
        info[spec.index] = TensorMeta(shape=tuple(spec.shape), dtype=spec.dtype, value=folded.get(spec.index))
    for const in record.constants:
        info.setdefault(const.index, TensorMeta(shape=tuple(const.shape), dtype=const.dtype))
    return info


def build_modellib(inputs: ModellibInputs, params: ModellibParams, out_dir: Path) -> ModellibManifest:
    """Lower each graph of the partition; errors name the graph and the MNN op."""
    partition = inputs.manifest(PartitionManifest, inputs.partition_dir)
    # the language model's (or only) graph as fetch recorded it, or a VL model's encoder
    part = chain_part(inputs.manifest(FetchManifest, Path(inputs.model_dir)).part, partition.params.part)
    model_path = Path(inputs.model_dir) / part.model_file
    model = load_model(model_path)
    graphs = [(p.plugin, g) for p in partition.plugins for g in p.graphs]
    read_dirs = {f"{QNN_DIR}/{g}" for _, g in graphs}
    records: list[LoweredRecord] = []
    first_graph: dict[int, Path] = {}
    saved = 0
    # a plugin's graphs (decode, then each prefill length) share its weights: decoded once, for the plugin's graphs
    conv_weights: dict[str, ConvWeights] = {}
    with staged_dir(out_dir) as tmp, WeightFile(Path(inputs.model_dir) / part.weight_file) as weights:
        for plugin, graph in tqdm(graphs, desc=f"lower {inputs.model}", unit="graph", disable=len(graphs) < 8):
            if plugin not in first_graph:
                conv_weights.clear()
            src = Path(inputs.partition_dir) / QNN_DIR / graph
            record = SubgraphRecord.read(src)
            try:
                lowered = lower_subgraph(
                    model,
                    weights,
                    [op.index for op in record.ops],
                    tensor_info(record, src),
                    [t.index for t in record.inputs],
                    [t.index for t in record.outputs],
                    conv_weights,
                )
            except LoweringError as exc:
                raise StageError(f"{src / 'graph.json'}: graph {graph} cannot be lowered: {exc}") from None
            dest = tmp / QNN_DIR / graph
            desc, data = lowered.description, lowered.statics
            first = first_graph.setdefault(plugin, dest)
            write_graph_dir(dest, desc, data, link_from=first if first != dest else None)
            del lowered, data
            statics = desc.static_tensors
            if first != dest:
                linked = [(dest / str(t.raw)).stat() for t in statics]
                saved += sum(st.st_size for st in linked if st.st_nlink > 1)
            records.append(
                LoweredRecord(
                    graph=graph,
                    plugin=plugin,
                    nodes=len(desc.nodes),
                    static_tensors=len(statics),
                    static_bytes=sum((dest / str(t.raw)).stat().st_size for t in statics),
                )
            )
            log.debug("modellib %s: %s -> %d QNN nodes", inputs.model, graph, len(desc.nodes))
        manifest = ModellibManifest(
            model=inputs.model,
            # the graph files read, not the partition manifest: a partition re-run with identical graphs
            # (say, a reworded report) must leave this manifest, and so the contexts, unchanged
            inputs=partition.outputs_in(read_dirs),
            params=params,
            tools=tool_versions(),
            outputs=record_outputs(tmp),
            graphs=records,
        )
        manifest.write(tmp)
    log.info(
        "modellib %s: %d graphs lowered, %d QNN nodes, %.1f MB of shared weights linked",
        inputs.model, len(records), sum(r.nodes for r in records), saved / 1e6,
    )  # fmt: skip
    return manifest


__all__ = ["GRAPH_JSON", "ModellibInputs", "ModellibManifest", "ModellibParams", "build_modellib"]


STAGE = Stage(
    name="modellib",
    entry=build_modellib,
    inputs=ModellibInputs,
    params=ModellibParams,
    manifest=ModellibManifest,
    upstream=("fetch", "partition"),
    outputs=(f"{QNN_DIR}/<graph>/{GRAPH_JSON}", f"{QNN_DIR}/<graph>/*.raw"),
    doc="Lower each model's graphs to QNN graph descriptions and static tensors.",
)
