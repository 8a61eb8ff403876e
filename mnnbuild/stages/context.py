"""context: one HTP context binary per plugin, holding its decode and prefill graphs.

Each ``merge`` entry of the partition's ``npu_postreat.json`` names the graphs of one plugin
(``qnn/graph<k>``, ``qnn/graph1_<k>``). They are composed from the modellib descriptions on
Qualcomm's HTP backend with the upstream settings (VTCM 8 MB, optimization level 3, fp16
relaxed precision, 4 HVX threads, the target's SoC id and DSP arch, weight sharing on),
finalized in ``allGraphName`` order and serialized to ``qnn/graph<k>.bin``. The same graphs are then
composed again without weight sharing into ``twin/graph<k>.bin``, the *unshared twin*: the x86 HTP
simulator cannot load weight-shared binaries, so verify runs the twin in the shipped binary's place. It is
an output like any other (recorded with its sha256, cached, restored), so verify composes nothing; the
bundle never ships it. Both written binaries are read back through QnnSystem and checked against what
was asked for.

Each binary is composed in a fresh process: the HTP library numbers graph tensors from a counter
that lives as long as the process (a new backend and device do not reset it, nor does reloading
the library), and those ids are serialized, so a second context built in one process gets other
bytes than the same context built first. A fresh process makes the binary depend on its inputs only
(the twin is composed second in that process, so it depends on its inputs and that order).
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from mnnbuild.errors import QnnError, StageError
from mnnbuild.fsutil import atomic_write_bytes, confined, staged_dir
from mnnbuild.layout import QNN_DIR, TWIN_DIR, twin_path
from mnnbuild.logs import configure_logging
from mnnbuild.lowering.graph import compose_context, read_graph_dirs
from mnnbuild.manifest import record_outputs, tool_versions
from mnnbuild.manifests.context import ContextInputs, ContextManifest, ContextParams, GraphIo
from mnnbuild.manifests.modellib import ModellibManifest
from mnnbuild.qnn import BinaryInfo, HtpTarget, QnnLibrary, read_binary_info
from mnnbuild.stage import Stage
from mnnbuild.targets import Soc

log = logging.getLogger(__name__)


def compose_to_file(
    target: HtpTarget, modellib_dir: Path, graphs: list[str], outputs: list[tuple[bool, Path]], log_level: str
) -> None:
    """`compose_context` of the same graphs into each ``(weight_sharing, dest)`` in turn; meant to run in a fresh
    process (see the module doc): the bytes then depend on the inputs and this order only."""
    configure_logging(log_level)  # as in the parent: each finalized graph is logged with its time
    descriptions = read_graph_dirs(modellib_dir, graphs)
    lib = QnnLibrary()
    for weight_sharing, dest in outputs:
        atomic_write_bytes(dest, compose_context(lib, target, descriptions, weight_sharing))


def _checked_info(lib: QnnLibrary, what: str, data: bytes, names: list[str], soc: Soc, shared: bool) -> BinaryInfo:
    """The binary info of a written binary, which must hold ``names`` for ``soc``, weight-shared or not."""
    info = read_binary_info(lib, data)
    if info.graph_names != names:
        raise StageError(f"{what}: binary holds graphs {info.graph_names}, expected {names}")
    try:
        info.check_target(soc.soc_id, soc.arch_number)
    except QnnError as exc:
        raise StageError(f"{what} for {soc.name}: {exc}") from None
    if info.weight_shared != shared:
        raise StageError(f"{what}: weight_shared is {info.weight_shared}, expected {shared}")
    return info


def build_context(inputs: ContextInputs, params: ContextParams, out_dir: Path) -> ContextManifest:
    """Build ``inputs.binary`` for ``params.soc`` (and, when it is weight-shared, its unshared twin for verify)
    and check both through QnnSystem's binary info."""
    modellib = inputs.manifest(ModellibManifest, inputs.modellib_dir)
    lib = QnnLibrary()
    soc = params.soc
    target = HtpTarget(soc.soc_id, soc.arch_number, soc.vtcm_mb)
    names = [Path(g).name for g in inputs.graphs]
    twin = twin_path(inputs.binary) if params.weight_sharing else None
    with staged_dir(out_dir) as tmp:
        dest = confined(tmp, inputs.binary, "npu_postreat.json field 'merge'")
        outputs = [(params.weight_sharing, dest)]
        if twin is not None:
            outputs.append((False, confined(tmp, twin, "npu_postreat.json field 'merge'")))
        for _, path in outputs:
            path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        # spawn, not fork: a forked child would inherit this process's QNN tensor id counter
        spawn = multiprocessing.get_context("spawn")
        try:
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                pool.submit(
                    compose_to_file,
                    target,
                    Path(inputs.modellib_dir),
                    list(inputs.graphs),
                    outputs,
                    logging.getLevelName(log.getEffectiveLevel()),
                ).result()
        except BrokenProcessPool as exc:
            raise StageError(f"{inputs.binary}: the process composing it died ({exc})") from None
        seconds = time.perf_counter() - started
        binary = dest.read_bytes()
        info = _checked_info(lib, inputs.binary, binary, names, soc, params.weight_sharing)
        if twin is not None:
            _checked_info(lib, f"{inputs.binary} (twin {twin})", (tmp / twin).read_bytes(), names, soc, False)
        manifest = ContextManifest(
            model=inputs.model,
            target=soc.dsp_arch,
            inputs=[r for r in modellib.outputs if Path(r.path).parent.as_posix() in inputs.graphs],
            params=params,
            tools=tool_versions(qnn=lib.version.build_id),
            outputs=record_outputs(tmp),
            binary=inputs.binary,
            twin=twin,
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
        "context %s %s for %s: %.1f MB, graphs %s%s, %.1fs",
        inputs.model,
        inputs.binary,
        soc.name,
        len(binary) / 1e6,
        ", ".join(names),
        f" (+ unshared twin {twin})" if twin else "",
        seconds,
    )
    return manifest


STAGE = Stage(
    name="context",
    entry=build_context,
    inputs=ContextInputs,
    params=ContextParams,
    manifest=ContextManifest,
    upstream=("modellib",),
    outputs=(f"{QNN_DIR}/graph<k>.bin", f"{TWIN_DIR}/graph<k>.bin"),
    per_target=True,
    tools=frozenset({"QNN"}),
    doc="HTP context binaries, one per plugin (created once the model's partition ran).",
)
