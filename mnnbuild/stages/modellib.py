"""modellib: lower every partition graph to a QNN graph description with its static tensors.

For each ``qnn/<graph>/`` of the partition it writes ``qnn/<graph>/graph.json`` (tensors and
nodes, see `mnnbuild.lowering.graph`) and one ``.raw`` per static tensor: the graph directory is
the model-lib, complete on its own (upstream's ``graph.bin`` is ``tar -cf graph.bin *.raw`` of
it). Every weight is written once: the prefill graphs' raws that equal the decode graph's are hard
links. Conv weights are float32 QNN tensors stored in fp16 raws (``storage`` in ``graph.json``): the HTP
prepares in fp16 and rounds them exactly so, so the context binaries are the same bytes at half the disk
(`mnnbuild.lowering.ops.htp_conv_weights`).

The model-lib is for a user who hands the graphs to QNN tools: the context and twin stages lower the same graphs
themselves (`mnnbuild.plugin.lowered`) instead of reading GBs of raws back at real size, so a bundle
or verify does not build it; ``doit modellib`` does.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from mnnbuild.base.fsutil import staged_dir
from mnnbuild.base.logs import progress
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.modellib import LoweredRecord, ModellibInputs, ModellibManifest, ModellibParams
from mnnbuild.manifests.partition import PartitionManifest, PluginRecord
from mnnbuild.model.modeldir import chain_part
from mnnbuild.model.npu_weights import NpuWeights
from mnnbuild.model.spec import VISUAL, ModelSpec
from mnnbuild.pipeline.layout import GRAPH_FILE as GRAPH_JSON
from mnnbuild.pipeline.layout import QNN_DIR
from mnnbuild.pipeline.manifest import record_outputs, tool_versions
from mnnbuild.pipeline.stage import At, Stage

if TYPE_CHECKING:
    import numpy as np

    from mnnbuild.mnn import MnnModel
    from mnnbuild.mnn.weights import WeightFile

log = logging.getLogger(__name__)


_PLUGINS_AT_ONCE = 2


def _lower_plugin(
    model: MnnModel,
    weights: WeightFile,
    partition_dir: Path,
    dest_root: Path,
    plugin: PluginRecord,
    npu_weights: NpuWeights,
) -> tuple[list[LoweredRecord], int]:
    """Lower one plugin's graphs (decode, then each prefill length) into ``dest_root``; returns their records and
    the bytes of weights the later graphs link from the first instead of writing again."""
    from mnnbuild.lowering.graph import write_graph_dir
    from mnnbuild.plugin.lowered import lower_plugin

    records: list[LoweredRecord] = []
    first: tuple[Path, dict[str, np.ndarray]] | None = None
    saved = 0
    graphs = [f"{QNN_DIR}/{g}" for g in plugin.graphs]
    for src, lowered in lower_plugin(model, weights, partition_dir, graphs, npu_weights):
        dest = dest_root / src.name
        desc, data = lowered.description, lowered.statics
        # the later graphs hold the first graph's very arrays: their raws become links to its files
        link_from, linked = first if first is not None else (None, None)
        write_graph_dir(dest, desc, data, link_from=link_from, linked_statics=linked)
        first = first or (dest, dict(data))
        statics = desc.static_tensors
        sizes = [(dest / str(t.raw)).stat() for t in statics]
        saved += sum(st.st_size for st in sizes if st.st_nlink > 1)  # the first graph's have one link yet
        records.append(
            LoweredRecord(
                graph=src.name,
                plugin=plugin.plugin,
                nodes=len(desc.nodes),
                static_tensors=len(statics),
                static_bytes=sum(st.st_size for st in sizes),
            )
        )
        log.debug("modellib: %s -> %d QNN nodes", src.name, len(desc.nodes))
    return records, saved


def build_modellib(inputs: ModellibInputs, params: ModellibParams, out_dir: Path) -> ModellibManifest:
    """Lower each graph of the partition; errors name the graph and the MNN op."""
    from mnnbuild.mnn import load_model
    from mnnbuild.mnn.weights import WeightFile
    from mnnbuild.plugin.lowered import source_model

    partition = inputs.manifest(PartitionManifest, inputs.partition_dir)
    # the language model's (or only) graph as fetch recorded it, or a VL model's encoder
    part = chain_part(inputs.manifest(FetchManifest, Path(inputs.model_dir)).part, partition.params.part)
    partition_dir = Path(inputs.partition_dir)
    # the fetched model, and the partition's split model for the plugins whose graphs index it
    sources = {
        p.plugin: source_model(Path(inputs.model_dir), part, partition_dir, [f"{QNN_DIR}/{g}" for g in p.graphs])
        for p in partition.plugins
    }
    models = {path: load_model(path) for path in set(sources.values())}
    read_dirs = {f"{QNN_DIR}/{g}" for p in partition.plugins for g in p.graphs}
    with staged_dir(out_dir) as tmp, WeightFile(Path(inputs.model_dir) / part.weight_file) as weights:
        bar = progress(total=len(read_dirs), desc=f"lower {inputs.model}", unit="graph")

        def lower_one(plugin: PluginRecord) -> tuple[list[LoweredRecord], int]:
            model = models[sources[plugin.plugin]]
            done = _lower_plugin(model, weights, partition_dir, tmp / QNN_DIR, plugin, params.npu_weights)
            bar.update(len(plugin.graphs))
            return done

        # plugins are independent and numpy, file writes and hashing release the GIL: two at a time use both
        # cores of a small box (a third plugin's weights would only add memory)
        with bar, ThreadPoolExecutor(max_workers=_PLUGINS_AT_ONCE) as pool:
            done = list(pool.map(lower_one, partition.plugins))
        records = [r for plugin_records, _ in done for r in plugin_records]
        saved = sum(n for _, n in done)
        manifest = ModellibManifest(
            model=inputs.model,
            # the graph files read, not the partition manifest: a partition re-run with identical graphs
            # (say, a reworded report) must leave this manifest, and so the contexts, unchanged
            inputs=partition.plugin_files(read_dirs),
            params=params,
            tools=tool_versions(),
            outputs=record_outputs(tmp),
            graphs=records,
        )
        manifest.write(tmp)
    log.debug(
        "modellib %s: %d graphs lowered, %d QNN nodes, %.1f MB of shared weights linked",
        inputs.model, len(records), sum(r.nodes for r in records), saved / 1e6,
    )  # fmt: skip
    return manifest


__all__ = ["GRAPH_JSON", "ModellibInputs", "ModellibManifest", "ModellibParams", "build_modellib"]


def modellib_params(spec: ModelSpec, at: At) -> ModellibParams:
    return ModellibParams(npu_weights=spec.npu_weights_of(at.part))


def describe(spec: ModelSpec, at: At) -> str:
    what = f"{spec.name} visual encoder graph" if at.part == VISUAL else f"{spec.name} graph"
    return f"lower every {what} to a QNN graph description + static tensor raws"


STAGE = Stage(
    entry=build_modellib,
    params_of=modellib_params,
    describe=describe,
    placement="part",
    defer=("*",),
    outputs=(f"{QNN_DIR}/<graph>/{GRAPH_JSON}", f"{QNN_DIR}/<graph>/*.raw"),
    doc=(
        "On demand only: each model's graphs as QNN model-libs (graph descriptions and static tensors), for "
        "QNN's own tools."
    ),
)
