"""The bundle runtime (runtime/mnnbuild_runtime): CPU segments in MNN, QNN plugins in the HTP simulator.

Self-contained: a small MNN graph made with MNN.expr gets two of its MatMuls replaced by QNN Plugin ops
(decode and prefill shape each) with real context binaries, weight-shared as shipped plus unshared twins;
and the shipped tiny Qwen3 gets its first q_proj Convolution replaced the same way (an NC4HW4 boundary).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mnnbuild_runtime import (
    BinaryCheckError,
    BinaryOverride,
    Bundle,
    BundleError,
    Embeddings,
    HybridModel,
    PluginShapeError,
    Segment,
    Tokenizer,
    cpu_forward_fn,
    cpu_greedy_generate,
    follow_draft,
    greedy_generate,
    kv_cache_draft,
    kv_cache_redraft,
    llm_inputs,
    loop_redraft,
    recompute_generate,
)

from mnnbuild.cpu import CpuRuntime, import_mnn, load_module, to_numpy, to_var
from mnnbuild.mnn import WeightFile, decode_conv, load_model, make_blob, make_plugin_op, read_embeddings, save_model
from mnnbuild.qnn import ContextBuilder, HtpTarget, QnnLibrary
from tests.conftest import RunDoit

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TINY = PROJECT_ROOT / "models" / "tiny-qwen3"
TARGET = HtpTarget.for_soc("SM8750")
DECODE, PREFILL = 1, 4


def close_enough(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(cosine, max abs error relative to the reference's max abs): fp16 tolerance is 0.999 / 2%."""
    g, r = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    cos = float(g @ r / (np.linalg.norm(g) * np.linalg.norm(r)))
    rel = float(np.abs(g - r).max() / np.abs(r).max())
    return cos, rel


def assert_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    cos, rel = close_enough(got, ref)
    assert cos >= 0.999 and rel <= 0.02, f"{what}: cosine {cos:.6f}, max abs err {rel:.4%} of ref max"


# ---- the synthetic bundle ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Synthetic:
    original: Path  # the MNN graph before partitioning
    bundle: Path  # bundle model dir, weight-shared binaries as shipped
    twins: dict[str, bytes]  # plugin path -> unshared twin
    shared: dict[str, bytes]


def _linear_binary(lib: QnnLibrary, shared: bool, graphs: list[tuple[str, int]], names: tuple[str, str], w, b) -> bytes:
    """One plugin's context: y = x @ w (+ b) as a FullyConnected, one graph per (name, rows)."""
    x_name, y_name = names
    with ContextBuilder(lib, TARGET, weight_sharing=shared) as ctx:
        for gname, rows in graphs:
            g = ctx.add_graph(gname)
            x = g.add_input(x_name, (rows, w.shape[0]))
            ins = [x, g.add_static("weight", np.ascontiguousarray(w.T))]
            if b is not None:
                ins.append(g.add_static("bias", b))
            y = g.add_output(y_name, (rows, w.shape[1]))
            g.add_node("fc", "FullyConnected", ins, [y])
        return ctx.serialize()


@pytest.fixture(scope="module")
def qnn_lib() -> QnnLibrary:
    return QnnLibrary()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory, qnn_lib: QnnLibrary) -> Synthetic:
    root = tmp_path_factory.mktemp("synthetic")
    F = import_mnn().expr
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((8, 16)).astype(np.float32) * 0.5
    b1 = rng.standard_normal(16).astype(np.float32)
    w2 = rng.standard_normal((16, 8)).astype(np.float32) * 0.5
    x = F.placeholder([-1, 8], F.NCHW, F.float)
    x.name = "x"
    h = F.relu(x)
    h.name = "h"
    y1 = F.matmul(h, F.const(w1, [8, 16], F.NCHW, F.float)) + F.const(b1, [16], F.NCHW, F.float)
    y1.name = "y1"
    t = F.tanh(y1)
    t.name = "t"
    y2 = F.matmul(t, F.const(w2, [16, 8], F.NCHW, F.float))
    y2.name = "y2"
    out = y2 + x
    out.name = "out"
    hid = y1 * F.scalar(0.5)
    hid.name = "hid"
    original = root / "original.mnn"
    F.save([out, hid], str(original))

    model = load_model(original)
    model.output_names = ["out", "hid"]
    idx = model.tensor_index
    # ops that the two plugins replace: h -> y1 (Cast, MatMul, add bias) and t -> y2 (Cast, MatMul)
    cut = [("h", "y1"), ("t", "y2")]
    plugins = []
    for k, (src, dst) in enumerate(cut):
        start = next(i for i, op in enumerate(model.ops) if idx(src) in op.inputs)
        end = next(i for i, op in enumerate(model.ops) if idx(dst) in op.outputs)
        plugins.append((k, start, end, idx(src), idx(dst)))
    dims = {"h": 8, "y1": 16, "t": 16, "y2": 8}
    bundle = root / "bundle" / "model" / "Synth"
    (bundle / "qnn").mkdir(parents=True)
    twins, shared = {}, {}
    for k, start, end, a, b in reversed(plugins):
        src, dst = model.tensor_names[a], model.tensor_names[b]
        removed = model.ops[start : end + 1]
        consts = {t for op in removed for t in op.inputs if t != a}
        attrs = {
            "path": f"qnn/graphllm{k}.bin",
            "inputs": [f"t{a}"],
            "outputs": [f"t{b}"],
            "allGraphName": [f"graphllm{k}", f"graphllm1_{k}"],
            "allInputShape": [DECODE, dims[src], PREFILL, dims[src]],
            "o_0_0": make_blob([DECODE, dims[dst]]),
            "o_1_0": make_blob([PREFILL, dims[dst]]),
        }
        model.ops[start : end + 1] = [make_plugin_op(f"qnn{k}", [a], [b], attrs)]
        model.delete_ops(lambda op, consts=consts: op.type == "Const" and bool(set(op.outputs) & consts))
        w, bias = (w1, b1) if k == 0 else (w2, None)
        graphs = [(f"graphllm{k}", DECODE), (f"graphllm1_{k}", PREFILL)]
        path = attrs["path"]
        shared[path] = _linear_binary(qnn_lib, True, graphs, (f"t{a}", f"t{b}"), w, bias)
        twins[path] = _linear_binary(qnn_lib, False, graphs, (f"t{a}", f"t{b}"), w, bias)
        (bundle / path).write_bytes(shared[path])
    save_model(model, bundle / "qnn" / "llm.mnn")
    (bundle / "config_qnn.json").write_text(
        json.dumps({"llm_model": "qnn/llm.mnn", "backend_type": "cpu", "chunk_limits": [PREFILL, DECODE]})
    )
    return Synthetic(original, bundle, twins, shared)


def reference(original: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    rt = CpuRuntime().create()
    module = load_module(original, rt, ["x"], ["out", "hid"])
    outs = module.forward([to_var(x)])
    return {"out": to_numpy(outs[0]), "hid": to_numpy(outs[1])}


@pytest.fixture
def bundle_copy(synthetic: Synthetic, tmp_path: Path) -> Path:
    """A private copy of the synthetic bundle, for tests that break it."""
    dest = tmp_path / "Synth"
    shutil.copytree(synthetic.bundle, dest)
    return dest


def test_bundle_open_decodes_plugins(synthetic: Synthetic) -> None:
    bundle = Bundle.open(synthetic.bundle)
    assert [p.name for p in bundle.plugins] == ["qnn0", "qnn1"]
    p0 = bundle.plugins[0]
    assert p0.path == "qnn/graphllm0.bin" and p0.file == synthetic.bundle / "qnn" / "graphllm0.bin"
    assert p0.input_tensors == ("h",) and p0.output_tensors == ("y1",)
    assert p0.graph_names == ("graphllm0", "graphllm1_0")
    assert p0.input_shapes([2]) == [[(1, 8)], [(4, 8)]]
    assert [d.dims for d in p0.outputs[1]] == [(4, 16)]
    assert bundle.chunk_size == PREFILL and bundle.output_names == ["out", "hid"]


def test_plan_alternates_mnn_segments_and_plugins(synthetic: Synthetic) -> None:
    with HybridModel(synthetic.bundle, binary_overrides=synthetic.twins) as model:
        kinds = [(type(s).__name__, s.name) for s in model.steps]
        assert kinds == [
            ("Segment", "cpu0"),
            ("PluginStep", "qnn0"),
            ("Segment", "cpu1"),
            ("PluginStep", "qnn1"),
            ("Segment", "cpu2"),
        ]
        segs = [s for s in model.steps if isinstance(s, Segment)]
        assert segs[0].inputs == ("x",) and segs[0].outputs == ("h",)
        assert segs[1].inputs == ("y1",) and set(segs[1].outputs) == {"t", "hid"}
        assert set(segs[2].inputs) == {"y2", "x"} and segs[2].outputs == ("out",)


@pytest.mark.parametrize("seq", [DECODE, PREFILL])
def test_hybrid_forward_matches_mnn(synthetic: Synthetic, qnn_lib: QnnLibrary, seq: int) -> None:
    x = np.random.default_rng(seq).standard_normal((seq, 8)).astype(np.float32)
    ref = reference(synthetic.original, x)
    with HybridModel(
        synthetic.bundle, binary_overrides=synthetic.twins, qnn_lib=qnn_lib, expected_target=TARGET
    ) as model:
        result = model.run({"x": x}, capture=True)
        for name in ("out", "hid"):
            assert_close(result.outputs[name], ref[name], f"{name} seq {seq}")
        graphs = [(s.name, s.graph) for s in result.steps if s.kind == "qnn"]
        k = 0 if seq == DECODE else 1
        assert graphs == [("qnn0", ["graphllm0", "graphllm1_0"][k]), ("qnn1", ["graphllm1", "graphllm1_1"][k])]
        assert result.qnn_seconds > 0 and result.mnn_seconds > 0
        assert result.plugin_io["qnn0"]["inputs"]["t" + str(model.bundle.model.tensor_index("h"))].shape == (seq, 8)
        report = model.report()
    plugin = report["plugins"][0]
    assert plugin["executed"] == "override" and plugin["executed_source"] == "<bytes>"
    assert plugin["shipped_weight_shared"] is True
    assert plugin["target"] == {"soc_model": 69, "soc_type": "SM8750", "dsp_arch": 79}
    assert plugin["calls"] == {["graphllm0", "graphllm1_0"][k]: 1}
    assert [s["segment"] for s in report["segments"]] == ["cpu0", "cpu1", "cpu2"]


def test_a_plugin_fed_what_it_ran_on_in_the_same_call_runs_once(synthetic: Synthetic, qnn_lib: QnnLibrary) -> None:
    """run_many: an input that feeds a plugin the bytes an earlier input of the call fed it takes that run's outputs
    (the simulator is deterministic) instead of running it again; any other input runs, and every result is as its
    own pass would be."""
    rng = np.random.default_rng(11)
    x, other = (rng.standard_normal((PREFILL, 8)).astype(np.float32) for _ in range(2))
    with HybridModel(
        synthetic.bundle, binary_overrides=synthetic.twins, qnn_lib=qnn_lib, expected_target=TARGET
    ) as model:
        first, again, different = model.run_many([{"x": x}, {"x": x.copy()}, {"x": other}], capture=True)
        report = model.report()
    for result, feed in ((first, x), (again, x), (different, other)):
        ref = reference(synthetic.original, feed)
        for name in ("out", "hid"):
            assert_close(result.outputs[name], ref[name], name)
    assert all(np.array_equal(first.outputs[n], again.outputs[n]) for n in ("out", "hid"))
    assert again.qnn_seconds == 0.0 and first.qnn_seconds > 0 and different.qnn_seconds > 0
    assert [(s.name, s.graph) for s in again.steps if s.kind == "qnn"] == [
        (s.name, s.graph) for s in first.steps if s.kind == "qnn"
    ]
    assert set(again.plugin_io) == {"qnn0", "qnn1"}
    assert [p["calls"] for p in report["plugins"]] == [{"graphllm1_0": 2}, {"graphllm1_1": 2}]


def test_unshared_shipped_binary_runs_as_shipped(synthetic: Synthetic, bundle_copy: Path, qnn_lib: QnnLibrary) -> None:
    for path, twin in synthetic.twins.items():
        (bundle_copy / path).write_bytes(twin)
    x = np.ones((PREFILL, 8), dtype=np.float32)
    with HybridModel(bundle_copy, qnn_lib=qnn_lib) as model:
        assert_close(model.forward({"x": x})["out"], reference(synthetic.original, x)["out"], "out")
        assert {p["executed"] for p in model.report()["plugins"]} == {"shipped"}


def test_override_from_file_is_reported(synthetic: Synthetic, tmp_path: Path, qnn_lib: QnnLibrary) -> None:
    files = {}
    for path, twin in synthetic.twins.items():
        f = tmp_path / Path(path).name
        f.write_bytes(twin)
        files[path] = f
    overrides = {
        "qnn/graphllm0.bin": BinaryOverride(files["qnn/graphllm0.bin"], shipped_sha256=None),
        "qnn/graphllm1.bin": files["qnn/graphllm1.bin"],
    }
    with HybridModel(synthetic.bundle, binary_overrides=overrides, qnn_lib=qnn_lib) as model:
        reports = model.check_binaries()
    assert [r["executed_source"] for r in reports] == [str(files["qnn/graphllm0.bin"]), str(files["qnn/graphllm1.bin"])]
    assert all(r["executed"] == "override" and r["shipped_sha256"] for r in reports)


def test_a_known_hash_holds_only_while_the_file_keeps_its_stamp(tmp_path: Path) -> None:
    """A hash known with a file's stamp (size, mtime, ctime, inode) is taken as long as the stamp holds, never
    further: an in-place rewrite of the same size with the mtime put back moves the ctime, and is hashed anew;
    what is hashed is remembered per file part; bytes of no file are always hashed."""
    from mnnbuild_runtime import FileHashes, KnownHash
    from mnnbuild_runtime.hashes import read_stamped

    from mnnbuild.base.fsutil import sha256_bytes

    path = tmp_path / "graph.bin"
    path.write_bytes(bytes(range(256)) * 64)
    with open(path, "rb") as fh:
        data, stamp = read_stamped(fh)
    assert stamp is not None
    hashes = FileHashes({path: KnownHash("0" * 64, stamp)})  # a wrong hash shows it is taken, not recomputed
    assert hashes.digest(path, data, stamp) == "0" * 64 and (hashes.hashed, hashes.trusted) == (0, 1)
    time.sleep(0.05)  # past the file system's timestamp tick: the rewrite gets another ctime
    st = path.stat()
    flipped = bytearray(data)
    flipped[100] ^= 0x01
    with open(path, "r+b") as fh:  # in place: same inode, same size
        fh.write(flipped)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with open(path, "rb") as fh:
        data, now = read_stamped(fh)
    assert data == bytes(flipped) and now is not None and now != stamp
    assert hashes.digest(path, data, now) == sha256_bytes(data) and hashes.hashed == 1
    assert hashes.digest(path, data, now) == sha256_bytes(data) and hashes.hashed == 1, "remembered with its stamp"
    assert hashes.digest(path, data[:10], now, 0, 10) == sha256_bytes(data[:10]) and hashes.hashed == 2
    assert hashes.digest(None, data, None) == sha256_bytes(data) and hashes.hashed == 3


def test_each_binary_is_hashed_once_however_often_it_loads(
    synthetic: Synthetic, bundle_copy: Path, tmp_path: Path, qnn_lib: QnnLibrary
) -> None:
    """One plugin context loaded at a time and three forwards: each context loads three times, its binaries are
    read at each load and checked against the hash of the bytes checked first, hashed only once each; a twin
    replaced after the check (its mtime put back) is hashed again and refused."""
    twins = {}
    for path, twin in synthetic.twins.items():
        twins[path] = tmp_path / Path(path).name
        twins[path].write_bytes(twin)
    x = np.ones((PREFILL, 8), dtype=np.float32)
    with HybridModel(bundle_copy, binary_overrides=twins, qnn_lib=qnn_lib, max_loaded=1) as model:
        for _ in range(3):
            model.forward({"x": x})
        assert [r.loads for r in model.plugins.values()] == [3, 3]
        assert model.hashes.hashed == 4, "a shipped binary and a twin per plugin, once each"
        assert model.hashes.trusted == 6, "every load after the check took the hash of the unchanged file"
        target = twins["qnn/graphllm1.bin"]
        st = target.stat()
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.unlink()
        target.write_bytes(bytes(data))
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(BinaryCheckError, match=r"qnn1.*changed after it was checked"):
            model.forward({"x": x})


def test_weight_shared_binary_without_override_is_refused(synthetic: Synthetic, qnn_lib: QnnLibrary) -> None:
    with HybridModel(synthetic.bundle, qnn_lib=qnn_lib) as model:
        with pytest.raises(BinaryCheckError, match=r"qnn0.*weight-shared.*binary_overrides"):
            model.forward({"x": np.ones((1, 8), dtype=np.float32)})


def test_shape_not_in_all_input_shape(synthetic: Synthetic, qnn_lib: QnnLibrary) -> None:
    with HybridModel(synthetic.bundle, binary_overrides=synthetic.twins, qnn_lib=qnn_lib) as model:
        with pytest.raises(PluginShapeError, match=r"plugin 'qnn0'.*\[\[3, 8\]\].*\[\[\[1, 8\]\], \[\[4, 8\]\]\]"):
            model.forward({"x": np.ones((3, 8), dtype=np.float32)})


def test_corrupt_binary_header_is_a_clear_error(synthetic: Synthetic, bundle_copy: Path, qnn_lib: QnnLibrary) -> None:
    path = bundle_copy / "qnn" / "graphllm1.bin"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # inside the header QnnSystem parses
    path.write_bytes(bytes(data))
    with HybridModel(bundle_copy, binary_overrides=synthetic.twins, qnn_lib=qnn_lib) as model:
        with pytest.raises(BinaryCheckError, match=r"plugin 'qnn1' \(qnn/graphllm1.bin\).*not a readable QNN context"):
            model.check_binaries()


def test_flipped_byte_is_caught_by_the_pinned_hash(
    synthetic: Synthetic, bundle_copy: Path, qnn_lib: QnnLibrary
) -> None:
    # QNN does not checksum its blobs: a flip in the payload reads fine; the recorded hash catches it
    path = bundle_copy / "qnn" / "graphllm0.bin"
    original_sha = __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    overrides = {p: BinaryOverride(t, shipped_sha256=original_sha if p == "qnn/graphllm0.bin" else None)
                 for p, t in synthetic.twins.items()}  # fmt: skip
    with HybridModel(bundle_copy, binary_overrides=overrides, qnn_lib=qnn_lib) as model:
        with pytest.raises(BinaryCheckError, match=r"qnn0.*sha256.*not the one the twin stands in for"):
            model.check_binaries()


def test_swapped_binaries_are_detected(synthetic: Synthetic, bundle_copy: Path, qnn_lib: QnnLibrary) -> None:
    a, b = bundle_copy / "qnn" / "graphllm0.bin", bundle_copy / "qnn" / "graphllm1.bin"
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    with HybridModel(bundle_copy, binary_overrides=synthetic.twins, qnn_lib=qnn_lib) as model:
        with pytest.raises(BinaryCheckError, match=r"qnn0.*names graph 'graphllm0'.*\['graphllm1', 'graphllm1_1'\]"):
            model.check_binaries()


def _edit_plugin(bundle_dir: Path, name: str, **attrs: object) -> None:
    path = bundle_dir / "qnn" / "llm.mnn"
    model = load_model(path)
    op = model.op_by_name(name)
    from mnnbuild.mnn import make_attribute, plugin_attributes

    current = plugin_attributes(op)
    current.update(attrs)
    for key in [k for k, v in current.items() if v is None]:
        del current[key]
    op.main.attr = [make_attribute(k, current[k]) for k in sorted(current)]
    save_model(model, path)


def test_all_graph_name_naming_a_missing_graph(synthetic: Synthetic, bundle_copy: Path, qnn_lib: QnnLibrary) -> None:
    _edit_plugin(bundle_copy, "qnn1", allGraphName=["graphllm1", "graphllm9"])
    with HybridModel(bundle_copy, binary_overrides=synthetic.twins, qnn_lib=qnn_lib) as model:
        with pytest.raises(BinaryCheckError, match=r"qnn1.*names graph 'graphllm9'.*does not contain"):
            model.check_binaries()


def test_override_with_another_plugins_twin_is_refused(synthetic: Synthetic, qnn_lib: QnnLibrary) -> None:
    overrides = {"qnn/graphllm0.bin": synthetic.twins["qnn/graphllm1.bin"]}
    with HybridModel(synthetic.bundle, binary_overrides=overrides, qnn_lib=qnn_lib) as model:
        with pytest.raises(BinaryCheckError, match=r"qnn0.*override <bytes>.*names graph 'graphllm0'"):
            model.check_binaries()


def test_wrong_target_is_refused(synthetic: Synthetic, qnn_lib: QnnLibrary) -> None:
    target = HtpTarget.for_soc("SM8650")
    with HybridModel(synthetic.bundle, binary_overrides=synthetic.twins, qnn_lib=qnn_lib, expected_target=target) as m:
        with pytest.raises(BinaryCheckError, match=r"qnn0.*prepared for soc 69, expected 57"):
            m.check_binaries()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"o_1_0": None}, r"qnn0.*attribute 'o_1_0' missing"),
        ({"inputs": ["t1", "t2"]}, r"qnn0.*attribute 'inputs' has 2 names, expected 1"),
        ({"path": "qnn/nope.bin"}, r"qnn0.*'path' = 'qnn/nope.bin' but .*nope.bin does not exist"),
        ({"allInputShape": [1, 8, 4]}, r"qnn0.*'allInputShape' has 3 dims, not a multiple of the 2 shapes"),
        ({"state": "x"}, r"qnn0.*'state'.*not supported"),
        # issue 43, item 6: MNN's engine ignores an offset without a size and loads the whole file; so did we
        ({"offset": [1 << 30, 0]}, r"qnn0.*attribute 'offset' is 1073741824 without a 'size'"),
        ({"offset": [-8, -1]}, r"qnn0.*attribute 'offset' is 18446744073709551608 without a 'size'"),
        ({"offset": [0, 1], "size": [16, 0]}, r"qnn0.*'offset' 4294967296 and 'size' 16 reach byte 4294967312, but"),
        ({"size": [1 << 30, 0]}, r"qnn0.*'offset' 0 and 'size' 1073741824 reach byte 1073741824, but .* has \d+ bytes"),
        ({"offset": [1, 2, 3]}, r"qnn0.*attribute 'offset' must be a list of two ints"),
        ({"dump_intermediate_outputs": 1}, r"qnn0.*'dump_intermediate_outputs' is set: MNN's engine would write"),
    ],
)
def test_bad_plugin_attributes(bundle_copy: Path, edit: dict[str, object], message: str) -> None:
    _edit_plugin(bundle_copy, "qnn0", **edit)
    with pytest.raises(BundleError, match=message):
        Bundle.open(bundle_copy)


def test_bad_config(bundle_copy: Path) -> None:
    (bundle_copy / "config_qnn.json").write_text('{"llm_model": "qnn/other.mnn"}')
    with pytest.raises(BundleError, match=r"config_qnn.json: field 'llm_model' = 'qnn/other.mnn' but"):
        Bundle.open(bundle_copy)
    (bundle_copy / "config_qnn.json").unlink()
    with pytest.raises(BundleError, match=r"config_qnn.json: file missing"):
        Bundle.open(bundle_copy)


@pytest.mark.parametrize("limits", [[1_000_000_000, 1], [PREFILL, 3, DECODE]])
def test_chunk_limits_must_be_compiled_lengths(bundle_copy: Path, limits: list[int]) -> None:
    """A caller sizes its inputs by chunk_limits: [1000000000, 1] was accepted and the next call asked for 477 GiB.
    Every length must be one of the plugins' compiled shapes (allInputShape)."""
    config = json.loads((bundle_copy / "config_qnn.json").read_text())
    (bundle_copy / "config_qnn.json").write_text(json.dumps({**config, "chunk_limits": limits}))
    with pytest.raises(BundleError) as info:
        Bundle.open(bundle_copy)
    bad = max(n for n in limits if n not in (PREFILL, DECODE))
    assert str(info.value) == (
        f"{bundle_copy.resolve() / 'config_qnn.json'}: field 'chunk_limits' {limits} holds {bad}, but plugin 'qnn0' "
        f"(qnn/graphllm0.bin) was compiled for {sorted({DECODE, PREFILL})} tokens (attribute 'allInputShape'); "
        "expected lengths among them"
    )


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("hidden_size", "x", "field 'hidden_size' must be an integer, got 'x'"),
        ("hidden_size", 128.0, "field 'hidden_size' must be an integer, got 128.0"),
        ("tie_embeddings", [190794, "a", 16384, 4, 64], "field 'tie_embeddings' entry 1 must be an integer, got 'a'"),
        (
            "tie_embeddings",
            [190794, 256330.5, 16384, 4, 64],
            "field 'tie_embeddings' entry 1 must be an integer, got 256330.5",
        ),
        ("tie_embeddings", {"weight_offset": "1"}, "field 'tie_embeddings.weight_offset' must be an integer"),
        ("tie_embeddings", "yes", "field 'tie_embeddings' must be a list of 5 integers or an object, got 'yes'"),
        (
            "tie_embeddings",
            [190794, 256330, 16384, 4, 0],
            "field 'tie_embeddings': alpha_size 16384 fits neither 4096 (a scale) nor 8192 bytes (a scale and a bias) "
            "for 1024 rows of 1 block(s) of quant_block 0",
        ),
        (
            "tie_embeddings",
            [190794, 256330, 16000, 4, 64],
            "field 'tie_embeddings': alpha_size 16000 fits neither 8192 (a scale) nor 16384 bytes",
        ),
        (
            "tie_embeddings",
            {"weight_offset": 190794, "alpha_offset": 256330, "alpha_size": 16384, "quant_block": 64},
            "field 'tie_embeddings.quant_bit' is missing; expected 2, 3, 4, 8 or 16",
        ),
    ],
)
def test_llm_config_numbers_are_checked_not_converted(tmp_path: Path, field: str, value: object, expected: str) -> None:
    """A string or float where llm_config.json needs an integer was a bare ValueError from int() (or, for a float
    offset, silently truncated): one line naming the file and field."""
    model = tmp_path / "m"
    shutil.copytree(TINY, model)
    config = json.loads((model / "llm_config.json").read_text())
    (model / "llm_config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(BundleError) as info:
        Embeddings(model)
    assert f"{model / 'llm_config.json'}: {expected}" in str(info.value) and "\n" not in str(info.value)


def test_unknown_override_path(synthetic: Synthetic) -> None:
    with pytest.raises(BundleError, match=r"binary_overrides name \['qnn/graphllm7.bin'\]"):
        HybridModel(synthetic.bundle, binary_overrides={"qnn/graphllm7.bin": b"x"})


# ---- the tiny Qwen3 with one Convolution on the NPU -----------------------------------------------------

CHUNK = 8


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory: pytest.TempPathFactory, qnn_lib: QnnLibrary) -> tuple[Path, dict[str, bytes]]:
    """The tiny model's first q_proj Convolution as a plugin: its input and output are NC4HW4 tensors."""
    bundle = tmp_path_factory.mktemp("tiny") / "model" / "tiny-qwen3"
    (bundle / "qnn").mkdir(parents=True)
    for name in ("llm.mnn.weight", "llm_config.json", "tokenizer.mtok"):
        shutil.copy(TINY / name, bundle / name)
    (bundle / "config_qnn.json").write_text(
        json.dumps(
            {
                "llm_model": "qnn/llm.mnn",
                "backend_type": "cpu",
                "chunk_limits": [CHUNK, 1],
                "tokenizer_file": "tokenizer.mtok",
            }
        )
    )
    model = load_model(TINY / "llm.mnn")
    i = next(k for k, op in enumerate(model.ops) if op.type == "Convolution")
    op = model.ops[i]
    with WeightFile(TINY / "llm.mnn.weight") as wf:
        conv = decode_conv(op, wf)
    out_ch, in_ch = conv.weight.shape
    a, b = op.inputs[0], op.outputs[0]
    model.ops[i] = make_plugin_op(
        "qnn0",
        [a],
        [b],
        {
            "path": "qnn/graphllm0.bin",
            "inputs": [f"t{a}"],
            "outputs": [f"t{b}"],
            "allGraphName": ["graphllm0", "graphllm1_0"],
            "allInputShape": [1, in_ch, 1, 1, CHUNK, in_ch, 1, 1],
            "o_0_0": make_blob([1, out_ch, 1, 1], data_format="NC4HW4"),
            "o_1_0": make_blob([CHUNK, out_ch, 1, 1], data_format="NC4HW4"),
        },
    )
    save_model(model, bundle / "qnn" / "llm.mnn")

    def build(shared: bool) -> bytes:
        # MatMul + Add: Reshape(4D)->FullyConnected->Reshape(4D) is miscomputed by the x86 HTP library
        with ContextBuilder(qnn_lib, TARGET, weight_sharing=shared) as ctx:
            for gname, rows in (("graphllm0", 1), ("graphllm1_0", CHUNK)):
                g = ctx.add_graph(gname)
                x = g.add_input(f"t{a}", (rows, in_ch, 1, 1))
                x2 = g.add_native("x2", (rows, in_ch))
                g.add_node("flatten", "Reshape", [x], [x2])
                wt = g.add_static("weight", np.ascontiguousarray(conv.weight.T))
                bias = g.add_static("bias", conv.bias)
                y2 = g.add_native("y2", (rows, out_ch))
                g.add_node("matmul", "MatMul", [x2, wt], [y2])
                y3 = g.add_native("y3", (rows, out_ch))
                g.add_node("bias_add", "ElementWiseAdd", [y2, bias], [y3])
                y = g.add_output(f"t{b}", (rows, out_ch, 1, 1))
                g.add_node("unflatten", "Reshape", [y3], [y])
            return ctx.serialize()

    (bundle / "qnn" / "graphllm0.bin").write_bytes(build(True))
    return bundle, {"qnn/graphllm0.bin": build(False)}


@pytest.mark.slow
def test_tiny_model_hybrid_matches_cpu(tiny_bundle: tuple[Path, dict[str, bytes]], qnn_lib: QnnLibrary) -> None:
    bundle, twins = tiny_bundle
    embed = Embeddings(bundle)
    reference_fn = cpu_forward_fn(TINY)
    with HybridModel(bundle, binary_overrides=twins, qnn_lib=qnn_lib) as model:
        assert [s.name for s in model.steps] == ["cpu0", "qnn0", "cpu1"]
        for seq, tokens in ((1, [5]), (CHUNK, [3, 5, 7, 9, 11])):
            feed = llm_inputs(embed(tokens), seq)
            got, ref = model.forward(feed), reference_fn(feed)
            for name in ("logits", "hidden_states"):
                assert_close(got[name], ref[name], f"{name} seq {seq}")
            assert np.array_equal(got["logits"][0].argmax(-1), ref["logits"][0].argmax(-1))


@pytest.mark.slow
def test_tiny_model_greedy_generation(tiny_bundle: tuple[Path, dict[str, bytes]], qnn_lib: QnnLibrary) -> None:
    bundle, twins = tiny_bundle
    prompt = [11, 22, 33]
    with HybridModel(bundle, binary_overrides=twins, qnn_lib=qnn_lib) as model:
        got = greedy_generate(model, prompt, max_new_tokens=10)
    ref = cpu_greedy_generate(TINY, prompt, max_new_tokens=10, chunk=CHUNK)
    assert got.tokens == ref.tokens and len(got.tokens) == CHUNK - len(prompt)
    assert got.stop_reason == ref.stop_reason == "chunk_full"
    assert len(got.top2_margins) == len(got.tokens)
    short = cpu_greedy_generate(TINY, prompt, max_new_tokens=2, chunk=CHUNK, stop_ids=[])
    assert short.tokens == ref.tokens[:2] and short.stop_reason == "max_new_tokens"


FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "models"


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_dir", [TINY, FIXTURES / "llama-int4-cw", FIXTURES / "qwen3-untied-int8-b32"], ids=lambda p: p.name
)
def test_cpu_reference_is_the_recompute_loop_in_one_forward(model_dir: Path) -> None:
    """MNN's own engine (KV cache) guesses the greedy tokens and one forward in the prefill shape confirms them:
    the reference tokens and margins are exactly the recompute loop's, for one forward instead of one per token."""
    ids = Tokenizer(model_dir / "config.json").encode("hello")
    forward, embed = cpu_forward_fn(model_dir), Embeddings(model_dir)
    loop = recompute_generate(forward, embed, ids, 16, 128)
    engine_rows: list[np.ndarray] = []
    draft = kv_cache_draft(model_dir, ids, 16, rows=engine_rows)
    assert draft == loop.tokens, "MNN's KV-cache path agrees with the recompute loop on these models"
    # the engine's own row of each token is the one that picked it, for the same prefix as the loop's row
    assert [int(r.argmax()) for r in engine_rows] == draft
    assert all(
        np.allclose(e, r, rtol=0, atol=1e-3 * np.abs(r).max()) for e, r in zip(engine_rows, loop.rows, strict=True)
    )
    got = follow_draft(forward, embed, ids, draft, 16, 128)
    assert got.result.tokens == loop.tokens and got.result.top2_margins == loop.top2_margins
    assert got.forwards == 1 and got.rejected is None
    assert cpu_greedy_generate(model_dir, ids, 16, chunk=128).tokens == loop.tokens
    # a big model's draft keeps quantized weights as stored: other arithmetic, maybe other tokens, but confirming
    # forwards still give exactly the loop's tokens
    low = kv_cache_draft(model_dir, ids, 16, low_memory_above=0)
    assert len(low) == 16
    confirmed = follow_draft(forward, embed, ids, low, 16, 128)
    assert confirmed.result.tokens == loop.tokens and confirmed.result.top2_margins == loop.top2_margins
    assert confirmed.forwards == (1 if confirmed.rejected is None else 16 - confirmed.rejected)


def test_padding_rows_never_reach_the_rows_before_them() -> None:
    """What lets one forward serve the whole-model check (random rows) and generation (token rows first): with the
    causal mask, the rows of the tokens come out bit for bit the same whatever pads the rest."""
    ids = Tokenizer(TINY / "config.json").encode("hello")
    forward, embed = cpu_forward_fn(TINY), Embeddings(TINY)
    zeros = np.asarray(forward(llm_inputs(embed(ids), 128, logits_index=0))["logits"]).reshape(128, -1)
    noise = np.random.default_rng(0).random((128, 1, embed.hidden), dtype=np.float32)
    feed = llm_inputs(embed(ids), 128, logits_index=0, pad=noise)
    assert np.array_equal(feed["input_ids"][len(ids) :], noise[len(ids) :])
    padded = np.asarray(forward(feed)["logits"]).reshape(128, -1)
    assert np.array_equal(padded[: len(ids)], zeros[: len(ids)])
    assert not np.array_equal(padded[len(ids) :], zeros[len(ids) :])


@pytest.mark.slow
def test_a_wrong_draft_costs_forwards_not_tokens() -> None:
    ids = Tokenizer(TINY / "config.json").encode("hello")
    forward, embed = cpu_forward_fn(TINY), Embeddings(TINY)
    loop = recompute_generate(forward, embed, ids, 12, 128)
    wrong = list(loop.tokens)
    wrong[5] = (wrong[5] + 1) % embed.vocab
    got = follow_draft(forward, embed, ids, wrong, 12, 128)
    assert got.result.tokens == loop.tokens and got.rejected == 5 and got.forwards == 1 + 6
    # not followed: the tokens end at the right one for the first wrong guess, after the draft's one forward
    halt = follow_draft(forward, embed, ids, wrong, 12, 128, redraft=kv_cache_redraft(TINY), follow=False)
    assert halt.result.tokens == loop.tokens[:6] and halt.rejected == 5 and halt.forwards == 1
    assert halt.result.stop_reason == "draft_rejected" and len(halt.step_rows) == 12
    short = follow_draft(forward, embed, ids, loop.tokens[:3], 12, 128)  # the loop goes on after a short draft
    assert short.result.tokens == loop.tokens and short.rejected is None and short.forwards == 1 + 8
    stop = follow_draft(forward, embed, ids, loop.tokens, 12, 128, stop_ids=[loop.tokens[2]])
    assert stop.result.tokens == loop.tokens[:3] and stop.result.stop_reason == "stop_token"
    full = follow_draft(forward, embed, ids, [], 12, len(ids) + 4)
    assert full.result.stop_reason == "chunk_full" and len(full.result.tokens) == 4
    # with a new guess after a wrong one, a wrong token costs one round (one forward here), not one per later token
    asked: list[tuple[int, int]] = []

    def oracle(seq: list[int], n: int) -> list[int]:
        asked.append((len(seq), n))
        return loop.tokens[len(seq) - len(ids) :][:n]

    again = follow_draft(forward, embed, ids, wrong, 12, 128, redraft=oracle)
    assert again.result.tokens == loop.tokens and again.rejected == 5 and again.forwards == 2
    assert asked == [(len(ids) + 6, 6)]
    assert all(np.array_equal(a, b) for a, b in zip(again.result.rows, loop.rows, strict=True))
    blind = follow_draft(forward, embed, ids, wrong, 12, 128, redraft=lambda seq, n: [])  # no guess: the plain loop
    assert blind.result.tokens == loop.tokens and blind.forwards == 1 + 6
    engine = follow_draft(forward, embed, ids, wrong, 12, 128, redraft=kv_cache_redraft(TINY))
    assert engine.result.tokens == loop.tokens and engine.result.top2_margins == loop.top2_margins
    assert engine.forwards == 2, "MNN's engine guesses the rest right from the loop's own sequence on tiny"
    # verify's guesser for the bundle: another forward's whole greedy loop (here the same model's), whose tokens
    # the followed forward then confirms in one forward per wrong guess
    guesser = loop_redraft(cpu_forward_fn(TINY), embed, 128, kv_cache_redraft(TINY))
    followed = follow_draft(forward, embed, ids, wrong, 12, 128, redraft=guesser)
    assert followed.result.tokens == loop.tokens and followed.forwards == 2
    assert guesser(ids, 0) == [] and guesser(ids, 3) == loop.tokens[:3]
    # a model MNN's engine cannot run gives no draft (and no crash): the reference then recomputes
    assert kv_cache_draft(FIXTURES / "qwen3-embedding-tiny", ids, 4) == []


def test_weight_file_of_another_model_is_refused(tiny_bundle: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    bundle = tmp_path / "tiny"
    shutil.copytree(tiny_bundle[0], bundle)
    shutil.copy(PROJECT_ROOT / "tests" / "fixtures" / "models" / "llama-int4-cw" / "llm.mnn.weight", bundle)
    with pytest.raises(BundleError, match=r"llm.mnn.weight: .* reads bytes up to .*not the weight file of this model"):
        Bundle.open(bundle)


# ---- file names read from a bundle stay inside it (issue 12) ------------------------------------------------

DEFAULT_NAMES = {"tokenizer_file": "tokenizer.mtok", "llm_model": "qnn/llm.mnn", "llm_weight": "llm.mnn.weight"}


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
@pytest.mark.parametrize(
    ("config", "field", "reader"),
    [
        ("config_qnn.json", "tokenizer_file", "tokenizer"),
        ("config_qnn.json", "llm_model", "bundle"),
        ("config_qnn.json", "llm_weight", "bundle"),
        ("llm_config.json", "llm_weight", "embeddings"),  # tied embeddings: read from the weight file it names
        ("llm_config.json", "tokenizer_file", "tokenizer"),  # MNN's engine merges llm_config.json into the config
    ],
)
def test_file_names_in_bundle_configs_stay_in_the_model_dir(
    tiny_bundle: tuple[Path, dict[str, bytes]], tmp_path: Path, config: str, field: str, reader: str, how: str
) -> None:
    """A crafted config names the right file, but outside the bundle (``../../outside/...`` or an absolute path):
    refused with one line naming the config and the field, before anything reads it."""
    import os

    bundle = tmp_path / "model" / "tiny-qwen3"
    shutil.copytree(tiny_bundle[0], bundle)
    outside = tmp_path / "outside" / Path(DEFAULT_NAMES[field]).name
    outside.parent.mkdir()
    shutil.copy(bundle / DEFAULT_NAMES[field], outside)
    value = str(outside) if how == "absolute" else os.path.relpath(outside, bundle)
    data = json.loads((bundle / config).read_text())
    data[field] = value
    (bundle / config).write_text(json.dumps(data))
    read = {
        "tokenizer": lambda: Tokenizer(bundle / "config_qnn.json"),
        "bundle": lambda: Bundle.open(bundle),
        "embeddings": lambda: Embeddings(bundle),
    }[reader]
    with pytest.raises(BundleError) as info:
        read()
    message = str(info.value)
    assert f"{bundle / config}: field {field!r}: path {value!r} must be relative, without '..'" in message, message
    assert "\n" not in message


def test_plugin_paths_and_symlinked_dirs_stay_in_the_bundle(bundle_copy: Path, tmp_path: Path) -> None:
    import os

    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(bundle_copy / "qnn" / "graphllm0.bin", outside / "graphllm0.bin")
    rel = os.path.relpath(outside / "graphllm0.bin", bundle_copy)
    _edit_plugin(bundle_copy, "qnn0", path=rel)
    expected = rf"plugin 'qnn0' \(op #\d+\): attribute 'path': path '{re.escape(rel)}' must be relative"
    with pytest.raises(BundleError, match=expected):
        Bundle.open(bundle_copy)
    _edit_plugin(bundle_copy, "qnn0", path="qnn/graphllm0.bin")
    Bundle.open(bundle_copy)
    # the names are plain, but the directory they go through is a link out of the bundle
    shutil.move(bundle_copy / "qnn", outside / "qnn")
    (bundle_copy / "qnn").symlink_to(outside / "qnn")
    with pytest.raises(BundleError, match=r"config_qnn.json: field 'llm_model': path 'qnn/llm.mnn' leads outside"):
        Bundle.open(bundle_copy)


def test_original_model_config_stays_in_its_dir(tmp_path: Path) -> None:
    """The original model dir's config.json, which verify's reference hands MNN's engine, is checked the same way."""
    from mnnbuild_runtime.generate import kv_cache_draft

    model = tmp_path / "model"
    shutil.copytree(TINY, model)
    data = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**data, "tokenizer_file": f"../../{TINY.name}/tokenizer.mtok"}))
    with pytest.raises(BundleError, match=r"model/config.json: field 'tokenizer_file': path '\.\./\.\./"):
        kv_cache_draft(model, [1, 2, 3], 2)
    with pytest.raises(BundleError, match=r"model/config.json: field 'tokenizer_file'"):
        cpu_forward_fn(model)


OUTSIDE_FIELDS = [
    ("context_file", "../context.json", r"field 'context_file': path '\.\./context\.json' must be relative"),
    ("npu_model_dir", "/data", "field 'npu_model_dir': path '/data' must be relative"),
    ("tmp_path", "/tmp", "field 'tmp_path' is not supported"),  # MNN writes its mmap files there
]
"""Fields of MNN's that name a path, each with a value leading out and the error it gets."""


@pytest.mark.parametrize(
    ("config_file", "field", "value", "expected"),
    [
        # every file read from there (MNN reads base_dir from the config itself, before merging llm_config.json)
        ("config_qnn.json", "base_dir", str(TINY) + "/", "field 'base_dir' is not supported"),
        *(("config_qnn.json", *case) for case in OUTSIDE_FIELDS),
        *(("llm_config.json", *case) for case in OUTSIDE_FIELDS),
    ],
)
def test_config_naming_a_path_outside_is_refused(
    tiny_bundle: tuple[Path, dict[str, bytes]], tmp_path: Path, config_file: str, field: str, value: str, expected: str
) -> None:
    """A model's config.json reaches config_qnn.json whole, and MNN's engine merges llm_config.json into it: any
    field of MNN's that names a path (or moves them all) is refused unless it stays in the model dir."""
    bundle = tmp_path / "tiny"
    shutil.copytree(tiny_bundle[0], bundle)
    data = json.loads((bundle / config_file).read_text())
    (bundle / config_file).write_text(json.dumps({**data, field: value}))
    with pytest.raises(BundleError, match=rf"{config_file}: {expected}"):
        Tokenizer(bundle / "config_qnn.json")


def test_embeddings_and_llm_inputs() -> None:
    embed = Embeddings(TINY)
    rows = embed([4, 1, 4])
    assert rows.shape == (3, 128) and np.array_equal(rows, read_embeddings(TINY, [4, 1, 4]))
    feed = llm_inputs(rows, 5)
    assert feed["input_ids"].shape == (5, 1, 128) and not feed["input_ids"][3:].any()
    mask = feed["attention_mask"][0, 0]
    assert mask.shape == (5, 5) and mask[0, 1] == np.finfo(np.float32).min and mask[4, 0] == 0 and mask[2, 2] == 0
    assert feed["position_ids"].tolist() == [[0, 1, 2, 3, 4]] and feed["logits_index"].tolist() == [0]
    assert llm_inputs(rows[:1])["logits_index"].tolist() == [-1]


def test_tokenizer_round_trip(tiny_bundle: tuple[Path, dict[str, bytes]]) -> None:
    bundle, _ = tiny_bundle
    tok = Tokenizer(bundle / "config_qnn.json")  # loads although qnn/llm.mnn has a Plugin op
    ids = tok.encode("hello world")
    assert ids and tok.decode(ids) == "hello world"
    assert Tokenizer(TINY / "config.json").encode("hello world") == ids
    (bundle / "no_tokenizer.json").write_text('{"llm_model": "qnn/llm.mnn"}')
    with pytest.raises(BundleError, match=r"tokenizer file .*tokenizer.txt .* does not exist"):
        Tokenizer(bundle / "no_tokenizer.json")


# ---- installing the runtime on its own ---------------------------------------------------------------

BUILD_ONLY = ("doit", "huggingface_hub", "fsspec", "tqdm")
"""What a user running a bundle does not need; the runtime must neither declare nor import them."""

_RUN_INSTALLED = """
import importlib.abc, json, sys
site, bundle, twins, x_file, out_file, modules_file = sys.argv[1:]
sys.path.insert(0, site)


class BuildOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked}:
            raise ImportError(f"the runtime imported {{name}}, which it does not ship with")
        return None


sys.meta_path.insert(0, BuildOnly())
import numpy as np
from mnnbuild_runtime import HybridModel

overrides = {{p: open(f, "rb").read() for p, f in json.loads(twins).items()}}
with HybridModel(bundle, binary_overrides=overrides) as model:
    np.save(out_file, model.forward({{"x": np.load(x_file)}})["out"])
ours = {{n: getattr(m, "__file__", None) for n, m in sys.modules.items() if n.partition(".")[0].startswith("mnnbuild")}}
open(modules_file, "w").write(json.dumps(ours))
"""


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


@pytest.mark.slow
def test_runtime_installs_and_runs_a_bundle_without_the_build(synthetic: Synthetic, tmp_path: Path) -> None:
    """``runtime/`` builds offline into a wheel holding the runtime and its format layers only, declaring none of
    the build's dependencies, and leaves its source tree as it was (no build/, no egg-info: ``git status`` of a
    committed copy is empty); its sdist builds that wheel on its own, with no ``../mnnbuild`` beside it. Installed
    alone, it runs a bundle with doit, huggingface_hub, fsspec and tqdm unimportable, and every mnnbuild module it
    loads comes from the wheel."""
    src = tmp_path / "src"  # a copy, committed, as a clone has it
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    shutil.copytree(PROJECT_ROOT / "runtime", src / "runtime", ignore=ignore)
    shutil.copytree(PROJECT_ROOT / "mnnbuild", src / "mnnbuild", ignore=ignore)
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "commit", "-q", "-m", "clone")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*build, "-w", str(tmp_path / "from-tree"), "./runtime"], cwd=src, check=True, capture_output=True)
    assert _git(src, "status", "--porcelain", "--ignored") == "", "building the runtime wrote into its source tree"

    sdists = tmp_path / "sdist"  # the backend's sdist hook, as a frontend (python -m build) calls it in the tree
    hook = f"import build_backend; build_backend.build_sdist({str(sdists)!r})"
    subprocess.run([sys.executable, "-c", hook], cwd=src / "runtime", check=True, capture_output=True, timeout=300)
    assert _git(src, "status", "--porcelain", "--ignored") == ""
    (sdist,) = sdists.glob("mnnbuild_runtime-*.tar.gz")
    with tarfile.open(sdist) as tf:
        tf.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    wheels = tmp_path / "wheels"
    subprocess.run([*build, "-w", str(wheels), str(unpacked)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("mnnbuild_runtime-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    with zipfile.ZipFile(next((tmp_path / "from-tree").glob("*.whl"))) as zf:
        assert sorted(zf.namelist()) == sorted(names), "the sdist's wheel is the source tree's"
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [
        line.split(":", 1)[1].strip().lower() for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    assert not [r for r in requires for b in BUILD_ONLY if r.replace("-", "_").startswith(b)], requires
    assert any(r.startswith("mnn") for r in requires) and any(r.startswith("onnxruntime-qnn") for r in requires)
    shipped = {n for n in names if n.startswith("mnnbuild/") and n.endswith(".py")}
    top = {n for n in shipped if n.count("/") == 1}
    assert top == {"mnnbuild/__init__.py"}
    assert {n for n in shipped if n.startswith("mnnbuild/base/")} == {
        "mnnbuild/base/__init__.py",
        "mnnbuild/base/errors.py",
        "mnnbuild/base/fsutil.py",
        "mnnbuild/base/native.py",  # what MNN and QNN print, captured (the runtime loads and runs them too)
    }
    assert {n.split("/")[1] for n in shipped - top} == {"base", "cpu", "mnn", "qnn"}
    site = tmp_path / "site"
    install = [*pip, "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)

    x = np.random.default_rng(3).standard_normal((PREFILL, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    twin_files = {}
    for path, data in synthetic.twins.items():
        twin_files[path] = str(tmp_path / Path(path).name)
        Path(twin_files[path]).write_bytes(data)
    script = _RUN_INSTALLED.format(blocked=set(BUILD_ONLY))
    args = [str(site), str(synthetic.bundle), json.dumps(twin_files), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")]
    args.append(str(tmp_path / "modules.json"))
    # -I: no PYTHONPATH, no cwd on sys.path; the venv's site-packages (numpy, MNN, onnxruntime-qnn) stay visible
    proc = subprocess.run([sys.executable, "-I", "-c", script, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads((tmp_path / "modules.json").read_text())
    assert "mnnbuild_runtime.hybrid" in loaded and "mnnbuild.qnn" in loaded
    outside = {n: f for n, f in loaded.items() if f is not None and not Path(f).is_relative_to(site)}
    assert outside == {}
    assert_close(np.load(tmp_path / "y.npy"), reference(synthetic.original, x)["out"], "installed runtime out")


# ---- the READMEs' examples, as written -----------------------------------------------------------------

README_EXAMPLES = (PROJECT_ROOT / "runtime" / "README.md", PROJECT_ROOT / "README.md")


def python_blocks(readme: Path) -> list[str]:
    """The ```python blocks of a README that use the runtime."""
    blocks = re.findall(r"^```python\n(.*?)^```", readme.read_text(encoding="utf-8"), re.S | re.M)
    return [b for b in blocks if "mnnbuild_runtime" in b]


@pytest.mark.slow
def test_readme_runtime_examples_run_as_written(run_doit: RunDoit, tmp_path: Path) -> None:
    """Each README's Python example of the runtime, executed as it is written from the directory `doit` ran in
    (``artifacts/`` there), on the tiny model's bundle and twins: no name it uses is undefined, its asserts hold."""
    run_doit("twin:tiny-qwen3-v79", "bundle:tiny-qwen3-v79")
    examples = [(readme, block) for readme in README_EXAMPLES for block in python_blocks(readme)]
    assert len(examples) >= 2, "each README has its runtime example"
    env = {k: v for k, v in os.environ.items() if k != "MNNBUILD_ARTIFACTS"}
    for readme, block in examples:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
        )
        assert proc.returncode == 0, f"{readme.relative_to(PROJECT_ROOT)}'s example failed:\n{proc.stderr[-3000:]}"
    # issue 43, first hour: the first example (the README sends a new user to runtime/README.md) ran only from the
    # project root and printed nothing
    (elsewhere := tmp_path / "elsewhere").mkdir()
    block = python_blocks(PROJECT_ROOT / "runtime" / "README.md")[0]
    proc = subprocess.run([sys.executable, "-I", "-c", block], cwd=elsewhere, capture_output=True, text=True,
                          timeout=600, env={**env, "MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts")})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.fullmatch(r"logits \[1, 128, 1024\]; the token after 1 2 3: \d+\n", proc.stdout), proc.stdout


def test_a_bundle_whose_llm_config_overrides_its_config_is_refused(bundle_copy: Path) -> None:
    """The engine merges llm_config.json over config_qnn.json: a bundle edited so that it would run other
    chunk_limits than its config says (the graphs verify checked) is refused on open, in one line."""
    Bundle.open(bundle_copy)
    (bundle_copy / "llm_config.json").write_text(json.dumps({"hidden_size": 8, "chunk_limits": [2, 1]}))
    with pytest.raises(BundleError) as info:
        Bundle.open(bundle_copy)
    assert str(info.value).startswith(f"{bundle_copy / 'llm_config.json'}: field 'chunk_limits' is [2, 1]")
