"""context: one HTP context binary per plugin, holding its decode and prefill graphs.

Each ``merge`` entry of the partition's ``npu_postreat.json`` names the graphs of one plugin
(``qnn/graphllm<k>``, ``qnn/graphllm1_<k>``). They are lowered from the partition's graph dirs and the model's
weights (as the modellib stage lowers them, `mnnbuild.plugin.lowered`, without writing a model-lib) and composed on
Qualcomm's HTP backend with the upstream settings (VTCM 8 MB, optimization level 3, fp16 relaxed precision, 4 HVX
threads, the target's SoC id and DSP arch, weight sharing on), finalized in ``allGraphName`` order, serialized to
``qnn/graphllm<k>.bin`` and read back through QnnSystem to check it holds what was asked for. The binary is composed
in a fresh process, so its bytes depend on its inputs only (``mnnbuild.plugin.compose``). Its unshared twin, which
verify runs in the x86 simulator, is the twin stage's: a bundle does not wait for it. Both are made by
`mnnbuild.plugin.binary`; this module says what is the shipped binary's (its file, weight sharing, its manifest).
"""

from __future__ import annotations

from pathlib import Path

from mnnbuild.manifests.context import ContextInputs, ContextManifest, ContextParams, GraphIo
from mnnbuild.model.spec import ModelSpec
from mnnbuild.pipeline.layout import QNN_DIR
from mnnbuild.pipeline.stage import At, Stage
from mnnbuild.plugin.binary import PluginBinary, build_plugin_binary, composing_memory


def build_context(inputs: ContextInputs, params: ContextParams, out_dir: Path) -> ContextManifest:
    """Build ``inputs.binary`` for ``params.soc`` and check it through QnnSystem's binary info."""
    return build_plugin_binary(
        inputs, params, out_dir, context_manifest, file=inputs.binary, weight_sharing=params.weight_sharing,
        what=inputs.binary,
    )  # fmt: skip


def context_manifest(made: PluginBinary) -> ContextManifest:
    """The manifest of the shipped binary: each graph's inputs and outputs, and the QNN library's versions."""
    return ContextManifest(
        **made.recorded,
        graphs=[
            GraphIo(name=g.name, inputs=[t.name for t in g.inputs], outputs=[t.name for t in g.outputs])
            for g in made.info.graphs
        ],
        weight_shared=made.info.weight_shared,
        qnn={k: str(v) for k, v in made.qnn.as_dict().items() if k != "lib_dir"},
    )


def context_params(spec: ModelSpec, at: At) -> ContextParams:
    return ContextParams(soc=spec.soc(str(at.arch)), npu_weights=spec.npu_weights_of(at.part))


def describe(spec: ModelSpec, at: At) -> str:
    return f"HTP context binary {at.binary} ({', '.join(at.graphs)}) for {spec.soc(str(at.arch)).name}"


STAGE = Stage(
    entry=build_context,
    params_of=context_params,
    describe=describe,
    placement="plugin",
    defer=("*",),
    outputs=(f"{QNN_DIR}/graphllm<k>.bin",),
    tools=frozenset({"QNN"}),
    memory=composing_memory,
    doc=(
        "HTP context binaries, one per plugin, all its graphs sharing weights (created once the model's partition ran)."
    ),
    mirrors="qnn-context-binary-generator",
)
