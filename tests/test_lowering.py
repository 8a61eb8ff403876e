"""MNN -> QNN lowering: every lowering runs as a one-op graph in the x86 HTP simulator against MNN CPU.

Ops come from the shipped tiny Qwen3 where it has them (run as a sub-module between the op's input and
output tensors on the MNN CPU); the kinds it lacks come from one-op models written with ``MNN.expr``
(and patched with the format layer for kinds ``MNN.expr`` cannot write). Tolerance (issue 5): cosine
>= 0.999 and max abs error <= 2% of the reference's max abs.
"""

from __future__ import annotations

import json
import logging
import shutil
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.base.compare import Tolerance, compare
from mnnbuild.cpu import import_mnn
from mnnbuild.lowering.context import TensorMeta
from mnnbuild.lowering.graph import (
    GraphDescription,
    LoweringError,
    TensorKind,
    compose,
    compose_context,
    raw_file_name,
    read_graph_description,
    write_graph_dir,
)
from mnnbuild.lowering.lower import LoweredGraph, constant_tensors, lower_subgraph, unsupported_reason
from mnnbuild.lowering.ops import BINARY_QNN, REGISTRY, UNARY_QNN
from mnnbuild.mnn import MnnModel, enum_name, load_model, save_model, schema
from mnnbuild.qnn import ContextBuilder, HtpTarget, QnnLibrary, load_context, read_binary_info, same_element_order
from mnnbuild.samples.inputs import make_inputs
from tests.lowering_check import mnn_run, mnn_tensors, simulate

from .conftest import FIXTURE_MODELS, TINY_MODEL_DIR

log = logging.getLogger(__name__)

V79 = HtpTarget(69, 79)
MODEL_FILE = TINY_MODEL_DIR / "llm.mnn"
WEIGHT_FILE = TINY_MODEL_DIR / "llm.mnn.weight"
HIDDEN = 128
PREFILL = 4  # small prefill for the one-op tests: real shapes, fast simulator


@pytest.fixture(scope="module")
def lib() -> QnnLibrary:
    logging.getLogger("mnnbuild.qnn.lib").setLevel(logging.ERROR)  # the simulator's chatter
    return QnnLibrary()


@pytest.fixture(scope="module")
def tiny() -> MnnModel:
    return load_model(MODEL_FILE)


def _tiny_info(model: MnnModel, seq: int) -> dict[int, TensorMeta]:
    return mnn_tensors(model, MODEL_FILE, WEIGHT_FILE, make_inputs(seq, HIDDEN, seed=0))


@pytest.fixture(scope="module")
def tiny_info(tiny: MnnModel) -> dict[int, TensorMeta]:
    return _tiny_info(tiny, PREFILL)


LOWERING_TOLERANCE = Tolerance(abs_floor=0.0)
"""cosine >= 0.999 and max abs error <= 2% of the reference's max abs, no absolute slack."""


def assert_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    check = compare(what, got, ref, LOWERING_TOLERANCE)
    log.info("%s", check.describe())
    assert check.passed, check.describe()


def op_boundary(model: MnnModel, op_indexes: Sequence[int]) -> tuple[list[int], list[int]]:
    """Non-constant tensors a set of ops reads from outside / writes for outside (or the model's outputs)."""
    const = constant_tensors(model)
    inside = set(op_indexes)
    produced = {t for i in op_indexes for t in model.ops[i].outputs}
    inputs: list[int] = []
    for i in op_indexes:
        for t in model.ops[i].inputs:
            if t not in produced and t not in const and t not in inputs:
                inputs.append(t)
    consumers = model.consumers()
    outputs = [
        t
        for i in op_indexes
        for t in model.ops[i].outputs
        if t not in const
        and (any(c not in inside for c in consumers.get(t, [])) or model.tensor_names[t] in model.output_names)
    ]
    return inputs, outputs


def check_one_op(
    lib: QnnLibrary,
    model: MnnModel,
    model_file: Path,
    weight_file: Path | None,
    info: dict[int, TensorMeta],
    op_index: int,
) -> LoweredGraph:
    """Lower op ``op_index`` alone, run it in the simulator and on MNN CPU (as a sub-module), compare."""
    op = model.ops[op_index]
    const = constant_tensors(model)
    inputs = list(dict.fromkeys(t for t in op.inputs if t not in const))
    outputs = list(op.outputs)
    assert unsupported_reason(op, model, precision=False) is None
    lowered = lower_subgraph(model, weight_file, [op_index], info, inputs, outputs)
    # MNN runs the op alone: every input fed, constant ones (shapes, axes) too
    feed = {model.tensor_names[t]: info[t].value for t in dict.fromkeys(op.inputs)}
    ref = mnn_run(model_file, weight_file, feed, [model.tensor_names[t] for t in outputs])
    got = simulate(lib, lowered, {f"t{t}": info[t].value for t in inputs})
    for t in outputs:
        out = got[f"t{t}"]
        expected = ref[model.tensor_names[t]]
        # MNN gives a sub-module fed a scalar index a [1] index (one more output dim): same values
        # a boundary [N, C, 1, 1] is declared [1, 1, N, C]: the same elements in the same order
        assert same_element_order(out.shape, info[t].shape) and expected.size == out.size
        assert_close(out, expected, f"{op.type} {op.name!r} [{', '.join(n.type for n in lowered.description.nodes)}]")
    return lowered


# -- one-op graphs from the tiny Qwen3 --------------------------------------------------------------

TINY_OPS = {
    "Convolution-q_proj": "/layers.0/self_attn/q_proj/Linear",
    "Convolution-k_proj": "/layers.0/self_attn/k_proj/Linear",
    "Convolution-down_proj": "/layers.0/mlp/down_proj/Linear",
    "Convolution-lm_head": "/lm/lm_head/Linear",
    "LayerNorm-rms-3d": "/blocks.0/input_layernorm/Mul_1_output_0",
    "LayerNorm-rms-qnorm-4d": "/blocks.0/self_attn/q_norm/Mul_1_output_0",
    "BinaryOp-ADD": "/blocks.0/Add_output_0",
    "BinaryOp-MUL-broadcast": "/blocks.0/self_attn/Mul_output_0",
    "BinaryOp-MUL-const": "/rotary/Mul_output_0",
    "BinaryOp-MUL_SILU": "/blocks.0/mlp/Mul_output_0",
    "UnaryOp-NEG": "/blocks.0/self_attn/Neg_output_0",
    "UnaryOp-SIN-rotary": "/rotary/Sin_output_0",  # lowerable; the partition keeps it on the CPU
    "UnaryOp-COS-rotary": "/rotary/Cos_output_0",
    "Reshape": "/blocks.0/self_attn/Reshape_output_0",
    "Unsqueeze": "/rotary/Unsqueeze_output_0",
    "ConvertTensor-to-NC4HW4": "/layers.0/self_attn/q_proj/Linear/pre_convert",
    "ConvertTensor-to-NCHW": "/layers.0/self_attn/q_proj/Linear/post_convert",
    "Concat": "/rotary/Concat_1_output_0",
    "Concat-rotate-half": "/blocks.0/self_attn/Concat_3_output_0",
    "StridedSlice-onnx": "/blocks.0/self_attn/Slice_1_output_0",
    "StridedSlice-onnx-head": "/blocks.0/self_attn/Slice_output_0",
    "GatherV2-scalar-index": "/blocks.0/self_attn/Gather_2_output_0",
    "Cast-int-to-float": "/rotary/Cast_output_0",
}


@pytest.mark.parametrize("op_name", list(TINY_OPS.values()), ids=list(TINY_OPS))
def test_tiny_op_in_simulator(lib: QnnLibrary, tiny: MnnModel, tiny_info: dict[int, TensorMeta], op_name: str) -> None:
    index = next(i for i, op in enumerate(tiny.ops) if op.name == op_name)
    check_one_op(lib, tiny, MODEL_FILE, WEIGHT_FILE, tiny_info, index)


def test_conv_weights_are_named_from_the_op(tiny: MnnModel, tiny_info: dict[int, TensorMeta]) -> None:
    index = next(i for i, op in enumerate(tiny.ops) if op.name == "/layers.0/self_attn/q_proj/Linear")
    lowered = lower_subgraph(
        tiny, WEIGHT_FILE, [index], tiny_info, [tiny.ops[index].inputs[0]], tiny.ops[index].outputs
    )
    statics = {t.name: t for t in lowered.description.static_tensors}
    assert set(statics) == {"/layers.0/self_attn/q_proj/Linear.weight", "/layers.0/self_attn/q_proj/Linear.bias"}
    assert statics["/layers.0/self_attn/q_proj/Linear.weight"].dims == [1, 1, HIDDEN, HIDDEN]  # HWIO
    assert statics["/layers.0/self_attn/q_proj/Linear.weight"].raw == raw_file_name(
        "/layers.0/self_attn/q_proj/Linear.weight"
    )
    assert [t.name for t in lowered.description.tensors if t.kind == TensorKind.APP_WRITE] == [
        f"t{tiny.ops[index].inputs[0]}"
    ]


# -- one-op graphs from MNN.expr models --------------------------------------------------------------


@dataclass(frozen=True)
class ExprCase:
    build: Callable[..., object]
    shapes: tuple[tuple[int, ...], ...]
    patch: Callable[[MnnModel], None] | None = None
    data: str = "normal"
    """``normal``; ``positive``: in [0.5, 2] (sqrt, log, pow); ``fractional``: k + [0.2, 0.8] and, for a
    second input, 1 or 2, so that fp16 rounding cannot move floor/ceil across an integer."""


def _set_unary(kind: str) -> Callable[[MnnModel], None]:
    def patch(model: MnnModel) -> None:
        model.op_by_name("y").main.opType = getattr(schema.UnaryOpOperation, kind)

    return patch


def _set_binary(kind: str) -> Callable[[MnnModel], None]:
    def patch(model: MnnModel) -> None:
        model.op_by_name("y").main.opType = getattr(schema.BinaryOpOperation, kind)

    return patch


def _to_permute(model: MnnModel) -> None:
    op = model.op_by_name("y")
    param = schema.PermuteT()
    param.dims = np.asarray([0, 2, 3, 1], dtype=np.int32)
    op.type, op.main, op.inputs = "Permute", param, op.inputs[:1]


def _unary_case(kind: str) -> ExprCase:
    F = import_mnn().expr
    data = "positive" if kind in ("SQRT", "RSQRT", "LOG", "RECIPROCAL") else "normal"
    if kind in ("FLOOR", "CEIL"):
        data = "fractional"
    return ExprCase(F.exp, ((2, 3, 16),), _set_unary(kind), data)


def _binary_case(kind: str) -> ExprCase:
    F = import_mnn().expr
    data = {"POW": "positive", "FLOORDIV": "fractional"}.get(kind, "normal")
    # MNN's CPU MUL_SILU crashes on broadcast inputs; LLM graphs only use it on equal shapes
    shapes = ((2, 3, 16), (2, 3, 16)) if kind == "MUL_SILU" else ((2, 3, 16), (3, 16))
    return ExprCase(F.subtract, shapes, _set_binary(kind), data)


def _expr_cases() -> dict[str, ExprCase]:
    F = import_mnn().expr
    cases = {
        "Softmax-last": ExprCase(lambda x: F.softmax(x, -1), ((2, 4, 32),)),
        "Softmax-axis1": ExprCase(lambda x: F.softmax(x, 1), ((2, 8, 16),)),
        "MatMul-2d-transB": ExprCase(lambda a, b: F.matmul(a, b, False, True), ((4, 32), (24, 32))),
        "MatMul-3d": ExprCase(lambda a, b: F.matmul(a, b, False, False), ((2, 4, 32), (2, 32, 8))),
        "MatMul-transA": ExprCase(lambda a, b: F.matmul(a, b, True, False), ((32, 4), (32, 8))),
        "Transpose": ExprCase(lambda x: F.transpose(x, [0, 2, 1, 3]), ((1, 4, 2, 32),)),
        "Permute": ExprCase(lambda x: F.transpose(x, [0, 2, 3, 1]), ((1, 4, 2, 8),), _to_permute),
        "Squeeze": ExprCase(lambda x: F.squeeze(x, [1]), ((4, 1, 32),)),
        "Slice-split": ExprCase(lambda x: F.split(x, [3, 9], 1), ((2, 12, 16),)),
        "Concat-3-inputs": ExprCase(lambda a, b, c: F.concat([a, b, c], -1), ((2, 4, 8), (2, 4, 16), (2, 4, 8))),
    }
    cases.update({f"UnaryOp-{k}": _unary_case(k) for k in sorted(UNARY_QNN) if k != "NEG"})
    cases.update({f"BinaryOp-{k}": _binary_case(k) for k in sorted(BINARY_QNN) if k not in ("ADD", "MUL")})
    return cases


EXPR_CASES = _expr_cases()


def _expr_model(directory: Path, name: str, case: ExprCase) -> tuple[Path, dict[str, np.ndarray]]:
    F = import_mnn().expr
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    feed: dict[str, np.ndarray] = {}
    xs = []
    for k, shape in enumerate(case.shapes):
        x = F.placeholder(list(shape), F.NCHW, F.float)
        x.name = f"x{k}"
        xs.append(x)
        if case.data == "positive":
            data = rng.uniform(0.5, 2.0, shape)
        elif case.data == "fractional":
            data = rng.integers(-4, 4, shape) + rng.uniform(0.2, 0.8, shape) if k == 0 else rng.integers(1, 3, shape)
        else:
            data = rng.standard_normal(shape)
        feed[x.name] = data.astype(np.float32)
    built = case.build(*xs)
    ys = list(built) if isinstance(built, (list, tuple)) else [built]
    for k, y in enumerate(ys):
        y.name = "y" if k == 0 else f"y{k}"  # the op is named after its first output
    path = directory / f"{name}.mnn"
    F.save(ys, str(path))
    if case.patch is not None:
        model = load_model(path)
        case.patch(model)
        save_model(model, path)
    return path, feed


@pytest.mark.parametrize("case_name", list(EXPR_CASES))
def test_expr_op_in_simulator(lib: QnnLibrary, tmp_path: Path, case_name: str) -> None:
    path, feed = _expr_model(tmp_path, case_name, EXPR_CASES[case_name])
    model = load_model(path)
    info = mnn_tensors(model, path, None, feed)
    index = next(i for i, op in enumerate(model.ops) if op.name == "y")
    check_one_op(lib, model, path, None, info, index)


def _standard_layer_norm(model: MnnModel) -> None:
    model.op_by_name("/blocks.0/input_layernorm/Mul_1_output_0").main.useRmsnorm = False


def _two_axis_layer_norm(model: MnnModel) -> None:
    p = model.op_by_name("/blocks.0/input_layernorm/Mul_1_output_0").main
    p.axis, p.external, p.useRmsnorm = np.asarray([-2, -1], np.int32), None, False


@pytest.mark.parametrize("patch", [_standard_layer_norm, _two_axis_layer_norm], ids=["standard", "two-axes"])
def test_layer_norm_variants_in_simulator(lib: QnnLibrary, tmp_path: Path, patch: Callable[[MnnModel], None]) -> None:
    """LayerNorm with mean and beta (gamma/beta from the weight file), and over the last two axes."""
    model = load_model(MODEL_FILE)
    patch(model)
    model_file = tmp_path / "llm.mnn"
    save_model(model, model_file)
    shutil.copyfile(WEIGHT_FILE, tmp_path / "llm.mnn.weight")
    info = mnn_tensors(model, model_file, tmp_path / "llm.mnn.weight", make_inputs(PREFILL, HIDDEN, seed=0))
    index = next(i for i, op in enumerate(model.ops) if op.name == "/blocks.0/input_layernorm/Mul_1_output_0")
    lowered = check_one_op(lib, model, model_file, tmp_path / "llm.mnn.weight", info, index)
    assert [n.type for n in lowered.description.nodes] == ["Reshape", "LayerNorm", "Reshape"]


def test_every_registered_kind_has_a_simulator_test(tiny: MnnModel) -> None:
    tested = {name.split("-")[0] for name in (*TINY_OPS, *EXPR_CASES)}
    # Const only lowers when a folded constant is a graph output (covered by the subgraph tests)
    assert set(REGISTRY) - tested <= {"Const", "ExpandDims", "Flatten"}, set(REGISTRY) - tested
    kinds = {name.split("-")[1] for name in (*TINY_OPS, *EXPR_CASES) if name.startswith(("UnaryOp", "BinaryOp"))}
    assert set(UNARY_QNN) | set(BINARY_QNN) <= kinds


# -- a whole decoder layer ---------------------------------------------------------------------------


def _layer_ops(model: MnnModel) -> list[int]:
    """The ops strictly between the first two Attention ops: o_proj, MLP, next layer up to its attention."""
    attn = [i for i, op in enumerate(model.ops) if op.type == "Attention"]
    return list(range(attn[0] + 1, attn[1]))


@pytest.mark.parametrize("seq", [1, 32], ids=["decode", "prefill32"])
def test_decoder_layer_subgraph_in_simulator(lib: QnnLibrary, tiny: MnnModel, tmp_path: Path, seq: int) -> None:
    ops = _layer_ops(tiny)
    inputs, outputs = op_boundary(tiny, ops)
    info = _tiny_info(tiny, seq)
    lowered = lower_subgraph(tiny, WEIGHT_FILE, ops, info, inputs, outputs)
    desc = lowered.description
    assert desc.inputs == [f"t{t}" for t in inputs] and desc.outputs == [f"t{t}" for t in outputs]
    assert {n.type for n in desc.nodes} >= {"Conv2d", "RmsNorm", "StridedSlice", "Concat", "ElementWiseMultiply"}
    # Through the files the modellib stage writes: graph.json + one .raw per static tensor.
    lowered.write(tmp_path / "graph0")
    assert read_graph_description(tmp_path / "graph0") == desc
    assert sorted(p.name for p in (tmp_path / "graph0").glob("*.raw")) == sorted(
        str(t.raw) for t in desc.static_tensors
    )
    with ContextBuilder(lib, V79) as ctx:
        compose(read_graph_description(tmp_path / "graph0"), tmp_path / "graph0", ctx.add_graph("graph0"))
        binary = ctx.serialize()
    g = read_binary_info(lib, binary).graph("graph0")
    for got_t, t in [*zip(g.inputs, inputs, strict=True), *zip(g.outputs, outputs, strict=True)]:
        assert got_t.name == f"t{t}" and same_element_order(got_t.dims, info[t].shape), (got_t.dims, info[t].shape)
    # Reference: MNN CPU running exactly this sub-graph between the boundary tensors.
    feed = {tiny.tensor_names[t]: info[t].value for t in inputs}
    ref = mnn_run(MODEL_FILE, WEIGHT_FILE, feed, [tiny.tensor_names[t] for t in outputs])
    with load_context(lib, binary) as runner:
        got = runner.execute("graph0", {f"t{t}": info[t].value for t in inputs})
    for t in outputs:
        assert_close(got[f"t{t}"], ref[tiny.tensor_names[t]], f"layer output {tiny.tensor_names[t]!r} seq {seq}")


@pytest.mark.parametrize("model_dir", ["qwen3-untied-int8-b32", "llama-int4-cw"])
def test_held_out_models_layer_in_simulator(lib: QnnLibrary, model_dir: str) -> None:
    """Block-wise int8 (Qwen3, untied) and channel-wise int4 (Llama) weights lower and match too."""
    directory = FIXTURE_MODELS / model_dir
    model_file, weight_file = directory / "llm.mnn", directory / "llm.mnn.weight"
    model = load_model(model_file)
    hidden = json.loads((directory / "llm_config.json").read_text())["hidden_size"]
    ops = _layer_ops(model)
    inputs, outputs = op_boundary(model, ops)
    info = mnn_tensors(model, model_file, weight_file, make_inputs(2, hidden, seed=1))
    lowered = lower_subgraph(model, weight_file, ops, info, inputs, outputs)
    got = simulate(lib, lowered, {f"t{t}": info[t].value for t in inputs})
    for t in outputs:
        assert_close(got[f"t{t}"], info[t].value, f"{model_dir} layer output {model.tensor_names[t]!r}")


def test_lowering_is_deterministic(tiny: MnnModel) -> None:
    ops = _layer_ops(tiny)
    inputs, outputs = op_boundary(tiny, ops)
    info = _tiny_info(tiny, 2)
    first = lower_subgraph(tiny, WEIGHT_FILE, ops, info, inputs, outputs)
    second = lower_subgraph(tiny, WEIGHT_FILE, ops, _tiny_info(tiny, 2), inputs, outputs)
    assert first.description.model_dump_json() == second.description.model_dump_json()
    assert all(np.array_equal(first.statics[n], second.statics[n]) for n in first.statics)


def test_a_plugins_graphs_decode_its_weights_once(tiny: MnnModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """modellib passes one ``conv_weights`` dict to a plugin's graphs: the prefill graph takes the decode graph's
    decoded weights (no second int4 decode) and lowers to exactly what it would alone."""
    import mnnbuild.lowering.ops as lowering_ops

    ops = _layer_ops(tiny)
    inputs, outputs = op_boundary(tiny, ops)
    alone = lower_subgraph(tiny, WEIGHT_FILE, ops, _tiny_info(tiny, 8), inputs, outputs)
    decoded: list[str] = []
    real = lowering_ops.htp_conv_weights
    monkeypatch.setattr(lowering_ops, "htp_conv_weights", lambda op, w: decoded.append(op.name) or real(op, w))
    shared: dict = {}
    lower_subgraph(tiny, WEIGHT_FILE, ops, _tiny_info(tiny, 1), inputs, outputs, shared)
    first = list(decoded)
    prefill = lower_subgraph(tiny, WEIGHT_FILE, ops, _tiny_info(tiny, 8), inputs, outputs, shared)
    assert len(first) == 7 and decoded == first and set(shared) == set(first)
    assert prefill.description.model_dump_json() == alone.description.model_dump_json()
    assert all(np.array_equal(prefill.statics[n], alone.statics[n]) for n in alone.statics)


def test_decode_and_prefill_name_shared_weights_alike(lib: QnnLibrary, tiny: MnnModel) -> None:
    ops = _layer_ops(tiny)
    inputs, outputs = op_boundary(tiny, ops)
    decode = lower_subgraph(tiny, WEIGHT_FILE, ops, _tiny_info(tiny, 1), inputs, outputs)
    prefill = lower_subgraph(tiny, WEIGHT_FILE, ops, _tiny_info(tiny, 8), inputs, outputs)
    weights = {n for n in decode.statics if n.endswith((".weight", ".bias", ".gamma", ".beta"))}
    assert weights and weights == {n for n in prefill.statics if n.endswith((".weight", ".bias", ".gamma", ".beta"))}
    assert len([n for n in weights if n.endswith(".weight")]) == 7  # o, gate, up, down; next layer's q, k, v
    # One name never holds two values across the graphs of a plugin (what weight sharing relies on),
    # and node names with tensor params (which QNN turns into statics) differ when the params do.
    for name in set(decode.statics) & set(prefill.statics):
        assert np.array_equal(decode.statics[name], prefill.statics[name]), name
    params = {}
    for lowered in (decode, prefill):
        for node in lowered.description.nodes:
            for p in node.params:
                if p.kind == "tensor":
                    key = f"{node.name}__{p.name}"
                    assert params.setdefault(key, p.values) == p.values, key
    # Both graphs in one weight-shared context: built, and the weights are stored once.
    graphs = {"graph0": (decode.description, decode.statics), "graph1_0": (prefill.description, prefill.statics)}
    shared = compose_context(lib, V79, graphs, weight_sharing=True)
    info = read_binary_info(lib, shared)
    assert info.graph_names == ["graph0", "graph1_0"] and info.weight_shared
    alone = compose_context(lib, V79, {"graph1_0": graphs["graph1_0"]}, weight_sharing=False)
    assert len(shared) <= 1.2 * len(alone) or len(shared) - len(alone) < 64 * 1024, (len(shared), len(alone))


# -- support questions -------------------------------------------------------------------------------


ROTARY_PHASE = ("/rotary/Cast_output_0", "/rotary/Mul_output_0", "/rotary/Sin_output_0", "/rotary/Cos_output_0")


def test_unsupported_reason(tiny: MnnModel) -> None:
    by_name = {op.name: op for op in tiny.ops}
    attention = next(op for op in tiny.ops if op.type == "Attention")
    assert "Attention" in str(unsupported_reason(attention, tiny))
    # The final slice reads logits_index at run time: not a constant range.
    reason = unsupported_reason(by_name["/Slice_output_0"], tiny)
    assert reason is not None and "must be constant" in reason
    for name in TINY_OPS.values():
        assert unsupported_reason(by_name[name], tiny, precision=False) is None, name
        assert (unsupported_reason(by_name[name], tiny) is None) != (name in ROTARY_PHASE), name
    # The rotary phase of position_ids (cast, scaled, sin/cos) would be lost in fp16 at long positions.
    for name in (*ROTARY_PHASE, "/rotary/Reshape_output_0"):
        reason = unsupported_reason(by_name[name], tiny)
        assert reason is not None and "position_ids" in reason and "fp16" in reason
    # Shape arithmetic folds away.
    shape_op = next(op for op in tiny.ops if op.type == "Shape")
    assert unsupported_reason(shape_op, tiny) is None
    const = constant_tensors(tiny)
    assert all(t in const for op in tiny.ops if op.type in ("Shape", "Rank", "Const") for t in op.outputs)
    assert not any(t in const for op in tiny.ops if op.type in ("Convolution", "LayerNorm") for t in op.outputs)


def test_rotary_in_fp16_loses_the_phase_at_long_positions(lib: QnnLibrary, tiny: MnnModel) -> None:
    """Why the rotary sin/cos stay on the CPU: fine at the io sample's positions, wrong at 4000."""
    names = ["/rotary/Cast_output_0", "/rotary/Reshape_output_0", "/rotary/Mul_output_0", "/rotary/Cos_output_0"]
    ops = [i for i, op in enumerate(tiny.ops) if op.name in names]
    position_ids = tiny.tensor_index("position_ids")
    cos = tiny.op_by_name("/rotary/Cos_output_0").outputs[0]
    results = {}
    for start in (0, 4000):
        feed = make_inputs(1, HIDDEN, seed=0)
        feed["position_ids"] = feed["position_ids"] + start
        info = mnn_tensors(tiny, MODEL_FILE, WEIGHT_FILE, feed)
        lowered = lower_subgraph(tiny, WEIGHT_FILE, ops, info, [position_ids], [cos])
        got = simulate(lib, lowered, {f"t{position_ids}": feed["position_ids"]})
        results[start] = compare("cos", got[f"t{cos}"], info[cos].value, LOWERING_TOLERANCE)
    assert results[0].passed and not results[4000].passed, results


def test_unsupported_op_in_a_subgraph_is_a_clear_error(tiny: MnnModel, tiny_info: dict[int, TensorMeta]) -> None:
    attn = next(i for i, op in enumerate(tiny.ops) if op.type == "Attention")
    op = tiny.ops[attn]
    with pytest.raises(LoweringError, match="FusedAttention.*Attention has no QNN lowering"):
        lower_subgraph(tiny, WEIGHT_FILE, [attn], tiny_info, [t for t in op.inputs], op.outputs)


def test_description_rejects_inconsistent_graphs() -> None:
    with pytest.raises(ValueError, match="not an APP_WRITE"):
        GraphDescription(inputs=["x"], outputs=[], tensors=[], nodes=[])
    with pytest.raises(ValueError, match="raw file"):
        GraphDescription.model_validate(
            {"inputs": [], "outputs": [], "nodes": [], "tensors": [{"name": "w", "kind": "STATIC", "dims": [1]}]}
        )


def test_binary_and_unary_kind_names_exist_in_the_schema() -> None:
    for kind in BINARY_QNN:
        assert enum_name(schema.BinaryOpOperation, getattr(schema.BinaryOpOperation, kind)) == kind
    for kind in UNARY_QNN:
        assert enum_name(schema.UnaryOpOperation, getattr(schema.UnaryOpOperation, kind)) == kind


def test_shared_weights_link_without_reading_back(
    tiny: MnnModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill graph's weight that is the decode graph's very array is linked without reading the decode raw
    back (an lm_head raw is over 600 MB); any other equal raw is still compared byte for byte before linking."""
    import mnnbuild.lowering.graph as graph_module

    ops = _layer_ops(tiny)
    inputs, outputs = op_boundary(tiny, ops)
    shared: dict = {}
    decode = lower_subgraph(tiny, WEIGHT_FILE, ops, _tiny_info(tiny, 1), inputs, outputs, shared)
    prefill = lower_subgraph(tiny, WEIGHT_FILE, ops, _tiny_info(tiny, 8), inputs, outputs, shared)
    write_graph_dir(tmp_path / "decode", decode.description, decode.statics)
    compared: list[int] = []
    real = graph_module._same_bytes
    monkeypatch.setattr(graph_module, "_same_bytes", lambda path, arr: compared.append(arr.nbytes) or real(path, arr))
    changed = dict(prefill.statics)
    bias = next(n for n in changed if n.endswith(".bias"))
    changed[bias] = changed[bias] + 1.0  # same size, other bytes: compared, then written
    write_graph_dir(
        tmp_path / "prefill", prefill.description, changed, link_from=tmp_path / "decode", linked_statics=decode.statics
    )
    raws = {t.name: t.raw for t in prefill.description.static_tensors}
    weights = [n for n in raws if n.endswith(".weight")]
    assert len(weights) == 7
    for name in weights:
        assert (tmp_path / "prefill" / str(raws[name])).stat().st_nlink == 2, name
    assert (tmp_path / "prefill" / str(raws[bias])).stat().st_nlink == 1
    # only small tensors were read back: never a weight
    assert compared and max(compared) < min(prefill.statics[n].nbytes for n in weights)
