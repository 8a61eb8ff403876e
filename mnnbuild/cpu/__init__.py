"""Running MNN graphs on the CPU with PyPI MNN, with fixed, recorded runtime settings."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.base.fsutil import check_free_space, remove_stale_temps, temp_path
from mnnbuild.base.native import native_output

if TYPE_CHECKING:
    import numpy as np


class CpuRuntime(BaseModel):
    """MNN runtime settings used for every reference computation; recorded in manifests."""

    model_config = ConfigDict(frozen=True)

    backend: str = "CPU"
    precision: str = "high"
    num_thread: int = 4
    """MNN's CPU kernels split work by output, so the thread count changes speed, not values (Qwen3-1.7B dims:
    logits bit-equal with 1, 2 and 4 threads); fixed rather than the machine's core count so cache keys are
    the same on every machine. MNN runs with at most as many threads as this process has CPUs (`threads`)."""

    def threads(self) -> int:
        """The threads MNN runs with: ``num_thread``, but no more than the CPUs this process may use. MNN's threads
        wait for each other at every op, spinning: one more than there are cores waits on a thread that is not
        running (the tiny Eagle pair's CPU loops beside one busy process on 2 cores: 430 s with 4 threads, 45 s
        with 2; docs/benchmarks.md). Values do not depend on it (see ``num_thread``)."""
        return max(1, min(self.num_thread, usable_cpus()))

    def create(self, weight_file: Path | None = None, threads: int | None = None) -> Any:
        """An MNN RuntimeManager with these settings (and the external weight file, if any), on ``threads``
        threads (default: `threads()`)."""
        nn = import_mnn().nn
        config = {"backend": self.backend, "precision": self.precision, "numThread": threads or self.threads()}
        with native_output("MNN (runtime manager)"):  # MNN prints the CPU's features here
            rt = nn.create_runtime_manager((config,))
        if weight_file is not None:
            rt.set_external(str(weight_file))
        return rt


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the OS has one), at least 1."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def import_mnn() -> Any:
    """Import PyPI MNN (never MNN.tools: it installs packages and sends telemetry); what it prints on the way is
    captured (`native_output`)."""
    if "MNN.nn" not in sys.modules:  # called for every Var made: capture the first import only
        with native_output("MNN (import)"):
            import MNN.expr
            import MNN.nn
    import MNN

    return MNN


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; absent elsewhere (musl, macOS)
    except (OSError, AttributeError):
        return None


def return_freed_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim``) once MNN has freed a big module.

    MNN frees a module's decoded weights (a segment's are up to 1 GiB) with ``free``, but glibc keeps the pages
    for reuse; at Qwen3-1.7B size verify held much of such freed memory from its CPU reference through the
    simulator pass, which is what raised its peak (measured: docs/benchmarks.md)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def llm_engine_greedy(
    config: Path,
    prompt_ids: Sequence[int],
    n: int,
    settings: Mapping[str, Any],
    rows: list[np.ndarray] | None = None,
) -> list[int]:
    """``n`` greedy tokens of the model ``config`` describes from PyPI MNN's LLM engine (``MNN.llm``, the engine
    ``llm_demo`` runs: one prefill of the prompt, then one decode step per token against its KV cache), with
    ``settings`` over the config's. ``rows``: each token's logits row (float32) is appended to it."""
    import numpy as np

    import_mnn()
    with native_output(f"MNN's LLM engine ({config})"):
        import MNN.llm  # never MNN.tools

        engine = MNN.llm.create(str(config))
        engine.set_config(dict(settings))
        engine.load()
        if engine.context.status.name in ("NOT_LOADED", "INTERNAL_ERROR"):  # forward() would crash (SIGSEGV)
            raise MNNFormatError(f"{config}: MNN's LLM engine cannot load this model")
        tokens: list[int] = []
        logits = engine.forward([int(t) for t in prompt_ids])
        while len(tokens) < n:
            out = to_numpy(logits)
            row = out.reshape(-1, out.shape[-1])[-1]  # the last token's
            tokens.append(int(np.argmax(row)))
            if rows is not None:
                rows.append(np.array(row, dtype=np.float32))  # a copy: the engine reuses its output
            if len(tokens) < n:
                logits = engine.forward(tokens[-1:])
        del logits  # before the engine: freeing its output after the engine crashes (SIGSEGV)
        del engine
    return_freed_memory()
    return tokens


def load_module(model: Path, rt: Any, inputs: Sequence[str] = (), outputs: Sequence[str] = ()) -> Any:
    """Load ``model`` (or the sub-graph between named tensors) as an MNN Module."""
    mnn = import_mnn()
    try:
        with native_output(f"MNN (loading {model})"):
            return mnn.nn.load_module_from_file(str(model), list(inputs), list(outputs), runtime_manager=rt)
    except Exception as exc:  # MNN reports a file it cannot load as a bare Exception/SystemError
        raise MNNFormatError(
            f"{model}: MNN cannot load this model ({exc}); is it truncated or not an MNN file?"
        ) from None


@functools.cache
def _dtypes() -> dict[np.dtype, str]:
    """MNN's name of each dtype a Var holds (made on first use: numpy is imported where arrays are made)."""
    import numpy as np

    return {
        np.dtype(np.float32): "float",
        np.dtype(np.int32): "int",
        np.dtype(np.int64): "int64",
        np.dtype(np.uint8): "uint8",
        np.dtype(np.int8): "int8",
    }


def forward_vars(module: Any, variables: Sequence[Any]) -> list[Any]:
    """Run an MNN module on MNN Vars (fed in their own layout); always a list of output Vars."""
    with native_output("MNN (forward)"):
        result = module.forward(list(variables))
    return list(result) if isinstance(result, (list, tuple)) else [result]


def to_var(array: np.ndarray, name: str | None = None, nhwc: bool = False) -> Any:
    """A constant MNN Var holding ``array`` (float32 or int32), optionally named."""
    import numpy as np

    F = import_mnn().expr
    shape = list(np.shape(array))  # before ascontiguousarray, which makes a 0-d array (a scalar) 1-d
    array = np.ascontiguousarray(array)
    dtype = getattr(F, _dtypes()[array.dtype])
    var = F.const(array, shape, F.NHWC if nhwc else F.NCHW, dtype)
    if name is not None:
        var.name = name
    return var


def var_format(var: Any) -> str:
    """MNN data format name of a Var (``NCHW``, ``NHWC``, ``NC4HW4``)."""
    return str(var.data_format).rpartition(".")[2]


def to_numpy(var: Any) -> np.ndarray:
    """A copy of a Var's values in logical (NCHW) order.

    ``read()`` alone returns NC4HW4 data still packed in blocks of four channels.
    """
    import numpy as np

    if var_format(var) == NC4HW4:
        F = import_mnn().expr
        var = F.convert(var, F.NCHW)
    return np.array(var.read(), copy=True)


def save_vars(path: Path, arrays: dict[str, np.ndarray], nhwc: Sequence[str] = ()) -> None:
    """Write named arrays as an MNN Var file (``input.mnn``/``output.mnn``), via a temp name."""
    F = import_mnn().expr
    # MNN crashes (SIGSEGV) when its write fails: make sure the file fits first (names + headers: 64 KB)
    check_free_space(path.parent, sum(a.nbytes for a in arrays.values()) + (64 << 10))
    remove_stale_temps(path)
    tmp = temp_path(path)
    try:
        F.save([to_var(a, n, n in nhwc) for n, a in arrays.items()], str(tmp))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_vars(path: Path) -> dict[str, np.ndarray]:
    """Read an MNN Var file into named numpy arrays (in file order)."""
    F = import_mnn().expr
    return {v.name: to_numpy(v) for v in F.load_as_list(str(path))}


# -- tensors at plugin boundaries ------------------------------------------------------------------
# Tensor layouts at plugin boundaries: what a QNN graph reads and writes, and what MNN's CPU ops see.
#
# A QNN graph's inputs and outputs are dense arrays in MNN's *logical* order (NCHW dims, as MNN reports
# the shape of an NC4HW4 tensor): MNN's plugin kernel (``PluginExecuteRaw`` in upstream
# ``QNNBackend.cpp``) binds each graph tensor to a ``Tensor::CAFFE`` copy of the MNN tensor. The MNN
# tensor itself keeps the layout MNN gives it in the source graph (NC4HW4 for a Convolution output):
# for a plugin output that layout is the ``dataFormat`` of its ``o_<shape>_<j>`` Blob (upstream
# ``compilefornpu`` writes the Var's order there, ``PluginShapeRaw`` sets the output tensor's format
# from it), and the kernel's copy-back converts the dense buffer into it.
#
# ``BoundaryValue`` holds a tensor between steps that way, for the partition's reference runs and the one
# hybrid executor (``runtime/mnnbuild_runtime/hybrid.py``).

NCHW, NHWC, NC4HW4 = "NCHW", "NHWC", "NC4HW4"
BLOB_FORMATS = (NCHW, NHWC, NC4HW4)
"""Layouts an ``o_*`` Blob can name (anything else is written as NCHW)."""


class BoundaryValue:
    """A tensor between steps: the MNN Var a CPU step made (in MNN's own layout), or a dense
    logical-NCHW array (a plugin output, a graph input) plus the MNN layout CPU ops get it in.
    Each view is made once, on first use."""

    __slots__ = ("_array", "_var", "fmt")

    def __init__(self, var: Any = None, array: np.ndarray | None = None, fmt: str = NCHW) -> None:
        if (var is None) == (array is None):
            raise ValueError("BoundaryValue needs exactly one of var and array")
        self._var, self._array = var, array
        self.fmt = var_format(var) if var is not None else fmt

    def as_var(self) -> Any:
        """The Var a CPU step reads: an array converted into its MNN layout, as the plugin kernel's
        copy-back does (MNN sub-modules adopt the layout of the Var they are fed)."""
        if self._var is None:
            assert self._array is not None
            F = import_mnn().expr
            var = to_var(self._array)
            if self.fmt == NC4HW4:
                var = F.convert(var, F.NC4HW4)
            elif self.fmt == NHWC and self._array.ndim >= 3:
                var = F.convert(var, F.NHWC)
            self._var = var
        return self._var

    def as_array(self) -> np.ndarray:
        """The dense logical-NCHW array a plugin reads (the kernel's ``Tensor::CAFFE`` copy)."""
        import numpy as np

        if self._array is None:
            var = self._var
            if var_format(var) != NCHW:
                F = import_mnn().expr
                var = F.convert(var, F.NCHW)
            self._array = np.array(var.read(), copy=True)
        return self._array
