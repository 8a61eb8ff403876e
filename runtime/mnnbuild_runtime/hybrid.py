"""Running a bundle's ``qnn/llm.mnn`` the way the phone does: CPU ops in MNN, each Plugin op in QNN.

PyPI MNN is built without plugin support (a forward through a Plugin op fails with "Plugin is not
supported. Please recompile with MNN_WITH_PLUGIN"), but it loads any sub-graph of a file that holds
Plugin ops when given tensor names, as long as the sub-graph does not reach a Plugin op. So the ops
between plugins run as MNN sub-modules of ``qnn/llm.mnn`` itself (maximal runs of non-plugin ops), and
the plugins run in the HTP simulator in between.

:class:`HybridExecutor` is that loop for any model file holding Plugin ops, with each plugin run by a
callback (:data:`PluginFn`): :class:`HybridModel` plugs in the HTP simulator, the build's tests plug in
the partition's CPU reference (``mnnbuild.partition.reference.SourceSubgraphRunner``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from mnnbuild.cpu import NHWC, BoundaryValue, CpuRuntime, forward_vars, load_module
from mnnbuild.mnn import MnnModel
from mnnbuild.mnn.llm import DEEPSTACK_INPUT, windowed_mask
from mnnbuild.mnn.semantics import CONST_OP_TYPES
from mnnbuild.qnn import HtpTarget, QnnLibrary
from mnnbuild_runtime.bundle import Bundle, PluginSpec
from mnnbuild_runtime.errors import BundleError
from mnnbuild_runtime.hashes import FileHashes
from mnnbuild_runtime.plugin import OverrideLike, PluginRunner, as_override, select_shape_index

log = logging.getLogger(__name__)


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
    op_index: int = -1


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
    error: Exception | None = None
    """:meth:`HybridExecutor.run_many` only: why this input's pass stopped (then ``outputs`` is empty)."""

    @property
    def mnn_seconds(self) -> float:
        return sum(s.seconds for s in self.steps if s.kind == "mnn")

    @property
    def qnn_seconds(self) -> float:
        return sum(s.seconds for s in self.steps if s.kind == "qnn")


PluginFn = Callable[[PluginSpec, int, Sequence[np.ndarray]], tuple[Sequence[np.ndarray], float]]
"""Runs one plugin: (its spec, the shape index the live inputs select, the inputs as dense logical-NCHW
arrays in ``inputs`` attribute order) -> (the outputs in ``outputs`` attribute order, seconds spent)."""


MROPE_INPUT = "position_ids"
MASK_INPUT = "attention_mask"


def text_feeds(
    inputs: Mapping[str, np.ndarray], declared: Mapping[str, Sequence[int]], window: int | None = None
) -> dict[str, np.ndarray]:
    """A text prompt's feeds completed for a vision-language model's declared inputs (``MnnModel.input_dims``) and
    for the mask MNN's engine builds.

    M-RoPE (``position_ids`` declared ``[3, -1]``): a text token has its position in every row, so one given row
    is repeated. Qwen3-VL's ``deepstack_embeds`` (declared ``[3, 1, hidden]``): text tokens add nothing, so a
    missing input is zeros ``[3, seq, hidden]``, as MNN's engine feeds for text. A model mixing full and sliding
    attention (``window``, `Bundle.mask_window`): a one-part ``attention_mask`` becomes the engine's two-part one
    (:func:`mnnbuild.mnn.llm.windowed_mask`). Other feeds pass unchanged."""
    feeds = dict(inputs)
    mask = feeds.get(MASK_INPUT)
    if window is not None and mask is not None:
        feeds[MASK_INPUT] = windowed_mask(np.asarray(mask), window)
    rows = list(declared.get(MROPE_INPUT, ()))
    pos = feeds.get(MROPE_INPUT)
    if pos is not None and len(rows) == 2 and rows[0] > 1 and np.ndim(pos) == 2 and np.shape(pos)[0] == 1:
        feeds[MROPE_INPUT] = np.repeat(np.asarray(pos), rows[0], axis=0)
    deep = list(declared.get(DEEPSTACK_INPUT, ()))
    if deep and DEEPSTACK_INPUT not in feeds and "input_ids" in feeds:
        seq = int(np.shape(feeds["input_ids"])[0])
        feeds[DEEPSTACK_INPUT] = np.zeros((deep[0], seq, deep[-1]), dtype=np.float32)
    return feeds


def build_plan(bundle: Bundle) -> list[Step]:
    """:func:`plan_steps` of a bundle's ``qnn/llm.mnn``."""
    return plan_steps(bundle.model, bundle.model_file, bundle.plugins)


def plan_steps(model: MnnModel, model_file: Path, plugins: Sequence[PluginSpec]) -> list[Step]:
    """Cut ``model`` into segments and plugin steps, in op order, with each segment's inputs and
    outputs reduced to what later steps and the model outputs need."""
    names = model.tensor_names
    graph_inputs = set(model.input_indexes)
    # MNN's own notion (mnn.semantics): Const/TrainableParam outputs are constant by construction
    const_tensors = {t for op in model.ops if op.type in CONST_OP_TYPES for t in op.outputs}
    raw: list[tuple[str, list[int]]] = []
    for i, op in enumerate(model.ops):
        if op.type == "Input" or op.type in CONST_OP_TYPES:
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
                    f"{model_file}: op #{i} {op.name!r} ({op.type}) reads {missing[:3]} before any op "
                    "writes them; expected ops in topological order"
                )
            ready.update(op.outputs)
    missing_out = [n for n in model.output_names if model.tensor_index(n) not in ready]
    if missing_out:
        raise BundleError(f"{model_file}: model outputs {missing_out} are never produced")
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
            spec = next(p for p in plugins if p.op_index == idxs[0])
            steps.append(PluginStep(spec.name, spec.path, spec.op_index))
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


class HybridExecutor:
    """Runs a model file holding Plugin ops: each segment as an MNN sub-module of that file, each plugin
    through ``run_plugin`` (see :data:`PluginFn`), with the tensor layouts the device uses at every boundary.

    A plugin gets dense logical-NCHW arrays whatever layout MNN keeps a tensor in; its outputs are converted
    into the layout its ``o_<shape>_<j>`` Blob names (NC4HW4 for a Convolution output) before CPU ops read
    them. Values passed between segments keep MNN's own layout.
    """

    def __init__(
        self,
        model_file: Path,
        model: MnnModel,
        plugins: Sequence[PluginSpec],
        weight_file: Path | None,
        run_plugin: PluginFn,
        *,
        runtime: CpuRuntime | None = None,
        check_files: Callable[[], None] | None = None,
        mask_window: int | None = None,
    ) -> None:
        """``check_files``: called right before MNN opens the model or weight file by name (a bundle's
        `Bundle.check_files`: no file became a link since it was opened). ``mask_window``: `Bundle.mask_window`
        (:func:`text_feeds`)."""
        self.check_files = check_files
        self.mask_window = mask_window
        self.model_file = Path(model_file)
        self.model = model
        self.plugins = {p.name: p for p in plugins}
        self.weight_file = weight_file
        self.run_plugin = run_plugin
        self.runtime = runtime or CpuRuntime()
        self.steps = plan_steps(model, self.model_file, plugins)
        self._rt: Any = None
        self._modules: dict[str, Any] = {}
        self.segment_seconds: dict[str, list[float]] = {}

    def _module(self, seg: Segment) -> Any:
        mod = self._modules.get(seg.name)
        if mod is None:
            if self.check_files is not None:
                self.check_files()
            if self._rt is None:
                self._rt = self.runtime.create(self.weight_file)
            try:
                mod = load_module(self.model_file, self._rt, seg.inputs, seg.outputs)
            except Exception as exc:  # MNN raises a bare SystemError with the reason on stderr
                raise BundleError(
                    f"{self.model_file}: MNN cannot load segment {seg.name} (inputs {list(seg.inputs)[:6]}, "
                    f"outputs {list(seg.outputs)[:6]}): {exc}"
                ) from exc
            self._modules[seg.name] = mod
        return mod

    def load_segments(self) -> None:
        """Load every MNN segment now instead of on first use."""
        for step in self.steps:
            if isinstance(step, Segment):
                self._module(step)

    def _feed(self, inputs: Mapping[str, np.ndarray]) -> dict[str, BoundaryValue]:
        inputs = text_feeds(inputs, self.model.input_dims, self.mask_window)
        expected = self.model.input_names
        missing = [n for n in expected if n not in inputs]
        unknown = sorted(set(inputs) - set(expected))
        if missing or unknown:
            raise BundleError(f"{self.model_file}: inputs missing {missing}, unknown {unknown}; expected {expected}")
        env = {}
        for name in expected:
            arr = np.asarray(inputs[name])
            if arr.dtype.kind == "f" and arr.dtype != np.float32:
                arr = arr.astype(np.float32)
            elif arr.dtype.kind in "iu" and arr.dtype != np.int32:
                arr = arr.astype(np.int32)
            env[name] = BoundaryValue(array=np.ascontiguousarray(arr))
        return env

    def _segment(self, step: Segment, env: dict[str, BoundaryValue]) -> float:
        mod = self._module(step)
        feed = [env[n].as_var() for n in step.inputs]
        t0 = time.perf_counter()
        outs = forward_vars(mod, feed)
        if len(outs) != len(step.outputs):
            raise BundleError(
                f"{self.model_file}: segment {step.name} returned {len(outs)} outputs, expected "
                f"{len(step.outputs)} ({list(step.outputs)[:6]}); MNN could not run it (see its log)"
            )
        for name, var in zip(step.outputs, outs, strict=True):
            env[name] = BoundaryValue(var=var)
        seconds = time.perf_counter() - t0
        self.segment_seconds.setdefault(step.name, []).append(seconds)
        return seconds

    def _plugin(
        self, spec: PluginSpec, env: dict[str, BoundaryValue]
    ) -> tuple[int, list[np.ndarray], list[np.ndarray], float]:
        arrays = [env[n].as_array() for n in spec.input_tensors]
        index = select_shape_index(spec, [a.shape for a in arrays])
        got, seconds = self.run_plugin(spec, index, arrays)
        outs = [np.asarray(o) for o in got]
        if len(outs) != len(spec.output_tensors):
            raise BundleError(f"{spec.where()}: produced {len(outs)} outputs, expected {len(spec.output_tensors)}")
        for j, (name, arr, desc) in enumerate(zip(spec.output_tensors, outs, spec.outputs[index], strict=True)):
            # an NHWC Blob lists MNN's NHWC dims while the graph writes NCHW order: only sizes compare
            same = arr.size == int(np.prod(desc.dims)) if desc.format_name == NHWC else tuple(arr.shape) == desc.dims
            if not same:
                raise BundleError(
                    f"{spec.where()}: output {j} ({spec.qnn_outputs[j]}) has shape {list(arr.shape)}, "
                    f"attribute 'o_{index}_{j}' says {list(desc.dims)}"
                )
            env[name] = BoundaryValue(array=arr, fmt=desc.format_name)
        return index, arrays, outs, seconds

    def run(self, inputs: Mapping[str, np.ndarray], *, capture: bool = False) -> ForwardResult:
        """One forward pass; returns outputs, per-step timings and (``capture``) every plugin's IO."""
        (result,) = self.run_many([inputs], capture=capture)
        if result.error is not None:
            raise result.error
        return result

    def run_many(
        self,
        feeds: Sequence[Mapping[str, np.ndarray]],
        *,
        capture: bool = False,
        on_step: Callable[[str], None] | None = None,
    ) -> list[ForwardResult]:
        """Forward passes of several inputs in lockstep: each step runs for every input before the next step
        starts, so each plugin is needed once per call, not once per input. An input whose pass fails gets the
        exception in its result's ``error`` and drops out; the others go on. The results are those of separate
        passes. ``on_step``: called with each step's name (segment or plugin) once it ran for every input (a
        caller's progress display)."""
        passes: list[tuple[dict[str, BoundaryValue], ForwardResult]] = []
        for inputs in feeds:
            result = ForwardResult({}, [])
            try:
                env = self._feed(inputs)
            except Exception as exc:
                env, result.error = {}, exc
            passes.append((env, result))
        for step in self.steps:
            # a plugin fed exactly what it ran on for an earlier input of this call gives what it gave then (the
            # simulator is deterministic): e.g. a whole-chunk sample repeats its padded twin up to the logits slice
            ran: dict[bytes, tuple[dict[str, BoundaryValue], ForwardResult]] = {}
            for env, result in passes:
                if result.error is not None:
                    continue
                try:
                    key = self._plugin_feed_key(step, env)
                    if key is not None and key in ran:
                        self._repeat(step, ran[key], env, result)
                        continue
                    self._step(step, env, result, capture)
                    if key is not None:
                        ran[key] = (env, result)
                except Exception as exc:  # this input's pass ends; the others do not depend on it
                    result.error = exc
            if on_step is not None:
                on_step(step.name)
        for env, result in passes:
            if result.error is None:
                result.outputs = {n: env[n].as_array() for n in self.model.output_names}
        return [result for _, result in passes]

    def _plugin_feed_key(self, step: Step, env: dict[str, BoundaryValue]) -> bytes | None:
        """A digest of a plugin step's input arrays (shapes, types, bytes); None for a CPU segment."""
        if isinstance(step, Segment):
            return None
        digest = hashlib.blake2b(digest_size=20)
        for name in self.plugins[step.name].input_tensors:
            arr = env[name].as_array()
            digest.update(f"{arr.dtype.str}{arr.shape}".encode())
            digest.update(np.ascontiguousarray(arr).data)
        return digest.digest()

    def _repeat(
        self,
        step: Step,
        earlier: tuple[dict[str, BoundaryValue], ForwardResult],
        env: dict[str, BoundaryValue],
        result: ForwardResult,
    ) -> None:
        """A plugin step's outputs taken from the earlier input it ran on with the same feed (no simulator time)."""
        before_env, before = earlier
        spec = self.plugins[step.name]
        for name in spec.output_tensors:
            env[name] = before_env[name]
        timing = next(t for t in reversed(before.steps) if t.name == step.name)
        result.steps.append(StepTiming("qnn", step.name, 0.0, timing.graph, timing.shape_index))
        if step.name in before.plugin_io:
            result.plugin_io[step.name] = before.plugin_io[step.name]

    def _step(self, step: Step, env: dict[str, BoundaryValue], result: ForwardResult, capture: bool) -> None:
        if isinstance(step, Segment):
            result.steps.append(StepTiming("mnn", step.name, self._segment(step, env)))
            return
        spec = self.plugins[step.name]
        index, arrays, outs, seconds = self._plugin(spec, env)
        graph = spec.graph_names[index]
        result.steps.append(StepTiming("qnn", step.name, seconds, graph, index))
        if capture:
            result.plugin_io[step.name] = {
                "graph": graph,
                "shape_index": index,
                "inputs": dict(zip(spec.qnn_inputs, arrays, strict=True)),
                "outputs": dict(zip(spec.qnn_outputs, outs, strict=True)),
            }

    def segment_report(self) -> list[dict[str, Any]]:
        """Per segment: its ops, boundary tensors, calls and MNN time so far."""
        segments = []
        for step in self.steps:
            if isinstance(step, Segment):
                times = self.segment_seconds.get(step.name, [])
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
        return segments

    def close(self) -> None:
        self._modules.clear()


class HybridModel:
    """A bundle ready to run: ``forward(inputs)`` gives the model outputs, CPU parts in PyPI MNN and
    plugins in the x86 HTP simulator.

    ``binary_overrides`` maps a plugin path (``"qnn/graphllm0.bin"``) to the binary to execute instead
    (bytes, a file, or a :class:`~mnnbuild_runtime.plugin.BinaryOverride`); ``expected_target`` makes every
    binary's SoC/arch tags checked. Contexts are created lazily and freed by :meth:`close` (or ``with``).
    ``max_loaded`` bounds how many plugin contexts are loaded at once: before another is loaded, the least
    recently run one is freed (and loaded again when next needed), so memory follows the largest plugins, not
    the model. ``None`` (the default, as on the phone) keeps every context once loaded. ``hashes``: the binaries'
    remembered hashes (`mnnbuild_runtime.hashes`; seed it with hashes known with their files' stamps), shared by
    every plugin; by default a new one, so each binary is hashed once while unchanged, however often it loads.
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
        max_loaded: int | None = None,
        hashes: FileHashes | None = None,
    ) -> None:
        if max_loaded is not None and max_loaded < 1:
            raise ValueError(f"max_loaded must be at least 1 (or None: no bound), got {max_loaded}")
        self.max_loaded = max_loaded
        self._recent: OrderedDict[str, None] = OrderedDict()  # plugin names, least recently run first
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(Path(bundle))
        self.runtime = runtime or CpuRuntime()
        self._lib = qnn_lib
        self.hashes = hashes if hashes is not None else FileHashes()
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
                hashes=self.hashes,
            )
            for p in self.bundle.plugins
        }
        self.executor = HybridExecutor(
            self.bundle.model_file,
            self.bundle.model,
            self.bundle.plugins,
            self.bundle.weight_file,
            self._run_plugin,
            runtime=self.runtime,
            check_files=self.bundle.check_files,
            mask_window=self.bundle.mask_window,
        )
        self._closed = False

    @property
    def steps(self) -> list[Step]:
        return self.executor.steps

    def _qnn_lib(self) -> QnnLibrary:
        if self._lib is None:
            self._lib = QnnLibrary()
        return self._lib

    def _admit(self, name: str) -> PluginRunner:
        """The runner of plugin ``name``, about to run: with ``max_loaded``, free the least recently run
        contexts so that loading this one keeps the bound."""
        runner = self.plugins[name]
        if self.max_loaded is None:
            return runner
        self._recent.pop(name, None)
        others = [n for n in self._recent if self.plugins[n].loaded]
        self._recent[name] = None
        excess = len(others) + 1 - self.max_loaded
        for n in others[: max(excess, 0)]:
            self.plugins[n].close()
        return runner

    def _run_plugin(self, spec: PluginSpec, index: int, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], float]:
        return self._admit(spec.name).run(index, inputs)

    @property
    def loaded_plugins(self) -> list[str]:
        """Plugins whose context is loaded now."""
        return [name for name, runner in self.plugins.items() if runner.loaded]

    def check_binaries(self) -> list[dict[str, Any]]:
        """Check every plugin's shipped binary (and override) now, without running anything."""
        for runner in self.plugins.values():
            runner.check()
        return [r.report() for r in self.plugins.values()]

    def load(self) -> None:
        """Load every MNN segment and create every QNN context now instead of on first use (with ``max_loaded``,
        the last ones only)."""
        self.executor.load_segments()
        for step in self.steps:
            if isinstance(step, PluginStep):
                self._admit(step.name).load()

    def run(self, inputs: Mapping[str, np.ndarray], *, capture: bool = False) -> ForwardResult:
        """One forward pass; returns outputs, per-step timings and (``capture``) every plugin's IO."""
        if self._closed:
            raise BundleError("HybridModel is closed")
        return self.executor.run(inputs, capture=capture)

    def run_many(
        self,
        feeds: Sequence[Mapping[str, np.ndarray]],
        *,
        capture: bool = False,
        on_step: Callable[[str], None] | None = None,
    ) -> list[ForwardResult]:
        """Forward passes of several inputs in lockstep (:meth:`HybridExecutor.run_many`): with ``max_loaded``,
        each plugin is loaded once for all of them (``capture=True`` keeps each plugin's inputs and outputs;
        ``on_step`` is told each step's name once it ran)."""
        if self._closed:
            raise BundleError("HybridModel is closed")
        return self.executor.run_many(feeds, capture=capture, on_step=on_step)

    @property
    def step_count(self) -> int:
        """How many steps (CPU segments and plugins) a forward pass runs: what ``on_step`` counts to."""
        return len(self.steps)

    def unload(self) -> None:
        """Free every loaded QNN context now (a later run loads what it needs again), e.g. before other work that
        needs the memory."""
        for runner in self.plugins.values():
            runner.close()

    def forward(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model outputs (``logits``, ``hidden_states`` ...) for ``inputs`` by name."""
        return self.run(inputs).outputs

    def report(self) -> dict[str, Any]:
        """Which binary each plugin executed (shipped or override, with hashes), and time spent so far."""
        lib = self._lib
        return {
            "bundle": str(self.bundle.model_dir),
            "model": str(self.bundle.model_file),
            "qnn_library": lib.version.as_dict() if lib is not None else None,
            "cpu_runtime": self.runtime.model_dump(),
            "order": [s.name for s in self.steps],
            "plugins": [r.report() for r in self.plugins.values()],
            "segments": self.executor.segment_report(),
        }

    def close(self) -> None:
        """Free every QNN context (the MNN modules go with the object); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for runner in self.plugins.values():
            runner.close()
        self.executor.close()

    def __enter__(self) -> HybridModel:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
