"""mnnbuild.mnn object model: load/save round trips checked by MNN itself, mutations, Plugin ops, errors."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import MNN
import MNN.expr as F
import numpy as np
import pytest

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.mnn import (
    MnnModel,
    Op,
    enum_name,
    get_field,
    load_model,
    make_blob,
    make_plugin_op,
    parse_model,
    plugin_attributes,
    read_embeddings,
    save_model,
    schema,
    serialize_model,
)

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIRS = {
    "tiny-qwen3": ROOT / "models" / "tiny-qwen3",
    "qwen3-untied-int8-b32": ROOT / "tests" / "fixtures" / "models" / "qwen3-untied-int8-b32",
    "llama-int4-cw": ROOT / "tests" / "fixtures" / "models" / "llama-int4-cw",
}
model_dirs = pytest.mark.parametrize("model_dir", list(MODEL_DIRS.values()), ids=list(MODEL_DIRS))


# ---- helpers (shared with the other test_mnn_* modules) --------------------------------------------


def make_io_inputs(model_dir: Path, seq: int) -> list[np.ndarray]:
    """LLM inputs as the io stage defines them: embeddings [seq,1,hidden], causal float mask with the
    lowest float above the diagonal, position ids [1,seq], logits index [1]."""
    emb = read_embeddings(model_dir, (np.arange(seq) * 37 + 11) % 1000)
    mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, dtype=np.float32), 1)
    return [
        emb.reshape(seq, 1, -1),
        mask.reshape(1, 1, seq, seq),
        np.arange(seq, dtype=np.int32).reshape(1, seq),
        np.array([seq - 1], dtype=np.int32),
    ]


def _var(a: np.ndarray) -> F.Var:
    dtype = F.int if a.dtype == np.int32 else F.float
    return F.const(a, list(a.shape), F.NCHW, dtype)


def run_module(
    mnn_path: Path, weight_path: Path, inputs: list[str], outputs: list[str], values: list[np.ndarray]
) -> list[np.ndarray]:
    """Run the sub-graph of ``mnn_path`` between tensor names ``inputs`` and ``outputs`` on MNN's CPU."""
    rt = MNN.nn.create_runtime_manager(({"backend": 0, "precision": "high", "numThread": 1},))
    rt.set_external(str(weight_path))
    module = MNN.nn.load_module_from_file(str(mnn_path), inputs, outputs, runtime_manager=rt)
    result = module.forward([_var(v) for v in values])
    result = result if isinstance(result, (list, tuple)) else [result]
    return [np.array(F.convert(r, F.NCHW).read()) for r in result]


IO_INPUTS = ["input_ids", "attention_mask", "position_ids", "logits_index"]
IO_OUTPUTS = ["logits", "hidden_states"]


def run_llm(mnn_path: Path, model_dir: Path, seq: int = 6) -> list[np.ndarray]:
    """Run a whole LLM graph on the io samples (inputs bound by name, in ``make_io_inputs`` order)."""
    return run_module(mnn_path, model_dir / "llm.mnn.weight", IO_INPUTS, IO_OUTPUTS, make_io_inputs(model_dir, seq))


def mnnconvert_json(mnn_path: Path, json_path: Path) -> str:
    """Dump a model to JSON with MNN's own converter core (``_tools``, never ``MNN.tools``: that one
    installs packages and sends telemetry). A subprocess keeps its C++ output and any crash apart."""
    code = "import sys, _tools; sys.exit(0 if _tools.mnnconvert(['mnnconvert'] + sys.argv[1:]) else 1)"
    argv = ["-f", "MNN", "--modelFile", str(mnn_path), "--JsonFile", str(json_path)]
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and json_path.exists(), proc.stdout + proc.stderr
    return json_path.read_text()


# ---- loading ---------------------------------------------------------------------------------------


@model_dirs
def test_load_llm_graph(model_dir: Path) -> None:
    model = load_model(model_dir / "llm.mnn")
    assert model.input_names == IO_INPUTS
    assert model.output_names == IO_OUTPUTS
    counts = model.op_type_counts()
    for op_type in ("Convolution", "LayerNorm", "BinaryOp", "Attention", "Reshape", "ConvertTensor"):
        assert counts.get(op_type, 0) > 0, op_type
    n = len(model.tensor_names)
    assert all(0 <= t < n for op in model.ops for t in (*op.inputs, *op.outputs))
    assert model.op_by_name(model.ops[0].name) is model.ops[0]


def test_load_does_not_need_weight_file(tmp_path: Path) -> None:
    shutil.copy(MODEL_DIRS["tiny-qwen3"] / "llm.mnn", tmp_path / "llm.mnn")
    model = load_model(tmp_path / "llm.mnn")
    assert len(model.ops_of_type("Convolution")) == 15


def test_output_names_naming_no_tensor_are_refused_unless_asked(tmp_path: Path) -> None:
    """MNN's compilefornpu keeps output names it cut away; only a caller that expects that reads such a file."""
    model = load_model(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")
    model.output_names = [*model.output_names, "gone"]
    data = serialize_model(model)
    with pytest.raises(MNNFormatError, match=r"output names \['gone'\] are not tensor names"):
        parse_model(data, "x.mnn")
    assert parse_model(data, "x.mnn", check_outputs=False).output_names[-1] == "gone"


@model_dirs
def test_parameters_are_reachable(model_dir: Path) -> None:
    model = load_model(model_dir / "llm.mnn")
    ln = model.ops_of_type("LayerNorm")[0].param("LayerNorm")
    assert 0 < ln.epsilon < 1e-3 and ln.useRmsnorm and get_field(ln, "useRMSNorm") is True
    kinds = {enum_name(schema.BinaryOpOperation, op.main.opType) for op in model.ops_of_type("BinaryOp")}
    assert {"ADD", "MUL"} <= kinds
    static = [op.param("Reshape") for op in model.ops_of_type("Reshape") if op.main.dims is not None]
    assert static and all(len(r.dims) >= 2 for r in static)
    assert model.ops_of_type("Concat")[0].param("Axis").axis is not None
    cast = model.ops_of_type("Cast")[0].param("CastParam")
    assert enum_name(schema.DataType, cast.dstT).startswith("DT_")
    assert model.ops_of_type("GatherV2")[0].param_type in ("GatherV2", "Axis", None)
    slices = model.ops_of_type("StridedSlice")
    assert slices and all(op.param_type in ("StridedSliceParam", None) for op in slices)
    attn = model.ops_of_type("Attention")[0].param("AttentionParam")
    assert attn.kvCache is True
    conv = model.ops_of_type("Convolution")[0].param("Convolution2D")
    assert conv.common.kernelX == 1 and conv.common.inputCount > 0 and len(conv.external) == 5
    convert = model.ops_of_type("ConvertTensor")[0].param("TensorConvertInfo")
    assert {convert.source, convert.dest} <= set(range(5))
    with pytest.raises(MNNFormatError, match="expected parameter LayerNorm"):
        reshape_op = model.ops_of_type("Reshape")[0]
        reshape_op.param("LayerNorm")


# ---- round trip --------------------------------------------------------------------------------------


@model_dirs
def test_round_trip_outputs_identical(model_dir: Path, tmp_path: Path) -> None:
    out = save_model(load_model(model_dir / "llm.mnn"), tmp_path / "llm.mnn")
    original = run_llm(model_dir / "llm.mnn", model_dir)
    ours = run_llm(out, model_dir)
    assert [a.shape for a in original] == [b.shape for b in ours]
    assert all(np.abs(a).max() > 0 for a in original), "io samples must produce non-trivial outputs"
    for a, b in zip(original, ours, strict=True):
        np.testing.assert_array_equal(a, b)


@model_dirs
def test_round_trip_is_faithful(model_dir: Path, tmp_path: Path) -> None:
    """MNN's converter dumps our rewrite to the same JSON as the original, and a second round trip is
    byte-identical to the first."""
    first = serialize_model(load_model(model_dir / "llm.mnn"))
    assert serialize_model(parse_model(first)) == first
    (tmp_path / "ours.mnn").write_bytes(first)
    assert mnnconvert_json(tmp_path / "ours.mnn", tmp_path / "ours.json") == mnnconvert_json(
        model_dir / "llm.mnn", tmp_path / "orig.json"
    )


def test_save_is_atomic_and_leaves_no_temp(tmp_path: Path) -> None:
    model = load_model(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")
    target = tmp_path / "sub" / "llm.mnn"
    save_model(model, target)
    save_model(model, target)  # replacing an existing file
    assert [p.name for p in target.parent.iterdir()] == ["llm.mnn"]
    assert (target.stat().st_mode & 0o777) == 0o644


def test_vectors_are_coerced_to_schema_types(tmp_path: Path) -> None:
    """An int64 list or array in an [int] field must not be written as 8-byte elements."""
    model = load_model(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")
    reshape = model.ops_of_type("Reshape")[0].main
    reshape.dims = np.asarray([1, -1, 7, 3], dtype=np.int64)
    again = parse_model(serialize_model(model))
    assert list(again.ops_of_type("Reshape")[0].main.dims) == [1, -1, 7, 3]


# ---- Plugin ops ------------------------------------------------------------------------------------


def _add_plugin(model: MnnModel) -> Op:
    ins = [model.tensor_index("input_ids"), model.tensor_index("position_ids")]
    out = model.add_tensor("plugin_out")
    return model.add_op(
        make_plugin_op(
            "qnn_plugin_0",
            ins,
            [out],
            {
                "path": "qnn/graph0.bin",
                "inputs": ["t2", "t4"],
                "allGraphName": ["graph0", "graph1_0"],
                "allInputShape": [1, 1, 128, 1, 1, 6, 1, 128, 1, 6],
                "o_0_0": make_blob([1, 1, 128], "DT_FLOAT", "NCHW"),
                "o_1_0": make_blob([6, 1, 128], schema.DataType.DT_HALF, schema.MNN_DATA_FORMAT.NC4HW4),
            },
        )
    )


def test_plugin_op_round_trip_and_mnnconvert(tmp_path: Path) -> None:
    model = load_model(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")
    _add_plugin(model)
    path = save_model(model, tmp_path / "plugin.mnn")

    op = load_model(path).op_by_name("qnn_plugin_0")
    assert op.type == "Plugin" and op.main.type == "QNN"
    attrs = plugin_attributes(op)
    assert attrs["path"] == "qnn/graph0.bin"
    assert attrs["inputs"] == ["t2", "t4"]
    assert attrs["allGraphName"] == ["graph0", "graph1_0"]
    assert attrs["allInputShape"] == [1, 1, 128, 1, 1, 6, 1, 128, 1, 6]
    assert list(attrs["o_0_0"].dims) == [1, 1, 128]
    assert attrs["o_1_0"].dataType == schema.DataType.DT_HALF
    assert attrs["o_1_0"].dataFormat == schema.MNN_DATA_FORMAT.NC4HW4

    dumped = json.loads(mnnconvert_json(path, tmp_path / "plugin.json"))
    (plugin,) = [o for o in dumped["oplists"] if o.get("name") == "qnn_plugin_0"]
    assert plugin["type"] == "Plugin" and plugin["main_type"] == "Plugin"
    assert plugin["main"]["type"] == "QNN"
    by_key = {a["key"]: a for a in plugin["main"]["attr"]}
    assert by_key["path"]["s"] == "qnn/graph0.bin"
    assert by_key["inputs"]["list"]["s"] == ["t2", "t4"]
    assert by_key["allGraphName"]["list"]["s"] == ["graph0", "graph1_0"]
    assert by_key["allInputShape"]["list"]["i"] == [1, 1, 128, 1, 1, 6, 1, 128, 1, 6]
    assert by_key["o_0_0"]["tensor"] == {"dims": [1, 1, 128], "dataFormat": "NCHW", "dataType": "DT_FLOAT"}
    assert by_key["o_1_0"]["tensor"]["dataType"] == "DT_HALF"
    assert by_key["o_1_0"]["tensor"]["dataFormat"] == "NC4HW4"
    assert plugin["inputIndexes"] == [model.tensor_index("input_ids"), model.tensor_index("position_ids")]
    assert plugin["outputIndexes"] == [model.tensor_index("plugin_out")]


def test_make_attribute_rejects_mixed_lists() -> None:
    with pytest.raises(ValueError, match="only str or only int"):
        make_plugin_op("p", [], [], {"bad": ["a", 1]})


# ---- mutations -------------------------------------------------------------------------------------


def test_delete_and_reindex_restores_the_original() -> None:
    original = load_model(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")
    unused = len(original.tensor_names) - len({t for op in original.ops for t in (*op.inputs, *op.outputs)})
    assert unused > 0, "llmexport leaves the names of replaced Linear tensors behind"
    original.reindex_tensors()
    expected = serialize_model(original)
    model = parse_model(expected)
    _add_plugin(model)
    model.add_tensor("never_used")
    removed = model.delete_ops(lambda op: op.type == "Plugin")
    assert [op.name for op in removed] == ["qnn_plugin_0"]
    mapping = model.reindex_tensors()
    assert all(old == new for old, new in mapping.items())
    assert serialize_model(model) == expected


def test_reindex_drops_unused_tensors_and_remaps(tmp_path: Path) -> None:
    model_dir = MODEL_DIRS["tiny-qwen3"]
    model = load_model(model_dir / "llm.mnn")
    used = sorted({t for op in model.ops for t in (*op.inputs, *op.outputs)})
    names = list(model.tensor_names)
    # interleave extra unused tensors so every index shifts, then let reindex compact them again
    spread = {old: 2 * old + 1 for old in range(len(names))}
    model.tensor_names = [n for name in names for n in (f"unused_{name}", name)]
    for op in model.ops:
        op.inputs = [spread[t] for t in op.inputs]
        op.outputs = [spread[t] for t in op.outputs]
    mapping = model.reindex_tensors()
    assert model.tensor_names == [names[i] for i in used]
    assert sorted(mapping) == [spread[i] for i in used]
    assert all(model.tensor_names[new] == names[(old - 1) // 2] for old, new in mapping.items())
    out = save_model(model, tmp_path / "llm.mnn")
    for a, b in zip(run_llm(model_dir / "llm.mnn", model_dir), run_llm(out, model_dir), strict=True):
        np.testing.assert_array_equal(a, b)


def test_reindex_when_ops_deleted_shrinks_and_keeps_references_consistent() -> None:
    model = load_model(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")
    before = list(model.tensor_names)
    # drop the lm_head chain: everything after the last decoder op that only feeds 'logits'
    model.output_names = ["hidden_states"]
    logits = model.tensor_index("logits")
    producers = model.producers()
    doomed = {producers[logits]}
    model.delete_ops(doomed)
    used_before = {t for op in model.ops for t in (*op.inputs, *op.outputs)}
    mapping = model.reindex_tensors()
    assert "logits" not in model.tensor_names and len(model.tensor_names) == len(used_before)
    for op in model.ops:
        for t in (*op.inputs, *op.outputs):
            assert 0 <= t < len(model.tensor_names)
    assert all(model.tensor_names[new] == before[old] for old, new in mapping.items())


def test_reindex_refuses_to_drop_an_output() -> None:
    model = load_model(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")
    producers = model.producers()
    model.delete_ops({producers[model.tensor_index("logits")]})
    with pytest.raises(MNNFormatError, match="logits"):
        model.reindex_tensors()


@model_dirs
def test_topological_sort_repairs_shuffled_order(model_dir: Path, tmp_path: Path) -> None:
    model = load_model(model_dir / "llm.mnn")
    original_order = [op.name for op in model.ops]
    model.topological_sort()
    assert [op.name for op in model.ops] == original_order, "an already sorted graph keeps its order"
    random.Random(7).shuffle(model.ops)
    model.topological_sort()
    seen: set[int] = set()
    produced = {t for op in model.ops for t in op.outputs}
    for op in model.ops:
        assert all(t in seen or t not in produced for t in op.inputs), op.name
        seen.update(op.outputs)
    out = save_model(model, tmp_path / "llm.mnn")
    for a, b in zip(run_llm(model_dir / "llm.mnn", model_dir), run_llm(out, model_dir), strict=True):
        np.testing.assert_array_equal(a, b)


def test_topological_sort_detects_cycles() -> None:
    model = load_model(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")
    first = next(op for op in model.ops if op.inputs and op.type != "Input")
    consumer = model.consumers()[first.outputs[0]][0]
    first.inputs = [*first.inputs, model.ops[consumer].outputs[0]]
    with pytest.raises(MNNFormatError, match="cycle"):
        model.topological_sort()


def test_add_op_checks_tensor_indexes() -> None:
    model = load_model(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")
    with pytest.raises(ValueError, match="refers to tensors"):
        model.add_op(make_plugin_op("p", [len(model.tensor_names)], [], {}))


# ---- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.9, 0.999, -1, -4])
def test_truncated_model_is_a_clear_error(tmp_path: Path, keep: float) -> None:
    data = (MODEL_DIRS["tiny-qwen3"] / "llm.mnn").read_bytes()
    cut = int(len(data) * keep) if keep >= 0 else len(data) + int(keep)
    path = tmp_path / "llm.mnn"
    path.write_bytes(data[:cut])
    with pytest.raises(MNNFormatError, match=str(path)) as info:
        load_model(path)
    assert "truncated" in str(info.value) or "too small" in str(info.value) or "not an MNN model" in str(info.value)


def test_every_truncation_is_detected() -> None:
    data = (MODEL_DIRS["llama-int4-cw"] / "llm.mnn").read_bytes()
    for cut in range(0, len(data), 7):
        with pytest.raises(MNNFormatError):
            parse_model(data[:cut], f"cut at {cut}")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x00" * 64,
        b'{"oplists": [], "tensorName": []}\n' * 4,
        bytes(random.Random(1).getrandbits(8) for _ in range(4096)),
        b"\x0c\x00\x00\x00TFL3" + b"\x00" * 56,
    ],
    ids=["empty", "zeros", "json", "random", "other-flatbuffer"],
)
def test_not_an_mnn_model_is_a_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.mnn"
    path.write_bytes(content)
    with pytest.raises(MNNFormatError, match=str(path)):
        load_model(path)


def test_missing_model_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MNNFormatError, match="cannot read"):
        load_model(tmp_path / "nope.mnn")


def test_flatbuffer_of_wrong_shape_is_rejected() -> None:
    """A well-formed flatbuffer Net whose ops point at tensors that do not exist."""
    model = load_model(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")
    model.ops[5].inputs = [10_000]
    with pytest.raises(MNNFormatError, match="expected indexes below the tensor count"):
        parse_model(serialize_model(model), "crafted")
