"""Checking lowered graphs: MNN CPU reference tensors, and running a lowered graph in the HTP simulator.

Used by the lowering tests and by whoever verifies a subgraph (CPU vs QNN on the same inputs).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnnbuild.cpu import CpuRuntime, import_mnn, load_module, to_var
from mnnbuild.lowering.context import TensorMeta
from mnnbuild.lowering.graph import compose
from mnnbuild.lowering.lower import LoweredGraph
from mnnbuild.mnn import MnnModel
from mnnbuild.qnn import ContextBuilder, HtpTarget, QnnLibrary, load_context

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
    results = module.forward([to_var(np.asarray(a)) for a in feed.values()])
    info: dict[int, TensorMeta] = {}
    for name, a in feed.items():
        arr = np.asarray(a)
        info[model.tensor_index(name)] = TensorMeta(tuple(arr.shape), str(arr.dtype), arr)
    for t, var in zip(wanted, results, strict=True):
        arr = _var_to_numpy(var)
        info[t] = TensorMeta(tuple(int(d) for d in arr.shape), str(arr.dtype), arr)
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
    results = module.forward([to_var(np.asarray(a)) for a in inputs.values()])
    return {n: _var_to_numpy(v) for n, v in zip(outputs, results, strict=True)}


def build_context(lib: QnnLibrary, graphs: Mapping[str, LoweredGraph], target: HtpTarget = SIMULATOR_TARGET) -> bytes:
    """One (unshared) context binary holding the lowered graphs, in order, with the upstream settings."""
    with ContextBuilder(lib, target) as ctx:
        for name, lowered in graphs.items():
            compose(lowered.description, lowered.statics, ctx.add_graph(name))
        return ctx.serialize()


def simulate(
    lib: QnnLibrary,
    lowered: LoweredGraph,
    inputs: Mapping[str, np.ndarray],
    target: HtpTarget = SIMULATOR_TARGET,
) -> dict[str, np.ndarray]:
    """Build ``lowered`` as graph ``g`` for ``target``, load it in the simulator and run it on ``inputs``
    (by QNN tensor name, ``t<index>``)."""
    binary = build_context(lib, {"g": lowered}, target)
    with load_context(lib, binary) as runner:
        return runner.execute("g", inputs)


@dataclass(frozen=True)
class Agreement:
    cosine: float
    max_abs_err: float
    ref_max_abs: float

    @property
    def relative(self) -> float:
        return self.max_abs_err / self.ref_max_abs if self.ref_max_abs else self.max_abs_err

    def ok(self, min_cosine: float = 0.999, max_relative: float = 0.02) -> bool:
        return self.cosine >= min_cosine and self.max_abs_err <= max_relative * self.ref_max_abs


def agreement(got: np.ndarray, ref: np.ndarray) -> Agreement:
    """Cosine similarity and max abs error of ``got`` against ``ref`` (identical arrays: cosine 1)."""
    g = np.asarray(got, dtype=np.float64).ravel()
    r = np.asarray(ref, dtype=np.float64).ravel()
    if g.shape != r.shape:
        raise ValueError(f"shape mismatch: {np.shape(got)} vs {np.shape(ref)}")
    norm = float(np.linalg.norm(g) * np.linalg.norm(r))
    cos = float(g @ r / norm) if norm else (1.0 if np.array_equal(g, r) else 0.0)
    return Agreement(cos, float(np.abs(g - r).max(initial=0.0)), float(np.abs(r).max(initial=0.0)))
