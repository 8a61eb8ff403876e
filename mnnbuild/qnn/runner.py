"""Loading a context binary and executing its graphs (on x86 this is the HTP simulator).

Follows the device runtime's path (MNN's QNN backend): binary info from QnnSystem, then
``contextCreateFromBinary``, ``graphRetrieve`` per graph name, and ``graphExecute`` with tensors
whose id, type and layout are copied from the binary info (a name alone gives QNN error 6004).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import numpy as np

from mnnbuild.base.errors import QnnError
from mnnbuild.qnn.binary_info import BinaryInfo, TensorInfo, read_binary_info
from mnnbuild.qnn.library import QnnLibrary
from mnnbuild.qnn.session import HtpTarget, QnnSession, free_context

log = logging.getLogger(__name__)

_SPARSE_LAYOUT_UNDEFINED = 0x7FFFFFFF
_MEMTYPE_RAW = 0


class ContextRunner:
    """A context created from a binary, its graphs retrieved, ready for :meth:`execute`.

    ``target`` adds the device SOC/ARCH configs (not needed to run in the simulator);
    ``device=False`` loads without a device handle. Weight-shared binaries are refused with a
    :class:`QnnError` before QNN sees them, because the x86 library crashes the process on them;
    ``allow_weight_shared=True`` skips that guard (for a library that can load them).
    """

    def __init__(
        self,
        lib: QnnLibrary,
        binary: bytes | bytearray | memoryview,
        *,
        target: HtpTarget | None = None,
        device: bool = True,
        info: BinaryInfo | None = None,
        allow_weight_shared: bool = False,
    ) -> None:
        self.lib = lib
        self.ffi = lib.ffi
        self.info = info if info is not None else read_binary_info(lib, binary)
        if self.info.weight_shared and not allow_weight_shared:
            raise QnnError(
                f"context binary with graphs {self.info.graph_names} is weight-shared; the QNN HTP library "
                f"{lib.version.build_id} cannot load weight-shared binaries on this host (x86 simulator: "
                f"'Shared weights buffer isn't supported on this platform', then a crash inside "
                f"contextCreateFromBinary). Run an unshared twin built from the same graphs instead "
                f"(ContextBuilder(weight_sharing=False)); see mnnbuild/qnn/README.md"
            )
        self.context: Any = self.ffi.NULL
        self.graph_handles: dict[str, Any] = {}
        self._closed = False
        self.load_seconds = 0.0
        self.session = QnnSession(lib, target, device=device)
        try:
            self._load(binary)
        except BaseException:
            self.close()
            raise

    def _load(self, binary: bytes | bytearray | memoryview) -> None:
        """QNN copies the binary here: the header does not promise it, but zeroing and freeing the caller's
        buffer after the load leaves every output bit-identical (tests/test_qnn_api.py), so no copy is kept (an
        lm_head's is over 1 GB)."""
        ffi, lib = self.ffi, self.lib
        t0 = time.perf_counter()
        out = ffi.new("Qnn_ContextHandle_t*")
        lib.call(
            "contextCreateFromBinary",
            lib.iface.contextCreateFromBinary,
            self.session.backend,
            self.session.device,
            ffi.NULL,
            ffi.from_buffer(binary),
            len(binary),
            out,
            ffi.NULL,
            native=True,
        )
        self.context = out[0]
        for g in self.info.graphs:
            handle = ffi.new("Qnn_GraphHandle_t*")
            c_name = ffi.new("char[]", g.name.encode())
            lib.call(f"graphRetrieve (graph {g.name!r})", lib.iface.graphRetrieve, self.context, c_name, handle)
            self.graph_handles[g.name] = handle[0]
        self.load_seconds = time.perf_counter() - t0

    def _fill(self, t: Any, info: TensorInfo, arr: np.ndarray, keep: list[Any]) -> None:
        ffi = self.ffi
        t.version = info.version
        v = t.v2 if info.version == 2 else t.v1
        name = ffi.new("char[]", info.name.encode())
        dims = ffi.new("uint32_t[]", list(info.dims) or [1])
        buf = ffi.from_buffer(arr)
        keep += [name, dims, buf, arr]
        v.id = info.id
        v.name = name
        v.type = info.tensor_type
        v.dataFormat = info.data_format
        v.dataType = info.qnn_dtype
        v.quantizeParams.encodingDefinition = 1 if info.quant_encoding == 0 else 0x7FFFFFFF
        v.quantizeParams.quantizationEncoding = info.quant_encoding
        if info.quant_encoding == 0:
            v.quantizeParams.scaleOffsetEncoding.scale = info.scale
            v.quantizeParams.scaleOffsetEncoding.offset = info.offset
        v.rank = len(info.dims)
        v.dimensions = dims
        v.memType = _MEMTYPE_RAW
        v.clientBuf.data = buf
        v.clientBuf.dataSize = arr.nbytes
        if info.version == 2:
            t.v2.sparseParams.type = _SPARSE_LAYOUT_UNDEFINED

    def execute(self, graph: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run ``graph`` on ``inputs`` (by tensor name); returns outputs by name, in binary order."""
        if self._closed:
            raise QnnError("runner is closed")
        ginfo = self.info.graph(graph)
        missing = [t.name for t in ginfo.inputs if t.name not in inputs]
        extra = sorted(set(inputs) - {t.name for t in ginfo.inputs})
        if missing or extra:
            raise QnnError(f"graph {graph!r}: inputs missing {missing}, unknown {extra}")
        ffi = self.ffi
        keep: list[Any] = []
        in_arr = ffi.new("Qnn_Tensor_t[]", max(len(ginfo.inputs), 1))
        for i, ti in enumerate(ginfo.inputs):
            arr = np.ascontiguousarray(inputs[ti.name], dtype=ti.numpy_dtype)
            if arr.size != int(np.prod(ti.dims, dtype=np.int64)):
                raise QnnError(f"graph {graph!r}: input {ti.name!r} has shape {arr.shape}, expected {ti.dims}")
            self._fill(in_arr[i], ti, arr.reshape(ti.dims), keep)
        outputs: dict[str, np.ndarray] = {}
        out_arr = ffi.new("Qnn_Tensor_t[]", max(len(ginfo.outputs), 1))
        for i, to in enumerate(ginfo.outputs):
            arr = np.zeros(to.dims, dtype=to.numpy_dtype)
            outputs[to.name] = arr
            self._fill(out_arr[i], to, arr, keep)
        t0 = time.perf_counter()
        self.lib.call(
            f"graphExecute (graph {graph!r})",
            self.lib.iface.graphExecute,
            self.graph_handles[graph],
            in_arr,
            len(ginfo.inputs),
            out_arr,
            len(ginfo.outputs),
            ffi.NULL,
            ffi.NULL,
            native=True,
        )
        log.debug("executed graph %s in %.3fs", graph, time.perf_counter() - t0)
        del keep
        return outputs

    def close(self) -> None:
        """Free the context, then the session; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            free_context(self.lib, self.context)
            self.context = self.ffi.NULL
            self.graph_handles.clear()
        finally:
            self.session.close()

    def __enter__(self) -> ContextRunner:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def load_context(
    lib: QnnLibrary,
    binary: bytes | bytearray | memoryview,
    *,
    target: HtpTarget | None = None,
    device: bool = True,
) -> ContextRunner:
    """Load a context binary for execution; a weight-shared binary raises :class:`QnnError` cleanly.

    The binary info is read first (QnnSystem, which never crashes on these), so a shared binary
    is refused before the backend sees it and the caller can fall back to an unshared twin.
    """
    return ContextRunner(lib, binary, target=target, device=device)
