"""Qualcomm QNN (HTP backend) through cffi: library discovery, graph composition, context binaries.

Format code only, no stage logic. Typical use::

    lib = QnnLibrary()                       # QNN_SDK_ROOT first, then the onnxruntime-qnn package
    with ContextBuilder(lib, HtpTarget(69, 79), weight_sharing=True) as ctx:
        g = ctx.add_graph("graph0")
        x = g.add_input("t0", (1, 64))
        w = g.add_static("fc0.weight", weight)  # float32 [out, in]
        y = g.add_output("t1", (1, 64))
        g.add_node("fc0", "FullyConnected", [x, w], [y])
        binary = ctx.serialize()
    info = read_binary_info(lib, binary)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mnnbuild.qnn.binary_info import (
        BinaryInfo,
        GraphInfo,
        HtpGraphBlobInfo,
        TensorInfo,
        read_binary_info,
        same_element_order,
    )
    from mnnbuild.qnn.builder import ContextBuilder, GraphBuilder, GraphOptions, Quant, Scalar, TensorRef
    from mnnbuild.qnn.library import QnnLibrary, QnnLibraryPaths, QnnVersion, find_qnn_libraries
    from mnnbuild.qnn.runner import ContextRunner, load_context
    from mnnbuild.qnn.session import KNOWN_SOCS, HtpTarget, QnnSession

__all__ = [
    "KNOWN_SOCS",
    "BinaryInfo",
    "ContextBuilder",
    "ContextRunner",
    "GraphBuilder",
    "GraphInfo",
    "GraphOptions",
    "HtpGraphBlobInfo",
    "HtpTarget",
    "QnnLibrary",
    "QnnLibraryPaths",
    "QnnSession",
    "QnnVersion",
    "Quant",
    "Scalar",
    "TensorInfo",
    "TensorRef",
    "find_qnn_libraries",
    "load_context",
    "read_binary_info",
    "same_element_order",
]


_SOURCES = {
    "binary_info": (
        "BinaryInfo",
        "GraphInfo",
        "HtpGraphBlobInfo",
        "TensorInfo",
        "read_binary_info",
        "same_element_order",
    ),
    "builder": ("ContextBuilder", "GraphBuilder", "GraphOptions", "Quant", "Scalar", "TensorRef"),
    "library": ("QnnLibrary", "QnnLibraryPaths", "QnnVersion", "find_qnn_libraries"),
    "runner": ("ContextRunner", "load_context"),
    "session": ("KNOWN_SOCS", "HtpTarget", "QnnSession"),
}
"""The module each name of the API comes from: imported when the name is first used, so that a task key's QNN
build id (`mnnbuild.qnn.library` alone) loads neither numpy nor the builder and runner (a doit start only declares
tasks)."""


def __getattr__(name: str) -> Any:
    """A name of the API, imported on first use and then kept as this module's attribute."""
    source = next((module for module, names in _SOURCES.items() if name in names), None)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{source}"), name)
    globals()[name] = value
    return value
