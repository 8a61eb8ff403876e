"""Composing QNN graphs on the HTP backend and serializing them as one context binary."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from mnnbuild.base.errors import QnnError
from mnnbuild.qnn import dtypes as dt
from mnnbuild.qnn.library import QnnLibrary
from mnnbuild.qnn.session import HtpTarget, QnnSession, free_context

log = logging.getLogger(__name__)

DEFAULT_PACKAGE = "qti.aisw"

# Qnn_TensorVersion_t, Qnn_OpConfigVersion_t, Qnn_ParamType_t, Qnn_TensorMemType_t
TENSOR_VERSION_1 = 1
TENSOR_VERSION_2 = 2
OPCONFIG_VERSION_1 = 1
PARAM_SCALAR = 0
PARAM_TENSOR = 1
MEMTYPE_RAW = 0
DATA_FORMAT_DENSE = 0
# Qnn_Definition_t, Qnn_QuantizationEncoding_t
DEFINITION_DEFINED = 1
DEFINITION_UNDEFINED = 0x7FFFFFFF
ENCODING_SCALE_OFFSET = 0
ENCODING_AXIS_SCALE_OFFSET = 1
ENCODING_BW_AXIS_SCALE_OFFSET = 3
ENCODING_BLOCK = 4
ENCODING_BW_FLOAT_BLOCK = 11
ENCODING_UNDEFINED = 0x7FFFFFFF
SPARSE_LAYOUT_UNDEFINED = 0x7FFFFFFF
# QnnContext/QnnGraph config options and HTP custom options
CONFIG_OPTION_CUSTOM = 0
HTP_CONTEXT_WEIGHT_SHARING_ENABLED = 1
HTP_GRAPH_OPTIMIZATION = 1
HTP_GRAPH_PRECISION = 2
HTP_GRAPH_VTCM_SIZE_IN_MB = 3
HTP_GRAPH_NUM_HVX_THREADS = 6
HTP_OPTIMIZATION_FINALIZE_FLAG = 3
PRECISION_FLOAT16 = 1


@dataclass(frozen=True)
class Quant:
    """Quantization of a tensor, as QNN defines it: real value = scale * (stored + offset) (offsets usually <= 0).

    - per tensor (``axis`` None, no ``block_size``): ``SCALE_OFFSET``;
    - per channel along ``axis``: ``AXIS_SCALE_OFFSET``, or with a ``bitwidth`` below the data type's (e.g. 4 in
      an 8-bit container, one value per byte) ``BW_AXIS_SCALE_OFFSET``;
    - per block (``block_size``: elements per block along each dim, e.g. ``[1, 1, 64, 1]``): one scale/offset per
      block, listed in the order the caller gives them (``BLOCK``, integer offsets), or with ``float_offset``
      ``BW_FLOAT_BLOCK`` (``bitwidth``, float offsets in units of the scale).
    """

    scale: float | Sequence[float] | np.ndarray
    offset: int | float | Sequence[int] | Sequence[float] | np.ndarray = 0
    axis: int | None = None
    bitwidth: int = 0
    """Bits the stored values use when fewer than the data type's (0: the type's)."""
    block_size: Sequence[int] | None = None
    float_offset: bool = False

    @property
    def encoding(self) -> int:
        """The ``Qnn_QuantizationEncoding_t`` this describes."""
        if self.block_size is not None:
            return ENCODING_BW_FLOAT_BLOCK if self.float_offset else ENCODING_BLOCK
        if self.axis is None:
            return ENCODING_SCALE_OFFSET
        return ENCODING_BW_AXIS_SCALE_OFFSET if self.bitwidth else ENCODING_AXIS_SCALE_OFFSET


@dataclass(frozen=True)
class Scalar:
    """A scalar op parameter with an explicit QNN data type (``dtype`` as for :func:`dtypes.qnn_dtype`)."""

    value: bool | int | float
    dtype: int | str


ParamValue = bool | int | float | np.generic | np.ndarray | Scalar


@dataclass(frozen=True)
class GraphOptions:
    """HTP graph compile settings; the defaults are upstream MNN's (npu_convert.py)."""

    vtcm_mb: int | None = None  # None: the target's VTCM size
    optimization_level: float = 3.0  # FINALIZE_OPTIMIZATION_FLAG
    fp16_precision: bool = True  # "fp16_relaxed_precision": float graphs run in fp16
    hvx_threads: int = 4


@dataclass
class TensorRef:
    """A tensor created in a graph. ``struct`` is the exact Qnn_Tensor_t QNN filled in (id set)."""

    name: str
    tensor_type: int
    dtype: int
    shape: tuple[int, ...]
    struct: Any = field(repr=False)
    owners: list[Any] = field(default_factory=list, repr=False)  # cffi/numpy memory it points to

    @property
    def id(self) -> int:
        return int(self.struct.v1.id)


def _dims(shape: Sequence[int]) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d <= 0 for d in dims):
        raise QnnError(f"tensor dims must be positive, got {dims}")
    return dims


class GraphBuilder:
    """One QNN graph inside a :class:`ContextBuilder`. Tensor names must be unique per graph."""

    def __init__(self, ctx: ContextBuilder, name: str, handle: Any) -> None:
        self.ctx = ctx
        self.name = name
        self.handle = handle
        self.lib: QnnLibrary = ctx.lib
        self.ffi = ctx.lib.ffi
        self.tensors: dict[str, TensorRef] = {}
        self.inputs: list[TensorRef] = []
        self.outputs: list[TensorRef] = []
        self.num_nodes = 0
        self.finalized = False
        self.finalize_seconds = 0.0
        self._keep: list[Any] = []  # memory QNN may still point at until the context is freed

    # -- tensors ----------------------------------------------------------------------------------
    def _fill_quant(self, q: Any, quant: Quant | None, owners: list[Any]) -> None:
        if quant is None:
            q.encodingDefinition = DEFINITION_UNDEFINED
            q.quantizationEncoding = ENCODING_UNDEFINED
            return
        q.encodingDefinition = DEFINITION_DEFINED
        encoding = quant.encoding
        q.quantizationEncoding = encoding
        if encoding == ENCODING_SCALE_OFFSET:
            if not isinstance(quant.scale, (int, float)) or not isinstance(quant.offset, (int, np.integer)):
                raise QnnError("per-tensor quantization needs a scalar scale and offset (or set axis)")
            q.scaleOffsetEncoding.scale = float(quant.scale)
            q.scaleOffsetEncoding.offset = int(quant.offset)
            return
        scales = np.atleast_1d(np.asarray(quant.scale, dtype=np.float32)).reshape(-1)
        offset_type = np.float32 if quant.float_offset else np.int32
        offsets = np.broadcast_to(np.asarray(quant.offset, dtype=offset_type).reshape(-1), scales.shape)
        if encoding == ENCODING_BW_AXIS_SCALE_OFFSET:
            e = q.bwAxisScaleOffsetEncoding
            e.bitwidth, e.axis, e.numElements = int(quant.bitwidth), int(quant.axis or 0), scales.size
            e.scales = self._c_array("float[]", scales, owners)
            e.offsets = self._c_array("int32_t[]", offsets, owners) if offsets.any() else self.ffi.NULL
            return
        # arrays of {float scale; int32/float offset} records, filled in bulk (an lm_head has millions of blocks)
        record = "Qnn_FloatScaleOffset_t[]" if quant.float_offset else "Qnn_ScaleOffset_t[]"
        arr = self.ffi.new(record, max(scales.size, 1))
        fields = np.frombuffer(self.ffi.buffer(arr), dtype=np.dtype([("s", "<f4"), ("o", offset_type)]))
        fields["s"][: scales.size], fields["o"][: scales.size] = scales, offsets
        owners.append(arr)
        if encoding == ENCODING_AXIS_SCALE_OFFSET:
            q.axisScaleOffsetEncoding.axis = int(quant.axis or 0)
            q.axisScaleOffsetEncoding.numScaleOffsets = scales.size
            q.axisScaleOffsetEncoding.scaleOffset = arr
            return
        block = self._c_array("uint32_t[]", np.asarray(quant.block_size, dtype=np.uint32), owners)
        if encoding == ENCODING_BLOCK:
            q.blockEncoding.blockSize = block
            q.blockEncoding.scaleOffset = arr
        else:
            q.bwFloatBlockEncoding.bitwidth = int(quant.bitwidth)
            q.bwFloatBlockEncoding.blockSize = block
            q.bwFloatBlockEncoding.floatScaleOffset = arr

    def _c_array(self, ctype: str, values: np.ndarray, owners: list[Any]) -> Any:
        arr = self.ffi.new(ctype, max(values.size, 1))
        np.frombuffer(self.ffi.buffer(arr), dtype=values.dtype)[: values.size] = values.reshape(-1)
        owners.append(arr)
        return arr

    def _new_struct(
        self,
        name: str,
        tensor_type: int,
        dtype: int,
        shape: tuple[int, ...],
        quant: Quant | None,
        data: np.ndarray | None,
    ) -> tuple[Any, list[Any]]:
        ffi = self.ffi
        owners: list[Any] = []
        t = ffi.new("Qnn_Tensor_t*")
        t.version = TENSOR_VERSION_1
        v = t.v1
        cname = ffi.new("char[]", name.encode())
        dims = ffi.new("uint32_t[]", list(shape) or [1])
        owners += [cname, dims]
        v.id = 0
        v.name = cname
        v.type = tensor_type
        v.dataFormat = DATA_FORMAT_DENSE
        v.dataType = dtype
        self._fill_quant(v.quantizeParams, quant, owners)
        v.rank = len(shape)
        v.dimensions = dims
        v.memType = MEMTYPE_RAW
        if data is not None:
            buf = ffi.from_buffer(data)
            owners += [data, buf]
            v.clientBuf.data = buf
            v.clientBuf.dataSize = data.nbytes
        return t, owners

    def _create(
        self,
        name: str,
        tensor_type: int,
        dtype: int | str | np.dtype | type,
        shape: Sequence[int],
        quant: Quant | None = None,
        data: np.ndarray | None = None,
    ) -> TensorRef:
        if self.finalized:
            raise QnnError(f"graph {self.name!r}: cannot add tensor {name!r} after finalize")
        if name in self.tensors:
            raise QnnError(f"graph {self.name!r}: tensor {name!r} already exists")
        code = dt.qnn_dtype(dtype)
        if code in dt.QUANTIZED and quant is None:
            raise QnnError(f"graph {self.name!r}: tensor {name!r} of type {dt.dtype_name(code)} needs a Quant")
        dims = _dims(shape) if len(shape) else ()
        struct, owners = self._new_struct(name, tensor_type, code, dims, quant, data)
        self.lib.call(
            f"tensorCreateGraphTensor (graph {self.name!r}, tensor {name!r})",
            self.lib.iface.tensorCreateGraphTensor,
            self.handle,
            struct,
        )
        if data is not None:
            # QNN copies static data at creation (checked: later writes to the array do not reach
            # the binary), so drop our references now to keep peak memory at one extra copy.
            struct.v1.clientBuf.data = self.ffi.NULL
            struct.v1.clientBuf.dataSize = 0
            del owners[-2:]
        ref = TensorRef(name, tensor_type, code, dims, struct, owners)
        self.tensors[name] = ref
        return ref

    def add_input(self, name: str, shape: Sequence[int], dtype: int | str | np.dtype | type = "float32") -> TensorRef:
        """A graph input the application writes (QNN APP_WRITE)."""
        ref = self._create(name, dt.TENSOR_APP_WRITE, dtype, shape)
        self.inputs.append(ref)
        return ref

    def add_output(self, name: str, shape: Sequence[int], dtype: int | str | np.dtype | type = "float32") -> TensorRef:
        """A graph output the application reads (QNN APP_READ)."""
        ref = self._create(name, dt.TENSOR_APP_READ, dtype, shape)
        self.outputs.append(ref)
        return ref

    def add_native(
        self,
        name: str,
        shape: Sequence[int],
        dtype: int | str | np.dtype | type = "float32",
        quant: Quant | None = None,
    ) -> TensorRef:
        """An intermediate tensor, internal to the graph (QNN NATIVE)."""
        return self._create(name, dt.TENSOR_NATIVE, dtype, shape, quant)

    def add_static(
        self,
        name: str,
        data: np.ndarray,
        dtype: int | str | np.dtype | type | None = None,
        quant: Quant | None = None,
    ) -> TensorRef:
        """A constant tensor from ``data`` (QNN STATIC). Same name in two graphs = shareable weight.

        ``dtype`` defaults to ``data``'s type; for quantized types pass e.g. ``"ufixed8"`` and a Quant,
        with ``data`` holding the stored integers.
        """
        arr = np.ascontiguousarray(data)
        code = dt.qnn_dtype(dtype if dtype is not None else arr.dtype)
        if code in dt._STORAGE and arr.dtype != dt.numpy_dtype(code):
            raise QnnError(
                f"graph {self.name!r}: static tensor {name!r} holds {arr.dtype} but is declared "
                f"{dt.dtype_name(code)} (stored as {dt.numpy_dtype(code)})"
            )
        return self._create(name, dt.TENSOR_STATIC, code, arr.shape, quant, arr)

    def tensor(self, name: str) -> TensorRef:
        try:
            return self.tensors[name]
        except KeyError:
            raise QnnError(f"graph {self.name!r}: no tensor named {name!r}") from None

    # -- nodes ------------------------------------------------------------------------------------
    def _scalar(self, s: Any, name: str, value: ParamValue) -> None:
        if isinstance(value, Scalar):
            code, raw = dt.qnn_dtype(value.dtype), value.value
        elif isinstance(value, (bool, np.bool_)):
            code, raw = dt.BOOL_8, bool(value)
        elif isinstance(value, np.generic):
            code, raw = dt.qnn_dtype(value.dtype), value.item()
        elif isinstance(value, int):
            code, raw = (dt.UINT_32 if value >= 0 else dt.INT_32), value
        elif isinstance(value, float):
            code, raw = dt.FLOAT_32, value
        else:
            raise QnnError(f"graph {self.name!r}: unsupported value for param {name!r}: {value!r}")
        s.dataType = code
        field_name = {
            dt.BOOL_8: "bool8Value",
            dt.FLOAT_32: "floatValue",
            dt.FLOAT_64: "doubleValue",
            dt.INT_8: "int8Value",
            dt.INT_16: "int16Value",
            dt.INT_32: "int32Value",
            dt.INT_64: "int64Value",
            dt.UINT_8: "uint8Value",
            dt.UINT_16: "uint16Value",
            dt.UINT_32: "uint32Value",
            dt.UINT_64: "uint64Value",
        }.get(code)
        if field_name is None:
            raise QnnError(f"graph {self.name!r}: param {name!r} has unsupported scalar type {dt.dtype_name(code)}")
        setattr(s, field_name, int(raw) if field_name != "floatValue" and field_name != "doubleValue" else raw)

    def add_node(
        self,
        name: str,
        op_type: str,
        inputs: Sequence[TensorRef | str],
        outputs: Sequence[TensorRef | str],
        params: Mapping[str, ParamValue] | None = None,
        package: str = DEFAULT_PACKAGE,
    ) -> None:
        """Add one op. Tensor params (numpy arrays) become static tensors named ``<node>__<param>``."""
        if self.finalized:
            raise QnnError(f"graph {self.name!r}: cannot add node {name!r} after finalize")
        ffi = self.ffi
        keep: list[Any] = []
        ins = [self.tensor(t) if isinstance(t, str) else t for t in inputs]
        outs = [self.tensor(t) if isinstance(t, str) else t for t in outputs]
        tsize = ffi.sizeof("Qnn_Tensor_t")
        in_arr = ffi.new("Qnn_Tensor_t[]", max(len(ins), 1))
        out_arr = ffi.new("Qnn_Tensor_t[]", max(len(outs), 1))
        for i, t in enumerate(ins):
            ffi.memmove(in_arr + i, t.struct, tsize)
        for i, t in enumerate(outs):
            ffi.memmove(out_arr + i, t.struct, tsize)
        params = dict(params or {})
        par_arr = ffi.new("Qnn_Param_t[]", max(len(params), 1))
        for i, (pname, value) in enumerate(params.items()):
            p = par_arr[i]
            cname = ffi.new("char[]", pname.encode())
            keep.append(cname)
            p.name = cname
            if isinstance(value, np.ndarray):
                tref = self.add_static(f"{name}__{pname}", value)
                p.paramType = PARAM_TENSOR
                ffi.memmove(ffi.addressof(p, "tensorParam"), tref.struct, tsize)
            else:
                p.paramType = PARAM_SCALAR
                self._scalar(p.scalarParam, pname, value)
        op = ffi.new("Qnn_OpConfigArg_t*")
        op.version = OPCONFIG_VERSION_1
        c_name, c_pkg, c_type = (ffi.new("char[]", s.encode()) for s in (name, package, op_type))
        keep += [c_name, c_pkg, c_type, in_arr, out_arr, par_arr, op]
        op.v1.name = c_name
        op.v1.packageName = c_pkg
        op.v1.typeName = c_type
        op.v1.numOfParams = len(params)
        op.v1.params = par_arr
        op.v1.numOfInputs = len(ins)
        op.v1.inputTensors = in_arr
        op.v1.numOfOutputs = len(outs)
        op.v1.outputTensors = out_arr
        self.lib.call(
            f"graphAddNode (graph {self.name!r}, node {name!r}, op {package}:{op_type})",
            self.lib.iface.graphAddNode,
            self.handle,
            op[0],
        )
        self._keep.append(keep)
        self.num_nodes += 1

    def finalize(self) -> None:
        """Prepare the graph for the target (this is where HTP compiles it)."""
        if self.finalized:
            return
        t0 = time.perf_counter()
        self.lib.call(
            f"graphFinalize (graph {self.name!r})",
            self.lib.iface.graphFinalize,
            self.handle,
            self.ffi.NULL,
            self.ffi.NULL,
            native=True,
        )
        self.finalize_seconds = time.perf_counter() - t0
        self.finalized = True
        log.debug("finalized graph %s (%d nodes) in %.2fs", self.name, self.num_nodes, self.finalize_seconds)


class ContextBuilder:
    """An HTP context being composed: create graphs, finalize them, serialize the context binary.

    Owns its QNN session (log, backend, device with the target's SOC/ARCH configs) and the
    context; :meth:`close` (or ``with``) frees everything, also after errors.
    """

    def __init__(self, lib: QnnLibrary, target: HtpTarget, *, weight_sharing: bool = False) -> None:
        self.lib = lib
        self.ffi = lib.ffi
        self.target = target
        self.weight_sharing = weight_sharing
        self.graphs: list[GraphBuilder] = []
        self.context: Any = self.ffi.NULL
        self._closed = False
        self.session = QnnSession(lib, target)
        try:
            self.context = self._create_context()
        except BaseException:
            self.session.close()
            raise

    def _create_context(self) -> Any:
        ffi, lib = self.ffi, self.lib
        keep: list[Any] = []
        configs = ffi.NULL
        if self.weight_sharing:
            custom = ffi.new("QnnHtpContext_CustomConfig_t*")
            custom.option = HTP_CONTEXT_WEIGHT_SHARING_ENABLED
            custom.weightSharingEnabled = True
            cfg = ffi.new("QnnContext_Config_t*")
            cfg.option = CONFIG_OPTION_CUSTOM
            cfg.customConfig = custom
            configs = ffi.new("const QnnContext_Config_t*[2]", [cfg, ffi.NULL])
            keep += [custom, cfg]
        out = ffi.new("Qnn_ContextHandle_t*")
        lib.call(
            "contextCreate",
            lib.iface.contextCreate,
            self.session.backend,
            self.session.device,
            configs,
            out,
            native=True,
        )
        del keep
        return out[0]

    def _graph_configs(self, options: GraphOptions) -> tuple[Any, list[Any]]:
        ffi = self.ffi
        customs = []
        vtcm = ffi.new("QnnHtpGraph_CustomConfig_t*")
        vtcm.option = HTP_GRAPH_VTCM_SIZE_IN_MB
        vtcm.vtcmSizeInMB = options.vtcm_mb if options.vtcm_mb is not None else self.target.vtcm_mb
        customs.append(vtcm)
        opt = ffi.new("QnnHtpGraph_CustomConfig_t*")
        opt.option = HTP_GRAPH_OPTIMIZATION
        opt.optimizationOption.type = HTP_OPTIMIZATION_FINALIZE_FLAG
        opt.optimizationOption.floatValue = float(options.optimization_level)
        customs.append(opt)
        if options.fp16_precision:
            prec = ffi.new("QnnHtpGraph_CustomConfig_t*")
            prec.option = HTP_GRAPH_PRECISION
            prec.precision = PRECISION_FLOAT16
            customs.append(prec)
        hvx = ffi.new("QnnHtpGraph_CustomConfig_t*")
        hvx.option = HTP_GRAPH_NUM_HVX_THREADS
        hvx.numHvxThreads = options.hvx_threads
        customs.append(hvx)
        wrapped = ffi.new("QnnGraph_Config_t[]", len(customs))
        for i, c in enumerate(customs):
            wrapped[i].option = CONFIG_OPTION_CUSTOM
            wrapped[i].customConfig = c
        ptrs = ffi.new("const QnnGraph_Config_t*[]", [wrapped + i for i in range(len(customs))] + [ffi.NULL])
        return ptrs, [customs, wrapped]

    def add_graph(self, name: str, options: GraphOptions | None = None) -> GraphBuilder:
        """Create a graph; graphs appear in the binary in creation order."""
        if any(g.name == name for g in self.graphs):
            raise QnnError(f"graph {name!r} already exists in this context")
        ffi = self.ffi
        configs, keep = self._graph_configs(options or GraphOptions())
        out = ffi.new("Qnn_GraphHandle_t*")
        c_name = ffi.new("char[]", name.encode())
        self.lib.call(f"graphCreate (graph {name!r})", self.lib.iface.graphCreate, self.context, c_name, configs, out)
        g = GraphBuilder(self, name, out[0])
        g._keep += [keep, c_name]
        self.graphs.append(g)
        return g

    def finalize_all(self) -> None:
        for g in self.graphs:
            g.finalize()

    def binary_size(self) -> int:
        size = self.ffi.new("Qnn_ContextBinarySize_t*")
        self.lib.call("contextGetBinarySize", self.lib.iface.contextGetBinarySize, self.context, size)
        return int(size[0])

    @contextlib.contextmanager
    def binary_view(self) -> Iterator[memoryview]:
        """The context binary (finalizes graphs that are not yet), as a view of the buffer QNN wrote it into,
        valid inside the ``with``: writing it to a file from there costs no second copy (an lm_head's binary is
        over 1 GB, and QNN's own serialization memory comes on top)."""
        self.finalize_all()
        t0 = time.perf_counter()
        size = self.binary_size()
        cbuf = self.ffi.new("char[]", max(size, 1))
        written = self.ffi.new("Qnn_ContextBinarySize_t*")
        self.lib.call(
            "contextGetBinary", self.lib.iface.contextGetBinary, self.context, cbuf, size, written, native=True
        )
        view = memoryview(self.ffi.buffer(cbuf, int(written[0])))
        log.debug(
            "serialized context (%d graphs) to %d bytes in %.2fs", len(self.graphs), len(view), time.perf_counter() - t0
        )
        try:
            yield view
        finally:
            view.release()
            del cbuf

    def serialize(self) -> bytes:
        """The context binary (finalizes graphs that are not yet)."""
        with self.binary_view() as view:
            return bytes(view)

    def close(self) -> None:
        """Free the context (and with it its graphs), then the session; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            free_context(self.lib, self.context)
            self.context = self.ffi.NULL
        finally:
            self.session.close()
            for g in self.graphs:
                g._keep.clear()
                for t in g.tensors.values():
                    t.owners.clear()

    def __enter__(self) -> ContextBuilder:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
