"""The cut: which ops of an MNN graph go into which QNN subgraph, and each subgraph's boundary.

Pure graph logic on the source model (no MNN runtime, no files), in the order upstream
``compilefornpu`` applies its rules:

1. *needed ops*: walk back from the graph outputs to the graph inputs; everything else is dead.
2. *folding*: an op whose inputs are all constant, or read only for their shape (``Shape``,
   ``Rank``, the target shape of ``Reshape`` ...), yields per-shape constants. Folded ops join no
   subgraph; their values are computed for each sample shape and become static tensors there.
3. *break ops*: control flow, ops named in ``skips``, Attention with a KV cache (unless KV goes to
   the NPU), ops between ``attention_mask`` and such an Attention, and every op the QNN lowering
   refuses. Each becomes a one-op CPU module; runs of other ops between them form candidates.
4. *schedule*: the runs are taken in a re-ordered, still topological op order (``schedule_ops``):
   every op that stays on the CPU anyway (break ops, the second split's ops below, folded and
   Const ops) runs as soon as its inputs are ready, all other ops keep their source order. A CPU
   op that depends only on graph inputs (the rotary phase from ``position_ids``) thus runs before
   the first NPU op instead of splitting a run in two just because of where the exporter put it;
   in the source order it sits between layer 0's q_proj and k_proj.
5. *second split*: inside a candidate, an op whose output shape depends on the content of a
   non-constant input becomes a module of its own (a fixed-shape NPU graph cannot hold it); the ops
   downstream of such an op are kept apart from the ops that are not (their row counts vary
   independently: after the ``logits_index`` slice the engine feeds 1 row or all of them, while the
   rest of the chunk keeps its length, and a plugin only runs input shapes it was compiled for
   together); and a candidate is split before a Convolution that would take its weights past
   ``max_plugin_parameters`` (what QNN holds while it serializes a context grows with them).
6. *boundaries* from tensor masks (1 consumed, 2 produced, 3 both): inputs are consumed
   non-static tensors made elsewhere, outputs are produced tensors nobody inside reads, plus graph
   outputs; a tensor internal to an earlier module that a later one reads is promoted to an output.
7. candidates without a ``Convolution`` stay on the CPU; the rest become NPU plugins ``0..n-1``,
   numbered in schedule order.
8. what the rewritten graph still runs on the CPU is found by walking back from the outputs over
   CPU ops and plugins; a plugin-internal tensor a CPU op reads is promoted as well.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.lowering.support import SupportCheck, unsupported_reason
from mnnbuild.mnn import MnnModel, Op
from mnnbuild.mnn.semantics import CONST_OP_TYPES, SOURCE_OP_TYPES, needed_ops, reads_content, shape_inputs
from mnnbuild.mnn.split import conv_parameters

log = logging.getLogger(__name__)

CONTROL_FLOW_TYPES = frozenset({"If", "Where", "Segment", "Unique", "NonMaxSuppressionV2"})
ATTENTION_TYPES = frozenset({"Attention", "LinearAttention"})
MASK_INPUT_MARK = "attention_mask"
CONVOLUTION = "Convolution"

ModuleKind = Literal["npu", "cpu"]


@dataclass
class Module:
    """A run of ops that executes as one unit: a QNN plugin (``npu``) or ops left on the CPU."""

    ops: list[int]
    """Source op indexes, in schedule order (``Cut.order``)."""
    is_break: bool = False
    """A single break op (never merged with neighbours)."""
    reason: str = ""
    """Why the module is on the CPU (empty for NPU modules)."""
    inputs: list[int] = field(default_factory=list)
    """Non-static tensors it reads and does not make, sorted by index."""
    outputs: list[int] = field(default_factory=list)
    """Tensors it makes that others (or the graph outputs) need, sorted by index."""
    produced: set[int] = field(default_factory=set)
    consumed: set[int] = field(default_factory=set)
    graph: int | None = None
    """Plugin number ``k`` (``qnn/graphllm<k>``) of an NPU module."""

    @property
    def kind(self) -> ModuleKind:
        return "npu" if self.graph is not None else "cpu"

    @property
    def internal(self) -> set[int]:
        """Tensors made and read inside (mask 3) that are not outputs."""
        return (self.produced & self.consumed) - set(self.outputs)

    def promote(self, tensor: int) -> None:
        if tensor not in self.outputs:
            self.outputs = sorted([*self.outputs, tensor])


@dataclass
class CpuOpInfo:
    """An op that stays on the CPU, and why (for the report)."""

    index: int
    name: str
    type: str
    reason: str


@dataclass
class Cut:
    """The result of ``plan_cut``: everything later steps need, in source tensor/op indexes."""

    model: MnnModel
    inputs: list[int]
    """Graph input tensors (from the sample's input names)."""
    outputs: list[int]
    """Graph output tensors (from the sample's output names)."""
    needed: list[int]
    """Ops on a path from the inputs to the outputs (Input/Const excluded), in source order."""
    order: list[int]
    """Every source op once, in the schedule the modules were cut from (``schedule_ops``)."""
    constants: set[int]
    """Outputs of Const/TrainableParam ops."""
    folded: set[int]
    """Tensors constant for a given input shape (outputs of folded ops)."""
    folded_ops: list[int]
    frontier: list[int]
    """Folded tensors read by non-folded needed ops: the values computed per shape."""
    modules: list[Module]
    cpu_ops: list[int]
    """Source ops the rewritten graph keeps (Input ops, CPU modules, folded chains CPU ops read)."""
    cpu_reasons: dict[int, str]
    """Source op index -> why it stays on the CPU, for every needed, non-folded op outside plugins."""

    @property
    def static(self) -> set[int]:
        return self.constants | self.folded

    @property
    def moved_ops(self) -> int:
        """Needed, non-folded ops the schedule runs ahead of an op that precedes them in the source."""
        computed = set(self.needed) - set(self.folded_ops)
        compute = [i for i in self.order if i in computed]
        moved = 0
        later_min = len(self.model.ops)
        for i in reversed(compute):
            if i > later_min:
                moved += 1
            later_min = min(later_min, i)
        return moved

    @property
    def plugins(self) -> list[Module]:
        return [m for m in self.modules if m.graph is not None]

    def cpu_op_infos(self) -> list[CpuOpInfo]:
        ops = self.model.ops
        return [CpuOpInfo(i, ops[i].name, ops[i].type, r) for i, r in sorted(self.cpu_reasons.items())]


def fold_ops(model: MnnModel, needed: Sequence[int], constants: Collection[int]) -> tuple[list[int], set[int]]:
    """Needed ops whose outputs are fixed once input shapes are: every input is constant (or
    folded) or read for its shape only. Returns the ops and their output tensors."""
    static = set(constants)
    folded_ops: list[int] = []
    folded: set[int] = set()
    for i in needed:
        op = model.ops[i]
        if not op.outputs:
            continue
        if all(t in static or not reads_content(op, pos) for pos, t in enumerate(op.inputs)):
            folded_ops.append(i)
            static.update(op.outputs)
            folded.update(op.outputs)
    return folded_ops, folded


def schedule_ops(model: MnnModel, eager: Collection[int]) -> list[int]:
    """A topological order of all ops of ``model`` (which must be in topological order) in which
    every op of ``eager`` runs as soon as its inputs are made, and the other ops keep their source
    order among themselves.

    List scheduling: of the ready ops, the lowest-index eager one goes first; only when no eager op
    is ready does the lowest-index other op go. As the source order is topological, an eager op is
    never held back by an other op that is not yet due, so the others come out exactly in source
    order. A tensor written by two ops would make re-ordering unsafe (a reader could move past the
    second write); then the source order is returned unchanged.

    Running CPU ops early is a heuristic, not an optimum: two CPU ops reading tensors made at
    different points of one NPU run split it where the source order might have kept them together.
    """
    n = len(model.ops)
    producer: dict[int, int] = {}
    for i, op in enumerate(model.ops):
        for t in op.outputs:
            if producer.setdefault(t, i) != i:
                log.debug("tensor %r is written twice: keeping the source op order", model.tensor_names[t])
                return list(range(n))
    users: dict[int, list[int]] = {}
    pending = [0] * n
    for i, op in enumerate(model.ops):
        # a producer after the reader is not its source (graph inputs written by the caller)
        deps = {producer[t] for t in op.inputs if t >= 0 and producer.get(t, n) < i}
        pending[i] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(i)
    eager_set = set(eager)
    ready_eager = [i for i in range(n) if pending[i] == 0 and i in eager_set]
    ready_other = [i for i in range(n) if pending[i] == 0 and i not in eager_set]
    heapq.heapify(ready_eager)
    heapq.heapify(ready_other)
    order: list[int] = []
    while ready_eager or ready_other:
        i = heapq.heappop(ready_eager if ready_eager else ready_other)
        order.append(i)
        for u in users.get(i, ()):
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready_eager if u in eager_set else ready_other, u)
    assert len(order) == n, "dependencies point only backwards, so every op becomes ready"
    return order


def _is_kv_attention(op: Op) -> bool:
    if op.type == "LinearAttention":
        return True
    return op.type == "Attention" and op.main is not None and bool(getattr(op.main, "kvCache", False))


def _mask_to_attention_ops(
    model: MnnModel, needed: Sequence[int], inputs: Collection[int], cpu_attention: Collection[int]
) -> set[int]:
    """Ops on a path from an ``attention_mask`` input to an Attention that stays on the CPU: they
    would otherwise form a tiny NPU graph whose only job is feeding the CPU attention."""
    masks = {t for t in inputs if MASK_INPUT_MARK in model.tensor_names[t]}
    if not masks:
        return set()
    dependent = set(masks)
    changed = True
    while changed:
        changed = False
        for i in needed:
            op = model.ops[i]
            if op.type in ATTENTION_TYPES or not op.inputs:
                continue
            if any(t in dependent for t in op.inputs):
                new = set(op.outputs) - dependent
                if new:
                    dependent |= new
                    changed = True
    producer = {t: i for i in needed for t in model.ops[i].outputs}
    extra: set[int] = set()
    for i in cpu_attention:
        todo = [t for t in model.ops[i].inputs if t in dependent and t not in masks]
        seen: set[int] = set()
        while todo:
            t = todo.pop()
            if t in seen or t in masks:
                continue
            seen.add(t)
            p = producer.get(t)
            if p is None or model.ops[p].type in CONST_OP_TYPES:
                continue
            extra.add(p)
            todo.extend(u for u in model.ops[p].inputs if u in dependent)
    return extra


def _break_reason(
    op: Op,
    model: MnnModel,
    static: Collection[int],
    skips: Collection[str],
    max_kv_size: int,
    support: SupportCheck,
) -> str | None:
    if op.type in CONTROL_FLOW_TYPES or (op.type == "While" and op.param_type == "WhileParam"):
        return f"control flow / data-dependent op {op.type}"
    if op.name in skips:
        return "named in skips"
    if max_kv_size <= 0 and _is_kv_attention(op):
        return f"{op.type} with kv_cache (max_kv_size 0 keeps the KV cache on the CPU)"
    reason = support(op, model, static)
    if reason is not None:
        return f"QNN lowering: {reason}"
    return None


def _dynamic_shape_inputs(op: Op, static: Collection[int]) -> list[int]:
    """Input positions whose non-constant content decides ``op``'s output shape."""
    return [k for k in shape_inputs(op) if op.inputs[k] not in static]


def _shape_split(model: MnnModel, group: list[int], static: Collection[int]) -> list[Module]:
    """Split one candidate at each op whose output shape depends on a non-constant input's content."""
    result: list[Module] = []
    start = 0
    for pos, i in enumerate(group):
        op = model.ops[i]
        dynamic = _dynamic_shape_inputs(op, static)
        if not dynamic:
            continue
        if pos > start:
            result.append(Module(ops=group[start:pos]))
        k = dynamic[0]
        result.append(
            Module(
                ops=[i],
                reason=f"output shape depends on the content of input #{k} "
                f"{model.tensor_names[op.inputs[k]]!r}, which is not constant",
            )
        )
        start = pos + 1
    if start < len(group):
        result.append(Module(ops=group[start:]))
    return result


def _boundaries(model: MnnModel, modules: list[Module], inputs: set[int], outputs: set[int], static: set[int]) -> None:
    for m in modules:
        for i in m.ops:
            op = model.ops[i]
            m.consumed.update(t for t in op.inputs if t >= 0)
            m.produced.update(op.outputs)
        if m.is_break:
            m.inputs = sorted(m.consumed - static)
            m.outputs = sorted(m.produced)
        else:
            m.inputs = sorted((m.consumed - m.produced) - static)
            m.outputs = sorted((m.produced - m.consumed) | (m.produced & m.consumed & outputs))
    for pos, m in enumerate(modules):
        for t in m.inputs:
            if t in inputs:
                continue
            if any(t in earlier.outputs for earlier in modules[:pos]):
                continue
            owner = next((e for e in modules[:pos] if not e.is_break and t in e.produced), None)
            if owner is None:
                raise MNNFormatError(
                    f"partition: tensor {t} {model.tensor_names[t]!r} read by op "
                    f"{model.ops[m.ops[0]].name!r} is neither a graph input nor made by an earlier op; "
                    "expected a source model whose ops are in topological order"
                )
            owner.promote(t)


def _check_order(model: MnnModel, needed: Sequence[int]) -> None:
    made: set[int] = {t for op in model.ops if op.type in SOURCE_OP_TYPES for t in op.outputs}
    for i in needed:
        op = model.ops[i]
        late = [t for t in op.inputs if t >= 0 and t not in made]
        if late:
            raise MNNFormatError(
                f"{model.path or 'model'}: op #{i} {op.name!r} reads tensor {model.tensor_names[late[0]]!r} "
                "before any op makes it; expected ops in topological order"
            )
        made.update(op.outputs)


def _cpu_side(model: MnnModel, cut_modules: list[Module], outputs: Iterable[int]) -> list[int]:
    """Ops the rewritten graph runs on the CPU: walk back from the outputs over CPU ops and plugins,
    promoting plugin-internal tensors that a CPU op reads."""
    plugin_of = {i: m for m in cut_modules if m.graph is not None for i in m.ops}
    plugin_made = {t: m for m in cut_modules if m.graph is not None for t in m.produced}
    producers: dict[int, list[int]] = {}
    for i, op in enumerate(model.ops):
        if i not in plugin_of:
            for t in op.outputs:
                producers.setdefault(t, []).append(i)
    kept: set[int] = set()
    done_plugins: set[int] = set()
    seen: set[int] = set()
    todo = list(outputs)
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        plugin = plugin_made.get(t)
        if plugin is not None:
            plugin.promote(t)
            if id(plugin) not in done_plugins:
                done_plugins.add(id(plugin))
                todo.extend(plugin.inputs)
            continue
        for i in producers.get(t, ()):
            if i not in kept:
                kept.add(i)
                todo.extend(u for u in model.ops[i].inputs if u >= 0)
    kept.update(i for i, op in enumerate(model.ops) if op.type == "Input")
    return sorted(kept)


def _break_reasons(
    model: MnnModel,
    needed: list[int],
    compute: list[int],
    inputs: list[int],
    static: set[int],
    folded_ops: set[int],
    skips: Collection[str],
    max_kv_size: int,
    support: SupportCheck,
) -> dict[int, str]:
    """Why each op that must stay on the CPU does (op index -> reason): its own break reason, or that it lies
    between ``attention_mask`` and an Attention kept on the CPU."""
    reasons: dict[int, str] = {}
    for i in compute:
        reason = _break_reason(model.ops[i], model, static, skips, max_kv_size, support)
        if reason is not None:
            reasons[i] = reason
    attention_on_cpu = [i for i in reasons if model.ops[i].type in ATTENTION_TYPES]
    for i in sorted(_mask_to_attention_ops(model, needed, inputs, attention_on_cpu)):
        if i not in folded_ops and i not in reasons:
            reasons[i] = "between attention_mask and an Attention that stays on the CPU"
    return reasons


def _weight_split(model: MnnModel, m: Module, max_parameters: int) -> list[Module]:
    """Split one candidate before each Convolution that would take its weights past ``max_parameters`` (a
    Convolution bigger than that alone gets a module of its own; the partition splits those first)."""
    if max_parameters <= 0 or m.reason:
        return [m]
    result: list[Module] = []
    start, held = 0, 0
    for pos, i in enumerate(m.ops):
        size = conv_parameters(model.ops[i])
        if size and held and held + size > max_parameters:
            result.append(Module(ops=m.ops[start:pos]))
            start, held = pos, 0
        held += size
    result.append(Module(ops=m.ops[start:]))
    return result


def _split_into_modules(
    model: MnnModel, compute: list[int], reasons: dict[int, str], static: set[int], max_parameters: int
) -> list[Module]:
    """The scheduled compute ops as modules: each break op alone, the runs between them split where a shape
    cannot be fixed and where a module would hold more than ``max_parameters`` weights (0: no limit)."""
    candidates: list[Module] = []
    group: list[int] = []
    for i in compute:
        if i in reasons:
            if group:
                candidates.append(Module(ops=group))
                group = []
            candidates.append(Module(ops=[i], is_break=True, reason=reasons[i]))
        else:
            group.append(i)
    if group:
        candidates.append(Module(ops=group))
    regimes = _shape_regimes(model, compute, static)
    modules: list[Module] = []
    for m in candidates:
        if m.is_break:
            modules.append(m)
            continue
        for piece in _shape_split(model, m.ops, static):
            for part in _regime_split(piece, regimes):
                modules.extend(_weight_split(model, part, max_parameters))
    return modules


def _shape_regimes(model: MnnModel, compute: Sequence[int], static: Collection[int]) -> dict[int, frozenset[int]]:
    """Per op of ``compute`` (in topological order), the content-dependent-shape ops it depends on: ops with the
    same set have row counts that vary together from one forward to the next."""
    producer = {t: i for i in compute for t in model.ops[i].outputs}
    regimes: dict[int, frozenset[int]] = {}
    for i in compute:
        regime: set[int] = set()
        for t in model.ops[i].inputs:
            j = producer.get(t)
            if j is None or j not in regimes:
                continue
            regime |= regimes[j]
            if _dynamic_shape_inputs(model.ops[j], static):
                regime.add(j)
        regimes[i] = frozenset(regime)
    return regimes


def _regime_split(piece: Module, regimes: Mapping[int, frozenset[int]]) -> list[Module]:
    """``piece`` as one module per shape regime (a piece with one regime comes back as it is). An op depends only
    on ops whose regime is a subset of its own, so smaller regimes first keeps the modules in dependency order."""
    if piece.reason or len({regimes.get(i, frozenset()) for i in piece.ops}) < 2:
        return [piece]
    parts: dict[frozenset[int], list[int]] = {}
    for i in piece.ops:
        parts.setdefault(regimes.get(i, frozenset()), []).append(i)
    ordered = sorted(parts.items(), key=lambda kv: (len(kv[0]), piece.ops.index(kv[1][0])))
    return [Module(ops=ops) for _, ops in ordered]


def _number_plugins(model: MnnModel, modules: list[Module]) -> None:
    """Give each NPU module its plugin number, in order; a run without a Convolution stays on the CPU."""
    k = 0
    for m in modules:
        if m.is_break or m.reason:
            continue
        if not any(model.ops[i].type == CONVOLUTION for i in m.ops):
            m.reason = "subgraph without a Convolution stays on the CPU"
            continue
        m.graph = k
        k += 1


def plan_cut(
    model: MnnModel,
    input_names: Sequence[str],
    output_names: Sequence[str],
    *,
    skips: Collection[str] = (),
    max_kv_size: int = 0,
    max_plugin_parameters: int = 0,
    cpu_ops: Mapping[str, str] | None = None,
    support: SupportCheck = unsupported_reason,
) -> Cut:
    """Partition ``model`` between the named graph inputs and outputs (see the module doc). A plugin holds at most
    ``max_plugin_parameters`` convolution weights unless one conv alone has more (0: no limit); ``cpu_ops`` names
    further ops that stay on the CPU, with the reason the report gives."""
    index = {n: i for i, n in enumerate(model.tensor_names)}
    inputs = [index[n] for n in input_names]
    outputs = [index[n] for n in output_names]
    constants = {t for op in model.ops if op.type in CONST_OP_TYPES for t in op.outputs}
    needed = needed_ops(model, inputs, outputs)
    _check_order(model, needed)
    folded_ops, folded = fold_ops(model, needed, constants)
    static = constants | folded
    folded_set = set(folded_ops)
    compute = [i for i in needed if i not in folded_set]

    reasons = _break_reasons(model, needed, compute, inputs, static, folded_set, skips, max_kv_size, support)
    named = dict(cpu_ops or {})
    reasons.update({i: named[model.ops[i].name] for i in compute if model.ops[i].name in named})

    # everything that cannot join an NPU run goes as early as it can, so it does not split a run
    # merely by where the exporter placed it
    eager = {i for i, op in enumerate(model.ops) if op.type in SOURCE_OP_TYPES}
    eager |= folded_set | set(reasons)
    eager |= {i for i in compute if _dynamic_shape_inputs(model.ops[i], static)}
    order = schedule_ops(model, eager)
    compute_set = set(compute)
    compute = [i for i in order if i in compute_set]

    modules = _split_into_modules(model, compute, reasons, static, max_plugin_parameters)
    _boundaries(model, modules, set(inputs), set(outputs), static)
    _number_plugins(model, modules)

    cpu_ops = _cpu_side(model, modules, outputs)
    for m in modules:
        if m.graph is None:
            for i in m.ops:
                reasons.setdefault(i, m.reason)
    frontier_set = {t for i in compute for t in model.ops[i].inputs if t in folded} | (set(outputs) & folded)
    cut = Cut(
        model=model,
        inputs=inputs,
        outputs=outputs,
        needed=needed,
        order=order,
        constants=constants,
        folded=folded,
        folded_ops=folded_ops,
        frontier=sorted(frontier_set),
        modules=modules,
        cpu_ops=cpu_ops,
        cpu_reasons={i: r for i, r in reasons.items() if i in set(cpu_ops)},
    )
    log.debug(
        "cut: %d needed ops, %d folded, %d moved by the schedule, %d modules, %d NPU plugins, %d ops on the CPU",
        len(needed),
        len(folded_ops),
        cut.moved_ops,
        len(modules),
        len(cut.plugins),
        len(cut.cpu_reasons),
    )
    return cut
