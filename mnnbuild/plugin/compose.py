"""One HTP context binary composed in a fresh process, and checked once written.

The context stage (the shipped, weight-shared binary) and the twin stage (its unshared twin, which the x86
simulator can load) both compose through :func:`compose_in_fresh_process`: the HTP library numbers graph tensors
from a counter that lives as long as the process (a new backend and device do not reset it, nor does reloading
the library), and those ids are serialized, so a second context built in one process gets other bytes than the
same context built first. One binary per fresh process makes its bytes depend on its inputs only.

What to compose is a :data:`GraphSource`: a picklable callable the fresh process calls for the graphs (name ->
description and static data, in order), e.g. ``functools.partial(read_graph_dirs, modellib_dir, graphs)``, or the
stages' `mnnbuild.plugin.lowered.PluginGraphs`, which lowers in that process (its statics never cross a pipe).
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mnnbuild.base.child import Channel, Child
from mnnbuild.base.errors import ChildDiedError, LoweringError, QnnError
from mnnbuild.base.fsutil import atomic_write_bytes
from mnnbuild.base.logs import configure_logging
from mnnbuild.lowering.graph import GraphDescription, StaticSource, composed_context
from mnnbuild.model.npu_weights import WeightNote
from mnnbuild.model.targets import Soc
from mnnbuild.qnn import BinaryInfo, HtpTarget, QnnLibrary, read_binary_info

log = logging.getLogger(__name__)

GraphSource = Callable[[], Mapping[str, tuple[GraphDescription, StaticSource]]]


def weight_notes(graphs: Mapping[str, tuple[GraphDescription, StaticSource]]) -> list[WeightNote]:
    """How each weight of the graphs is stored, once per weight (the graphs of a plugin share them)."""
    notes: dict[str, WeightNote] = {}
    for name in graphs:
        for note in graphs[name][0].weights:
            notes.setdefault(note.tensor, note)
    return list(notes.values())


def compose_to_file(
    target: HtpTarget, source: GraphSource, weight_sharing: bool, dest: Path, log_level: str
) -> list[WeightNote]:
    """`composed_context` of ``source``'s graphs into ``dest``; meant to run in a fresh process (see the module doc).
    Returns how the binary stores each weight."""
    configure_logging(log_level)  # as in the parent: each finalized graph is logged with its time
    graphs = dict(source())
    notes = weight_notes(graphs)
    with composed_context(QnnLibrary(), target, graphs, weight_sharing, label=dest.stem) as ctx:
        # QNN copied every static when it was created: let go of ours before serializing, QNN's peak
        graphs.clear()
        with ctx.binary_view() as binary:
            atomic_write_bytes(dest, binary)  # straight from QNN's buffer: no copy of a GB-sized binary
    return notes


def _fresh_processes(source: GraphSource) -> multiprocessing.context.BaseContext:
    """Processes forked from a server that imported this module, the MNN schema and ``source``'s module (say,
    the partition's lowering) but never loaded QNN.

    Not a plain fork: this process may have loaded QNN (its tensor id counter would be inherited). A forked
    child of the server is as fresh as a spawned interpreter for QNN, without importing numpy, pydantic and
    mnnbuild again for every binary (a cost docs/benchmarks.md gives). The server starts
    with the first binary a process composes, with that one's preloads.
    """
    ctx = multiprocessing.get_context("forkserver")
    # tqdm: each child's progress bar imports it (about 60 ms a child, once in the server)
    ctx.set_forkserver_preload([__name__, "mnnbuild.mnn._generated.mnn_fb", type(source).__module__, "tqdm"])
    return ctx


def compose_in_fresh_process(
    target: HtpTarget, source: GraphSource, weight_sharing: bool, dest: Path
) -> list[WeightNote]:
    """Compose ``source``'s graphs into the binary ``dest`` in a fresh process (returns how it stores each weight);
    a ``LoweringError`` when that process dies.

    That process never outlives this one (`mnnbuild.base.child`): stopped here (Ctrl-C, SIGTERM as
    KeyboardInterrupt), this one kills it before passing the interrupt on; killed here (``kill -9``, the OOM
    killer), it kills itself."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with Child(_fresh_processes(source), _compose_child, (target, source, weight_sharing, dest), "compose") as child:
        try:
            notes = child.result()
        except ChildDiedError as exc:
            raise LoweringError(str(exc).replace("the compose process", "the process composing it")) from None
    return [WeightNote.model_validate(n) for n in notes]


def _compose_child(
    channel: Channel, target: HtpTarget, source: GraphSource, weight_sharing: bool, dest: Path
) -> list[dict[str, Any]]:
    """The compose process: `compose_to_file`, its weight notes returned as data."""
    level = logging.getLevelName(logging.getLogger("mnnbuild").getEffectiveLevel())
    return [n.model_dump() for n in compose_to_file(target, source, weight_sharing, dest, level)]


def checked_info(lib: QnnLibrary, what: str, data: bytes, names: list[str], soc: Soc, shared: bool) -> BinaryInfo:
    """The binary info of a written binary, which must hold ``names`` for ``soc``, weight-shared or not; a
    ``LoweringError`` naming ``what`` otherwise."""
    info = read_binary_info(lib, data)
    if info.graph_names != names:
        raise LoweringError(f"{what}: binary holds graphs {info.graph_names}, expected {names}")
    try:
        info.check_target(soc.soc_id, soc.arch_number)
    except QnnError as exc:
        raise LoweringError(f"{what} for {soc.name}: {exc}") from None
    if info.weight_shared != shared:
        raise LoweringError(f"{what}: weight_shared is {info.weight_shared}, expected {shared}")
    return info


def compose_checked(
    lib: QnnLibrary,
    soc: Soc,
    source: GraphSource,
    names: list[str],
    weight_sharing: bool,
    dest: Path,
    what: str,
) -> tuple[BinaryInfo, int, float, list[WeightNote]]:
    """:func:`compose_in_fresh_process` for ``soc``, then :func:`checked_info` of what it wrote (it must hold the
    graphs ``names``, in order): the binary's info, its size, the seconds composing it took and how it stores each
    weight. A ``LoweringError`` names ``what``."""
    started = time.perf_counter()
    target = HtpTarget(soc.soc_id, soc.arch_number, soc.vtcm_mb)
    try:
        notes = compose_in_fresh_process(target, source, weight_sharing, dest)
    except LoweringError as exc:  # the same type, named after the binary
        raise type(exc)(f"{what}: {exc}") from None
    seconds = time.perf_counter() - started
    data = dest.read_bytes()
    return checked_info(lib, what, data, names, soc, weight_sharing), len(data), seconds, notes
