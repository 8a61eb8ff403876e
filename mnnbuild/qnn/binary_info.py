"""Reading a QNN context binary's description through QnnSystem (``systemContextGetBinaryInfo``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mnnbuild.base.errors import QnnError
from mnnbuild.qnn import dtypes as dt
from mnnbuild.qnn.library import QnnLibrary

_SOC_TAG = re.compile(r"(\w+)=([^;]*)")


def same_element_order(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether dims ``a`` and ``b`` hold the same elements in the same (C) order: equal once 1s are dropped.
    A graph tensor may be declared ``[1, 1, N, C]`` for a plugin tensor MNN calls ``[N, C, 1, 1]``: the same
    bytes, bound by name to the same buffer."""
    return [d for d in a if d != 1] == [d for d in b if d != 1]


@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output as the binary records it (what graphExecute must be given)."""

    name: str
    id: int
    dims: tuple[int, ...]
    qnn_dtype: int
    tensor_type: int
    version: int
    data_format: int = 0
    quant_encoding: int = 0x7FFFFFFF
    scale: float = 0.0
    offset: int = 0

    @property
    def dtype(self) -> str:
        """QNN type name, e.g. ``"float32"``."""
        return dt.dtype_name(self.qnn_dtype)

    @property
    def numpy_dtype(self) -> np.dtype:
        return dt.numpy_dtype(self.qnn_dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64)) * self.numpy_dtype.itemsize


@dataclass(frozen=True)
class HtpGraphBlobInfo:
    """The HTP backend's per-graph record in binary info v3 (``graphBlobInfo``).

    Layout (from QnnHtpSystemContext.h, checked against API 2.40 output): a v1 block
    {version, spillFillBufferSize, vtcmSize, optimizationLevel, htpDlbc, numHvxThreads} directly
    followed by a v2 block {version, nativeK/VChannelSize, isSafeShareIO, ioTensorSize, opDataSize,
    constSize, ddrTensorSize, sharedWeightsSize}. A graph whose weights live in the context's
    shared weights buffer has constSize 0 and sharedWeightsSize > 0.
    """

    spill_fill_size: int
    vtcm_bytes: int
    optimization_level: int
    hvx_threads: int
    io_tensor_size: int | None = None
    op_data_size: int | None = None
    const_size: int | None = None
    shared_weights_size: int | None = None


_BLOB_V1 = np.dtype(
    [("version", "<u4"), ("pad0", "<u4"), ("spill", "<u8"), ("vtcm", "<u4"), ("opt", "<u4"),
     ("dlbc", "u1"), ("pad1", "V7"), ("hvx", "<u8")]
)  # fmt: skip
_BLOB_V2 = np.dtype(
    [("version", "<u4"), ("pad0", "<u4"), ("k", "<u8"), ("v", "<u8"), ("safe_io", "<u4"), ("pad1", "<u4"),
     ("io", "<u8"), ("opdata", "<u8"), ("const", "<u8"), ("ddr", "<u8"), ("shared", "<u8")]
)  # fmt: skip


def _parse_graph_blob(raw: bytes) -> HtpGraphBlobInfo | None:
    if len(raw) < _BLOB_V1.itemsize:
        return None
    v1 = np.frombuffer(raw, _BLOB_V1, count=1)[0]
    if int(v1["version"]) != 1:
        return None
    blob = HtpGraphBlobInfo(int(v1["spill"]), int(v1["vtcm"]), int(v1["opt"]), int(v1["hvx"]))
    if len(raw) >= _BLOB_V1.itemsize + _BLOB_V2.itemsize:
        v2 = np.frombuffer(raw, _BLOB_V2, count=1, offset=_BLOB_V1.itemsize)[0]
        if int(v2["version"]) == 2:
            blob = replace(
                blob,
                io_tensor_size=int(v2["io"]),
                op_data_size=int(v2["opdata"]),
                const_size=int(v2["const"]),
                shared_weights_size=int(v2["shared"]),
            )
    return blob


@dataclass(frozen=True)
class GraphInfo:
    name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    version: int
    htp: HtpGraphBlobInfo | None = None  # binary info v3 only

    def input(self, name: str) -> TensorInfo:
        for t in self.inputs:
            if t.name == name:
                return t
        raise QnnError(f"graph {self.name!r} has no input {name!r}; inputs: {[t.name for t in self.inputs]}")

    def output(self, name: str) -> TensorInfo:
        for t in self.outputs:
            if t.name == name:
                return t
        raise QnnError(f"graph {self.name!r} has no output {name!r}; outputs: {[t.name for t in self.outputs]}")


@dataclass(frozen=True)
class BinaryInfo:
    """What QnnSystem reports about a context binary; graphs in binary order."""

    info_version: int
    backend_id: int
    build_id: str
    core_api: tuple[int, int, int]
    backend_api: tuple[int, int, int]
    soc_version: str  # e.g. "soc_type=SM8750;arch=79"
    context_blob_version: tuple[int, int, int]
    context_blob_size: int
    num_context_tensors: int
    soc_model: int | None  # binary info v3 only
    graphs: tuple[GraphInfo, ...]
    context_dsp_arch: int | None = None  # binary info v3 context metadata (HTP ContextBlobInfo v1)

    @property
    def weight_shared(self) -> bool:
        """True if any graph keeps its weights in the context's shared weights buffer."""
        return any(g.htp is not None and (g.htp.shared_weights_size or 0) > 0 for g in self.graphs)

    @property
    def tags(self) -> dict[str, str]:
        """``soc_version`` parsed: ``{"soc_type": "SM8750", "arch": "79"}``."""
        return dict(_SOC_TAG.findall(self.soc_version))

    @property
    def soc_type(self) -> str | None:
        return self.tags.get("soc_type")

    @property
    def dsp_arch(self) -> int | None:
        if self.context_dsp_arch:
            return self.context_dsp_arch
        arch = self.tags.get("arch")
        return int(arch) if arch and arch.isdigit() else None

    @property
    def graph_names(self) -> list[str]:
        return [g.name for g in self.graphs]

    def check_target(self, soc_id: int, dsp_arch: int) -> None:
        """Raise :class:`QnnError` unless the binary was prepared for this SoC id and Hexagon arch.

        Worth calling after a build: the library silently replaces an ARCH that does not belong
        to the SoC (API 2.40 prepares soc 85 / SM8735 for v73, not v79).
        """
        if self.soc_model is not None and self.soc_model != soc_id:
            raise QnnError(f"context binary was prepared for soc {self.soc_model}, expected {soc_id}")
        if self.dsp_arch is not None and self.dsp_arch != dsp_arch:
            raise QnnError(
                f"context binary for soc {self.soc_model} ({self.soc_type}) was prepared for v{self.dsp_arch}, "
                f"expected v{dsp_arch}: this QNN library maps that SoC to v{self.dsp_arch}"
            )

    def graph(self, name: str) -> GraphInfo:
        for g in self.graphs:
            if g.name == name:
                return g
        raise QnnError(f"context binary has no graph {name!r}; graphs: {self.graph_names}")


def _ver(v: Any) -> tuple[int, int, int]:
    return (int(v.major), int(v.minor), int(v.patch))


def _tensor(ffi: Any, t: Any) -> TensorInfo:
    if t.version not in (1, 2):
        raise QnnError(f"unsupported Qnn_Tensor_t version {t.version} in binary info")
    v = t.v2 if t.version == 2 else t.v1  # v1 is a prefix of v2
    name = ffi.string(v.name).decode() if v.name != ffi.NULL else ""
    dims = tuple(int(v.dimensions[i]) for i in range(v.rank)) if v.dimensions != ffi.NULL else ()
    q = v.quantizeParams
    scale, offset = 0.0, 0
    if q.quantizationEncoding == 0:  # scale/offset: enough to feed quantized IO
        scale, offset = float(q.scaleOffsetEncoding.scale), int(q.scaleOffsetEncoding.offset)
    return TensorInfo(
        name=name,
        id=int(v.id),
        dims=dims,
        qnn_dtype=int(v.dataType),
        tensor_type=int(v.type),
        version=int(t.version),
        data_format=int(v.dataFormat),
        quant_encoding=int(q.quantizationEncoding),
        scale=scale,
        offset=offset,
    )


def _graph(ffi: Any, g: Any) -> GraphInfo:
    if g.version not in (1, 2, 3):
        raise QnnError(f"unsupported graph info version {g.version} in binary info")
    # V1..V3 share their leading fields, so V1 reads every version.
    v = g.graphInfoV1
    inputs = tuple(_tensor(ffi, v.graphInputs[i]) for i in range(v.numGraphInputs))
    outputs = tuple(_tensor(ffi, v.graphOutputs[i]) for i in range(v.numGraphOutputs))
    htp = None
    v3 = g.graphInfoV3
    if g.version == 3 and v3.graphBlobInfo != ffi.NULL and v3.graphBlobInfoSize:
        htp = _parse_graph_blob(ffi.buffer(v3.graphBlobInfo, v3.graphBlobInfoSize)[:])
    return GraphInfo(ffi.string(v.graphName).decode(), inputs, outputs, int(g.version), htp)


def _embedded_soc_tags(binary: bytes | bytearray | memoryview) -> str:
    """The HTP hardware tag string embedded in the blob (``soc_type=SM8750;arch=79;...``).

    API 2.40 leaves ``socVersion`` NULL in binary info v3, but the prepared blob carries this
    string; only its ``soc_type`` and ``arch`` entries are kept.
    """
    raw = bytes(binary) if not isinstance(binary, bytes) else binary
    at = raw.find(b"soc_type=")
    if at < 0:
        return ""
    end = raw.find(b"\0", at, at + 512)
    text = raw[at : end if end > 0 else at + 512].decode("ascii", "replace")
    keep = [f"{k}={v}" for k, v in _SOC_TAG.findall(text) if k in ("soc_type", "arch")]
    return ";".join(keep)


def _parse(ffi: Any, info: Any) -> BinaryInfo:
    version = int(info.version)
    if version == 1:
        b = info.contextBinaryInfoV1
    elif version == 2:
        b = info.contextBinaryInfoV2
    elif version == 3:
        b = info.contextBinaryInfoV3
    else:
        raise QnnError(f"unsupported context binary info version {version}")
    graphs = tuple(_graph(ffi, b.graphs[i]) for i in range(b.numGraphs))
    arch = None
    if version == 3 and b.contextMetadata != ffi.NULL and b.contextMetadataSize >= 8:
        words = np.frombuffer(ffi.buffer(b.contextMetadata, 8)[:], "<u4")
        if int(words[0]) == 1:  # HTP ContextBlobInfo v1: {version, dspArch}
            arch = int(words[1])
    return BinaryInfo(
        info_version=version,
        backend_id=int(b.backendId),
        build_id=ffi.string(b.buildId).decode() if b.buildId != ffi.NULL else "",
        core_api=_ver(b.coreApiVersion),
        backend_api=_ver(b.backendApiVersion),
        soc_version=ffi.string(b.socVersion).decode() if b.socVersion != ffi.NULL else "",
        context_blob_version=_ver(b.contextBlobVersion),
        context_blob_size=int(b.contextBlobSize),
        num_context_tensors=int(b.numContextTensors),
        soc_model=int(b.socModel) if version == 3 else None,
        graphs=graphs,
        context_dsp_arch=arch,
    )


def read_binary_info(lib: QnnLibrary, binary: bytes | bytearray | memoryview) -> BinaryInfo:
    """Describe a context binary: graphs in order with their input/output tensors, target tags."""
    ffi, sys_iface = lib.ffi, lib.sys_iface
    if len(binary) == 0:
        raise QnnError("empty context binary")
    handle = ffi.new("QnnSystemContext_Handle_t*")
    lib.call("systemContextCreate", sys_iface.systemContextCreate, handle)
    try:
        # QnnSystem takes a non-const buffer; give it a private copy.
        private = bytearray(binary)
        buf = ffi.from_buffer(private)
        info = ffi.new("const QnnSystemContext_BinaryInfo_t**")
        size = ffi.new("Qnn_ContextBinarySize_t*")
        lib.call(
            "systemContextGetBinaryInfo (not a context binary this QnnSystem can read?)",
            sys_iface.systemContextGetBinaryInfo,
            handle[0],
            buf,
            len(binary),
            info,
            size,
        )
        # The info lives in memory owned by the system context: copy it out before freeing.
        parsed = _parse(ffi, info[0])
    finally:
        sys_iface.systemContextFree(handle[0])
    if not parsed.soc_version:
        parsed = replace(parsed, soc_version=_embedded_soc_tags(binary))
    return parsed
