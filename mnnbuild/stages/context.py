"""context: one HTP context binary per plugin, holding its decode and prefill graphs.

Each ``merge`` entry of the partition's ``npu_postreat.json`` names the graphs of one plugin
(``qnn/graph<k>``, ``qnn/graph1_<k>``). They are composed from the modellib descriptions on
Qualcomm's HTP backend with the upstream settings (VTCM 8 MB, optimization level 3, fp16
relaxed precision, 4 HVX threads, the target's SoC id and DSP arch, weight sharing on),
finalized in ``allGraphName`` order and serialized to ``qnn/graph<k>.bin``. The written
binary is read back through QnnSystem and checked against what was asked for.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from mnnbuild.errors import QnnError, StageError
from mnnbuild.fsutil import atomic_write_bytes, staged_dir
from mnnbuild.lowering.graph import compose_context, read_graph_dirs
from mnnbuild.manifest import Manifest, record_outputs, tool_versions
from mnnbuild.qnn import HtpTarget, QnnLibrary, read_binary_info
from mnnbuild.stages.modellib import ModellibManifest
from mnnbuild.targets import Soc

log = logging.getLogger(__name__)


class ContextInputs(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    modellib_dir: Path
    binary: str
    """The merge entry's key, e.g. ``qnn/graph0.bin``."""
    graphs: list[str]
    """Its graph dirs in allGraphName order, e.g. ``["qnn/graph0", "qnn/graph1_0"]``."""


class ContextParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    soc: Soc
    weight_sharing: bool = True


class GraphIo(BaseModel):
    name: str
    inputs: list[str]
    outputs: list[str]


class ContextManifest(Manifest):
    stage = "context"
    params: ContextParams
    binary: str
    graphs: list[GraphIo]
    weight_shared: bool
    soc_type: str | None
    qnn: dict[str, str]
    """QNN library versions (build id, API versions)."""


def read_merge(partition_dir: Path) -> dict[str, list[str]]:
    """The ``merge`` map of ``npu_postreat.json``: binary path -> graph dirs."""
    path = Path(partition_dir) / "npu_postreat.json"
    try:
        merge = json.loads(path.read_text(encoding="utf-8"))["merge"]
    except (OSError, ValueError, KeyError) as exc:
        raise StageError(f"{path}: cannot read field 'merge': {exc}") from None
    if not isinstance(merge, dict) or not all(isinstance(v, list) for v in merge.values()):
        raise StageError(f"{path}: field 'merge' must map a binary path to a list of graph dirs")
    return merge


def build_context(inputs: ContextInputs, params: ContextParams, out_dir: Path) -> ContextManifest:
    """Build ``inputs.binary`` for ``params.soc`` and check it through QnnSystem's binary info."""
    modellib = ModellibManifest.read(inputs.modellib_dir)
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
