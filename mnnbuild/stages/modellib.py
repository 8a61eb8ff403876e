"""modellib: lower every partition graph to a QNN graph description with its static tensors.

For each ``qnn/<graph>/`` of the partition it writes ``qnn/<graph>/graph.json`` (tensors and
nodes, see `mnnbuild.lowering.graph`), one ``.raw`` per static tensor, and ``<graph>.bin``, a
tar of the raws (upstream ``tar -cf graph.bin *.raw``) that is byte-identical whenever the raw
contents are (sorted members, fixed metadata). The context stage composes QNN graphs from it.
"""

from __future__ import annotations

import filecmp
import logging
import os
import tarfile
from pathlib import Path

from tqdm import tqdm

from mnnbuild.errors import StageError
from mnnbuild.fsutil import staged_dir
from mnnbuild.layout import QNN_DIR
from mnnbuild.lowering.context import TensorMeta
from mnnbuild.lowering.graph import GRAPH_JSON, LoweringError
from mnnbuild.lowering.lower import lower_subgraph
from mnnbuild.manifest import record_outputs, tool_versions
from mnnbuild.manifests.modellib import LoweredRecord, ModellibInputs, ModellibManifest, ModellibParams
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.mnn import load_model
from mnnbuild.mnn.weights import WeightFile
from mnnbuild.modeldir import MODEL_FILE, WEIGHT_FILE
from mnnbuild.partition.records import SubgraphRecord
from mnnbuild.stage import Stage

log = logging.getLogger(__name__)


def tar_raws(graph_dir: Path, dest: Path) -> None:
    """A tar of the ``.raw`` files of ``graph_dir``, identical bytes for identical contents.

    Streamed to ``dest`` (a graph holding an lm_head has over a GB of raws); the caller's staging
    directory makes it appear atomically.
    """
    with tarfile.open(dest, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for raw in sorted(graph_dir.glob("*.raw")):
            info = tarfile.TarInfo(raw.name)
            info.size = raw.stat().st_size
            info.mode = 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(raw, "rb") as f:
                tar.addfile(info, f)


def link_shared_raws(graph_dir: Path, first_dir: Path) -> int:
    """Hard-link raws of ``graph_dir`` that equal the same-named raw of ``first_dir``; returns bytes saved.

    The decode and prefill graphs of one plugin name their weights alike, so a model's weights
    would otherwise sit on disk twice (fp32: 13 GB for Qwen3-1.7B).
    """
    saved = 0
    for raw in sorted(graph_dir.glob("*.raw")):
        twin = first_dir / raw.name
        if twin.is_file() and raw.stat().st_size == twin.stat().st_size and filecmp.cmp(raw, twin, shallow=False):
            tmp = raw.with_name(raw.name + ".link")
            os.link(twin, tmp)
            os.replace(tmp, raw)
            saved += raw.stat().st_size
    return saved


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
    model_path = Path(inputs.model_dir) / MODEL_FILE
    model = load_model(model_path)
    graphs = [(p.plugin, g) for p in partition.plugins for g in p.graphs]
    read_dirs = {f"{QNN_DIR}/{g}" for _, g in graphs}
    records: list[LoweredRecord] = []
    first_graph: dict[int, Path] = {}
    saved = 0
    with staged_dir(out_dir) as tmp, WeightFile(Path(inputs.model_dir) / WEIGHT_FILE) as weights:
        for plugin, graph in tqdm(graphs, desc=f"lower {inputs.model}", unit="graph", disable=len(graphs) < 8):
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
                )
            except LoweringError as exc:
                raise StageError(f"{src / 'graph.json'}: graph {graph} cannot be lowered: {exc}") from None
            dest = tmp / QNN_DIR / graph
            lowered.write(dest)
            first = first_graph.setdefault(plugin, dest)
            if first != dest:
                saved += link_shared_raws(dest, first)
            tar_raws(dest, dest / f"{graph}.bin")
            statics = lowered.description.static_tensors
            records.append(
                LoweredRecord(
                    graph=graph,
                    plugin=plugin,
                    nodes=len(lowered.description.nodes),
                    static_tensors=len(statics),
                    static_bytes=sum((dest / str(t.raw)).stat().st_size for t in statics),
                )
            )
            log.debug("modellib %s: %s -> %d QNN nodes", inputs.model, graph, len(lowered.description.nodes))
        manifest = ModellibManifest(
            model=inputs.model,
            # the graph files read, not the partition manifest: a partition re-run with identical graphs
            # (say, a reworded report) must leave this manifest, and so the contexts, unchanged
            inputs=[r for r in partition.outputs if Path(r.path).parent.as_posix() in read_dirs],
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


__all__ = ["GRAPH_JSON", "ModellibInputs", "ModellibManifest", "ModellibParams", "build_modellib", "tar_raws"]


STAGE = Stage(
    name="modellib",
    entry=build_modellib,
    inputs=ModellibInputs,
    params=ModellibParams,
    manifest=ModellibManifest,
    upstream=("fetch", "partition"),
    outputs=(f"{QNN_DIR}/<graph>/{GRAPH_JSON}", f"{QNN_DIR}/<graph>/*.raw", f"{QNN_DIR}/<graph>/<graph>.bin"),
    doc="Lower each model's graphs to QNN graph descriptions and static tensors.",
)
