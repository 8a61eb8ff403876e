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
