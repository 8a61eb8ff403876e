"""twin: each plugin's *unshared twin*, the binary verify runs in the shipped one's place.

The x86 HTP simulator cannot load weight-shared context binaries (``mnnbuild/qnn/README.md``), so verify runs,
for each plugin, the same graphs composed without weight sharing: ``twin/graphllm<k>/graphllm<k>.bin``. It is
an output like any other (recorded with its sha256, cached, restored), so verify composes nothing; only verify
depends on it, so a bundle never waits for it, and the bundle never ships it. It is composed in a fresh process,
as the context stage composes the shipped binary (both by `mnnbuild.plugin.binary`), so its bytes depend on its
inputs only, and read back through QnnSystem to check it holds the plugin's graphs for the target, unshared.
"""

from __future__ import annotations

from pathlib import Path

from mnnbuild.manifests.twin import TwinInputs, TwinManifest, TwinParams
from mnnbuild.model.spec import ModelSpec
from mnnbuild.pipeline.layout import twin_file
from mnnbuild.pipeline.stage import At, Stage
from mnnbuild.plugin.binary import PluginBinary, build_plugin_binary, composing_memory


def build_twin(inputs: TwinInputs, params: TwinParams, out_dir: Path) -> TwinManifest:
    """Compose the unshared twin of ``inputs.binary`` for ``params.soc`` and check it through its binary info."""
    return build_plugin_binary(
        inputs, params, out_dir, twin_manifest, file=twin_file(inputs.binary), weight_sharing=False,
        what=f"unshared twin of {inputs.binary}",
    )  # fmt: skip


def twin_manifest(made: PluginBinary) -> TwinManifest:
    """The manifest of a twin: its file (hashed in ``outputs``) and graph names, which the runtime reads."""
    return TwinManifest(**made.recorded, twin=made.file, graphs=made.info.graph_names)


def twin_params(spec: ModelSpec, at: At) -> TwinParams:
    return TwinParams(soc=spec.soc(str(at.arch)), npu_weights=spec.npu_weights_of(at.part))


def describe(spec: ModelSpec, at: At) -> str:
    soc = spec.soc(str(at.arch))
    return f"unshared twin of {at.binary} ({', '.join(at.graphs)}) for {soc.name}, which verify runs"


STAGE = Stage(
    entry=build_twin,
    params_of=twin_params,
    describe=describe,
    placement="plugin",
    defer=("*",),
    outputs=("graphllm<k>.bin",),
    tools=frozenset({"QNN"}),
    memory=composing_memory,
    doc=(
        "Unshared twins of the context binaries, one per plugin, for the x86 simulator: verify's, never "
        "shipped (created once the partition ran)."
    ),
)
