"""Architectures llmexport exports beyond Qwen/Llama (issue 42): each failure class of the zoo, on a tiny fixture.

The fixtures under tests/fixtures/models/zoo-* come from ``models/export/make_zoo.py --fixture`` (2 layers, hidden
64, int4 block 64): Phi-3 (fused gate_up_proj chunk), LFM2 (short-conv zero state), Gemma 2 (logit soft-cap),
GLM-4 (RMSNorm epsilon 0), Qwen3-MoE (experts in subgraphs, on the CPU), Gemma 3 (full and sliding-window layers,
window 8: the two-part mask MNN's engine builds).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from mnnbuild_runtime import Embeddings, cpu_forward_fn, kv_cache_draft, llm_inputs
from mnnbuild_runtime.bundle import mask_window
from mnnbuild_runtime.errors import BundleError

from mnnbuild.base.compare import Tolerance, compare
from mnnbuild.base.errors import ModelDirError
from mnnbuild.cpu import load_vars
from mnnbuild.lowering.lower import lower_subgraph
from mnnbuild.lowering.support import _unary_kind, unsupported_reason
from mnnbuild.mnn import MnnModel, Op, load_model, save_model
from mnnbuild.mnn._generated import mnn_fb as fb
from mnnbuild.mnn.llm import causal_mask, engine_mask, windowed_mask
from mnnbuild.mnn.model import OP_TYPE_NAMES, OP_TYPES
from mnnbuild.mnn.semantics import shape_inputs
from mnnbuild.mnn.summary import op_weight_bytes
from mnnbuild.model.modeldir import read_llm_config
from mnnbuild.model.spec import LocalSource
from mnnbuild.partition.cut import plan_cut
from mnnbuild.partition.fold import compute_folded
from mnnbuild.partition.records import PartitionReport
from mnnbuild.qnn import QnnLibrary
from mnnbuild.samples.checks import warn_zero_epsilon
from mnnbuild.samples.inputs import make_inputs
from mnnbuild.stages.fetch import FetchInputs, FetchParams, fetch
from mnnbuild.stages.io import IoInputs, IoParams, generate_io
from mnnbuild.verify.failures import generation_failures
from mnnbuild.verify.verdict import GenerationCheck, GenerationStep
from tests.conftest import FIXTURE_MODELS, PROJECT_ROOT, RunDoit
from tests.lowering_check import mnn_tensors, simulate

ZOO = {name: FIXTURE_MODELS / f"zoo-{name}" for name in ("phi3", "lfm2", "gemma2", "gemma3_text", "glm4", "qwen3_moe")}


def zoo_specs(tmp_path: Path, *names: str) -> dict[str, str]:
    """A spec dir naming the zoo fixtures (chunk 32, v79) and the env that points doit at it."""
    specs = tmp_path / "specs"
    specs.mkdir(exist_ok=True)
    for name in names:
        (specs / f"zoo-{name}.toml").write_text(
            f'name = "zoo-{name}"\nsource = {{ local = "{ZOO[name]}" }}\nchunk_size = 32\ntargets = ["v79"]\n',
            encoding="utf-8",
        )
    return {"MNNBUILD_MODELS_PATH": str(specs)}


def _onnx_slices(model: MnnModel, n_inputs: int) -> list:
    return [
        op
        for op in model.ops_of_type("StridedSlice")
        if op.param_type == "StridedSliceParam" and int(op.main.fromType) == 1 and len(op.inputs) == n_inputs
    ]


# ---- 1. ONNX-form slices without steps (Phi-3's and GLM-4's chunk of the fused gate_up_proj) -----------------


def test_every_onnx_slice_form_has_its_shape_inputs() -> None:
    phi3 = load_model(ZOO["phi3"] / "llm.mnn")
    (chunk, *_) = _onnx_slices(phi3, 4)  # data, starts, ends, axes: no steps
    assert shape_inputs(chunk) == (1, 2, 3)
    for n in (3, 4, 5):  # starts and ends are required; axes and steps optional
        op = copy.copy(chunk)
        op.inputs = (chunk.inputs * 2)[:n]
        assert shape_inputs(op) == tuple(range(1, n))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["phi3", "glm4"])
def test_partition_of_a_fused_gate_up_chunk(tmp_path: Path, run_doit: RunDoit, name: str) -> None:
    proc = run_doit(f"partition:zoo-{name}", env=zoo_specs(tmp_path, name), check=False)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- 2. Fill of a folded shape (LFM2's zero conv state) ------------------------------------------------------


def test_folded_fill_is_computed() -> None:
    lfm2 = load_model(ZOO["lfm2"] / "llm.mnn")
    fills = [op for op in lfm2.ops if op.type == "Fill"]
    assert fills, "the LFM2 fixture holds its short-conv zero state as a Fill"
    names = [lfm2.tensor_names[op.outputs[0]] for op in fills]
    hidden, seq = 64, 5
    sample = {
        "input_ids": np.ones((seq, 1, hidden), np.float32),
        "attention_mask": np.zeros((1, 1, seq, seq), np.float32),
        "position_ids": np.arange(seq, dtype=np.int32)[None],
        "logits_index": np.array([-1], np.int32),
    }
    (values,) = compute_folded(ZOO["lfm2"] / "llm.mnn", [sample], names, lfm2)
    for n in names:
        assert values[n].dtype == np.float32
        assert values[n].size > 0 and not values[n].any()
        assert seq in values[n].shape  # follows the sample's length, not a fixed shape


@pytest.mark.parametrize(
    "model_file",
    sorted(FIXTURE_MODELS.glob("*/*.mnn")) + sorted((PROJECT_ROOT / "models").glob("*/llm.mnn")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_every_subgraph_has_a_data_input(model_file: Path) -> None:
    """No CPU step without data inputs ("subgraph ... has no data input", LFM2 before its Fill folded): an op whose
    inputs are all constant, folded or read for their shape only is folded, so every op a subgraph runs reads the
    content of a graph input or of another subgraph's output."""
    model = load_model(model_file)
    cut = plan_cut(model, model.input_names, model.output_names)
    assert all(m.inputs for m in cut.modules)
    folded = set(cut.folded_ops)
    assert all(i in folded for i, op in enumerate(model.ops) if op.type == "Fill" and i in set(cut.needed))


@pytest.mark.slow
def test_partition_of_a_short_conv_model(tmp_path: Path, run_doit: RunDoit) -> None:
    proc = run_doit("partition:zoo-lfm2", env=zoo_specs(tmp_path, "lfm2"), check=False)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- 3. fp16 error a constant factor scales up (Gemma 2's logit soft-cap 30 * tanh(x / 30)) -----------------


def test_soft_cap_tanh_stays_on_the_cpu() -> None:
    gemma2 = load_model(ZOO["gemma2"] / "llm.mnn")
    tanh = {op.name: op for op in gemma2.ops_of_type("UnaryOp") if _unary_kind(op) == "TANH"}
    cap = tanh.pop("/lm/Tanh_output_0")
    reason = unsupported_reason(cap, gemma2)
    assert reason is not None and "multiplied by 30" in reason
    assert unsupported_reason(cap, gemma2, precision=False) is None  # lowerable, just not precise enough
    # The scale-down before it stays lowerable, and so do the MLP's tanh-approximated GELUs (x * 0.5 * (1 + tanh)).
    div = next(op for op in gemma2.ops if op.outputs and op.outputs[0] == cap.inputs[0])
    assert unsupported_reason(div, gemma2) is None
    assert len(tanh) == 2 and all(unsupported_reason(op, gemma2) is None for op in tanh.values())


@pytest.mark.slow
def test_soft_cap_reason_in_partition_txt(tmp_path: Path, run_doit: RunDoit) -> None:
    run_doit("partition:zoo-gemma2", env=zoo_specs(tmp_path, "gemma2"))
    text = (tmp_path / "artifacts" / "zoo-gemma2" / "partition" / "partition.txt").read_text(encoding="utf-8")
    (line,) = [ln for ln in text.splitlines() if "/lm/Tanh_output_0" in ln]
    assert "UnaryOp" in line and "multiplied by 30" in line


# ---- 4. a non-finite reference (GLM-4's RMSNorm epsilon 0 on a zero row) -------------------------------------


def test_non_finite_reference_is_not_a_bundle_mismatch() -> None:
    ref = np.array([[0.5, -1.0, 2.0], [np.nan, np.nan, np.nan]], np.float32)
    got = np.array([[0.5, -1.0, 2.0], [0.1, 0.2, 0.3]], np.float32)
    check = compare("step 1 logits", got, ref, Tolerance())
    assert not check.passed
    line = check.describe(Tolerance())
    assert "reference (MNN CPU) itself has 3 non-finite values" in line and "[1, 0]" in line
    assert "nan" not in line.lower().replace("non-finite", "")  # no "cosine nan" blaming the bundle


def test_zero_epsilon_norm_is_warned_at_io(caplog: pytest.LogCaptureFixture) -> None:
    glm4 = load_model(ZOO["glm4"] / "llm.mnn")
    norms = glm4.ops_of_type("LayerNorm")
    assert norms and all(float(op.main.epsilon) == 0.0 for op in norms)  # what llmexport 0.0.5 writes for GLM-4
    with caplog.at_level(logging.WARNING, logger="mnnbuild.samples.checks"):
        warn_zero_epsilon(glm4, ZOO["glm4"] / "llm.mnn")
    assert f"{len(norms)} LayerNorm ops have epsilon 0" in caplog.text and norms[0].name in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mnnbuild.samples.checks"):
        warn_zero_epsilon(load_model(ZOO["phi3"] / "llm.mnn"), ZOO["phi3"] / "llm.mnn")
    assert "epsilon 0" not in caplog.text


# ---- LFM2's NC4HW4 norms (MNN's FuseTransformerC4): a LayerNorm over the channels -------------------------


@pytest.mark.parametrize("seq", [1, 32])
def test_channel_norm_of_an_nc4hw4_region(seq: int) -> None:
    model_file, weight_file = ZOO["lfm2"] / "llm.mnn", ZOO["lfm2"] / "llm.mnn.weight"
    lfm2 = load_model(model_file)
    by_name = {op.name: i for i, op in enumerate(lfm2.ops)}
    norm = by_name["/blocks.0/input_layernorm/Mul_1_output_0"]
    ops = [by_name["FuseTransformerC4_region_pre_reshape_236"], by_name["FuseTransformerC4_region_pre_convert_237"]]
    info = mnn_tensors(lfm2, model_file, weight_file, make_inputs(seq, 64, seed=0))
    src, dst = lfm2.ops[ops[0]].inputs[0], lfm2.ops[norm].outputs[0]
    assert info[lfm2.ops[norm].inputs[0]].format == "NC4HW4" and info[dst].shape == (seq, 64, 1, 1)
    lowered = lower_subgraph(lfm2, weight_file, [*ops, norm], info, [src], [dst])
    got = simulate(QnnLibrary(), lowered, {f"t{src}": info[src].value})[f"t{dst}"]
    check = compare("norm", got.reshape(info[dst].shape), info[dst].value, Tolerance())
    assert check.passed, check.describe(Tolerance())


def test_fused_residual_norm_is_refused_by_name() -> None:
    lfm2 = load_model(ZOO["lfm2"] / "llm.mnn")
    fused = [op for op in lfm2.ops_of_type("LayerNorm") if len(op.inputs) == 2]
    assert fused
    for op in fused:
        assert "fused residual add (2 inputs, 2 outputs)" in (unsupported_reason(op, lfm2) or "")


# ---- 5. what cannot be supported: one line at the earliest stage that knows -----------------------------------


def _custom(op: Op) -> Op:
    extra = fb.ExtraT()
    extra.type, extra.engine = "MyCustomOp", "Tiny"
    return dataclasses.replace(op, type="Extra", main=extra)


def _plugin(op: Op) -> Op:
    plugin = fb.PluginT()
    plugin.type, plugin.attr = "QNN", []
    return dataclasses.replace(op, type="Plugin", main=plugin)


REFUSED_OPS: dict[str, tuple[Callable[[Op], Op], str, str]] = {
    # what replaces the first MLP activation: (make it, the stage that refuses it, the op's type as the line names it)
    "custom": (_custom, "io", "Extra 'MyCustomOp'"),  # a custom op MNN's CPU has no kernel for
    "plugin": (_plugin, "io", "Plugin"),  # a bundle's partitioned graph given back as a source model
    "no-cpu-kernel": (lambda op: dataclasses.replace(op, type="QuantizedAdd", main=None), "io", "QuantizedAdd"),
    "unknown-type": (lambda op: dataclasses.replace(op, type="Unknown9999", main=None), "fetch", "9999"),
}


def _with_refused_op(dest: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The Gemma 2 fixture with its first MLP activation replaced by an op of ``kind``; returns how the refusal
    names it."""
    shutil.copytree(ZOO["gemma2"], dest)
    model = load_model(dest / "llm.mnn")
    i = next(k for k, op in enumerate(model.ops) if op.type == "UnaryOp" and "act_fn" in op.name)
    make, _, type_name = REFUSED_OPS[kind]
    # an OpType value no MNN schema has: written by this process only (the build's parser does not know it)
    monkeypatch.setitem(OP_TYPES, "Unknown9999", 9999)
    monkeypatch.setitem(OP_TYPE_NAMES, 9999, "Unknown9999")
    model.ops[i] = make(model.ops[i])
    save_model(model, dest / "llm.mnn")
    if kind == "unknown-type":
        return f"llm.mnn: op #{i} has unknown OpType value {type_name}"
    return f"MNN's CPU cannot run op #{i} {model.ops[i].name!r} ({type_name})"


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(REFUSED_OPS))
def test_an_op_we_refuse_is_one_line_naming_it(
    tmp_path: Path, run_doit: RunDoit, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Every stage asked for (verify of the bundle), on a model holding an op of a type the chain refuses: the first
    stage that reads the op stops the build in one line naming it and its type, never a traceback."""
    named = _with_refused_op(tmp_path / "model", kind, monkeypatch)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "refused.toml").write_text(
        f'name = "refused"\nsource = {{ local = "{tmp_path / "model"}" }}\nchunk_size = 32\ntargets = ["v79"]\n',
        encoding="utf-8",
    )
    proc = run_doit("verify:refused-v79", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    assert f"failed  {REFUSED_OPS[kind][1]}:refused" in out  # the first stage that reads the op
    (line,) = [ln for ln in out.splitlines() if named in ln]
    assert "weight file" not in line


# ---- 6. the partition says up front what runs where (MoE experts keep their weights on the CPU) ---------------


@pytest.mark.slow
def test_partition_summary_names_the_cpu_share(tmp_path: Path, run_doit: RunDoit) -> None:
    proc = run_doit("partition:zoo-qwen3_moe", env=zoo_specs(tmp_path, "qwen3_moe"))
    (ending,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("partition zoo-qwen3_moe: ")]
    text = (tmp_path / "artifacts" / "zoo-qwen3_moe" / "partition" / "partition.txt").read_text(encoding="utf-8")
    assert text.splitlines()[1] == ending.split(": ", 1)[1]  # the report's second line, the same words
    report = PartitionReport.model_validate_json(
        (tmp_path / "artifacts" / "zoo-qwen3_moe" / "partition" / "partition.json").read_text(encoding="utf-8")
    )
    model = load_model(ZOO["qwen3_moe"] / "llm.mnn")
    experts = sum(
        op_weight_bytes(Op(type="Convolution", main=node.main))
        for sg in model.subgraphs
        for node in sg.nodes
        if node.main is not None and type(node.main).__name__ == "Convolution2DT"
    )
    moe = report.cpu_weight_bytes["MoE"]
    assert experts > 0 and experts <= moe <= 1.01 * experts  # the experts' convolutions, plus their small constants
    share = moe / (report.total_weight_bytes + report.subgraph_weight_bytes)
    assert 0.2 < share < 0.8 and f"the CPU keeps {share:.1%} of the weights (MoE {share:.1%}" in ending


def test_generation_on_a_non_finite_reference_is_one_reference_line() -> None:
    tol = Tolerance()
    nan_row, row = np.full(4, np.nan, np.float32), np.array([0.1, 0.9, 0.2, 0.3], np.float32)
    steps = [
        GenerationStep(
            step=i,
            cpu_token=0,
            hybrid_pick=1,
            cpu_margin=float("nan"),
            logits=compare(f"step {i} logits", row, nan_row, tol),
        )
        for i in range(3)
    ]
    gen = GenerationCheck(prompt="hello", max_new_tokens=3, passed=False, steps=steps)
    (line,) = [f.line for f in generation_failures(gen, tol)]
    assert line.startswith("generation: the CPU reference's logits are not finite at 3 of 3 steps")
    assert "out of tolerance" not in line and "picks" not in line


# ---- 7. the masks MNN's engine builds for the model's attention kinds (Gemma 3: full and sliding layers) -------


def _engine_rule(seq: int, window: int) -> np.ndarray:
    """Upstream llm.cpp's two-part float mask, element by element: a key is seen by the full layers when at or before
    the query, by the sliding ones when also fewer than ``window`` positions behind it."""
    low = np.finfo(np.float32).min
    full = [[0.0 if j <= i else low for j in range(seq)] for i in range(seq)]
    sliding = [[0.0 if i - window < j <= i else low for j in range(seq)] for i in range(seq)]
    return np.array([full, sliding], np.float32).reshape(2, 1, 1, seq, seq)


def test_windowed_mask_follows_the_query_positions() -> None:
    """Two new rows after 4 cached keys (MNN's engine puts row ``i``'s query at ``i + kv - seq``), window 3."""
    low = np.finfo(np.float32).min
    seen = np.zeros((1, 1, 2, 6), np.float32)  # the caller's mask: every key seen
    mask = windowed_mask(seen, 3)
    assert mask.shape == (2, 1, 1, 2, 6) and np.array_equal(mask[0], seen)
    assert (mask[1, 0, 0, 0] == 0).tolist() == [False, False, True, True, True, True]  # query 4: keys 2.. (3 back)
    assert (mask[1, 0, 0, 1] == 0).tolist() == [False, False, False, True, True, True]
    assert mask[1, 0, 0, 0, 0] == low and windowed_mask(mask, 3) is mask and windowed_mask(seen, None) is seen
    assert np.array_equal(engine_mask(12, 5), _engine_rule(12, 5)) and np.array_equal(engine_mask(12), causal_mask(12))


def _gemma3(tmp_path: Path, **changes: object) -> tuple[Path, int]:
    """A copy of the Gemma 3 fixture (layer 0 sliding, layer 1 full) with ``llm_config.json`` fields changed (None:
    removed), and its sliding window."""
    dest = tmp_path / "gemma3"
    shutil.copytree(ZOO["gemma3_text"], dest)
    config = json.loads((dest / "llm_config.json").read_text(encoding="utf-8"))
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    (dest / "llm_config.json").write_text(json.dumps(config), encoding="utf-8")
    return dest, config.get("sliding_window", 0)


def _fetched(src: Path, dest: Path) -> Path:
    fetch(FetchInputs(model="m", source=LocalSource(local=str(src)), source_dir=src), FetchParams(), dest)
    return dest


def test_io_samples_carry_the_engines_two_part_mask(tmp_path: Path) -> None:
    model_dir = _fetched(ZOO["gemma3_text"], tmp_path / "model")
    config = json.loads((model_dir / "llm_config.json").read_text(encoding="utf-8"))
    assert config["attention_type"] == "mix" and 0 < config["sliding_window"] < 32  # the sample goes past it
    window, seq = config["sliding_window"], 32
    generate_io(IoInputs(model="m", model_dir=model_dir), IoParams(chunk_sizes=(seq,), seed=3), tmp_path / "io")
    feed = load_vars(tmp_path / "io" / "testdir" / str(seq) / "input.mnn")
    ref = load_vars(tmp_path / "io" / "testdir" / str(seq) / "output.mnn")["logits"].reshape(seq, -1)
    assert np.array_equal(feed["attention_mask"], _engine_rule(seq, window))
    assert np.array_equal(load_vars(tmp_path / "io" / "testdir" / "1" / "input.mnn")["attention_mask"],
                          _engine_rule(1, window))  # fmt: skip
    # The reference outputs are the model's on that mask: fed one full mask in both parts instead, the rows past the
    # window (whose sliding layer would see keys it must not) come out otherwise, the rows within it the same.
    forward = cpu_forward_fn(model_dir)
    full = np.stack([causal_mask(seq)] * 2)
    wrong = np.asarray(forward({**feed, "attention_mask": full})["logits"]).reshape(seq, -1)
    assert np.array_equal(wrong[:window], ref[:window])
    assert not compare("rows past the window", wrong[window:], ref[window:], Tolerance()).passed


def test_recompute_forward_is_mnns_engine_past_the_window(tmp_path: Path) -> None:
    """The forward verify's reference and the bundle run (a one-part mask completed to the model's kinds) against
    MNN's own LLM engine, which builds the two-part mask itself: the same rows, on a prompt longer than the window.
    ``attn_scale`` is dropped: the engine hands it to the Attention op at run time (KV meta), which a module run has
    no way to (noticed, not this test's subject)."""
    model_dir, window = _gemma3(tmp_path, attn_scale=None)
    prompt = list(range(40, 40 + window + 4))
    rows: list[np.ndarray] = []
    tokens = kv_cache_draft(model_dir, prompt, 6, rows=rows)
    assert len(rows) == 6, "MNN's LLM engine ran the model"
    feed = llm_inputs(Embeddings(model_dir)(prompt + tokens[:-1]), 32, logits_index=0)
    assert feed["attention_mask"].shape == (1, 1, 32, 32)  # one part: the forward completes it as the engine does
    forward = cpu_forward_fn(model_dir)
    got = np.asarray(forward(feed)["logits"]).reshape(32, -1)
    full = np.asarray(forward({**feed, "attention_mask": np.stack([feed["attention_mask"]] * 2)})["logits"])
    full = full.reshape(32, -1)
    tol = Tolerance()
    for i, row in enumerate(rows):
        at = len(prompt) - 1 + i
        check = compare(f"step {i}", got[at], row, tol)
        assert check.passed, check.describe(tol)
        assert not compare(f"step {i}, one full mask", full[at], row, tol).passed


def test_mixed_attention_without_a_window_or_a_two_part_input_is_one_line(tmp_path: Path) -> None:
    no_window, _ = _gemma3(tmp_path, sliding_window=None)
    with pytest.raises(ModelDirError) as err:
        read_llm_config(no_window)
    assert str(err.value).startswith(f"{no_window / 'llm_config.json'}: field 'sliding_window' must be a positive")
    with pytest.raises(BundleError, match=r"llm_config.json: field 'sliding_window' must be a positive integer when"):
        mask_window(no_window / "config.json", {})
    # A graph taking one mask, described as mixing both kinds: the engine would feed it two.
    one_part = tmp_path / "one-part"
    shutil.copytree(ZOO["gemma2"], one_part)
    config = json.loads((one_part / "llm_config.json").read_text(encoding="utf-8"))
    (one_part / "llm_config.json").write_text(json.dumps({**config, "attention_type": "mix", "sliding_window": 8}))
    model_dir = tmp_path / "model"
    fetch(
        FetchInputs(model="m", source=LocalSource(local=str(one_part)), source_dir=one_part), FetchParams(), model_dir
    )
    with pytest.raises(ModelDirError) as err:
        generate_io(IoInputs(model="m", model_dir=model_dir), IoParams(chunk_sizes=(32,)), tmp_path / "io")
    assert "field 'attention_type' is 'mix'" in str(err.value) and "graph input 'attention_mask'" in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "io").exists()


@pytest.mark.slow
def test_sliding_window_model_verifies_on_the_engines_mask(tmp_path: Path, run_doit: RunDoit) -> None:
    proc = run_doit("verify:zoo-gemma3_text-v79", env=zoo_specs(tmp_path, "gemma3_text"), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out
    verify_dir = tmp_path / "artifacts" / "zoo-gemma3_text" / "v79" / "verify"
    assert (verify_dir / "verify.txt").read_text().startswith("verify zoo-gemma3_text for SM8750 (v79): PASSED")
    report = json.loads((verify_dir / "verify.json").read_text(encoding="utf-8"))
    # the generation's forward at 32 is the io sample's run: its inputs, the two-part mask included, are the same
    assert report["generation"]["passed"] and report["generation"]["shared_lengths"] == [32]
    assert len(report["generation"]["prompt_ids"]) + len(report["generation"]["hybrid_tokens"]) > 8  # past the window


# ---- the fast subset of the matrix (benchmarks/bench_archs.py runs the whole zoo, float16 and int4) ------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["phi3", "lfm2", "gemma2", "qwen3_moe"])
def test_zoo_fixture_builds_and_verifies(tmp_path: Path, run_doit: RunDoit, name: str) -> None:
    proc = run_doit(f"verify:zoo-{name}-v79", env=zoo_specs(tmp_path, name), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out
    assert (
        (tmp_path / "artifacts" / f"zoo-{name}" / "v79" / "verify" / "verify.txt")
        .read_text()
        .startswith(f"verify zoo-{name} for SM8750 (v79): PASSED")
    )
