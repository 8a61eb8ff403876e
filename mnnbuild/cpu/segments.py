"""Run a whole MNN graph on the CPU in segments of bounded weight, so memory follows a segment, not the model.

PyPI MNN decodes every quantized convolution of a loaded module to fp32: a Qwen3-1.7B-shaped ``llm.mnn``
(int4) takes several times its size on disk once loaded whole. Loading only the ops between named tensors
(``load_module(path, rt, inputs, outputs)``, as the partition's subgraph runs do) keeps just those
weights. The graph's ops are split in source order into segments whose fp32 parameters stay under a
budget; each segment is loaded once, runs every sample, and is freed before the next loads. The tensors
that cross a cut (the hidden state, the mask and rotary tables, ...) are carried between segments in the
memory layout MNN gave them, so every op computes what it would in the whole graph.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.cpu import NCHW, BoundaryValue, forward_vars, load_module, return_freed_memory, to_numpy, var_format
from mnnbuild.mnn import MnnModel
from mnnbuild.mnn.semantics import CONST_OP_TYPES, needed_ops
from mnnbuild.mnn.summary import op_parameter_count

log = logging.getLogger(__name__)

SEGMENT_BYTES = 1 << 30
"""fp32 parameter bytes a segment may hold (a few Qwen3-1.7B layers; its lm_head alone is over it)."""


@dataclass(frozen=True)
class Segment:
    ops: list[int]
    inputs: list[int]
    """Tensors it is fed: graph inputs and earlier segments' outputs (Const tensors load with it)."""
    outputs: list[int]
    """Tensors later segments read, and the requested outputs it makes."""


def plan_segments(
    model: MnnModel, inputs: Sequence[int], outputs: Sequence[int], budget: int = SEGMENT_BYTES
) -> list[Segment]:
    """Split the ops computing ``outputs`` from ``inputs`` (source order) where the next op would take a
    segment's fp32 parameters (its own and the Const tensors it reads) over ``budget``. An op heavier than the
    budget gets a segment of its own."""
    ops = needed_ops(model, inputs, outputs)
    const_made = {t for op in model.ops if op.type in CONST_OP_TYPES for t in op.outputs}
    const_bytes = {t: 4 * op_parameter_count(op) for op in model.ops if op.type in CONST_OP_TYPES for t in op.outputs}
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in ops:
        op = model.ops[i]
        cost = 4 * op_parameter_count(op) + sum(const_bytes.get(t, 0) for t in op.inputs)
        if current and used + cost > budget:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += cost
    if current:
        groups.append(current)

    made_in = {t: g for g, group in enumerate(groups) for i in group for t in model.ops[i].outputs}
    wanted = set(outputs)
    segments = []
    for g, group in enumerate(groups):
        read = {t for i in group for t in model.ops[i].inputs if t >= 0 and t not in const_made}
        fed = sorted(t for t in read if made_in.get(t, -1) != g)
        later = {t for h in groups[g + 1 :] for i in h for t in model.ops[i].inputs if made_in.get(t, -1) == g}
        made = [t for i in group for t in model.ops[i].outputs]
        outs = sorted({t for t in made if t in later or t in wanted})
        if outs:  # a group whose results nobody reads (a dead end) is not run
            segments.append(Segment(ops=group, inputs=fed, outputs=outs))
    return segments


def run_segmented(
    model_path: Path,
    rt: Any,
    model: MnnModel,
    samples: Sequence[Mapping[str, np.ndarray]],
    output_names: Sequence[str],
    budget: int = SEGMENT_BYTES,
    label: str = "",
    segments: Sequence[Segment] | None = None,
) -> list[dict[str, Any]]:
    """The named outputs of the graph for each sample (graph input name -> array), as MNN Vars, computed
    segment by segment; with one segment this is one module over the whole graph. ``segments``: the
    `plan_segments` of these inputs, outputs and budget, made once by a caller that runs the graph again and
    again (a generation loop's forwards), instead of planned again for every call."""
    results = dict(
        iter_segmented(
            model_path, rt, model, len(samples), samples.__getitem__, output_names, budget, label, segments=segments
        )
    )
    return [results[i] for i in range(len(samples))]


def iter_segmented(
    model_path: Path,
    rt: Any,
    model: MnnModel,
    count: int,
    sample: Callable[[int], Mapping[str, np.ndarray]],
    output_names: Sequence[str],
    budget: int = SEGMENT_BYTES,
    label: str = "",
    spill_dir: Path | None = None,
    on_run: Callable[[int, int], None] | None = None,
    segments: Sequence[Segment] | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """:func:`run_segmented` for ``count`` samples made one at a time by ``sample(i)``, each sample's outputs
    yielded (``(i, outputs)``) as soon as its last segment ran, so a caller that writes and drops them holds one
    sample's arrays at a time: with one segment, ``sample(i + 1)`` is made only after sample ``i`` was yielded.
    With several, what crosses a cut is kept for every sample until the next segment reads it: in ``spill_dir``
    (memory-mapped ``.npy`` files, removed as they are used) when given, else in memory. ``on_run(done, total)``:
    told after each run of a segment on a sample (a caller's progress display). ``segments``: as for
    :func:`run_segmented`."""
    if count == 0:
        return
    first = sample(0)
    input_names = list(first)
    input_idx = [model.tensor_index(n) for n in input_names]
    out_idx = [model.tensor_index(n) for n in output_names]
    if segments is None:
        segments = plan_segments(model, input_idx, out_idx, budget)
    names = model.tensor_names
    envs: list[dict[int, BoundaryValue]] = [{} for _ in range(count)]
    made: list[dict[str, Any]] = [{} for _ in range(count)]
    """Requested outputs a segment before the last made, until the sample's last segment ran."""
    still_read = [{t for seg in segments[k + 1 :] for t in seg.inputs} for k in range(len(segments))]
    log.debug("%s: %d segment(s) of at most %d MB", label or model_path.name, len(segments), budget >> 20)
    for k, seg in enumerate(segments):
        started = time.perf_counter()
        last = k == len(segments) - 1
        module = load_module(model_path, rt, [names[t] for t in seg.inputs], [names[t] for t in seg.outputs])
        if module is None:
            raise MNNFormatError(f"{model_path}: MNN could not load the ops {names[seg.inputs[0]]!r} ... onwards")
        for i, env in enumerate(envs):
            if k == 0:
                feed = first if i == 0 else sample(i)
                env.update(
                    {model.tensor_index(n): BoundaryValue(array=np.asarray(a), fmt=NCHW) for n, a in feed.items()}
                )
                del feed
            out_vars = forward_vars(module, [env[t].as_var() for t in seg.inputs])
            if len(out_vars) != len(seg.outputs):  # MNN failed inside forward (it prints why)
                feeds = [env[t].as_var() for t in seg.inputs]
                culprit = failing_op(model_path, rt, model, seg.inputs, seg.outputs, feeds)
                raise MNNFormatError(
                    f"{model_path}: MNN computed {len(out_vars)} of the {len(seg.outputs)} outputs of segment {k}"
                    + (f": MNN's CPU cannot run {culprit}, so this model cannot be built" if culprit else "")
                )
            if on_run is not None:
                on_run(k * count + i + 1, len(segments) * count)
            for t, var in zip(seg.outputs, out_vars, strict=True):
                if t in out_idx:
                    made[i][names[t]] = var
                if t in still_read[k]:
                    env[t] = _kept(to_numpy(var), var_format(var), spill_dir, f"{i}-{t}")
            for t in [t for t in env if t not in still_read[k]]:
                del env[t]  # nothing after this segment reads it
            if k == 0:
                first = {}  # sample 0's arrays live on in its env only as long as a segment reads them
                if spill_dir is not None:  # and graph inputs that later segments read (the mask) go to disk too
                    for t in [t for t in input_idx if t in env]:
                        env[t] = _kept(env[t].as_array(), NCHW, spill_dir, f"{i}-{t}")
            if last:
                envs[i], res, made[i] = {}, made[i], {}
                yield i, res
        del module
        return_freed_memory()  # the segment's decoded weights, before the next segment decodes its own
        if len(segments) > 1:
            log.debug(
                "%s: segment %d/%d in %.1f s",
                label or model_path.name,
                k + 1,
                len(segments),
                time.perf_counter() - started,
            )


def _kept(array: np.ndarray, fmt: str, spill_dir: Path | None, name: str) -> BoundaryValue:
    """A value a later segment reads: in memory, or written to ``spill_dir`` and mapped back (the page cache, not
    this process, then holds it between segments)."""
    if spill_dir is None:
        return BoundaryValue(array=array, fmt=fmt)
    path = Path(spill_dir) / f"{name}.npy"
    np.save(path, array, allow_pickle=False)
    mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    path.unlink()  # the mapping keeps the data until it is dropped
    return BoundaryValue(array=mapped, fmt=fmt)


def describe_op(model: MnnModel, i: int) -> str:
    """``op #i 'name' (Type)``, with a custom op's own type name (``Extra 'FusedFoo'``)."""
    op = model.ops[i]
    kind = op.type
    custom = getattr(op.main, "type", None) if op.param_type == "Extra" else None
    if custom:
        kind += f" {custom.decode() if isinstance(custom, bytes) else custom!r}"
    return f"op #{i} {op.name!r} ({kind})"


def failing_op(
    model_path: Path, rt: Any, model: MnnModel, inputs: Sequence[int], outputs: Sequence[int], feeds: Sequence[Any]
) -> str | None:
    """The first op (source order) MNN cannot compute between ``inputs`` and ``outputs``, found by bisecting on the
    prefix of ops a module computes (a module with an op MNN cannot run computes nothing); None if not found."""
    ops = [i for i in needed_ops(model, inputs, outputs) if model.ops[i].type not in CONST_OP_TYPES]
    names = model.tensor_names

    def runs(n: int) -> bool:  # can MNN compute every output of ops[:n]?
        wanted = [t for i in ops[:n] for t in model.ops[i].outputs]
        module = load_module(model_path, rt, [names[t] for t in inputs], [names[t] for t in wanted])
        return module is not None and len(forward_vars(module, list(feeds))) == len(wanted)

    lo, hi = 0, len(ops)  # ops[:lo] run; ops[:hi] do not
    if not ops or runs(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if runs(mid):
            lo = mid
        else:
            hi = mid
    return describe_op(model, ops[hi - 1])
