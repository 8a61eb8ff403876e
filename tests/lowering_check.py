"""Checking lowered graphs: MNN CPU reference tensors, and running a lowered graph in the HTP simulator.

The lowering tests' helper (moved out of mnnbuild/lowering/: no build code uses it; verify has its own checks).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from mnnbuild.cpu import CpuRuntime, forward_vars, import_mnn, load_module, to_var
from mnnbuild.lowering.context import TensorMeta
from mnnbuild.lowering.graph import compose_context
from mnnbuild.lowering.lower import LoweredGraph
from mnnbuild.mnn import MnnModel
from mnnbuild.qnn import HtpTarget, QnnLibrary, load_context

log = logging.getLogger(__name__)

SIMULATOR_TARGET = HtpTarget(69, 79)  # SM8750, what the tests build for


def _var_to_numpy(var: object) -> np.ndarray:
    F = import_mnn().expr
    if var.data_format == F.NC4HW4:  # type: ignore[attr-defined]
        var = F.convert(var, F.NCHW)
    return np.array(var.read(), copy=True)  # type: ignore[attr-defined]


def mnn_tensors(
    model: MnnModel,
    model_file: Path,
    weight_file: Path | None,
    feed: Mapping[str, np.ndarray],
    runtime: CpuRuntime | None = None,
) -> dict[int, TensorMeta]:
    """Run ``model_file`` on the CPU with every tensor as an output; shape, dtype and value of each.

    The input names are ``feed``'s keys; tensors MNN cannot produce (dangling names) are left out.
    NC4HW4 tensors are returned in NCHW, their logical layout.
    """
    rt = (runtime or CpuRuntime()).create(weight_file)
    producers = model.producers()
    wanted = [t for t, name in enumerate(model.tensor_names) if name not in feed and t in producers]
    names = [model.tensor_names[t] for t in wanted]
    module = load_module(model_file, rt, list(feed), names)
    results = forward_vars(module, [to_var(np.asarray(a)) for a in feed.values()])
    info: dict[int, TensorMeta] = {}
    for name, a in feed.items():
        arr = np.asarray(a)
        info[model.tensor_index(name)] = TensorMeta(tuple(arr.shape), str(arr.dtype), arr)
    c4 = import_mnn().expr.NC4HW4
    for t, var in zip(wanted, results, strict=True):
        arr = _var_to_numpy(var)
        layout = "NC4HW4" if var.data_format == c4 else "NCHW"  # type: ignore[attr-defined]
        info[t] = TensorMeta(tuple(int(d) for d in arr.shape), str(arr.dtype), arr, format=layout)
    return info


def mnn_run(
    model_file: Path,
    weight_file: Path | None,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    runtime: CpuRuntime | None = None,
) -> dict[str, np.ndarray]:
    """Run the sub-graph of ``model_file`` between the named tensors on the MNN CPU."""
    rt = (runtime or CpuRuntime()).create(weight_file)
    module = load_module(model_file, rt, list(inputs), list(outputs))
    results = forward_vars(module, [to_var(np.asarray(a)) for a in inputs.values()])
    return {n: _var_to_numpy(v) for n, v in zip(outputs, results, strict=True)}


def simulate(
    lib: QnnLibrary,
    lowered: LoweredGraph,
    inputs: Mapping[str, np.ndarray],
    target: HtpTarget = SIMULATOR_TARGET,
) -> dict[str, np.ndarray]:
    """Build ``lowered`` as graph ``g`` for ``target``, load it in the simulator and run it on ``inputs``
    (by QNN tensor name, ``t<index>``)."""
    binary = compose_context(lib, target, {"g": (lowered.description, lowered.statics)}, weight_sharing=False)
    with load_context(lib, binary) as runner:
        return runner.execute("g", inputs)
