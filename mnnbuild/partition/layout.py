"""Tensor layouts at plugin boundaries: what a QNN graph reads and writes, and what MNN's CPU ops see.

A QNN graph's inputs and outputs are dense arrays in MNN's *logical* order (NCHW dims, as MNN reports
the shape of an NC4HW4 tensor): MNN's plugin kernel (``PluginExecuteRaw`` in upstream
``QNNBackend.cpp``) binds each graph tensor to a ``Tensor::CAFFE`` copy of the MNN tensor. The MNN
tensor itself keeps the layout MNN gives it in the source graph (NC4HW4 for a Convolution output):
for a plugin output that layout is the ``dataFormat`` of its ``o_<shape>_<j>`` Blob (upstream
``compilefornpu`` writes the Var's order there, ``PluginShapeRaw`` sets the output tensor's format
from it), and the kernel's copy-back converts the dense buffer into it.

``BoundaryValue`` holds a tensor between steps the same way, for the partition's reference runs and
the hybrid executor (mirroring ``runtime/mnnbuild_runtime/hybrid.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mnnbuild.cpu import import_mnn, to_var, var_format
from mnnbuild.mnn import enum_name, schema

NCHW, NHWC, NC4HW4 = "NCHW", "NHWC", "NC4HW4"
BLOB_FORMATS = (NCHW, NHWC, NC4HW4)
"""Layouts an ``o_*`` Blob can name (anything else is written as NCHW)."""


def blob_format(blob: Any) -> str:
    """The MNN data format name an ``o_*`` Blob gives a plugin output."""
    return enum_name(schema.MNN_DATA_FORMAT, int(blob.dataFormat))


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
        if self._array is None:
            var = self._var
            if var_format(var) != NCHW:
                F = import_mnn().expr
                var = F.convert(var, F.NCHW)
            self._array = np.array(var.read(), copy=True)
        return self._array
