"""partition: the cut algorithm, the lowering's support table and small helpers (no MNN runs)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from mnnbuild_runtime import shape_index

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.cpu import BoundaryValue, CpuRuntime, to_numpy, var_format
from mnnbuild.cpu.segments import run_segmented
from mnnbuild.lowering.lower import constant_tensors
from mnnbuild.lowering.support import LOWERED_OP_TYPES, SupportCheck, unsupported_reason
from mnnbuild.mnn import MnnModel, Op, load_model, make_blob, schema
from mnnbuild.mnn.semantics import reads_content, shape_inputs
from mnnbuild.partition.cut import Cut, plan_cut, schedule_ops
from mnnbuild.partition.fold import compute_folded, folded_model
from mnnbuild.partition.rewrite import fuse_attributes
from mnnbuild.samples.inputs import make_inputs
from tests.conftest import FIXTURE_MODELS, PROJECT_ROOT, TINY_MODEL_DIR

MODEL_FILES = {
    "tiny-qwen3": TINY_MODEL_DIR / "llm.mnn",
    "qwen3-untied-int8-b32": FIXTURE_MODELS / "qwen3-untied-int8-b32" / "llm.mnn",
    "llama-int4-cw": FIXTURE_MODELS / "llama-int4-cw" / "llm.mnn",
}
LOGITS_SLICE = "/Slice_output_0"
ROTARY = "rotary phase"
"""Part of the reason the lowering gives for the ops that compute the rotary phase as a float."""
KV_ATTENTION = "kv_cache"
NO_CONVOLUTION = "subgraph without a Convolution stays on the CPU"


@pytest.fixture(scope="module")
def tiny() -> MnnModel:
    return load_model(TINY_MODEL_DIR / "llm.mnn")


def cut_of(model: MnnModel, **kw: object) -> Cut:
    return plan_cut(model, model.input_names, model.output_names, **kw)  # type: ignore[arg-type]


def everything_supported(op: Op, model: MnnModel, static: object) -> str | None:
    return None


def npu_runs(
    model: MnnModel, support: SupportCheck = unsupported_reason, skips: tuple[str, ...] = ()
) -> list[list[int]]:
    """The plugins the cut should find, computed without it: skip what the lowering's
    ``constant_tensors`` folds, break at every Attention, skipped or refused op, walk the ops in the
    cut's schedule (those breaks and the folded ops as early as their inputs allow) and keep the
    maximal runs in between that hold a Convolution."""
    const = constant_tensors(model)
    folded = {i for i, op in enumerate(model.ops) if op.type in ("Input", "Const", "TrainableParam")}
    folded |= {i for i, op in enumerate(model.ops) if set(op.outputs) <= const}
    breaks = {
        i
        for i, op in enumerate(model.ops)
        if i not in folded and (op.type == "Attention" or op.name in skips or support(op, model, const) is not None)
    }
    runs: list[list[int]] = [[]]
    for i in schedule_ops(model, folded | breaks):
        if i in folded:
            continue
        if i in breaks:
            runs.append([])
        else:
            runs[-1].append(i)
    return [r for r in runs if any(model.ops[i].type == "Convolution" for i in r)]


def input_only_ops(model: MnnModel) -> set[int]:
    """Ops whose inputs are all graph inputs, constants or outputs of such ops (the rotary phase)."""
    ready = set(model.input_indexes)
    ops: set[int] = set()
    for i, op in enumerate(model.ops):
        if all(t in ready for t in op.inputs if t >= 0):
            ops.add(i)
            ready.update(op.outputs)
    return ops


def rotary_ops(model: MnnModel) -> set[int]:
    """Ops the lowering itself refuses because they compute the rotary phase as a float."""
    const = constant_tensors(model)
    return {
        i
        for i, op in enumerate(model.ops)
        if op.outputs and not set(op.outputs) <= const and ROTARY in (unsupported_reason(op, model, const) or "")
    }


# ---- semantics -----------------------------------------------------------------------------------------


def test_content_and_shape_tables(tiny: MnnModel) -> None:
    shape_op = tiny.ops_of_type("Shape")[0]
    assert not reads_content(shape_op, 0)
    reshape = next(op for op in tiny.ops_of_type("Reshape") if len(op.inputs) == 2)
    assert reads_content(reshape, 0) and not reads_content(reshape, 1)
    assert shape_inputs(reshape) == (1,)
    slices = {len(op.inputs): op for op in tiny.ops_of_type("StridedSlice")}
    assert shape_inputs(slices[5]) == (1, 2, 3, 4)  # fromType 1 (ONNX Slice)
    assert shape_inputs(slices[4]) == (1, 2, 3)  # fromType 0, TF form
    gather = tiny.ops_of_type("GatherV2")[0]
    assert shape_inputs(gather) == (2,)
    assert shape_inputs(tiny.ops_of_type("Convolution")[0]) == ()
    unsq = {len(op.inputs): op for op in tiny.ops_of_type("Unsqueeze")}
    assert shape_inputs(unsq[2]) == (1,) and shape_inputs(unsq[1]) == ()


# ---- support table ---------------------------------------------------------------------------------------


def test_support_refusals(tiny: MnnModel) -> None:
    const = constant_tensors(tiny)

    def live(kind: str) -> Op:
        """A copy of the first op of ``kind`` whose output is not folded away as a constant."""
        return copy.deepcopy(next(op for op in tiny.ops_of_type(kind) if not set(op.outputs) <= const))

    conv = live("Convolution")
    assert unsupported_reason(conv, tiny) is None
    conv.main.common.kernelX = 3
    assert "only 1x1" in (unsupported_reason(conv, tiny) or "")
    binary = live("BinaryOp")
    binary.main.opType = schema.BinaryOpOperation.ATAN2
    assert "BinaryOp ATAN2 has no QNN lowering" in (unsupported_reason(binary, tiny) or "")
    unary = live("UnaryOp")
    unary.main.opType = schema.UnaryOpOperation.ERFINV
    assert "UnaryOp ERFINV" in (unsupported_reason(unary, tiny) or "")
    attention = tiny.ops_of_type("Attention")[0]
    assert unsupported_reason(attention, tiny) == "op kind Attention has no QNN lowering"
    cast = live("Cast")
    # the rotary phase stays on the CPU: fp16 on the HTP loses it at long positions
    assert "rotary phase" in (unsupported_reason(cast, tiny) or "")
    cast.main.dstT = schema.DataType.DT_BOOL
    assert "Cast to DT_BOOL" in (unsupported_reason(cast, tiny) or "")
    reshape = next(op for op in tiny.ops_of_type("Reshape") if len(op.inputs) == 2)
    assert "must be constant" in (unsupported_reason(reshape, tiny, static=set()) or "")
    assert unsupported_reason(reshape, tiny, static=set(reshape.inputs)) is None
    assert {"Convolution", "LayerNorm", "BinaryOp", "MatMul", "Softmax"} <= LOWERED_OP_TYPES
    assert "Attention" not in LOWERED_OP_TYPES


@pytest.mark.parametrize("path", list(MODEL_FILES.values()), ids=list(MODEL_FILES))
def test_cpu_ops_are_attention_rotary_phase_and_logits_slice(path: Path) -> None:
    model = load_model(path)
    cut = cut_of(model)
    reasons = cut.cpu_reasons
    names = model.tensor_names
    attention = [i for i, op in enumerate(model.ops) if op.type == "Attention"]
    assert attention and all(KV_ATTENTION in reasons[i] for i in attention)
    # the rotary phase stays on the CPU (fp16 loses it), every op of it with the lowering's reason
    rotary = rotary_ops(model)
    assert {"Cast", "UnaryOp"} <= {model.ops[i].type for i in rotary}
    assert {i for i, r in reasons.items() if ROTARY in r} == rotary
    logits_slice = model.ops.index(model.op_by_name(LOGITS_SLICE))
    assert "'logits_index'" in reasons[logits_slice]
    # anything else on the CPU is a leftover run without a Convolution, fed by the CPU side only
    # (keeping it there adds no NPU -> CPU transfer)
    made_on_npu = {t for m in cut.plugins for t in m.produced}
    others = set(reasons) - set(attention) - rotary - {logits_slice}
    for i in others:
        assert reasons[i] == NO_CONVOLUTION, (model.ops[i].name, reasons[i])
        assert not set(model.ops[i].inputs) & made_on_npu, model.ops[i].name
    # every op is folded, in exactly one plugin, or on the CPU with a reason
    in_plugins = [i for m in cut.plugins for i in m.ops]
    assert len(in_plugins) == len(set(in_plugins))
    assert sorted([*in_plugins, *reasons, *cut.folded_ops]) == cut.needed
    convolutions = {i for i, op in enumerate(model.ops) if op.type == "Convolution"}
    assert convolutions <= set(in_plugins)
    for m in cut.plugins:
        assert not {model.ops[i].type for i in m.ops} & {"Shape", "Rank", "Attention"}
    # one plugin per maximal NPU run, checked against a count made without the cut
    assert [m.ops for m in cut.plugins] == npu_runs(model)
    assert [m.graph for m in cut.plugins] == list(range(len(cut.plugins)))
    assert "logits" in [names[t] for t in cut.plugins[-1].outputs]


# ---- the cut -----------------------------------------------------------------------------------------


def test_schedule_runs_eager_ops_early_and_keeps_the_rest_in_order(tiny: MnnModel) -> None:
    const = constant_tensors(tiny)
    eager = {i for i, op in enumerate(tiny.ops) if set(op.outputs) <= const or op.type == "Attention"}
    eager |= rotary_ops(tiny)
    order = schedule_ops(tiny, eager)
    assert sorted(order) == list(range(len(tiny.ops)))
    made: set[int] = set()
    for i in order:  # topological
        assert all(t in made or t in tiny.input_indexes for t in tiny.ops[i].inputs if t >= 0), tiny.ops[i].name
        made.update(tiny.ops[i].outputs)
    others = [i for i in order if i not in eager]
    assert others == sorted(others)
    # an eager op comes right after the last producer of its inputs (or first, when it reads only inputs)
    position = {i: p for p, i in enumerate(order)}
    producer = {t: i for i, op in enumerate(tiny.ops) for t in op.outputs}
    for i in eager:
        deps = [position[producer[t]] for t in tiny.ops[i].inputs if t in producer]
        before = order[max(deps, default=-1) + 1 : position[i]]
        assert all(j in eager for j in before), tiny.ops[i].name
    cast = tiny.ops.index(next(op for op in tiny.ops_of_type("Cast") if not set(op.outputs) <= const))
    first_conv = tiny.ops.index(tiny.ops_of_type("Convolution")[0])
    assert first_conv < cast and position[cast] < position[first_conv]  # the rotary phase moved ahead
    assert schedule_ops(tiny, ()) == list(range(len(tiny.ops)))


def test_schedule_keeps_source_order_when_a_tensor_is_written_twice(tiny: MnnModel) -> None:
    model = copy.deepcopy(tiny)
    cast = next(op for op in model.ops if op.type == "Cast")
    late = next(op for op in reversed(model.ops) if op.type == "Reshape")
    late.outputs = [*late.outputs, cast.outputs[0]]
    assert schedule_ops(model, {model.ops.index(cast)}) == list(range(len(model.ops)))


@pytest.mark.parametrize("path", list(MODEL_FILES.values()), ids=list(MODEL_FILES))
def test_one_plugin_per_attention_boundary(path: Path) -> None:
    """Before, between and after the attentions, and the lm_head after the logits slice: the CPU ops that
    depend on graph inputs only (the rotary phase) run ahead and no longer split layer 0's plugin."""
    model = load_model(path)
    cut = cut_of(model)
    attention = {i for i, op in enumerate(model.ops) if op.type == "Attention"}
    assert len(cut.plugins) == len(attention) + 2
    assert cut.moved_ops > 0
    logits_slice = model.ops.index(model.op_by_name(LOGITS_SLICE))
    allowed = attention | {logits_slice} | input_only_ops(model)
    kinds = [m.kind for m in cut.modules]
    first, last = kinds.index("npu"), len(kinds) - 1 - kinds[::-1].index("npu")
    between = [i for m in cut.modules[first:last] if m.kind == "cpu" for i in m.ops]
    assert between and set(between) <= allowed, [model.ops[i].name for i in set(between) - allowed]
    # the modules follow the schedule
    in_modules = [i for m in cut.modules for i in m.ops]
    assert in_modules == [i for i in cut.order if i in set(in_modules)]
    assert [m.graph for m in cut.plugins] == list(range(len(cut.plugins)))


def test_upstream_rules_split_at_logits_slice(tiny: MnnModel) -> None:
    """With every op supported (upstream has no lowering table), the logits_index slice still leaves the
    NPU: its output shape follows logits_index's content (the second split)."""
    cut = cut_of(tiny, support=everything_supported)
    slice_module = next(m for m in cut.modules if tiny.ops[m.ops[0]].name == LOGITS_SLICE)
    assert slice_module.ops == [tiny.ops.index(tiny.op_by_name(LOGITS_SLICE))]
    assert slice_module.kind == "cpu" and not slice_module.is_break
    assert "content of input #1 'logits_index'" in slice_module.reason
    attention = [m for m in cut.modules if m.is_break]
    assert [tiny.ops[m.ops[0]].type for m in attention] == ["Attention"] * len(tiny.ops_of_type("Attention"))
    # upstream's structure: a plugin before, between and after the attentions, plus one after the slice
    assert len(cut.plugins) == len(attention) + 2


def test_boundaries_and_masks(tiny: MnnModel) -> None:
    cut = cut_of(tiny)
    names = tiny.tensor_names
    first, *_ = cut.plugins
    # the embeddings, and the rotary phase the CPU computed ahead of the first plugin
    rotary_made = {t for i in rotary_ops(tiny) for t in tiny.ops[i].outputs}
    assert [names[t] for t in first.inputs if t not in rotary_made] == ["input_ids"]
    assert {names[t] for t in first.inputs if t in rotary_made} == {"/rotary/Cos_output_0", "/rotary/Sin_output_0"}
    # position_ids feeds only the rotary phase, which stays on the CPU
    position_ids = tiny.tensor_index("position_ids")
    readers = [m for m in cut.modules if position_ids in m.inputs]
    assert readers and all(m.kind == "cpu" and ROTARY in m.reason for m in readers)
    for m in cut.modules:
        assert m.inputs == sorted(m.inputs) and m.outputs == sorted(m.outputs)
        assert not set(m.inputs) & cut.static
        if m.graph is not None:
            # mask 2 (made, not read inside) are outputs; mask 3 only when promoted or a graph output
            assert set(m.produced - m.consumed) <= set(m.outputs)
            assert all(t in m.produced for t in m.outputs)
    hidden = tiny.tensor_index("hidden_states")
    last = cut.plugins[-1]
    assert hidden in last.consumed and hidden in last.outputs  # mask 3, kept as a graph output
    # every folded tensor a plugin reads is in the frontier, with its value computed per shape
    assert {t for m in cut.plugins for t in m.consumed if t in cut.folded} <= set(cut.frontier)


def test_subgraph_without_convolution_stays_on_cpu(tiny: MnnModel) -> None:
    def no_layernorm(op: Op, model: MnnModel, static: object) -> str | None:
        return "refused" if op.type == "LayerNorm" else unsupported_reason(op, model, static)  # type: ignore[arg-type]

    cut = cut_of(tiny, support=no_layernorm)
    bare = [m for m in cut.modules if m.reason == "subgraph without a Convolution stays on the CPU"]
    assert bare, "the Reshape before the first LayerNorm forms a module without a Convolution"
    assert all(not any(tiny.ops[i].type == "Convolution" for i in m.ops) for m in bare)
    assert all(m.kind == "npu" for m in cut.modules if any(tiny.ops[i].type == "Convolution" for i in m.ops))


def test_max_kv_size_defers_to_the_lowering(tiny: MnnModel) -> None:
    cut = cut_of(tiny, max_kv_size=1024)
    reasons = {c.type: c.reason for c in cut.cpu_op_infos()}
    assert reasons["Attention"] == "QNN lowering: op kind Attention has no QNN lowering"


def test_ops_between_mask_and_cpu_attention_stay_on_cpu(tiny: MnnModel) -> None:
    model = copy.deepcopy(tiny)
    mask = model.tensor_index("attention_mask")
    scaled = model.add_tensor("scaled_mask")
    one = model.add_tensor("one")
    blob = make_blob([1], "DT_FLOAT")
    blob.float32s = np.array([1.0], dtype=np.float32)
    binary = schema.BinaryOpT()
    binary.opType = schema.BinaryOpOperation.MUL
    binary.T = schema.DataType.DT_FLOAT
    attention = next(i for i, op in enumerate(model.ops) if op.type == "Attention")
    model.add_op(Op(type="Const", name="one", outputs=[one], main=blob), attention)
    model.add_op(
        Op(type="BinaryOp", name="scale_mask", inputs=[mask, one], outputs=[scaled], main=binary), attention + 1
    )
    attn_op = model.ops[attention + 2]
    attn_op.inputs = [scaled if t == mask else t for t in attn_op.inputs]
    cut = cut_of(model)
    reasons = {c.name: c.reason for c in cut.cpu_op_infos()}
    assert reasons["scale_mask"] == "between attention_mask and an Attention that stays on the CPU"


def test_ops_out_of_order_are_rejected(tiny: MnnModel) -> None:
    model = copy.deepcopy(tiny)
    i = next(k for k, op in enumerate(model.ops) if op.type == "LayerNorm")
    model.ops[i - 1], model.ops[i] = model.ops[i], model.ops[i - 1]
    with pytest.raises(MNNFormatError, match="before any op makes it; expected ops in topological order"):
        cut_of(model)


def test_cpu_side_keeps_only_what_the_outputs_need(tiny: MnnModel) -> None:
    cut = cut_of(tiny)
    kept = {i for i in cut.cpu_ops if tiny.ops[i].type not in ("Input", "Const")}
    # exactly the ops that stay on the CPU for a reason: no folded shape arithmetic, no plugin op
    assert kept == set(cut.cpu_reasons)
    assert not {tiny.ops[i].type for i in kept} & {"Shape", "Rank", "Convolution"}
    assert {i for i, op in enumerate(tiny.ops) if op.type == "Input"} <= set(cut.cpu_ops)


# ---- helpers -------------------------------------------------------------------------------------------


def test_fuse_attributes() -> None:
    first = {
        "path": "qnn/graph0.bin",
        "inputs": ["t1"],
        "outputs": ["t2"],
        "allGraphName": ["graph0"],
        "allInputShape": [1, 4],
        "o_0_0": "blob0",
    }
    later = {
        "path": "qnn/graph0.bin",
        "inputs": ["t9"],
        "outputs": ["t9"],
        "allGraphName": ["graph1_0"],
        "allInputShape": [16, 4],
        "o_1_0": "blob1",
    }
    fused = fuse_attributes(first, later)
    assert fused == {
        "path": "qnn/graph0.bin",
        "inputs": ["t1"],
        "outputs": ["t2"],
        "allGraphName": ["graph0", "graph1_0"],
        "allInputShape": [1, 4, 16, 4],
        "o_0_0": "blob0",
        "o_1_0": "blob1",
    }
    assert first["allGraphName"] == ["graph0"]  # not mutated


def test_shape_index() -> None:
    all_shape = [1, 1, 1, 1, 64, 1, 16, 16, 1, 64]
    assert shape_index(all_shape, [[1, 1], [1, 1, 64]], 2) == 0
    assert shape_index(all_shape, [[1, 16], [16, 1, 64]], 2) == 1
    assert shape_index([], [[], []], 1) == 0
    assert shape_index(all_shape, [[1, 8], [8, 1, 64]], 2) is None
    assert shape_index(all_shape, [[1, 16], [16, 1, 64]], 1) is None  # one graph: only block 0 selectable


def test_folded_model_replaces_producers(tiny: MnnModel) -> None:
    cut = cut_of(tiny)
    t = cut.frontier[0]
    value = np.array([1, 1, 4, 32], dtype=np.int32)
    folded = folded_model(tiny, {t: value})
    producers = [op for op in folded.ops if t in op.outputs]
    assert len(producers) == 1 and producers[0].type == "Const"
    assert producers[0].main.int32s.tolist() == value.tolist()
    assert len(folded.ops) == len(tiny.ops)
    assert all(op.type != "Const" for op in tiny.ops if t in op.outputs)  # the source is left alone


def test_boundary_value_layouts() -> None:
    """A plugin output named NC4HW4 reaches CPU ops as an NC4HW4 Var, and a CPU Var reaches a plugin as a
    dense logical-NCHW array (6 channels and 2x2 pixels: the two layouts differ byte for byte)."""
    logical = np.arange(2 * 6 * 2 * 2, dtype=np.float32).reshape(2, 6, 2, 2)
    packed = BoundaryValue(array=logical, fmt="NC4HW4")
    var = packed.as_var()
    assert var_format(var) == "NC4HW4"
    raw = np.array(var.read()).reshape(-1)
    assert not np.array_equal(raw[: logical.size], logical.reshape(-1))  # really packed in blocks of 4
    np.testing.assert_array_equal(to_numpy(var), logical)
    back = BoundaryValue(var=var)
    assert back.fmt == "NC4HW4"
    np.testing.assert_array_equal(back.as_array(), logical)
    plain = BoundaryValue(array=logical)
    assert var_format(plain.as_var()) == "NCHW" and plain.as_array() is logical
    with pytest.raises(ValueError, match="exactly one"):
        BoundaryValue()


@pytest.mark.parametrize("seq_len", [1, 32])
def test_folded_values_need_no_layer_run(tmp_path: Path, seq_len: int) -> None:
    """A folded tensor reads the data only for its shape, so its value comes without running a layer: the graph
    file alone (no weight file beside it) gives every folded value, bit for bit what running the graph's ops on
    the CPU (weights and all) computes."""
    model = load_model(TINY_MODEL_DIR / "llm.mnn")
    cut = plan_cut(model, model.input_names, model.output_names)
    names = [model.tensor_names[t] for t in cut.frontier]
    assert len(names) > 5 and any("blocks.1" in n for n in names), "folded tensors in later layers too"
    alone = tmp_path / "llm.mnn"
    alone.write_bytes((TINY_MODEL_DIR / "llm.mnn").read_bytes())
    hidden = json.loads((TINY_MODEL_DIR / "llm_config.json").read_text())["hidden_size"]
    sample = make_inputs(seq_len, hidden, 0, model.input_dims)
    (got,) = compute_folded(alone, [sample], names)
    rt = CpuRuntime().create(TINY_MODEL_DIR / "llm.mnn.weight")
    (ran,) = run_segmented(TINY_MODEL_DIR / "llm.mnn", rt, model, [sample], names)
    for n in names:
        want = to_numpy(ran[n])
        assert got[n].dtype == want.dtype and np.array_equal(got[n].reshape(want.shape), want), n
    assert any(got[n].size > 1 for n in names)


def test_no_plugin_mixes_rows_the_logits_index_selects_with_rows_it_does_not() -> None:
    """The engine feeds the ops after the ``logits_index`` slice 1 row or all of them while the rest of a chunk keeps
    its length (an unpadded prefill chunk takes the last row only), and a plugin only runs the input shapes it was
    compiled for together. An Eagle3 target also outputs ``hidden_states`` (three tapped layers concatenated, every
    row): its Concat must not share the lm_head's plugin, or a full 128-token chunk finds no graph (MNN's engine:
    "onForward returned no outputs")."""
    model = load_model(PROJECT_ROOT / "models" / "tiny-qwen3-eagle" / "llm.mnn")
    cut = cut_of(model)
    index = {n: i for i, n in enumerate(model.tensor_names)}
    slice_op = next(i for i, op in enumerate(model.ops) if index[LOGITS_SLICE] in op.outputs)
    producer = {t: i for i, op in enumerate(model.ops) for t in op.outputs}

    def after_slice(i: int, seen: dict[int, bool]) -> bool:
        if i not in seen:
            seen[i] = i == slice_op or any(after_slice(producer[t], seen) for t in model.ops[i].inputs if t in producer)
        return seen[i]

    seen: dict[int, bool] = {}
    for plugin in cut.plugins:
        sides = {after_slice(i, seen) for i in plugin.ops}
        assert len(sides) == 1, f"plugin {plugin.graph} holds ops on both sides of the logits_index slice"
    concat = producer[index["hidden_states"]]
    assert concat not in {i for p in cut.plugins for i in p.ops}, "the hidden_states Concat stays on the CPU"
