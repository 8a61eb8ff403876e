"""Running a bundle's ``qnn/llm.mnn`` the way the phone does: CPU ops in MNN, each Plugin op in QNN.

PyPI MNN is built without plugin support (a forward through a Plugin op fails with "Plugin is not
supported. Please recompile with MNN_WITH_PLUGIN"), but it loads any sub-graph of a file that holds
Plugin ops when given tensor names, as long as the sub-graph does not reach a Plugin op. So the ops
between plugins run as MNN sub-modules of ``qnn/llm.mnn`` itself (maximal runs of non-plugin ops), and
the plugins run in the HTP simulator in between.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from mnnbuild.cpu import CpuRuntime, import_mnn, load_module, to_numpy, to_var
from mnnbuild.mnn import Op, schema
from mnnbuild.qnn import HtpTarget, QnnLibrary
from mnnbuild_runtime.bundle import Bundle
from mnnbuild_runtime.errors import BundleError
from mnnbuild_runtime.plugin import OverrideLike, PluginRunner, as_override

log = logging.getLogger(__name__)

_NCHW = schema.MNN_DATA_FORMAT.NCHW
_NHWC = schema.MNN_DATA_FORMAT.NHWC
_NC4HW4 = schema.MNN_DATA_FORMAT.NC4HW4


@dataclass(frozen=True)
class Segment:
    """A maximal run of non-plugin ops, run as one MNN sub-module between tensor names."""

    name: str
    op_indexes: tuple[int, ...]  # the ops of qnn/llm.mnn this run covers (the needed ones)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class PluginStep:
    name: str
    path: str


Step = Segment | PluginStep


@dataclass(frozen=True)
class StepTiming:
    kind: str  # "mnn" (a CPU segment) or "qnn" (a plugin in the HTP simulator)
    name: str
    seconds: float
    graph: str | None = None
    shape_index: int | None = None


@dataclass
class ForwardResult:
    outputs: dict[str, np.ndarray]
    steps: list[StepTiming]
    plugin_io: dict[str, dict[str, Any]] = field(default_factory=dict)
    """With ``capture=True``: per plugin, ``graph`` and its ``inputs``/``outputs`` by QNN tensor name."""

    @property
    def mnn_seconds(self) -> float:
        return sum(s.seconds for s in self.steps if s.kind == "mnn")

    @property
    def qnn_seconds(self) -> float:
        return sum(s.seconds for s in self.steps if s.kind == "qnn")


class _Value:
    """A tensor between steps: an MNN Var (from a segment) and/or an NCHW numpy array (from a plugin)."""

    __slots__ = ("array", "fmt", "var")

    def __init__(self, var: Any = None, array: np.ndarray | None = None, fmt: int = _NCHW) -> None:
        self.var, self.array, self.fmt = var, array, fmt

    def as_var(self) -> Any:
        if self.var is None:
            F = import_mnn().expr
            var = to_var(np.ascontiguousarray(self.array))
            # MNN sub-modules take a tensor in the layout the graph keeps it in (as the plugin
            # kernel's copy-back does); an NCHW Var fed where NC4HW4 is expected is misread.
            if self.fmt == _NC4HW4:
                var = F.convert(var, F.NC4HW4)
            elif self.fmt == _NHWC and self.array is not None and self.array.ndim >= 3:
                var = F.convert(var, F.NHWC)
            self.var = var
        return self.var

    def as_array(self) -> np.ndarray:
        if self.array is None:
            F = import_mnn().expr
            var = self.var
            # read() returns the raw buffer; NC4HW4 and NHWC tensors are converted to the logical
            # NCHW layout first, as the plugin kernel does (Tensor::CAFFE) before handing them to QNN.
            if var.data_format != F.NCHW:
                var = F.convert(var, F.NCHW)
            self.array = to_numpy(var)
        return self.array


def _const_like(op: Op) -> bool:
    return op.type != "Input" and not op.inputs


def build_plan(bundle: Bundle) -> list[Step]:
    """Cut ``qnn/llm.mnn`` into segments and plugin steps, in op order, with each segment's inputs and
    outputs reduced to what later steps and the model outputs need."""
    model = bundle.model
    names = model.tensor_names
    graph_inputs = set(model.input_indexes)
    const_tensors = {t for op in model.ops if _const_like(op) for t in op.outputs}
    raw: list[tuple[str, list[int]]] = []
    for i, op in enumerate(model.ops):
        if op.type == "Input" or _const_like(op):
            continue  # Inputs are fed; constants are pulled in by MNN wherever they are used
        kind = "plugin" if op.type == "Plugin" else "ops"
        if kind == "ops" and raw and raw[-1][0] == "ops":
            raw[-1][1].append(i)
        else:
            raw.append((kind, [i]))
    # forward check: every op reads tensors that exist by then
    ready = set(graph_inputs) | const_tensors
    for _, idxs in raw:
        for i in idxs:
            op = model.ops[i]
            missing = [names[t] for t in op.inputs if t not in ready]
            if missing:
                raise BundleError(
                    f"{bundle.model_file}: op #{i} {op.name!r} ({op.type}) reads {missing[:3]} before any op "
                    "writes them; expected ops in topological order"
                )
            ready.update(op.outputs)
    missing_out = [n for n in model.output_names if model.tensor_index(n) not in ready]
    if missing_out:
        raise BundleError(f"{bundle.model_file}: model outputs {missing_out} are never produced")
    # backward pass: what each step must produce and read
    live = {model.tensor_index(n) for n in model.output_names}
    steps: list[Step] = []
    seg_count = sum(1 for k, _ in raw if k == "ops")
    for kind, idxs in reversed(raw):
        if kind == "plugin":
            op = model.ops[idxs[0]]
            if not live & set(op.outputs):
                log.warning("plugin %r: no output is used; it is not run", op.name)
                continue
            live -= set(op.outputs)
            live |= set(op.inputs)
            spec = next(p for p in bundle.plugins if p.op_index == idxs[0])
            steps.append(PluginStep(spec.name, spec.path))
            continue
        seg_count -= 1
        produced = {t for i in idxs for t in model.ops[i].outputs}
        outs = [t for t in sorted(produced & live)]
        if not outs:
            continue
        need = set(outs)
        used_ops = []
        for i in reversed(idxs):
            op = model.ops[i]
            if need & set(op.outputs):
                used_ops.append(i)
                need |= set(op.inputs)
        used_set = set(used_ops)
        produced_used = {t for i in used_set for t in model.ops[i].outputs}
        ins: list[int] = []
        for i in sorted(used_set):
            for t in model.ops[i].inputs:
                if t not in produced_used and t not in const_tensors and t not in ins:
                    ins.append(t)
        live -= produced
        live |= set(ins)
        steps.append(
            Segment(
                name=f"cpu{seg_count}",
                op_indexes=tuple(sorted(used_set)),
                inputs=tuple(names[t] for t in ins),
                outputs=tuple(names[t] for t in outs),
            )
        )
    steps.reverse()
    return steps


class HybridModel:
    """A bundle ready to run: ``forward(inputs)`` gives the model outputs, CPU parts in PyPI MNN and
    plugins in the x86 HTP simulator.

    ``binary_overrides`` maps a plugin path (``"qnn/graph0.bin"``) to the binary to execute instead
    (bytes, a file, or a :class:`~mnnbuild_runtime.plugin.BinaryOverride`); ``expected_target`` makes every
    binary's SoC/arch tags checked. Contexts are created lazily, once per plugin, and freed by
    :meth:`close` (or ``with``).
    """

    def __init__(
        self,
        bundle: Bundle | str | os.PathLike[str],
        *,
        binary_overrides: Mapping[str, OverrideLike] | None = None,
        expected_target: HtpTarget | None = None,
        runtime: CpuRuntime | None = None,
        qnn_lib: QnnLibrary | None = None,
        allow_weight_shared: bool = False,
    ) -> None:
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(Path(bundle))
        self.runtime = runtime or CpuRuntime()
        self._lib = qnn_lib
        overrides = dict(binary_overrides or {})
        paths = {p.path for p in self.bundle.plugins}
        unknown = sorted(set(overrides) - paths)
        if unknown:
            raise BundleError(
                f"{self.bundle.model_file}: binary_overrides name {unknown}, which no plugin uses; plugin paths: "
                f"{sorted(paths)}"
            )
        self.plugins: dict[str, PluginRunner] = {
            p.name: PluginRunner(
                p,
                self._qnn_lib,
                override=as_override(overrides[p.path]) if p.path in overrides else None,
                expected_target=expected_target,
                allow_weight_shared=allow_weight_shared,
            )
            for p in self.bundle.plugins
        }
        self.steps = build_plan(self.bundle)
        self._rt: Any = None
        self._modules: dict[str, Any] = {}
        self._segment_stats: dict[str, list[float]] = {}
        self._closed = False

    # -- resources ---------------------------------------------------------------------------------
    def _qnn_lib(self) -> QnnLibrary:
        if self._lib is None:
            self._lib = QnnLibrary()
        return self._lib

    def _module(self, seg: Segment) -> Any:
        mod = self._modules.get(seg.name)
        if mod is None:
            if self._rt is None:
                self._rt = self.runtime.create(self.bundle.weight_file)
            try:
                mod = load_module(self.bundle.model_file, self._rt, seg.inputs, seg.outputs)
            except Exception as exc:  # MNN raises a bare SystemError with the reason on stderr
                raise BundleError(
                    f"{self.bundle.model_file}: MNN cannot load segment {seg.name} (inputs {list(seg.inputs)[:6]}, "
                    f"outputs {list(seg.outputs)[:6]}): {exc}"
                ) from exc
            self._modules[seg.name] = mod
        return mod

    def check_binaries(self) -> list[dict[str, Any]]:
        """Check every plugin's shipped binary (and override) now, without running anything."""
        for runner in self.plugins.values():
            runner.check()
        return [r.report() for r in self.plugins.values()]

    def load(self) -> None:
        """Load every MNN segment and create every QNN context now instead of on first use."""
        for step in self.steps:
            if isinstance(step, Segment):
                self._module(step)
            else:
                self.plugins[step.name].load()

    # -- running -----------------------------------------------------------------------------------
    def _feed(self, inputs: Mapping[str, np.ndarray]) -> dict[str, _Value]:
        expected = self.bundle.input_names
        missing = [n for n in expected if n not in inputs]
        unknown = sorted(set(inputs) - set(expected))
        if missing or unknown:
            raise BundleError(
                f"{self.bundle.model_file}: inputs missing {missing}, unknown {unknown}; expected {expected}"
            )
        env = {}
        for name in expected:
            arr = np.asarray(inputs[name])
            if arr.dtype.kind == "f" and arr.dtype != np.float32:
                arr = arr.astype(np.float32)
            elif arr.dtype.kind in "iu" and arr.dtype != np.int32:
                arr = arr.astype(np.int32)
            env[name] = _Value(array=np.ascontiguousarray(arr))
        return env

    def run(self, inputs: Mapping[str, np.ndarray], *, capture: bool = False) -> ForwardResult:
        """One forward pass; returns outputs, per-step timings and (``capture``) every plugin's IO."""
        if self._closed:
            raise BundleError("HybridModel is closed")
        env = self._feed(inputs)
        timings: list[StepTiming] = []
        plugin_io: dict[str, dict[str, Any]] = {}
        for step in self.steps:
            if isinstance(step, Segment):
                mod = self._module(step)
                feed = [env[n].as_var() for n in step.inputs]
                t0 = time.perf_counter()
                outs = mod.forward(feed)
                if len(outs) != len(step.outputs):
                    raise BundleError(
                        f"{self.bundle.model_file}: segment {step.name} returned {len(outs)} outputs, expected "
                        f"{len(step.outputs)} ({list(step.outputs)[:6]}); MNN could not run it (see its log)"
                    )
                for name, var in zip(step.outputs, outs, strict=True):
                    env[name] = _Value(var=var)
                seconds = time.perf_counter() - t0
                self._segment_stats.setdefault(step.name, []).append(seconds)
                timings.append(StepTiming("mnn", step.name, seconds))
            else:
                runner = self.plugins[step.name]
                spec = runner.spec
                arrays = [env[n].as_array() for n in spec.input_tensors]
                index, outs, seconds = runner.execute(arrays)
                for name, arr, desc in zip(spec.output_tensors, outs, spec.outputs[index], strict=True):
                    env[name] = _Value(array=arr, fmt=desc.data_format)
                graph = spec.graph_names[index]
                timings.append(StepTiming("qnn", step.name, seconds, graph, index))
                if capture:
                    plugin_io[step.name] = {
                        "graph": graph,
                        "shape_index": index,
                        "inputs": dict(zip(spec.qnn_inputs, arrays, strict=True)),
                        "outputs": dict(zip(spec.qnn_outputs, outs, strict=True)),
                    }
        outputs = {n: env[n].as_array() for n in self.bundle.output_names}
        return ForwardResult(outputs, timings, plugin_io)

    def forward(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model outputs (``logits``, ``hidden_states`` ...) for ``inputs`` by name."""
        return self.run(inputs).outputs

    # -- reporting ---------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Which binary each plugin executed (shipped or override, with hashes), and time spent so far."""
        segments = []
        for step in self.steps:
            if isinstance(step, Segment):
                times = self._segment_stats.get(step.name, [])
                segments.append(
                    {
                        "segment": step.name,
                        "ops": len(step.op_indexes),
                        "inputs": list(step.inputs),
                        "outputs": list(step.outputs),
                        "calls": len(times),
                        "mnn_seconds": sum(times),
                    }
                )
        lib = self._lib
        return {
            "bundle": str(self.bundle.model_dir),
            "model": str(self.bundle.model_file),
            "qnn_library": lib.version.as_dict() if lib is not None else None,
            "cpu_runtime": self.runtime.model_dump(),
            "order": [s.name for s in self.steps],
            "plugins": [r.report() for r in self.plugins.values()],
            "segments": segments,
        }

    def close(self) -> None:
        """Free every QNN context (the MNN modules go with the object); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for runner in self.plugins.values():
            runner.close()
        self._modules.clear()

    def __enter__(self) -> HybridModel:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
