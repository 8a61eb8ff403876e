"""The serializable description of one QNN graph, and playing it into a ``GraphBuilder``.

A lowered subgraph is a :class:`GraphDescription` (tensors and nodes, JSON) plus the data of its
static tensors (one ``.raw`` file each: the tensor's elements, little-endian, C order, no header, of
the tensor's data type or of its narrower ``storage`` type, see :class:`QnnTensorDesc`).
The modellib stage writes both into a graph directory (the model-lib); the context and twin stages keep them in
memory (`mnnbuild.plugin.lowered`); either way :func:`compose` adds the tensors and nodes to a QNN graph.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from mnnbuild.base.errors import LoweringError, MnnbuildError, QnnError, field_problems
from mnnbuild.base.fsutil import confined, sha256_bytes
from mnnbuild.base.logs import progress
from mnnbuild.model.npu_weights import WeightNote
from mnnbuild.pipeline.layout import GRAPH_FILE
from mnnbuild.qnn import ContextBuilder, GraphBuilder, HtpTarget, QnnLibrary, Quant, Scalar
from mnnbuild.qnn import dtypes as qdt

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3  # 2: STATIC tensors may name a narrower storage type; 3: quantized STATIC tensors, weight notes
GRAPH_JSON = GRAPH_FILE
DEFAULT_PACKAGE = "qti.aisw"


class QnnRefusal(LoweringError):
    """QNN's backend refused a graph (an op or tensor it does not validate, a graph it cannot finalize): the
    message names the graph, the node and its MNN op."""


# Storage types a raw may narrow a tensor's data type to: every stored value widens exactly.
NARROWER_STORAGE: dict[str, tuple[str, ...]] = {"float32": ("float16",)}


class TensorKind(str, Enum):
    APP_WRITE = "APP_WRITE"  # graph input
    APP_READ = "APP_READ"  # graph output
    NATIVE = "NATIVE"  # intermediate
    STATIC = "STATIC"  # constant, data in a .raw file


QUANT_ENCODINGS = ("axis_scale_offset", "bw_axis_scale_offset", "block", "bw_float_block")


class QuantDesc(BaseModel):
    """How a quantized STATIC tensor's stored integers map to reals (QNN's encodings, see `Quant`); its (scale,
    offset) pairs, one per channel or block in channel-major order, are float32 ``[n, 2]`` in the raw file ``raw``
    (in memory: the statics under `quant_key` of the tensor's name)."""

    model_config = ConfigDict(frozen=True)

    encoding: Literal["axis_scale_offset", "bw_axis_scale_offset", "block", "bw_float_block"]
    bitwidth: int
    """Bits of each stored value (8, or 4 in an 8-bit container)."""
    axis: int = 0
    block_size: list[int] = Field(default_factory=list)
    raw: str

    def quant(self, params: np.ndarray) -> Quant:
        """The builder's `Quant` for the (scale, offset) rows ``params``."""
        scale = params[:, 0]
        if self.encoding == "bw_float_block":
            return Quant(scale, params[:, 1], block_size=self.block_size, bitwidth=self.bitwidth, float_offset=True)
        offset = np.rint(params[:, 1]).astype(np.int32)
        if self.encoding == "block":
            return Quant(scale, offset, block_size=self.block_size, bitwidth=self.bitwidth)
        bits = self.bitwidth if self.encoding == "bw_axis_scale_offset" else 0
        return Quant(scale, offset, axis=self.axis, bitwidth=bits)


def quant_key(tensor_name: str) -> str:
    """The key of a quantized tensor's (scale, offset) rows among a graph's statics."""
    return f"{tensor_name}#quant"


class QnnTensorDesc(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    kind: TensorKind
    dims: list[int]
    dtype: str = "float32"
    """A QNN data type name from ``mnnbuild.qnn.dtypes`` (``float32``, ``int32``, ``uint32``, ``bool`` ...)."""
    raw: str | None = None
    """STATIC only: the ``.raw`` file name (in the graph directory) holding the data."""
    storage: str | None = None
    """STATIC only: the data type of the ``.raw`` file when it is not ``dtype`` (``float16`` for a ``float32``
    weight). The tensor is still ``dtype`` to QNN; its values are the stored ones, widened exactly."""
    quant: QuantDesc | None = None
    """STATIC only: the stored values are integers of this quantization (``dtype`` ``sfixed8``)."""

    @model_validator(mode="after")
    def _check(self) -> QnnTensorDesc:
        if (self.kind == TensorKind.STATIC) != (self.raw is not None):
            raise ValueError(f"tensor {self.name!r}: a raw file is required for STATIC tensors and only for them")
        if self.dtype not in qdt.NAME_TO_DTYPE:
            raise ValueError(f"tensor {self.name!r}: unknown QNN data type {self.dtype!r}")
        if self.storage is not None:
            if self.kind != TensorKind.STATIC:
                raise ValueError(f"tensor {self.name!r}: only STATIC tensors have a storage type")
            if self.storage not in NARROWER_STORAGE.get(self.dtype, ()):
                raise ValueError(f"tensor {self.name!r}: {self.dtype} cannot be stored as {self.storage!r}")
        if self.quant is not None and (self.kind != TensorKind.STATIC or self.dtype != "sfixed8"):
            raise ValueError(f"tensor {self.name!r}: only sfixed8 STATIC tensors are quantized")
        return self

    @property
    def numpy_dtype(self) -> np.dtype:
        return qdt.numpy_dtype(qdt.NAME_TO_DTYPE[self.dtype])

    @property
    def raw_dtype(self) -> np.dtype:
        """The element type of the raw file (little-endian)."""
        name = self.storage or self.dtype
        return qdt.numpy_dtype(qdt.NAME_TO_DTYPE[name]).newbyteorder("<")


class ScalarParam(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["scalar"] = "scalar"
    name: str
    dtype: str
    value: bool | int | float


class TensorParam(BaseModel):
    """A small constant tensor parameter (permutation, ranges, axes ...), stored inline."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["tensor"] = "tensor"
    name: str
    dtype: str
    dims: list[int]
    values: list[int] | list[float]

    def array(self) -> np.ndarray:
        dtype = qdt.numpy_dtype(qdt.NAME_TO_DTYPE[self.dtype])
        return np.asarray(self.values, dtype=dtype).reshape(self.dims)


Param = ScalarParam | TensorParam


class QnnNodeDesc(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    package: str = DEFAULT_PACKAGE
    type: str
    inputs: list[str]
    outputs: list[str]
    params: list[Param] = Field(default_factory=list)
    mnn_op: str = ""
    """The MNN op this node was lowered from (for error messages)."""


class GraphDescription(BaseModel):
    """One QNN graph: tensors (inputs and outputs in boundary order) and nodes in execution order."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = SCHEMA_VERSION
    inputs: list[str]
    outputs: list[str]
    tensors: list[QnnTensorDesc]
    nodes: list[QnnNodeDesc]
    weights: list[WeightNote] = Field(default_factory=list)
    """One note per convolution weight, in lowering order."""

    @model_validator(mode="after")
    def _check(self) -> GraphDescription:
        names = [t.name for t in self.tensors]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate tensor names {dup[:5]}")
        by_name = {t.name: t for t in self.tensors}
        for n in self.inputs:
            if by_name.get(n) is None or by_name[n].kind != TensorKind.APP_WRITE:
                raise ValueError(f"graph input {n!r} is not an APP_WRITE tensor")
        for n in self.outputs:
            if by_name.get(n) is None or by_name[n].kind != TensorKind.APP_READ:
                raise ValueError(f"graph output {n!r} is not an APP_READ tensor")
        raws = [t.raw for t in self.tensors if t.raw is not None] + [t.quant.raw for t in self.tensors if t.quant]
        if len(set(raws)) != len(raws):
            raise ValueError("two static tensors share a raw file name")
        for node in self.nodes:
            for n in (*node.inputs, *node.outputs):
                if n not in by_name:
                    raise ValueError(f"node {node.name!r} refers to unknown tensor {n!r}")
        return self

    def tensor(self, name: str) -> QnnTensorDesc:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def static_tensors(self) -> list[QnnTensorDesc]:
        return [t for t in self.tensors if t.kind == TensorKind.STATIC]


def raw_file_name(tensor_name: str) -> str:
    """A file-system safe, deterministic ``.raw`` name for a static tensor name.

    Characters outside ``[A-Za-z0-9._-]`` become ``_``; a short hash of the full name keeps names that
    differ only in such characters apart.
    """
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", tensor_name).strip("._") or "tensor"
    digest = sha256_bytes(tensor_name.encode())[:8]
    return f"{safe[:100]}.{digest}.raw"


def write_graph_dir(
    directory: Path,
    desc: GraphDescription,
    statics: Mapping[str, np.ndarray],
    link_from: Path | None = None,
    linked_statics: Mapping[str, np.ndarray] | None = None,
) -> list[Path]:
    """Write ``graph.json`` and one ``.raw`` per static tensor into ``directory``; returns the paths written.

    A raw whose bytes equal the same-named raw in ``link_from`` (another graph of the same plugin, which
    names its weights alike) becomes a hard link to it instead of a second copy. ``linked_statics`` are the
    arrays ``link_from``'s raws were written from: a tensor whose array is the same memory is linked without
    reading the file back (an lm_head's raw is over 600 MB). The caller provides atomicity (the stages write
    into a staging dir and rename it).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for t in desc.static_tensors:
        if t.name not in statics:
            raise LoweringError(f"static tensor {t.name!r} has no data")
        arr = np.ascontiguousarray(statics[t.name], dtype=t.raw_dtype)
        if list(arr.shape) != t.dims:
            raise LoweringError(f"static tensor {t.name!r}: data shape {list(arr.shape)} != dims {t.dims}")
        path = directory / str(t.raw)
        twin = Path(link_from) / str(t.raw) if link_from is not None else None
        known = linked_statics.get(t.name) if linked_statics is not None else None
        if (
            twin is not None
            and twin.is_file()
            and twin.stat().st_size == arr.nbytes
            and ((known is not None and _same_memory(known, statics[t.name])) or _same_bytes(twin, arr))
        ):
            os.link(twin, path)
        else:
            with open(path, "wb") as f:
                arr.tofile(f)
        written.append(path)
        if t.quant is not None:
            params = np.ascontiguousarray(statics[quant_key(t.name)], dtype="<f4")
            qpath = directory / t.quant.raw
            with open(qpath, "wb") as f:
                params.tofile(f)
            written.append(qpath)
    path = directory / GRAPH_JSON
    path.write_text(json.dumps(desc.model_dump(mode="json"), indent=1, sort_keys=True) + "\n")
    written.append(path)
    return written


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays are views of the very same elements (so hold the same bytes)."""
    ia, ib = a.__array_interface__, b.__array_interface__
    return bool(
        ia["data"] == ib["data"] and ia["typestr"] == ib["typestr"] and a.shape == b.shape and a.strides == b.strides
    )


def _same_bytes(path: Path, arr: np.ndarray, chunk: int = 64 << 20) -> bool:
    """Whether the file holds exactly ``arr``'s bytes, read a chunk at a time (an lm_head is over 1 GB)."""
    flat = arr.reshape(-1).view(np.uint8)
    with open(path, "rb") as f:
        for start in range(0, flat.size, chunk):
            block = f.read(chunk)
            if block != flat[start : start + chunk].tobytes():
                return False
        return f.read(1) == b""


def read_graph_description(directory: Path) -> GraphDescription:
    path = Path(directory) / GRAPH_JSON
    try:
        return GraphDescription.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        raise LoweringError(f"{path}: cannot read the graph description: {field_problems(exc)}") from None


def read_static(directory: Path, t: QnnTensorDesc, chunk: int = 16 << 20) -> np.ndarray:
    """The data of static tensor ``t`` from its raw file in ``directory``, of the tensor's data type (a narrower
    stored type is widened a chunk at a time, so the widened array is the only full-size one)."""
    path = Path(directory) / str(t.raw)
    stored = t.raw_dtype
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise LoweringError(f"{path}: missing raw file of static tensor {t.name!r}") from exc
    count = int(np.prod(t.dims, dtype=np.int64))
    expected = count * stored.itemsize
    if size != expected:
        what = f"{t.dtype} stored as {t.storage}" if t.storage else t.dtype
        raise LoweringError(f"{path}: {size} bytes, static tensor {t.name!r} {t.dims} {what} needs {expected}")
    if t.storage is None:
        return np.fromfile(path, dtype=stored).reshape(t.dims).astype(t.numpy_dtype, copy=False)
    out = np.empty(count, dtype=t.numpy_dtype)
    step = max(1, chunk // stored.itemsize)
    with open(path, "rb") as f:
        for start in range(0, count, step):
            out[start : start + step] = np.fromfile(f, dtype=stored, count=min(step, count - start))
    return out.reshape(t.dims)


def read_quant_params(directory: Path, t: QnnTensorDesc) -> np.ndarray:
    """The (scale, offset) rows of quantized static ``t`` from its raw file in ``directory``."""
    assert t.quant is not None
    path = Path(directory) / t.quant.raw
    try:
        data = np.fromfile(path, dtype="<f4")
    except OSError as exc:
        raise LoweringError(f"{path}: missing quantization raw of static tensor {t.name!r}") from exc
    if data.size % 2:
        raise LoweringError(f"{path}: {data.size * 4} bytes is not a whole number of (scale, offset) pairs")
    return data.reshape(-1, 2)


def _param_value(p: Param) -> object:
    if isinstance(p, TensorParam):
        return p.array()
    return Scalar(p.value, p.dtype)


def compose(desc: GraphDescription, raw_source: Path | Mapping[str, np.ndarray], graph: GraphBuilder) -> None:
    """Add every tensor and node of ``desc`` to ``graph`` (not finalized).

    ``raw_source`` is the graph directory holding the ``.raw`` files, or the static data by tensor name.
    A node QNN refuses raises ``QnnError`` naming the node and its MNN op.
    """
    # graph inputs/outputs first, in boundary order: QNN lists them in creation order, and the binary
    # must show them in the order of the Plugin's `inputs`/`outputs` attributes
    by_name = {t.name: t for t in desc.tensors}
    boundary = [by_name[n] for n in (*desc.inputs, *desc.outputs)]
    rest = [t for t in desc.tensors if t.name not in set(desc.inputs) | set(desc.outputs)]
    for t in (*boundary, *rest):
        if t.kind == TensorKind.APP_WRITE:
            graph.add_input(t.name, t.dims, t.dtype)
        elif t.kind == TensorKind.APP_READ:
            graph.add_output(t.name, t.dims, t.dtype)
        elif t.kind == TensorKind.NATIVE:
            graph.add_native(t.name, t.dims, t.dtype)
        else:
            if isinstance(raw_source, Mapping):
                data = np.asarray(raw_source[t.name], dtype=t.numpy_dtype).reshape(t.dims)
            else:
                data = read_static(Path(raw_source), t)
            quant = None
            if t.quant is not None:
                params = (
                    np.asarray(raw_source[quant_key(t.name)], dtype=np.float32)
                    if isinstance(raw_source, Mapping)
                    else read_quant_params(Path(raw_source), t)
                )
                quant = t.quant.quant(params)
            graph.add_static(t.name, data, t.dtype, quant=quant)
    for node in desc.nodes:
        params = {p.name: _param_value(p) for p in node.params}
        try:
            graph.add_node(node.name, node.type, node.inputs, node.outputs, params, package=node.package)  # type: ignore[arg-type]
        except MnnbuildError as exc:
            raise type(exc)(f"{exc} (lowered from MNN op {node.mnn_op!r})") from exc
    log.debug("composed graph %s: %d tensors, %d nodes", graph.name, len(desc.tensors), len(desc.nodes))


StaticSource = Path | Mapping[str, np.ndarray]
"""Where a graph's STATIC data comes from: its graph directory (``.raw`` files) or the arrays by tensor name."""


def _add_finalized(ctx: ContextBuilder, name: str, desc: GraphDescription, statics: StaticSource) -> None:
    builder = ctx.add_graph(name)
    where = statics if isinstance(statics, Path) else "in-memory graph"
    try:
        compose(desc, statics, builder)
        started = time.perf_counter()
        builder.finalize()
    except QnnError as exc:
        raise QnnRefusal(f"{where}: QNN refused graph {name}: {exc}") from None
    log.debug("context: finalized %s (%d nodes) in %.2fs", name, len(desc.nodes), time.perf_counter() - started)


@contextlib.contextmanager
def composed_context(
    lib: QnnLibrary,
    target: HtpTarget,
    graphs: Mapping[str, tuple[GraphDescription, StaticSource]],
    weight_sharing: bool,
    label: str | None = None,
) -> Iterator[ContextBuilder]:
    """One context holding ``graphs`` (name -> description and static data), finalized in order with the upstream
    HTP settings, for the ``with`` body to serialize. A graph QNN refuses raises ``LoweringError`` naming it.
    QNN copies every static as it is created: the body may free ``graphs``' data before serializing (nothing
    here keeps a reference to it). ``label``: a progress bar over the graphs, named so (the plugin)."""
    with ContextBuilder(lib, target, weight_sharing=weight_sharing) as ctx:
        with progress(desc=label or "compose", total=len(graphs), unit="graph") as bar:
            for name in graphs:  # by name: no loop variable keeps the last graph's data alive
                bar.set_postfix_str(name)
                _add_finalized(ctx, name, *graphs[name])
                bar.update()
        yield ctx


def compose_context(
    lib: QnnLibrary,
    target: HtpTarget,
    graphs: Mapping[str, tuple[GraphDescription, StaticSource]],
    weight_sharing: bool,
) -> bytes:
    """:func:`composed_context`, serialized."""
    with composed_context(lib, target, graphs, weight_sharing) as ctx:
        return ctx.serialize()


def read_graph_dirs(root: Path, graphs: Sequence[str]) -> dict[str, tuple[GraphDescription, Path]]:
    """The graph descriptions of ``root/<graph>`` for each relative graph dir (``qnn/graphllm0``), by graph
    name (the dir's basename), ready for :func:`compose_context`."""
    dirs = [confined(Path(root), g, "npu_postreat.json field 'merge'") for g in graphs]
    return {d.name: (read_graph_description(d), d) for d in dirs}
