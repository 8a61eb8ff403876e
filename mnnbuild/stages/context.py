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

import json
import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from mnnbuild.errors import QnnError, StageError
from mnnbuild.fsutil import atomic_write_bytes, confined, staged_dir
from mnnbuild.lowering.graph import compose, read_graph_description
from mnnbuild.manifest import Manifest, record_outputs, tool_versions
from mnnbuild.qnn import ContextBuilder, HtpTarget, QnnLibrary, read_binary_info
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


def compose_context(
    lib: QnnLibrary, target: HtpTarget, modellib_dir: Path, graphs: list[str], weight_sharing: bool
) -> bytes:
    """Compose, finalize and serialize the named graphs (graph names are the dirs' basenames)."""
    with ContextBuilder(lib, target, weight_sharing=weight_sharing) as ctx:
        for graph in graphs:
            src = confined(Path(modellib_dir), graph, "npu_postreat.json field 'merge'")
            desc = read_graph_description(src)
            name = Path(graph).name
            builder = ctx.add_graph(name)
            try:
                compose(desc, src, builder)
                started = time.perf_counter()
                builder.finalize()
            except QnnError as exc:
                raise StageError(f"{src}: QNN refused graph {name}: {exc}") from None
            log.info("context: finalized %s (%d nodes) in %.2fs", name, len(desc.nodes), time.perf_counter() - started)
        return ctx.serialize()


def compose_to_file(
    target: HtpTarget, modellib_dir: Path, graphs: list[str], weight_sharing: bool, dest: Path, log_level: int
) -> None:
    """`compose_context` into ``dest``; meant to run in a fresh process (see the module doc)."""
    logging.basicConfig(level=log_level, format="%(levelname).1s %(name)s: %(message)s")
    atomic_write_bytes(dest, compose_context(QnnLibrary(), target, modellib_dir, graphs, weight_sharing))


def build_context(inputs: ContextInputs, params: ContextParams, out_dir: Path) -> ContextManifest:
    """Build ``inputs.binary`` for ``params.soc`` and check it through QnnSystem's binary info."""
    modellib = ModellibManifest.read(inputs.modellib_dir)
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
