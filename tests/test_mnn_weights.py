"""mnnbuild.mnn weights: every Convolution decoded by us matches MNN running that op; synthetic
int2/3/4/8 block/channel sym/asym weights; embeddings; clear errors on bad weight files."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.mnn import (
    MnnModel,
    Op,
    WeightFile,
    conv_codes,
    conv_ops,
    decode_conv,
    embedding_info,
    iter_conv_weights,
    load_model,
    quantize_blocks,
    quantize_linear,
    read_embeddings,
    save_model,
    schema,
    unpack_codes,
)
from tests.test_mnn_model import MODEL_DIRS, model_dirs, run_module

# ---- real models: decoded weights against MNN -------------------------------------------------------

EXPECTED_STORAGE = {
    # model dir -> (bits, symmetric, block size or None for channel-wise)
    "tiny-qwen3": (4, False, 64),
    "qwen3-untied-int8-b32": (8, False, 32),
    "llama-int4-cw": (4, True, None),
}


def _conv_case_ids() -> list[tuple[str, str]]:
    cases = []
    for key, model_dir in MODEL_DIRS.items():
        for op in conv_ops(load_model(model_dir / "llm.mnn")):
            cases.append((key, op.name))
    return cases


CONV_CASES = _conv_case_ids()


@pytest.mark.parametrize(("model_key", "op_name"), CONV_CASES, ids=[f"{k}:{n}" for k, n in CONV_CASES])
def test_conv_matches_mnn(model_key: str, op_name: str) -> None:
    model_dir = MODEL_DIRS[model_key]
    model = load_model(model_dir / "llm.mnn")
    op = model.op_by_name(op_name)
    with WeightFile(model_dir / "llm.mnn.weight") as wf:
        cw = decode_conv(op, wf)
    out_ch, in_ch = cw.weight.shape
    assert (out_ch, in_ch) == (op.main.common.outputCount, op.main.common.inputCount)
    x = np.random.default_rng(len(op_name)).standard_normal((5, in_ch)).astype(np.float32)
    (got,) = run_module(
        model_dir / "llm.mnn",
        model_dir / "llm.mnn.weight",
        [model.tensor_names[op.inputs[0]]],
        [model.tensor_names[op.outputs[0]]],
        [x.reshape(5, in_ch, 1, 1)],
    )
    ours = x @ cw.weight.T + cw.bias
    rel = np.abs(got.reshape(5, out_ch) - ours).max() / np.abs(ours).max()
    assert rel < 1e-4, f"{op_name}: relative error {rel:.3g}"


@model_dirs
def test_quantization_layout_is_recognised(model_dir: Path) -> None:
    bits, symmetric, block = EXPECTED_STORAGE[model_dir.name]
    model = load_model(model_dir / "llm.mnn")
    decoded = list(iter_conv_weights(model))
    assert len(decoded) == len(conv_ops(model)) > 0
    for cw in decoded:
        assert cw.quant.quant_type == 1 and cw.quant.bits == bits and cw.quant.symmetric == symmetric
        assert cw.weight.dtype == np.float32 and cw.bias.dtype == np.float32
        if block is None:
            assert cw.channel_wise and cw.quant.block_size == cw.weight.shape[1]
        else:
            assert not cw.channel_wise and cw.quant.block_size == block
        distinct = np.unique(cw.weight[0, : cw.quant.block_size])
        assert distinct.size <= 2**bits  # one block holds at most 2^bits distinct values


def test_decoding_is_one_op_at_a_time() -> None:
    """Peak memory while decoding the whole model stays near the largest op, not the model."""
    model = load_model(MODEL_DIRS["qwen3-untied-int8-b32"] / "llm.mnn")
    sizes = [op.main.common.outputCount * op.main.common.inputCount * 4 for op in conv_ops(model)]
    tracemalloc.start()
    try:
        for cw in iter_conv_weights(model):
            del cw
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * max(sizes) < sum(sizes) * 3, (peak, max(sizes), sum(sizes))


# ---- embeddings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "{path}: cannot read llm_config.json: [Errno 2] No such file or directory: '{path}'"),
        (b"[", "{path}: cannot read llm_config.json: Expecting value: line 1 column 2 (char 1)"),
        (b'"x"', "{path}: expected a JSON object, got str"),
    ],
    ids=["missing", "not-json", "not-an-object"],
)
def test_unreadable_llm_config_is_one_line(tmp_path: Path, content: bytes | None, expected: str) -> None:
    path = tmp_path / "llm_config.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(MNNFormatError) as exc:
        embedding_info(tmp_path)
    assert str(exc.value) == expected.format(path=path)


def test_tied_embeddings_are_the_lm_head() -> None:
    model_dir = MODEL_DIRS["tiny-qwen3"]
    info = embedding_info(model_dir)
    assert info.kind == "quant" and info.path.name == "llm.mnn.weight" and (info.bits, info.block) == (4, 64)
    model = load_model(model_dir / "llm.mnn")
    with WeightFile(model_dir / "llm.mnn.weight") as wf:
        lm_head = decode_conv(model.op_by_name("/lm/lm_head/Linear"), wf)
    table = read_embeddings(model_dir)
    assert table.shape == (1024, 128)
    np.testing.assert_allclose(table, lm_head.weight, rtol=0, atol=1e-6)
    tokens = [5, 1023, 0, 5]
    np.testing.assert_array_equal(read_embeddings(model_dir, tokens), table[tokens])


@pytest.mark.parametrize("key", ["qwen3-untied-int8-b32", "llama-int4-cw"])
def test_bf16_embeddings(key: str) -> None:
    model_dir = MODEL_DIRS[key]
    cfg = json.loads((model_dir / "llm_config.json").read_text())
    assert "tie_embeddings" not in cfg
    info = embedding_info(model_dir)
    assert info.kind == "bf16" and info.path.name == "embeddings_bf16.bin"
    raw = np.fromfile(model_dir / "embeddings_bf16.bin", dtype="<u2").reshape(-1, cfg["hidden_size"])
    table = read_embeddings(model_dir)
    assert table.shape == raw.shape == (info.vocab, cfg["hidden_size"])
    row = 17
    expected = np.array([np.frombuffer((int(v) << 16).to_bytes(4, "little"), "<f4")[0] for v in raw[row]])
    np.testing.assert_array_equal(table[row], expected)
    np.testing.assert_array_equal(read_embeddings(model_dir, [row, 3]), table[[row, 3]])
    with pytest.raises(MNNFormatError, match="token ids"):
        read_embeddings(model_dir, [info.vocab])


def test_tied_embeddings_dict_form_and_fp16_alpha(tmp_path: Path) -> None:
    """llm_config's newer dict form of tie_embeddings, with fp16 scales, reads the same rows."""
    src = MODEL_DIRS["tiny-qwen3"]
    cfg = json.loads((src / "llm_config.json").read_text())
    w_off, a_off, a_size, bits, block = cfg["tie_embeddings"]
    data = bytearray((src / "llm.mnn.weight").read_bytes())
    # fp16 scales written where the fp32 ones were: the engine derives the vocab from alpha_offset
    alpha = np.frombuffer(bytes(data[a_off : a_off + a_size]), "<f4").astype("<f2")
    data[a_off : a_off + alpha.nbytes] = alpha.tobytes()
    (tmp_path / "llm.mnn.weight").write_bytes(bytes(data))
    cfg["tie_embeddings"] = {
        "weight_offset": w_off,
        "alpha_offset": a_off,
        "alpha_size": alpha.nbytes,
        "quant_bit": bits,
        "quant_block": block,
        "alpha_dtype": "fp16",
    }
    (tmp_path / "llm_config.json").write_text(json.dumps(cfg))
    info = embedding_info(tmp_path)
    assert info.alpha_fp16
    got = read_embeddings(tmp_path, [0, 7])
    want = read_embeddings(src, [0, 7])
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-4)


# ---- synthetic weights: our encoder (llmexport's layout) -> MNN and our decoder -------------------------


def encode_idst(
    w: np.ndarray, bits: int, block: int, symmetric: bool, alpha_fp16: bool = False
) -> tuple[bytes, bytes, np.ndarray]:
    """Quantize ``w`` [out, in] like llmexport: returns (weight block, alpha bytes, dequantized float)."""
    out_ch, in_ch = w.shape
    blocks = in_ch // block
    wb = w.reshape(out_ch, blocks, block).astype(np.float64)
    offset = 1 << (bits - 1)
    if symmetric:
        scale = np.abs(wb).max(-1, keepdims=True) / (offset - 1)
        q = np.clip(np.round(wb / scale), -(offset - 1), offset - 1)
        zero = np.zeros_like(scale)
        alpha = scale.reshape(-1)
    else:
        lo, hi = wb.min(-1, keepdims=True), wb.max(-1, keepdims=True)
        scale = (hi - lo) / (2 * offset - 1)
        q = np.clip(np.round((wb - lo) / scale) - offset, -offset, offset - 1)
        zero = lo + scale * offset
        alpha = np.stack([zero.reshape(-1), scale.reshape(-1)], -1).reshape(-1)
    alpha_dtype = "<f2" if alpha_fp16 else "<f4"
    alpha_stored = alpha.astype(alpha_dtype)
    a = alpha_stored.astype(np.float32)
    if symmetric:
        deq = q.reshape(-1, block) * a[:, None]
    else:
        deq = q.reshape(-1, block) * a[1::2, None] + a[0::2, None]
    codes = (q + offset).astype(np.uint8).reshape(-1)
    packed = np.packbits(np.unpackbits(codes[:, None], axis=1)[:, 8 - bits :].reshape(-1))
    table = np.arange(-offset, offset, dtype=np.int8)
    header = bytes([2]) + np.array([out_ch, in_ch], "<u2").tobytes()
    header += bytes([0 if table.size == 256 else table.size]) + table.tobytes()
    return header + packed.tobytes(), alpha_stored.tobytes(), deq.reshape(out_ch, in_ch).astype(np.float32)


def conv_model(specs: list[dict], weight_path: Path) -> tuple[MnnModel, list[np.ndarray]]:
    """A graph of independent 1x1 convs x_i -> y_i, weights in ``weight_path`` per ``specs``
    (keys: out, in, bits, block, symmetric, bias, alpha_fp16). Returns the model and expected weights."""
    model = MnnModel(ops=[], tensor_names=[])
    blob = bytearray()
    expected = []
    rng = np.random.default_rng(3)
    for k, spec in enumerate(specs):
        out_ch, in_ch = spec["out"], spec["in"]
        w = rng.standard_normal((out_ch, in_ch)).astype(np.float32) * 0.1
        wbytes, abytes, deq = encode_idst(
            w, spec["bits"], spec["block"], spec["symmetric"], spec.get("alpha_fp16", False)
        )
        bias = rng.standard_normal(out_ch).astype(np.float32) if spec.get("bias") else None
        bbytes = b"" if bias is None else bias.tobytes()
        external = [len(blob), len(wbytes), len(abytes), len(bbytes), 0]
        blob += wbytes + abytes + bbytes
        expected.append((deq, bias if bias is not None else np.zeros(out_ch, np.float32)))

        x, x4, y4, y = (model.add_tensor(f"{n}{k}") for n in ("x", "x4_", "y4_", "y"))
        inp = schema.InputT()
        inp.dims, inp.dtype, inp.dformat = np.array([-1, in_ch, 1, 1], "<i4"), schema.DataType.DT_FLOAT, 0
        model.add_op(Op("Input", f"x{k}", [], [x], inp))
        to4 = schema.TensorConvertInfoT()
        to4.source, to4.dest = schema.MNN_DATA_FORMAT.NCHW, schema.MNN_DATA_FORMAT.NC4HW4
        model.add_op(Op("ConvertTensor", f"to4_{k}", [x], [x4], to4))
        conv = schema.Convolution2DT()
        conv.common = schema.Convolution2DCommonT()
        conv.common.inputCount, conv.common.outputCount = in_ch, out_ch
        q = schema.IDSTQuanT()
        q.type, q.aMaxOrBits, q.quantScale = 1, spec["bits"], 1.0
        q.aMin, q.readType = (0, 0) if spec["symmetric"] else (1, out_ch * (in_ch // spec["block"]))
        q.scaleStorage = schema.ScaleStorageType.FP16 if spec.get("alpha_fp16") else schema.ScaleStorageType.FP32
        conv.quanParameter = q
        conv.external = np.array(external, "<i8")
        model.add_op(Op("Convolution", f"conv{k}", [x4], [y4], conv))
        back = schema.TensorConvertInfoT()
        back.source, back.dest = schema.MNN_DATA_FORMAT.NC4HW4, schema.MNN_DATA_FORMAT.NCHW
        model.add_op(Op("ConvertTensor", f"from4_{k}", [y4], [y], back))
        model.output_names.append(f"y{k}")
    weight_path.write_bytes(bytes(blob))
    return model, expected


SYNTHETIC = [
    {"out": 24, "in": 64, "bits": 8, "block": 32, "symmetric": True, "bias": True},
    {"out": 24, "in": 64, "bits": 8, "block": 64, "symmetric": False},
    {"out": 16, "in": 96, "bits": 4, "block": 32, "symmetric": True, "bias": True},
    {"out": 16, "in": 96, "bits": 4, "block": 96, "symmetric": False, "bias": True},
    {"out": 8, "in": 64, "bits": 2, "block": 16, "symmetric": False},
    {"out": 8, "in": 64, "bits": 3, "block": 64, "symmetric": True},
]


@pytest.mark.parametrize(
    "spec", SYNTHETIC, ids=lambda s: f"int{s['bits']}-b{s['block']}-{'sym' if s['symmetric'] else 'asym'}"
)
def test_synthetic_quantization_matches_mnn_and_encoder(spec: dict, tmp_path: Path) -> None:
    model, [(deq, bias)] = conv_model([spec], tmp_path / "m.mnn.weight")
    path = save_model(model, tmp_path / "m.mnn")
    (cw,) = iter_conv_weights(load_model(path))
    np.testing.assert_allclose(cw.weight, deq, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(cw.bias, bias)
    assert cw.quant.bits == spec["bits"] and cw.quant.symmetric == spec["symmetric"]
    assert cw.quant.block_size == spec["block"]
    x = np.random.default_rng(9).standard_normal((3, spec["in"])).astype(np.float32)
    (got,) = run_module(path, tmp_path / "m.mnn.weight", ["x0"], ["y0"], [x.reshape(3, -1, 1, 1)])
    ours = x @ cw.weight.T + cw.bias
    rel = np.abs(got.reshape(3, -1) - ours).max() / np.abs(ours).max()
    assert rel < 1e-4, rel


def test_fp16_scales_decode(tmp_path: Path) -> None:
    spec = {"out": 8, "in": 64, "bits": 4, "block": 32, "symmetric": False, "alpha_fp16": True}
    model, [(deq, _)] = conv_model([spec], tmp_path / "m.mnn.weight")
    with WeightFile(tmp_path / "m.mnn.weight") as wf:
        cw = decode_conv(model.ops_of_type("Convolution")[0], wf)
    assert cw.quant.alpha_dtype == "fp16"
    np.testing.assert_allclose(cw.weight, deq, rtol=0, atol=1e-6)


def test_inline_buffers_and_float_weights() -> None:
    """Quantized data inside the .mnn (IDSTQuan.buffer/alpha), raw int8 (type 4), fp16 (type 3), float."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 32)).astype(np.float32)
    wbytes, abytes, deq = encode_idst(w, 8, 32, True)

    def conv_op(q: object | None, weight: np.ndarray | None = None) -> Op:
        conv = schema.Convolution2DT()
        conv.common = schema.Convolution2DCommonT()
        conv.common.inputCount, conv.common.outputCount = 32, 4
        conv.quanParameter, conv.weight = q, weight
        conv.bias = np.arange(4, dtype=np.float32)
        return Op("Convolution", "c", [0], [1], conv)

    q1 = schema.IDSTQuanT()
    q1.type, q1.quantScale = 1, 1.0
    q1.buffer = np.frombuffer(wbytes, np.int8)
    q1.alpha = np.frombuffer(abytes, "<f4")
    got = decode_conv(conv_op(q1), None)
    np.testing.assert_allclose(got.weight, deq, atol=1e-6)
    np.testing.assert_array_equal(got.bias, np.arange(4, dtype=np.float32))

    q4 = schema.IDSTQuanT()
    q4.type, q4.quantScale = 4, 1.0
    ints = rng.integers(-127, 128, size=(4, 32)).astype(np.int8)
    q4.buffer = ints.reshape(-1)
    q4.alpha = np.array([0.5, 1.0, 2.0, 0.25], np.float32)
    np.testing.assert_array_equal(decode_conv(conv_op(q4), None).weight, ints * q4.alpha[:, None])

    q3 = schema.IDSTQuanT()
    q3.type = 3
    q3.buffer = w.astype("<f2").view(np.int8).reshape(-1)
    np.testing.assert_array_equal(decode_conv(conv_op(q3), None).weight, w.astype(np.float16).astype(np.float32))

    plain = decode_conv(conv_op(None, w.reshape(-1)), None)
    np.testing.assert_array_equal(plain.weight, w)
    assert plain.quant.bits == 32


def test_external_float_weights(tmp_path: Path) -> None:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([1, 2, 3], np.float32)
    (tmp_path / "w").write_bytes(b"\x00" * 8 + w.tobytes() + b.tobytes())
    conv = schema.Convolution2DT()
    conv.common = schema.Convolution2DCommonT()
    conv.common.inputCount, conv.common.outputCount = 4, 3
    conv.external = np.array([8, w.nbytes, b.nbytes], "<i8")
    with WeightFile(tmp_path / "w") as wf:
        cw = decode_conv(Op("Convolution", "f", [0], [1], conv), wf)
    np.testing.assert_array_equal(cw.weight, w)
    np.testing.assert_array_equal(cw.bias, b)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
def test_unpack_codes_round_trip(bits: int) -> None:
    codes = np.random.default_rng(bits).integers(0, 2**bits, size=1001).astype(np.uint8)
    packed = np.packbits(np.unpackbits(codes[:, None], axis=1)[:, 8 - bits :].reshape(-1))
    np.testing.assert_array_equal(unpack_codes(packed, bits, codes.size), codes)


# ---- bad input ---------------------------------------------------------------------------------------


def test_weight_file_shorter_than_offsets(tmp_path: Path) -> None:
    src = MODEL_DIRS["tiny-qwen3"]
    shutil.copy(src / "llm.mnn", tmp_path / "llm.mnn")
    data = (src / "llm.mnn.weight").read_bytes()
    (tmp_path / "llm.mnn.weight").write_bytes(data[: len(data) // 2])
    model = load_model(tmp_path / "llm.mnn")
    with pytest.raises(MNNFormatError, match=r"llm\.mnn\.weight: op '.*' .* needs bytes \[\d+, \d+\)"):
        for _ in iter_conv_weights(model):
            pass


def test_missing_weight_file(tmp_path: Path) -> None:
    shutil.copy(MODEL_DIRS["tiny-qwen3"] / "llm.mnn", tmp_path / "llm.mnn")
    model = load_model(tmp_path / "llm.mnn")
    with pytest.raises(MNNFormatError, match="external weight file but none was given"):
        next(iter_conv_weights(model))
    with pytest.raises(MNNFormatError, match="cannot open weight file"):
        WeightFile(tmp_path / "llm.mnn.weight")


@pytest.mark.parametrize(("qtype", "message"), [(7, "unknown quantization type 7"), (2, "sparse")])
def test_unknown_quantization_type(qtype: int, message: str) -> None:
    model_dir = MODEL_DIRS["tiny-qwen3"]
    model = load_model(model_dir / "llm.mnn")
    op = conv_ops(model)[0]
    op.main.quanParameter.type = qtype
    with WeightFile(model_dir / "llm.mnn.weight") as wf, pytest.raises(MNNFormatError, match=message):
        decode_conv(op, wf)


def test_corrupt_weight_header(tmp_path: Path) -> None:
    model, _ = conv_model([SYNTHETIC[0]], tmp_path / "m.mnn.weight")
    data = bytearray((tmp_path / "m.mnn.weight").read_bytes())
    data[0] = 9  # ndim
    (tmp_path / "m.mnn.weight").write_bytes(bytes(data))
    with WeightFile(tmp_path / "m.mnn.weight") as wf, pytest.raises(MNNFormatError, match="9 dims"):
        decode_conv(model.ops_of_type("Convolution")[0], wf)


def test_bad_llm_config(tmp_path: Path) -> None:
    with pytest.raises(MNNFormatError, match="llm_config.json"):
        embedding_info(tmp_path)
    (tmp_path / "llm_config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(MNNFormatError, match="embeddings_bf16.bin"):
        embedding_info(tmp_path)


@pytest.mark.parametrize(("bits", "block", "symmetric"), [(4, 32, False), (8, 0, True), (3, 64, False)])
def test_library_quantizer_matches_llmexport_layout(bits: int, block: int, symmetric: bool, tmp_path: Path) -> None:
    w = np.random.default_rng(bits).standard_normal((8, 64)).astype(np.float32)
    ql = quantize_linear(w, bits, block, symmetric)
    wbytes, abytes, deq = encode_idst(w, bits, block or 64, symmetric)
    assert ql.weight_block == wbytes
    np.testing.assert_allclose(np.frombuffer(ql.alpha, "<f4"), np.frombuffer(abytes, "<f4"), rtol=1e-6)
    np.testing.assert_allclose(ql.dequantized, deq, atol=1e-6)
    assert np.abs(ql.dequantized - w).max() <= np.abs(w).max() / (2 ** (bits - 1) - 1)


@model_dirs
def test_parameter_count_of_a_conv_is_what_it_decodes_to(model_dir: Path) -> None:
    """The count the partition report shows per plugin, from shapes alone, equals the decoded weight and bias."""
    from mnnbuild.mnn.summary import op_parameter_count

    model = load_model(model_dir / "llm.mnn")
    with WeightFile(model_dir / "llm.mnn.weight") as weights:
        for op in conv_ops(model):
            decoded = decode_conv(op, weights)
            assert op_parameter_count(op) == decoded.weight.size + decoded.bias.size, op.name


@pytest.mark.parametrize("spec", [SYNTHETIC[1], SYNTHETIC[2]], ids=["int8-channel-asym", "int4-block-sym"])
def test_in_major_and_fp16_decode_hold_the_same_values(spec: dict, tmp_path: Path) -> None:
    """The layouts the QNN lowering asks for: same values, ``weight.T`` contiguous, fp16 rounded as astype does."""
    model, _ = conv_model([spec], tmp_path / "m.mnn.weight")
    op = model.ops_of_type("Convolution")[0]
    with WeightFile(tmp_path / "m.mnn.weight") as wf:
        plain = decode_conv(op, wf)
        io = decode_conv(op, wf, in_major=True)
        half = decode_conv(op, wf, dtype=np.float16, in_major=True)
    assert plain.weight.flags.c_contiguous and io.weight.T.flags.c_contiguous and half.weight.T.flags.c_contiguous
    np.testing.assert_array_equal(io.weight, plain.weight)
    assert half.weight.dtype == np.float16
    np.testing.assert_array_equal(half.weight, plain.weight.astype(np.float16))
    np.testing.assert_array_equal(half.bias, plain.bias)


def test_in_major_decode_holds_one_full_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An lm_head-like conv decoded for QNN peaks near one float32 copy of its weight (not two)."""
    import mnnbuild.mnn.weights as weights_module

    spec = {"out": 4096, "in": 512, "bits": 4, "block": 64, "symmetric": False}
    model, [(deq, _)] = conv_model([spec], tmp_path / "m.mnn.weight")
    op = model.ops_of_type("Convolution")[0]
    monkeypatch.setattr(weights_module, "_BLOCK_BYTES", 1 << 20)  # many blocks, as an lm_head has
    full = 4096 * 512 * 4
    with WeightFile(tmp_path / "m.mnn.weight") as wf:
        tracemalloc.start()
        try:
            cw = decode_conv(op, wf, in_major=True)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    np.testing.assert_allclose(cw.weight, deq, rtol=0, atol=1e-6)
    # the result, the unpacked codes (1 byte per weight) and one block of temporaries
    assert peak < full + full // 4 + (3 << 20), (peak, full)


# ---- a conv's own codes (what the NPU keeps with npu_weights int4/int8) ----------------------------------


@model_dirs
def test_conv_codes_are_the_stored_integers_and_scales(model_dir: Path) -> None:
    """Codes within the stored bit width, one scale group per block, and codes * scale + zero = MNN's weights."""
    bits, symmetric, block = EXPECTED_STORAGE[model_dir.name]
    model = load_model(model_dir / "llm.mnn")
    with WeightFile(model_dir / "llm.mnn.weight") as wf:
        for op in conv_ops(model):
            cc = conv_codes(op, wf)
            cw = decode_conv(op, wf)
            assert cc is not None and cc.bits == bits and (cc.zero is None) == symmetric
            in_ch = cw.weight.shape[1]
            assert cc.block == (block or in_ch)
            assert cc.codes.dtype == np.int8 and cc.codes.shape == cw.weight.shape
            assert -(1 << (bits - 1)) <= int(cc.codes.min()) and int(cc.codes.max()) < (1 << (bits - 1))
            assert cc.scale.shape == (cw.weight.shape[0], in_ch // cc.block)
            err = np.abs(cc.dequantized() - cw.weight).max() / np.abs(cw.weight).max()
            assert err < 1e-6, (op.name, err)
            np.testing.assert_array_equal(cc.bias, cw.bias)


def test_float_weights_have_no_codes() -> None:
    model = load_model(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")
    op = conv_ops(model)[0]
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    conv = op.main
    conv.quanParameter, conv.external, conv.weight = None, None, w.reshape(-1).tolist()
    conv.bias = [0.0, 0.0, 0.0]
    conv.common.outputCount, conv.common.inputCount = 3, 4
    assert conv_codes(op, None) is None
    np.testing.assert_array_equal(decode_conv(op, None).weight, w)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [0, 32])
@pytest.mark.parametrize("symmetric", [True, False])
def test_quantize_blocks_rounds_to_nearest(bits: int, block: int, symmetric: bool) -> None:
    w = np.random.default_rng(3).standard_normal((48, 96)).astype(np.float32)
    codes, scale, zero = quantize_blocks(w, bits, block, symmetric)
    blk = block or 96
    assert scale.shape == (48, 96 // blk) and (zero is None) == symmetric
    half = 1 << (bits - 1)
    assert int(codes.min()) >= -half and int(codes.max()) < half
    deq = codes.reshape(48, -1, blk).astype(np.float32) * scale[:, :, None]
    if zero is not None:
        deq += zero[:, :, None]
    err = np.abs(deq.reshape(48, 96) - w)
    # within half a step of the nearest code, everywhere
    assert (err <= np.repeat(scale, blk, axis=1) * 0.5 + 1e-6).all()
    assert err.max() > 0
