"""context: one HTP context binary per plugin, holding its decode and prefill graphs.

Each ``merge`` entry of the partition's ``npu_postreat.json`` names the graphs of one plugin
(``qnn/graphllm<k>``, ``qnn/graphllm1_<k>``). They are lowered from the partition's graph dirs and the model's
weights (as the modellib stage lowers them, `mnnbuild.partition.lowered`, without writing a model-lib) and composed on
Qualcomm's HTP backend with the upstream settings (VTCM 8 MB, optimization level 3, fp16
relaxed precision, 4 HVX threads, the target's SoC id and DSP arch, weight sharing on),
finalized in ``allGraphName`` order, serialized to ``qnn/graphllm<k>.bin`` and read back through QnnSystem
to check it holds what was asked for. The binary is composed in a fresh process, so its bytes depend on its
inputs only (``mnnbuild.lowering.binary``). Its unshared twin, which verify runs in the x86 simulator, is
the twin stage's: a bundle does not wait for it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mnnbuild.base.fsutil import confined, staged_dir
from mnnbuild.lowering.binary import compose_checked
from mnnbuild.manifests.context import ContextInputs, ContextManifest, ContextParams, GraphIo
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.manifests.plugin import plugin_part, plugin_sources
from mnnbuild.model.spec import ModelSpec
from mnnbuild.partition.lowered import PluginGraphs
from mnnbuild.pipeline.layout import QNN_DIR
from mnnbuild.pipeline.manifest import record_outputs, tool_versions
from mnnbuild.pipeline.stage import At, Stage
from mnnbuild.qnn import QnnLibrary

log = logging.getLogger(__name__)


def build_context(inputs: ContextInputs, params: ContextParams, out_dir: Path) -> ContextManifest:
    """Build ``inputs.binary`` for ``params.soc`` and check it through QnnSystem's binary info."""
    fetch = inputs.manifest(FetchManifest, inputs.model_dir)
    partition = inputs.manifest(PartitionManifest, inputs.partition_dir)
    lib = QnnLibrary()
    soc = params.soc
    with staged_dir(out_dir) as tmp:
        dest = confined(tmp, inputs.binary, "npu_postreat.json field 'merge'")
        part = plugin_part(fetch, partition)
        source = PluginGraphs.of(inputs.model_dir, part, inputs.partition_dir, inputs.graphs, params.npu_weights)
        # a one-graph plugin (a VL encoder built for one image size) has nothing to share: QNN marks it unshared
        sharing = params.weight_sharing and len(source.graphs) > 1
        info, size, seconds, notes = compose_checked(lib, soc, source, source.names, sharing, dest, inputs.binary)
        manifest = ContextManifest(
            model=inputs.model,
            target=soc.dsp_arch,
            inputs=plugin_sources(fetch, partition, inputs.graphs),
            params=params,
            tools=tool_versions(qnn=lib.version.build_id),
            outputs=record_outputs(tmp),
            binary=inputs.binary,
            graphs=[
                GraphIo(name=g.name, inputs=[t.name for t in g.inputs], outputs=[t.name for t in g.outputs])
                for g in info.graphs
            ],
            weight_shared=info.weight_shared,
            soc_type=info.soc_type,
            weights=notes,
            qnn={k: str(v) for k, v in lib.version.as_dict().items() if k != "lib_dir"},
        )
        manifest.write(tmp)
    log.debug(
        "context %s %s for %s: %.1f MB, graphs %s, %.1fs",
        inputs.model,
        inputs.binary,
        soc.name,
        size / 1e6,
        ", ".join(info.graph_names),
        seconds,
    )
    return manifest


def context_params(spec: ModelSpec, at: At) -> ContextParams:
    return ContextParams(soc=spec.soc(str(at.arch)), npu_weights=spec.npu_weights_of(at.part))


def describe(spec: ModelSpec, at: At) -> str:
    return f"HTP context binary {at.binary} ({', '.join(at.graphs)}) for {spec.soc(str(at.arch)).name}"


STAGE = Stage(
    name="context",
    entry=build_context,
    inputs=ContextInputs,
    params=ContextParams,
    manifest=ContextManifest,
    params_of=context_params,
    describe=describe,
    placement="plugin",
    defer=("*",),
    outputs=(f"{QNN_DIR}/graphllm<k>.bin",),
    tools=frozenset({"QNN"}),
    doc="HTP context binaries, one per plugin (created once the model's partition ran).",
)
