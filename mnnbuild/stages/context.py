"""context: one HTP context binary per plugin, holding its decode and prefill graphs.

Each ``merge`` entry of the partition's ``npu_postreat.json`` names the graphs of one plugin
(``qnn/graph<k>``, ``qnn/graph1_<k>``). They are composed from the modellib descriptions on
Qualcomm's HTP backend with the upstream settings (VTCM 8 MB, optimization level 3, fp16
relaxed precision, 4 HVX threads, the target's SoC id and DSP arch, weight sharing on),
finalized in ``allGraphName`` order and serialized to ``qnn/graph<k>.bin``. The written
binary is read back through QnnSystem and checked against what was asked for.

Each binary is composed in a fresh process: the HTP library numbers graph tensors from a counter
that lives as long as the process (a new backend and device do not reset it, nor does reloading
the library), and those ids are serialized, so a second context built in one process gets other
bytes than the same context built first. A fresh process makes the binary depend on its inputs only.
"""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from mnnbuild.errors import QnnError, StageError
from mnnbuild.fsutil import atomic_write_bytes, confined, staged_dir
from mnnbuild.layout import QNN_DIR
from mnnbuild.lowering.graph import compose_context, read_graph_dirs
from mnnbuild.manifest import record_outputs, tool_versions
from mnnbuild.manifests.context import ContextInputs, ContextManifest, ContextParams, GraphIo
from mnnbuild.manifests.modellib import ModellibManifest
from mnnbuild.qnn import HtpTarget, QnnLibrary, read_binary_info
from mnnbuild.stage import Stage

log = logging.getLogger(__name__)


def compose_to_file(
    target: HtpTarget, modellib_dir: Path, graphs: list[str], weight_sharing: bool, dest: Path, log_level: int
) -> None:
    """`compose_context` into ``dest``; meant to run in a fresh process (see the module doc)."""
    logging.basicConfig(level=log_level, format="%(levelname).1s %(name)s: %(message)s")
    descriptions = read_graph_dirs(modellib_dir, graphs)
    atomic_write_bytes(dest, compose_context(QnnLibrary(), target, descriptions, weight_sharing))


def build_context(inputs: ContextInputs, params: ContextParams, out_dir: Path) -> ContextManifest:
    """Build ``inputs.binary`` for ``params.soc`` and check it through QnnSystem's binary info."""
    modellib = inputs.manifest(ModellibManifest, inputs.modellib_dir)
    lib = QnnLibrary()
    target = HtpTarget(params.soc.soc_id, params.soc.arch_number, params.soc.vtcm_mb)
    names = [Path(g).name for g in inputs.graphs]
    with staged_dir(out_dir) as tmp:
        dest = confined(tmp, inputs.binary, "npu_postreat.json field 'merge'")
        dest.parent.mkdir(parents=True, exist_ok=True)
        # spawn, not fork: a forked child would inherit this process's QNN tensor id counter
        spawn = multiprocessing.get_context("spawn")
        try:
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                pool.submit(
                    compose_to_file,
                    target,
                    Path(inputs.modellib_dir),
                    list(inputs.graphs),
                    params.weight_sharing,
                    dest,
                    logging.getLogger().getEffectiveLevel(),
                ).result()
        except BrokenProcessPool as exc:
            raise StageError(f"{inputs.binary}: the process composing it died ({exc})") from None
        binary = dest.read_bytes()
        info = read_binary_info(lib, binary)
        if info.graph_names != names:
            raise StageError(f"{inputs.binary}: binary holds graphs {info.graph_names}, expected {names}")
        try:
            info.check_target(params.soc.soc_id, params.soc.arch_number)
        except QnnError as exc:
            raise StageError(f"{inputs.binary} for {params.soc.name}: {exc}") from None
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
