"""QNN C API layer: real Qualcomm libraries (onnxruntime-qnn), x86 HTP simulator, no network."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.base.errors import QnnError
from mnnbuild.qnn import (
    ContextBuilder,
    ContextRunner,
    HtpTarget,
    QnnLibrary,
    Quant,
    find_qnn_libraries,
    load_context,
    read_binary_info,
)

V79 = HtpTarget(69, 79)  # SM8750
V75 = HtpTarget(57, 75)  # SM8650
HIDDEN = 64


@pytest.fixture(scope="module")
def lib() -> QnnLibrary:
    return QnnLibrary()


@pytest.fixture(scope="module")
def weight() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((HIDDEN, HIDDEN)).astype(np.float32)


def build_fc(
    lib: QnnLibrary,
    weight: np.ndarray,
    graphs: list[tuple[str, int]],
    *,
    target: HtpTarget = V79,
    weight_sharing: bool = False,
) -> bytes:
    """One FullyConnected per graph, all naming their weight "fc.weight" (shareable)."""
    out_features, in_features = weight.shape
    with ContextBuilder(lib, target, weight_sharing=weight_sharing) as ctx:
        for name, rows in graphs:
            g = ctx.add_graph(name)
            x = g.add_input("t0", (rows, in_features))
            w = g.add_static("fc.weight", weight)
            y = g.add_output("t7", (rows, out_features))
            g.add_node("fc", "FullyConnected", [x, w], [y])
        return ctx.serialize()


@pytest.fixture(scope="module")
def fc_binary(lib: QnnLibrary, weight: np.ndarray) -> bytes:
    return build_fc(lib, weight, [("graph0", 4)])


def assert_close(got: np.ndarray, ref: np.ndarray) -> None:
    got64, ref64 = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    cos = float(got64 @ ref64 / (np.linalg.norm(got64) * np.linalg.norm(ref64)))
    max_err = float(np.abs(got64 - ref64).max())
    assert cos >= 0.999, cos
    assert max_err <= 0.02 * float(np.abs(ref64).max()), (max_err, float(np.abs(ref64).max()))


def test_library_found_with_versions(lib: QnnLibrary, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    paths = find_qnn_libraries()
    assert paths.backend.name == "libQnnHtp.so" and paths.system.name == "libQnnSystem.so"
    v = lib.version
    assert v.provider == "HTP_QTI_AISW"
    assert v.core_api[0] == 2 and v.core_api >= (2, 32, 0)
    assert v.build_id.startswith("v2.")
    assert v.as_dict()["core_api"] == ".".join(map(str, v.core_api))


def test_core_api_outside_the_checked_range_is_one_line(lib: QnnLibrary) -> None:
    """The installed library is inside the range the cffi layout was checked against; one outside it (a newer or
    older QNN release) is refused in one line naming its build, not misread."""
    from dataclasses import replace

    from mnnbuild.qnn.library import CHECKED_CORE_API, check_core_api

    check_core_api(lib.version, lib.paths.backend)
    (lo, hi) = CHECKED_CORE_API
    for api in ((hi[0], hi[1] + 1, 0), (lo[0], lo[1] - 1, 3)):
        other = replace(lib.version, core_api=api, build_id="v9.9.9.0")
        with pytest.raises(QnnError) as info:
            check_core_api(other, lib.paths.backend)
        message = str(info.value)
        assert "\n" not in message and "QNN build v9.9.9.0" in message
        assert f"core API {'.'.join(map(str, api))}" in message
        assert "onnxruntime-qnn>=2.7,<2.8" in message, message


def test_fc_binary_info(lib: QnnLibrary, fc_binary: bytes) -> None:
    info = read_binary_info(lib, fc_binary)
    assert info.graph_names == ["graph0"]
    g = info.graph("graph0")
    assert [(t.name, t.dims, t.dtype) for t in g.inputs] == [("t0", (4, HIDDEN), "float32")]
    assert [(t.name, t.dims, t.dtype) for t in g.outputs] == [("t7", (4, HIDDEN), "float32")]
    assert (info.soc_type, info.dsp_arch, info.soc_model) == ("SM8750", 79, 69)
    info.check_target(69, 79)
    # The upstream HTP graph settings are recorded per graph.
    assert g.htp is not None
    assert (g.htp.vtcm_bytes, g.htp.optimization_level, g.htp.hvx_threads) == (8 << 20, 3, 4)
    assert not info.weight_shared
    assert info.build_id == lib.version.build_id


def test_fc_executes_in_simulator(lib: QnnLibrary, fc_binary: bytes, weight: np.ndarray) -> None:
    x = np.random.default_rng(1).standard_normal((4, HIDDEN)).astype(np.float32)
    with load_context(lib, fc_binary) as runner:
        out = runner.execute("graph0", {"t0": x})
    assert list(out) == ["t7"]
    assert out["t7"].shape == (4, HIDDEN) and out["t7"].dtype == np.float32
    assert_close(out["t7"], x.astype(np.float64) @ weight.T.astype(np.float64))


def test_qnn_copies_the_binary_at_load(lib: QnnLibrary, fc_binary: bytes) -> None:
    """What lets the runner keep no copy of a (GB-sized) binary: after the load, zeroing and freeing the buffer
    it was loaded from changes no output."""
    x = np.random.default_rng(3).standard_normal((4, HIDDEN)).astype(np.float32)
    buffer = bytearray(fc_binary)
    with ContextRunner(lib, buffer) as runner:
        before = runner.execute("graph0", {"t0": x})["t7"]
        buffer[:] = bytes(len(buffer))
        del buffer
        gc.collect()
        after = runner.execute("graph0", {"t0": x})["t7"]
    assert np.array_equal(before, after)


def test_binary_view_is_the_serialized_binary(lib: QnnLibrary, weight: np.ndarray, fc_binary: bytes) -> None:
    """The context stage writes a binary straight from QNN's buffer (no copy of a GB-sized binary)."""
    with ContextBuilder(lib, V79) as ctx:
        g = ctx.add_graph("graph0")
        g.add_node("fc", "FullyConnected", [g.add_input("t0", (4, HIDDEN)), g.add_static("fc.weight", weight)],
                   [g.add_output("t7", (4, HIDDEN))])  # fmt: skip
        with ctx.binary_view() as view:
            assert isinstance(view, memoryview)
            info = read_binary_info(lib, view)
            copied = bytes(view)
        assert ctx.serialize() == copied  # the view is the binary, not a partial or stale buffer
    assert info.graph_names == ["graph0"] and len(copied) == len(fc_binary)


def test_two_inputs_native_tensor_and_params(lib: QnnLibrary) -> None:
    """Several inputs/outputs (tensor array stride), a NATIVE tensor, scalar and tensor params, int32 static."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((8, 16)).astype(np.float32)
    with ContextBuilder(lib, V79) as ctx:
        g = ctx.add_graph("mm")
        ta, tb = g.add_input("t1", a.shape), g.add_input("t2", b.shape)
        mm = g.add_native("mm_out", (8, 8))
        relu = g.add_output("t3", (8, 8))
        rows = g.add_output("t4", (2, 16))
        g.add_node("matmul", "MatMul", [ta, tb], [mm], {"transpose_in0": False, "transpose_in1": True})
        g.add_node("relu", "Relu", [mm], [relu])
        idx = g.add_static("rows.index", np.array([5, 1], dtype=np.int32))
        g.add_node("gather", "Gather", [ta, idx], [rows], {"axis": np.int32(0)})
        tr = g.add_output("t5", (16, 8))
        g.add_node("transpose", "Transpose", [tb], [tr], {"perm": np.array([1, 0], dtype=np.uint32)})
        binary = ctx.serialize()
    info = read_binary_info(lib, binary)
    g_info = info.graph("mm")
    assert [t.name for t in g_info.inputs] == ["t1", "t2"]
    assert [(t.name, t.dims) for t in g_info.outputs] == [("t3", (8, 8)), ("t4", (2, 16)), ("t5", (16, 8))]
    assert len({t.id for t in g_info.inputs + g_info.outputs}) == 5
    with ContextRunner(lib, binary, device=False) as runner:
        out = runner.execute("mm", {"t1": a, "t2": b})
    assert_close(out["t3"], np.maximum(a.astype(np.float64) @ b.T.astype(np.float64), 0.0))
    assert_close(out["t4"], a[[5, 1]])
    assert_close(out["t5"], b.T)


@pytest.mark.slow
def test_weight_sharing_keeps_one_copy(lib: QnnLibrary) -> None:
    # Big enough that weights, not per-graph overhead (~20 KB), dominate the size.
    weight = np.random.default_rng(4).standard_normal((512, 512)).astype(np.float32)
    decode_prefill = [("graph0", 1), ("graph1_0", 16)]
    shared = build_fc(lib, weight, decode_prefill, weight_sharing=True)
    unshared = build_fc(lib, weight, decode_prefill, weight_sharing=False)
    prefill_alone = build_fc(lib, weight, [("graph1_0", 16)])
    assert len(shared) <= 1.2 * len(prefill_alone), (len(shared), len(prefill_alone))
    assert len(shared) < len(unshared)
    info = read_binary_info(lib, shared)
    assert info.graph_names == ["graph0", "graph1_0"]  # creation order is binary order
    assert info.weight_shared
    assert all(g.htp is not None and g.htp.shared_weights_size and g.htp.const_size == 0 for g in info.graphs)
    assert not read_binary_info(lib, unshared).weight_shared
    # The x86 library crashes the process on a shared binary: refused before QNN sees it.
    with pytest.raises(QnnError, match="weight-shared"):
        load_context(lib, shared)
    # The unshared twin runs both graphs.
    x = np.random.default_rng(3).standard_normal((16, 512)).astype(np.float32)
    with load_context(lib, unshared) as runner:
        assert_close(runner.execute("graph1_0", {"t0": x})["t7"], x.astype(np.float64) @ weight.T)


def test_v75_build_is_tagged_differently(lib: QnnLibrary, weight: np.ndarray, fc_binary: bytes) -> None:
    v75 = read_binary_info(lib, build_fc(lib, weight, [("graph0", 4)], target=V75))
    v79 = read_binary_info(lib, fc_binary)
    assert (v75.soc_type, v75.dsp_arch, v75.soc_model) == ("SM8650", 75, 57)
    assert v75.soc_version != v79.soc_version
    with pytest.raises(QnnError, match="v75"):
        v75.check_target(57, 79)


def test_missing_library_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path / "no-sdk"))
    with pytest.raises(QnnError, match="QNN_SDK_ROOT"):
        QnnLibrary()
    monkeypatch.delenv("QNN_SDK_ROOT")
    with pytest.raises(QnnError, match="onnxruntime-qnn"):
        QnnLibrary(tmp_path)


def test_finalize_failure_names_graph_and_qnn_message(lib: QnnLibrary, caplog: pytest.LogCaptureFixture) -> None:
    with ContextBuilder(lib, V79) as ctx:
        g = ctx.add_graph("broken_graph")
        x = g.add_input("t0", (1, 8))
        y = g.add_output("t1", (1, 8))
        g.add_node("mystery", "NoSuchOp", [x], [y])
        with caplog.at_level(logging.ERROR, logger="mnnbuild.qnn.lib"), pytest.raises(QnnError) as err:
            g.finalize()
    text = str(err.value)
    assert "broken_graph" in text and "graphFinalize" in text
    assert "could not create op" in text  # QNN's own words, via the log callback
    assert any("NoSuchOp" in r.getMessage() for r in caplog.records)  # routed to Python logging
    assert ctx._closed and ctx.session._closed


def test_bad_inputs(lib: QnnLibrary, fc_binary: bytes) -> None:
    with pytest.raises(QnnError, match="context binary"):
        read_binary_info(lib, b"not a context binary" * 50)
    with pytest.raises(QnnError, match="dsp arch"):
        HtpTarget(69, 77)
    with pytest.raises(QnnError, match="unknown SoC"):
        HtpTarget.for_soc("SM0000")
    assert HtpTarget.for_soc("sm8750") == V79
    with load_context(lib, fc_binary) as runner:
        with pytest.raises(QnnError, match="missing"):
            runner.execute("graph0", {})
        with pytest.raises(QnnError, match="expected"):
            runner.execute("graph0", {"t0": np.zeros((3, 3), np.float32)})
        with pytest.raises(QnnError, match="no graph"):
            runner.execute("nope", {"t0": np.zeros((4, HIDDEN), np.float32)})
    with ContextBuilder(lib, V79) as ctx:
        g = ctx.add_graph("g")
        g.add_input("t0", (1, 4))
        with pytest.raises(QnnError, match="already exists"):
            g.add_input("t0", (1, 4))
        with pytest.raises(QnnError, match="needs a Quant"):
            g.add_static("q", np.zeros(4, np.uint8), dtype="ufixed8")
        with pytest.raises(QnnError, match="declared"):
            g.add_static("f", np.zeros(4, np.float64), dtype="float32")
        # Quantized statics, per tensor and per channel, are accepted by QNN.
        g.add_static("q8", np.arange(8, dtype=np.uint8).reshape(2, 4), dtype="ufixed8", quant=Quant(0.1, -128))
        g.add_static("qc", np.zeros((2, 4), np.int8), dtype="sfixed8", quant=Quant([0.1, 0.2], 0, axis=0))
        with pytest.raises(QnnError, match="graphAddNode"):
            g.add_node("bad", "Relu", ["t0"], ["q8"])  # a static tensor cannot be an output


def test_int8_weight_fc_matches_dequantized(lib: QnnLibrary, weight: np.ndarray) -> None:
    """Weight-only int8 (per output channel) in an fp16 graph: matches the dequantized weight."""
    scale = np.abs(weight).max(axis=1) / 127.0
    w_q = np.round(weight / scale[:, None]).astype(np.int8)
    with ContextBuilder(lib, V79) as ctx:
        g = ctx.add_graph("q")
        x = g.add_input("t0", (4, HIDDEN))
        w = g.add_static("fc.weight", w_q, dtype="sfixed8", quant=Quant(scale.tolist(), 0, axis=0))
        y = g.add_output("t1", (4, HIDDEN))
        g.add_node("fc", "FullyConnected", [x, w], [y])
        binary = ctx.serialize()
    x_in = np.random.default_rng(5).standard_normal((4, HIDDEN)).astype(np.float32)
    with load_context(lib, binary) as runner:
        out = runner.execute("q", {"t0": x_in})["t1"]
    assert_close(out, x_in.astype(np.float64) @ (w_q * scale[:, None]).T.astype(np.float64))


def test_precompiled_ffi_matches_the_declarations() -> None:
    # the committed out-of-line module must be what the current _cdefs.py compiles to
    from mnnbuild.qnn.regen_ffi import OUT_FILE, generate

    assert generate() == OUT_FILE.read_text(), "run: python -m mnnbuild.qnn.regen_ffi"


def test_quantization_structs_have_the_header_layout(lib: QnnLibrary) -> None:
    """The encodings the quantized NPU weights use, laid out as QnnTypes.h (API 2.32, x86_64/aarch64) declares them:
    a wrong offset would hand QNN another tensor's scales, not fail."""
    ffi = lib.ffi
    assert ffi.sizeof("Qnn_FloatScaleOffset_t") == 8
    assert ffi.sizeof("Qnn_BlockEncoding_t") == 16
    assert ffi.sizeof("Qnn_BwAxisScaleOffset_t") == 32
    assert [ffi.offsetof("Qnn_BwAxisScaleOffset_t", f) for f in ("axis", "numElements", "scales", "offsets")] == [
        4,
        8,
        16,
        24,
    ]
    assert ffi.sizeof("Qnn_BwFloatBlockEncoding_t") == 24
    assert [ffi.offsetof("Qnn_BwFloatBlockEncoding_t", f) for f in ("blockSize", "floatScaleOffset")] == [8, 16]
    assert ffi.sizeof("Qnn_QuantizeParams_t") == 40 and ffi.offsetof("Qnn_QuantizeParams_t", "blockEncoding") == 8
    assert ffi.sizeof("Qnn_TensorV1_t") == 112


def _quantized_conv(kind: str, w: np.ndarray, block: int) -> tuple[np.ndarray, str, Quant | None, np.ndarray]:
    """HWIO data, its QNN type, its quantization and the weights it stands for, in each encoding the lowering uses."""
    from mnnbuild.mnn.weights import quantize_blocks

    out_ch, in_ch = w.shape
    if kind == "float32":
        return np.ascontiguousarray(w.T).reshape(1, 1, in_ch, out_ch), "float32", None, w
    bits, blk, symmetric = {"block": (4, block, True), "bw_float_block": (4, block, False)}.get(kind, (4, 0, True))
    if kind == "axis8":
        bits = 8
    q, scale, zero = quantize_blocks(w, bits, blk, symmetric)
    deq = q.reshape(out_ch, -1, blk or in_ch).astype(np.float64) * scale[:, :, None]
    if zero is not None:
        deq += zero[:, :, None]
    data = np.ascontiguousarray(q.T).reshape(1, 1, in_ch, out_ch)
    quant = {
        "block": Quant(scale.reshape(-1), 0, block_size=[1, 1, block, 1], bitwidth=4),
        "bw_float_block": Quant(
            scale.reshape(-1),
            (zero / scale).reshape(-1) if zero is not None else 0,
            block_size=[1, 1, block, 1],
            bitwidth=4,
            float_offset=True,
        ),
        "bw_axis4": Quant(scale.reshape(-1), 0, axis=3, bitwidth=4),
        "axis8": Quant(scale.reshape(-1), 0, axis=3),
    }[kind]
    return data, "sfixed8", quant, deq.reshape(out_ch, in_ch)


@pytest.mark.parametrize("kind", ["block", "bw_float_block", "bw_axis4", "axis8"])
def test_quantized_conv_weights_in_the_cast_form(lib: QnnLibrary, kind: str) -> None:
    """Each weight encoding in a 1x1 Conv2d between Casts to and from fp16 (the form the HTP finalizes) computes
    with the weights it encodes, in a binary smaller than the float one by what the codes save."""
    in_ch, out_ch, rows, block = 256, 128, 4, 64
    w = np.random.default_rng(0).standard_normal((out_ch, in_ch)).astype(np.float32)
    x_in = np.random.default_rng(1).standard_normal((1, 1, rows, in_ch)).astype(np.float32)
    sizes, results = {}, {}
    for variant in ("float32", kind):
        data, dtype, quant, deq = _quantized_conv(variant, w, block)
        ft = "float32" if quant is None else "float16"
        with ContextBuilder(lib, V79) as ctx:
            g = ctx.add_graph("g")
            x = g.add_input("x", (1, 1, rows, in_ch))
            y = g.add_output("y", (1, 1, rows, out_ch))
            xi, yo = x, y
            if quant is not None:
                xi = g.add_native("x16", (1, 1, rows, in_ch), "float16")
                g.add_node("cast_in", "Cast", [x], [xi])
                yo = g.add_native("y16", (1, 1, rows, out_ch), "float16")
            weight = g.add_static("w", data, dtype, quant=quant)
            bias = g.add_static("b", np.zeros(out_ch, ft))
            conv = {"stride": np.array([1, 1], np.uint32), "pad_amount": np.zeros((2, 2), np.uint32)}
            g.add_node("conv", "Conv2d", [xi, weight, bias], [yo], conv)
            if quant is not None:
                g.add_node("cast_out", "Cast", [yo], [y])
            binary = ctx.serialize()
        with load_context(lib, binary) as runner:
            out = runner.execute("g", {"x": x_in})["y"].reshape(rows, out_ch).astype(np.float64)
        ref = x_in.reshape(rows, in_ch).astype(np.float64) @ deq.T
        results[variant] = float(np.abs(out - ref).max() / np.abs(ref).max())
        sizes[variant] = len(binary)
    assert results[kind] < 2e-3, results  # fp16 arithmetic on the encoded weights, not int4 rounding (~1e-1)
    weight_bytes = in_ch * out_ch * 2  # fp16 weights in the float binary
    saved = sizes["float32"] - sizes[kind]
    expected = weight_bytes * (0.5 if kind == "axis8" else 0.75)  # 1 byte or half a byte per weight
    assert 0.8 * expected <= saved <= 1.2 * expected, (sizes, expected)


def test_every_name_of_the_api_resolves() -> None:
    """`mnnbuild.qnn` imports its modules on first use: each name it lists comes from one of them."""
    import mnnbuild.qnn as qnn

    assert all(getattr(qnn, name) is not None for name in qnn.__all__)
    with pytest.raises(AttributeError):
        qnn.NoSuchName  # noqa: B018
