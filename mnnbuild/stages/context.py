"""context: one HTP context binary per plugin, holding its decode and prefill graphs.

Each ``merge`` entry of the partition's ``npu_postreat.json`` names the graphs of one plugin
(``qnn/graph<k>``, ``qnn/graph1_<k>``). They are composed from the modellib descriptions on
Qualcomm's HTP backend with the upstream settings (VTCM 8 MB, optimization level 3, fp16
relaxed precision, 4 HVX threads, the target's SoC id and DSP arch, weight sharing on),
finalized in ``allGraphName`` order and serialized to ``qnn/graph<k>.bin``. The written
binary is read back through QnnSystem and checked against what was asked for.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mnnbuild.errors import QnnError, StageError
from mnnbuild.fsutil import atomic_write_bytes, staged_dir
from mnnbuild.layout import QNN_DIR
from mnnbuild.lowering.graph import compose_context, read_graph_dirs
from mnnbuild.manifest import record_outputs, tool_versions
from mnnbuild.manifests.context import ContextInputs, ContextManifest, ContextParams, GraphIo
from mnnbuild.manifests.modellib import ModellibManifest
from mnnbuild.qnn import HtpTarget, QnnLibrary, read_binary_info
from mnnbuild.stage import Stage

log = logging.getLogger(__name__)


def build_context(inputs: ContextInputs, params: ContextParams, out_dir: Path) -> ContextManifest:
    """Build ``inputs.binary`` for ``params.soc`` and check it through QnnSystem's binary info."""
    modellib = inputs.manifest(ModellibManifest, inputs.modellib_dir)
    lib = QnnLibrary()
    target = HtpTarget(params.soc.soc_id, params.soc.arch_number, params.soc.vtcm_mb)
    binary = compose_context(lib, target, read_graph_dirs(inputs.modellib_dir, inputs.graphs), params.weight_sharing)
    info = read_binary_info(lib, binary)
    names = [Path(g).name for g in inputs.graphs]
    if info.graph_names != names:
        raise StageError(f"{inputs.binary}: binary holds graphs {info.graph_names}, expected {names}")
    try:
        info.check_target(params.soc.soc_id, params.soc.arch_number)
    except QnnError as exc:
        raise StageError(f"{inputs.binary} for {params.soc.name}: {exc}") from None
    with staged_dir(out_dir) as tmp:
        atomic_write_bytes(tmp / inputs.binary, binary)
        manifest = ContextManifest(
            model=inputs.model,
            target=params.soc.dsp_arch,
            inputs=[r for r in modellib.outputs if Path(r.path).parent.as_posix() in inputs.graphs],
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
            qnn={k: str(v) for k, v in lib.version.as_dict().items() if k != "lib_dir"},
        )
        manifest.write(tmp)
    log.info(
        "context %s %s for %s: %.1f MB, graphs %s",
        inputs.model,
        inputs.binary,
        params.soc.name,
        len(binary) / 1e6,
        ", ".join(names),
    )
    return manifest


STAGE = Stage(
    name="context",
    entry=build_context,
    inputs=ContextInputs,
    params=ContextParams,
    manifest=ContextManifest,
    upstream=("modellib",),
    outputs=(f"{QNN_DIR}/graph<k>.bin",),
    per_target=True,
    tools=frozenset({"QNN"}),
    doc="HTP context binaries, one per plugin (created once the model's partition ran).",
)
