"""One QNN plugin: check its context binary against the plugin attributes, load it once, execute graphs.

Mirrors MNN's QNN plugin kernel: the shape index comes from matching the live input shapes against
``allInputShape``; the binary is described through QnnSystem binary info, a context is created from
it and every graph is retrieved in ``allGraphName`` order; buffers are bound by the QNN tensor names
of the ``inputs``/``outputs`` attributes; graph ``allGraphName[shape index]`` is executed.

The x86 HTP library cannot load a weight-shared context binary (see ``mnnbuild/qnn/README.md``), so a
:class:`BinaryOverride` can name an unshared twin built from the same graphs: the shipped binary is
still checked through binary info (and, if its hash is given, byte for byte), and the run report says
which binary was executed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mnnbuild.base.errors import QnnError
from mnnbuild.cpu import return_freed_memory
from mnnbuild.mnn import schema
from mnnbuild.qnn import BinaryInfo, ContextRunner, HtpTarget, QnnLibrary, read_binary_info, same_element_order
from mnnbuild_runtime.bundle import PluginSpec
from mnnbuild_runtime.errors import BinaryCheckError, PluginShapeError
from mnnbuild_runtime.hashes import FileHashes, read_stamped

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BinaryOverride:
    """Run ``binary`` (bytes or a file) instead of a plugin's shipped context binary.

    ``shipped_sha256``: the hash the shipped binary had when the twin was built next to it; a bundle
    whose binary differs (a flipped byte, a swapped file) is then refused. ``sha256``: the twin's own
    recorded hash; a twin that no longer has it is refused. ``label`` names the twin in reports
    (defaults to its path, or ``"<bytes>"``). A file is read when needed, not held in memory.
    """

    binary: bytes | Path
    shipped_sha256: str | None = None
    label: str | None = None
    sha256: str | None = None

    def read(self) -> bytes:
        return self.read_stamped()[0]

    @property
    def file(self) -> Path | None:
        """The file it is read from (None: bytes in memory)."""
        return None if isinstance(self.binary, (bytes, bytearray)) else Path(self.binary)

    def read_stamped(self) -> tuple[bytes, tuple[int, ...] | None]:
        """Its bytes, with the file's stamp while they were read (`mnnbuild_runtime.hashes.read_stamped`; None for
        bytes in memory)."""
        if isinstance(self.binary, (bytes, bytearray)):
            return bytes(self.binary), None
        try:
            with open(self.binary, "rb") as fh:
                return read_stamped(fh)
        except OSError as exc:
            raise BinaryCheckError(f"binary override {self.binary}: cannot read: {exc}") from exc

    @property
    def source(self) -> str:
        if self.label:
            return self.label
        return str(self.binary) if isinstance(self.binary, (str, os.PathLike)) else "<bytes>"


OverrideLike = BinaryOverride | bytes | Path | str


def as_override(value: OverrideLike) -> BinaryOverride:
    if isinstance(value, BinaryOverride):
        return value
    if isinstance(value, (bytes, bytearray)):
        return BinaryOverride(bytes(value))
    return BinaryOverride(Path(value))


def shape_index(all_input_shape: Sequence[int], shapes: Sequence[Sequence[int]], num_shapes: int) -> int | None:
    """The index of the first block of ``allInputShape`` equal to the live input shapes, as MNN's plugin
    kernel picks it (``None``: no block matches). Inputs of total rank 0 select block 0; only the first
    ``num_shapes`` blocks (one per graph) can be selected."""
    flat = [int(d) for s in shapes for d in s]
    if not flat:
        return 0
    for index in range(min(len(all_input_shape) // len(flat), num_shapes)):
        if [int(d) for d in all_input_shape[index * len(flat) : (index + 1) * len(flat)]] == flat:
            return index
    return None


def select_shape_index(spec: PluginSpec, shapes: Sequence[tuple[int, ...]]) -> int:
    """:func:`shape_index` of ``spec``'s ``allInputShape``; no match raises :class:`PluginShapeError`."""
    index = shape_index(spec.all_input_shape, shapes, spec.num_shapes)
    if index is not None:
        return index
    ranks = [len(s) for s in shapes]
    candidates = spec.input_shapes(ranks)
    live = [tuple(int(d) for d in s) for s in shapes]
    shown = [[list(d) for d in c] for c in candidates] if len(spec.all_input_shape) % sum(ranks) == 0 else None
    raise PluginShapeError(
        f"{spec.where()}: input shapes {[list(s) for s in live]} (tensors {list(spec.input_tensors)}) match none "
        f"of its allInputShape {shown if shown is not None else list(spec.all_input_shape)} "
        f"(graphs {list(spec.graph_names)})"
    )


_QNN_NUMPY_COMPATIBLE = {np.dtype(np.float32), np.dtype(np.int32)}


def check_structure(spec: PluginSpec, info: BinaryInfo, what: str) -> None:
    """Raise :class:`BinaryCheckError` unless ``info`` holds exactly the plugin's graphs, in ``allGraphName``
    order, each with the plugin's input/output tensor names, the shapes of ``allInputShape`` and
    ``o_<shape>_<output>``, and float32/int32 IO."""
    where = f"{spec.where()}: {what}"
    names = list(info.graph_names)
    for g in spec.graph_names:
        if g not in names:
            raise BinaryCheckError(
                f"{where}: attribute 'allGraphName' names graph {g!r}, which the context binary does not contain; "
                f"it holds {names}"
            )
    if names != list(spec.graph_names):
        raise BinaryCheckError(
            f"{where}: context binary holds graphs {names}; expected exactly {list(spec.graph_names)} "
            "in that order (attribute 'allGraphName')"
        )
    ranks: list[int] | None = None
    for s, gname in enumerate(spec.graph_names):
        graph = info.graph(gname)
        got_in = sorted(t.name for t in graph.inputs)
        got_out = sorted(t.name for t in graph.outputs)
        if got_in != sorted(spec.qnn_inputs):
            raise BinaryCheckError(
                f"{where}: graph {gname!r} has inputs {got_in}; expected the plugin's 'inputs' "
                f"{sorted(spec.qnn_inputs)}"
            )
        if got_out != sorted(spec.qnn_outputs):
            raise BinaryCheckError(
                f"{where}: graph {gname!r} has outputs {got_out}; expected the plugin's 'outputs' "
                f"{sorted(spec.qnn_outputs)}"
            )
        tin = [graph.input(n) for n in spec.qnn_inputs]
        these = [len(t.dims) for t in tin]
        if ranks is None:
            ranks = these
            if sum(ranks) * spec.num_shapes != len(spec.all_input_shape):
                raise BinaryCheckError(
                    f"{where}: graph inputs have ranks {ranks} ({sum(ranks)} dims per shape) but attribute "
                    f"'allInputShape' holds {len(spec.all_input_shape)} dims for {spec.num_shapes} shapes"
                )
        elif these != ranks:
            raise BinaryCheckError(
                f"{where}: graph {gname!r} input ranks {these} differ from the first graph's {ranks}"
            )
        expected_in = spec.input_shapes(ranks)[s]
        for t, dims in zip(tin, expected_in, strict=True):
            if not same_element_order(t.dims, dims):  # [1, 1, N, C] for MNN's [N, C, 1, 1]: the same bytes
                raise BinaryCheckError(
                    f"{where}: graph {gname!r} input {t.name!r} has dims {list(t.dims)}; attribute 'allInputShape' "
                    f"gives {list(dims)} for shape {s}"
                )
            if t.numpy_dtype not in _QNN_NUMPY_COMPATIBLE:
                raise BinaryCheckError(
                    f"{where}: graph {gname!r} input {t.name!r} is {t.dtype}; expected float32 or int32 IO"
                )
        for i, (qname, desc) in enumerate(zip(spec.qnn_outputs, spec.outputs[s], strict=True)):
            t = graph.output(qname)
            same = (
                int(np.prod(t.dims)) == int(np.prod(desc.dims))
                if desc.data_format == schema.MNN_DATA_FORMAT.NHWC
                else same_element_order(t.dims, desc.dims)
            )
            if not same:
                raise BinaryCheckError(
                    f"{where}: graph {gname!r} output {qname!r} has dims {list(t.dims)}; attribute "
                    f"'o_{s}_{i}' gives {list(desc.dims)}"
                )
            expected_dtype = np.dtype(np.float32) if desc.dtype.kind == "f" else np.dtype(np.int32)
            if t.numpy_dtype != expected_dtype:
                raise BinaryCheckError(
                    f"{where}: graph {gname!r} output {qname!r} is {t.dtype}; attribute 'o_{s}_{i}' "
                    f"({desc.dtype}) needs {expected_dtype}"
                )


def _target_tags(info: BinaryInfo) -> dict[str, Any]:
    return {"soc_model": info.soc_model, "soc_type": info.soc_type, "dsp_arch": info.dsp_arch}


@dataclass
class PluginStats:
    calls: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, graph: str, seconds: float) -> None:
        self.calls[graph] = self.calls.get(graph, 0) + 1
        self.seconds[graph] = self.seconds.get(graph, 0.0) + seconds


class PluginRunner:
    """Loads one plugin's context binary lazily and executes its graphs; :meth:`close` frees the context, and the
    next run loads it again (from the checked bytes, read anew). ``hashes``: where the binaries' hashes are
    remembered (`mnnbuild_runtime.hashes`: a file unchanged since it was hashed is not hashed again)."""

    def __init__(
        self,
        spec: PluginSpec,
        lib_factory: Callable[[], QnnLibrary],
        *,
        override: BinaryOverride | None = None,
        expected_target: HtpTarget | None = None,
        allow_weight_shared: bool = False,
        hashes: FileHashes | None = None,
    ) -> None:
        self.spec = spec
        self.hashes = hashes if hashes is not None else FileHashes()
        self._lib_factory = lib_factory
        self.override = override
        self.expected_target = expected_target
        self.allow_weight_shared = allow_weight_shared
        self.shipped_info: BinaryInfo | None = None
        self.shipped_sha256: str | None = None
        self.executed_info: BinaryInfo | None = None
        self.executed_sha256: str | None = None
        self.executed: str | None = None  # "shipped" or "override"
        self.load_seconds = 0.0
        """Time spent creating the context, over every load."""
        self.loads = 0
        self.stats = PluginStats()
        self._runner: ContextRunner | None = None
        self._checked = False

    def _info(self, lib: QnnLibrary, data: bytes, what: str) -> BinaryInfo:
        try:
            return read_binary_info(lib, data)
        except QnnError as exc:
            raise BinaryCheckError(f"{self.spec.where()}: {what} is not a readable QNN context binary: {exc}") from exc

    def _check_target(self, info: BinaryInfo, what: str) -> None:
        if self.expected_target is None:
            return
        try:
            info.check_target(self.expected_target.soc_id, self.expected_target.dsp_arch)
        except QnnError as exc:
            raise BinaryCheckError(f"{self.spec.where()}: {what}: {exc}") from exc

    def check(self) -> None:
        """Read and check the shipped binary (and the override, if any); does not create a context."""
        if self._checked:
            return
        lib: QnnLibrary = self._lib_factory()
        shipped, self.shipped_sha256 = self._shipped()
        self.shipped_info = self._info(lib, shipped, f"shipped binary {self.spec.file}")
        check_structure(self.spec, self.shipped_info, f"shipped binary {self.spec.file}")
        self._check_target(self.shipped_info, f"shipped binary {self.spec.file}")
        if self.override is not None:
            ov = self.override
            if ov.shipped_sha256 is not None and ov.shipped_sha256 != self.shipped_sha256:
                raise BinaryCheckError(
                    f"{self.spec.where()}: shipped binary {self.spec.file} has sha256 {self.shipped_sha256}, but the "
                    f"override {ov.source} was built next to a binary with sha256 {ov.shipped_sha256}: the bundle's "
                    "binary is not the one the twin stands in for (corrupted or swapped?)"
                )
            twin, twin_sha256 = self._override(ov)
            if ov.sha256 is not None and ov.sha256 != twin_sha256:
                raise BinaryCheckError(
                    f"{self.spec.where()}: override {ov.source} has sha256 {twin_sha256}, but {ov.sha256} was recorded "
                    "for it: the twin changed after it was built"
                )
            twin_info = self._info(lib, twin, f"override {ov.source}")
            check_structure(self.spec, twin_info, f"override {ov.source}")
            self._check_target(twin_info, f"override {ov.source}")
            if _target_tags(twin_info) != _target_tags(self.shipped_info):
                raise BinaryCheckError(
                    f"{self.spec.where()}: override {ov.source} targets {_target_tags(twin_info)} but the shipped "
                    f"binary targets {_target_tags(self.shipped_info)}"
                )
            if twin_info.weight_shared and not self.allow_weight_shared:
                raise BinaryCheckError(
                    f"{self.spec.where()}: override {ov.source} is weight-shared too; expected an unshared twin "
                    "(ContextBuilder(weight_sharing=False)) that this QNN library can load"
                )
            self.executed_info, self.executed_sha256, self.executed = twin_info, twin_sha256, "override"
        else:
            if self.shipped_info.weight_shared and not self.allow_weight_shared:
                raise BinaryCheckError(
                    f"{self.spec.where()}: shipped binary {self.spec.file} is weight-shared "
                    f"(graphs {self.shipped_info.graph_names}); the QNN library {lib.version.build_id} cannot load "
                    "weight-shared binaries on this host (see mnnbuild/qnn/README.md). Pass binary_overrides="
                    f"{{{self.spec.path!r}: <unshared twin built from the same graphs>}}"
                )
            self.executed_info, self.executed_sha256, self.executed = self.shipped_info, self.shipped_sha256, "shipped"
        self._checked = True

    def _shipped(self) -> tuple[bytes, str]:
        data, stamp = self.spec.read_binary_stamped()
        return data, self.hashes.digest(self.spec.file, data, stamp, self.spec.offset, self.spec.size)

    def _override(self, ov: BinaryOverride) -> tuple[bytes, str]:
        data, stamp = ov.read_stamped()
        return data, self.hashes.digest(ov.file, data, stamp)

    def _executed_bytes(self) -> bytes:
        """The checked binary read again (nothing is held between check and load, so a model of many plugins
        keeps none of them in memory); it must still be the bytes that were checked (the same hash, or the
        stamp it had when hashed)."""
        if self.executed == "override" and self.override is not None:
            (data, digest), what = self._override(self.override), f"override {self.override.source}"
        else:
            (data, digest), what = self._shipped(), f"shipped binary {self.spec.file}"
        if digest != self.executed_sha256:
            raise BinaryCheckError(f"{self.spec.where()}: {what} changed after it was checked")
        return data

    @property
    def loaded(self) -> bool:
        return self._runner is not None

    def load(self) -> ContextRunner:
        """Check, then create the context and retrieve every graph (once; again after :meth:`close`)."""
        if self._runner is not None:
            return self._runner
        self.check()
        lib: QnnLibrary = self._lib_factory()
        data = self._executed_bytes()
        t0 = time.perf_counter()
        try:
            self._runner = ContextRunner(
                lib, data, info=self.executed_info, allow_weight_shared=self.allow_weight_shared
            )
        except QnnError as exc:
            raise BinaryCheckError(f"{self.spec.where()}: loading the {self.executed} binary failed: {exc}") from exc
        seconds = time.perf_counter() - t0
        self.load_seconds += seconds
        self.loads += 1
        log.info("%s: loaded %s binary (%s) in %.3fs", self.spec.where(), self.executed, self.source, seconds)
        return self._runner

    @property
    def source(self) -> str:
        if self.executed == "override" and self.override is not None:
            return self.override.source
        return str(self.spec.file)

    def execute(self, inputs: Sequence[np.ndarray]) -> tuple[int, list[np.ndarray], float]:
        """Run the graph for these inputs (in ``inputs`` attribute order); returns (shape index, outputs in
        ``outputs`` attribute order, simulator seconds)."""
        index = select_shape_index(self.spec, [a.shape for a in inputs])
        outs, seconds = self.run(index, inputs)
        return index, outs, seconds

    def run(self, index: int, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], float]:
        """Run graph ``allGraphName[index]`` on ``inputs``; returns the outputs (``outputs`` attribute order)
        and the simulator seconds (context creation excluded). A :data:`~mnnbuild_runtime.hybrid.PluginFn`."""
        spec = self.spec
        runner = self.load()
        graph = spec.graph_names[index]
        ginfo = runner.info.graph(graph)
        feed = {}
        for qname, arr in zip(spec.qnn_inputs, inputs, strict=True):
            dtype = ginfo.input(qname).numpy_dtype
            feed[qname] = np.ascontiguousarray(arr, dtype=dtype)
        t0 = time.perf_counter()
        try:
            got = runner.execute(graph, feed)
        except QnnError as exc:
            raise BinaryCheckError(f"{spec.where()}: executing graph {graph!r} failed: {exc}") from exc
        seconds = time.perf_counter() - t0
        self.stats.add(graph, seconds)
        outs = []
        for qname, desc in zip(spec.qnn_outputs, spec.outputs[index], strict=True):
            arr = got[qname]
            if desc.data_format != schema.MNN_DATA_FORMAT.NHWC:
                arr = arr.reshape(desc.dims)
            outs.append(arr.astype(desc.dtype, copy=False))
        return outs, seconds

    def report(self) -> dict[str, Any]:
        """What was checked and what was executed, for the run report."""
        info = self.shipped_info
        return {
            "plugin": self.spec.name,
            "path": self.spec.path,
            "graphs": list(self.spec.graph_names),
            "shipped_sha256": self.shipped_sha256,
            "shipped_weight_shared": info.weight_shared if info else None,
            "target": _target_tags(info) if info else None,
            "executed": self.executed,
            "executed_source": self.source if self.executed else None,
            "executed_sha256": self.executed_sha256,
            "load_seconds": self.load_seconds,
            "loads": self.loads,
            "calls": dict(self.stats.calls),
            "simulator_seconds": dict(self.stats.seconds),
        }

    def close(self) -> None:
        """Free the context (a later :meth:`run` loads it again)."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None
            return_freed_memory()  # a freed context's C heap goes back: the next plugin or MNN needs it
