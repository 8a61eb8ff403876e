"""partition: the cut algorithm, the lowering's support table and small helpers (no MNN runs)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.errors import StageError
from mnnbuild.lowering.lower import constant_tensors
from mnnbuild.lowering.support import LOWERED_OP_TYPES, unsupported_reason
from mnnbuild.mnn import MnnModel, Op, load_model, make_blob, schema
from mnnbuild.partition.cut import Cut, plan_cut
from mnnbuild.partition.execute import shape_index
from mnnbuild.partition.fold import folded_model
from mnnbuild.partition.rewrite import fuse_attributes
from mnnbuild.partition.semantics import reads_content, shape_inputs
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR

MODEL_FILES = {
    "tiny-qwen3": TINY_MODEL_DIR / "llm.mnn",
    "qwen3-untied-int8-b32": FIXTURE_MODELS / "qwen3-untied-int8-b32" / "llm.mnn",
    "llama-int4-cw": FIXTURE_MODELS / "llama-int4-cw" / "llm.mnn",
}
LOGITS_SLICE = "/Slice_output_0"


@pytest.fixture(scope="module")
def tiny() -> MnnModel:
    return load_model(TINY_MODEL_DIR / "llm.mnn")


def cut_of(model: MnnModel, **kw: object) -> Cut:
    return plan_cut(model, model.input_names, model.output_names, **kw)  # type: ignore[arg-type]


def everything_supported(op: Op, model: MnnModel, static: object) -> str | None:
    return None


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
def test_every_llm_op_but_attention_and_logits_slice_is_lowered(path: Path) -> None:
    model = load_model(path)
    cut = cut_of(model)
    reasons = {(c.type, c.name): c.reason for c in cut.cpu_op_infos()}
    assert {t for t, _ in reasons} == {"Attention", "StridedSlice"}
    assert [n for t, n in reasons if t == "StridedSlice"] == [LOGITS_SLICE]
    # the shape arithmetic never reaches the lowering: it is folded
    for m in cut.plugins:
        assert not {model.ops[i].type for i in m.ops} & {"Shape", "Rank"}


# ---- the cut -----------------------------------------------------------------------------------------


def test_upstream_rules_split_at_logits_slice(tiny: MnnModel) -> None:
    """With every op supported (upstream has no lowering table), the logits_index slice still leaves the
    NPU: its output shape follows logits_index's content (the second split)."""
    cut = cut_of(tiny, support=everything_supported)
    slice_module = next(m for m in cut.modules if tiny.ops[m.ops[0]].name == LOGITS_SLICE)
    assert slice_module.ops == [tiny.ops.index(tiny.op_by_name(LOGITS_SLICE))]
    assert slice_module.kind == "cpu" and not slice_module.is_break
    assert "content of input #1 'logits_index'" in slice_module.reason
    assert len(cut.plugins) == 4
    attention = [m for m in cut.modules if m.is_break]
    assert [tiny.ops[m.ops[0]].type for m in attention] == ["Attention", "Attention"]


def test_boundaries_and_masks(tiny: MnnModel) -> None:
    cut = cut_of(tiny)
    names = tiny.tensor_names
    first, *_ = cut.plugins
    assert [names[t] for t in first.inputs] == ["position_ids", "input_ids"]  # sorted by tensor index
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
    with pytest.raises(StageError, match="before any op makes it; expected ops in topological order"):
        cut_of(model)


def test_cpu_side_keeps_only_what_the_outputs_need(tiny: MnnModel) -> None:
    cut = cut_of(tiny)
    kept = {tiny.ops[i].type for i in cut.cpu_ops}
    assert kept == {"Input", "Const", "Attention", "StridedSlice"}
    assert not kept & {"Shape", "Rank", "Convolution"}


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
    assert shape_index(all_shape, [[1, 1], [1, 1, 64]]) == 0
    assert shape_index(all_shape, [[1, 16], [16, 1, 64]]) == 1
    assert shape_index([], [[], []]) == 0
    with pytest.raises(StageError, match="match no block of allInputShape"):
        shape_index(all_shape, [[1, 8], [8, 1, 64]])


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
