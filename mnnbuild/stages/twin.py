"""twin: each plugin's *unshared twin*, the binary verify runs in the shipped one's place.

The x86 HTP simulator cannot load weight-shared context binaries (``mnnbuild/qnn/README.md``), so verify runs,
for each plugin, the same graphs composed without weight sharing: ``twin/graphllm<k>/graphllm<k>.bin``. It is
an output like any other (recorded with its sha256, cached, restored), so verify composes nothing; only verify
depends on it, so a bundle never waits for it, and the bundle never ships it. It is composed in a fresh process,
as the context stage composes the shipped binary (``mnnbuild.lowering.binary``), so its bytes depend on its
inputs only, and read back through QnnSystem to check it holds the plugin's graphs for the target, unshared.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mnnbuild.base.fsutil import confined, staged_dir
from mnnbuild.lowering.binary import compose_checked
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.manifests.plugin import plugin_part, plugin_sources
from mnnbuild.manifests.twin import TwinInputs, TwinManifest, TwinParams
from mnnbuild.model.spec import ModelSpec
from mnnbuild.partition.lowered import PluginGraphs
from mnnbuild.pipeline.layout import twin_file
from mnnbuild.pipeline.manifest import record_outputs, tool_versions
from mnnbuild.pipeline.stage import At, Stage
from mnnbuild.qnn import QnnLibrary

log = logging.getLogger(__name__)


def build_twin(inputs: TwinInputs, params: TwinParams, out_dir: Path) -> TwinManifest:
    """Compose the unshared twin of ``inputs.binary`` for ``params.soc`` and check it through its binary info."""
    fetch = inputs.manifest(FetchManifest, inputs.model_dir)
    partition = inputs.manifest(PartitionManifest, inputs.partition_dir)
    lib = QnnLibrary()
    soc = params.soc
    name = twin_file(inputs.binary)
    what = f"unshared twin of {inputs.binary}"
    with staged_dir(out_dir) as tmp:
        dest = confined(tmp, name, "npu_postreat.json field 'merge'")
        part = plugin_part(fetch, partition)
        source = PluginGraphs.of(inputs.model_dir, part, inputs.partition_dir, inputs.graphs, params.npu_weights)
        info, size, seconds, notes = compose_checked(lib, soc, source, source.names, False, dest, what)
        manifest = TwinManifest(
            model=inputs.model,
            target=soc.dsp_arch,
            inputs=plugin_sources(fetch, partition, inputs.graphs),
            params=params,
            tools=tool_versions(qnn=lib.version.build_id),
            outputs=record_outputs(tmp),
            binary=inputs.binary,
            twin=name,
            graphs=info.graph_names,
            soc_type=info.soc_type,
            weights=notes,
        )
        manifest.write(tmp)
    log.debug(
        "twin %s %s for %s: %.1f MB, graphs %s, %.1fs",
        inputs.model,
        inputs.binary,
        soc.name,
        size / 1e6,
        ", ".join(info.graph_names),
        seconds,
    )
    return manifest


def twin_params(spec: ModelSpec, at: At) -> TwinParams:
    return TwinParams(soc=spec.soc(str(at.arch)), npu_weights=spec.npu_weights_of(at.part))


def describe(spec: ModelSpec, at: At) -> str:
    soc = spec.soc(str(at.arch))
    return f"unshared twin of {at.binary} ({', '.join(at.graphs)}) for {soc.name}, which verify runs"


STAGE = Stage(
    name="twin",
    entry=build_twin,
    inputs=TwinInputs,
    params=TwinParams,
    manifest=TwinManifest,
    params_of=twin_params,
    describe=describe,
    placement="plugin",
    defer=("*",),
    outputs=("graphllm<k>.bin",),
    tools=frozenset({"QNN"}),
    doc="Unshared twins of the context binaries, one per plugin, which verify runs (created once the partition ran).",
)
