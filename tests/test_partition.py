"""partition stage: Plugin model, graph dirs, reference IO, CPU equivalence, report, errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.cpu import load_vars, save_vars
from mnnbuild.errors import StageError
from mnnbuild.lowering.support import unsupported_reason
from mnnbuild.mnn import MnnModel, Op, load_model, plugin_attributes
from mnnbuild.partition.execute import HybridExecutor, PluginCall, SourceSubgraphRunner
from mnnbuild.partition.records import GraphDescription
from mnnbuild.partition.rewrite import plugin_attrs_of
from mnnbuild.spec import LocalSource
from mnnbuild.stages.fetch import FetchInputs, FetchParams, fetch
from mnnbuild.stages.io import IoInputs, IoParams, generate_io
from mnnbuild.stages.partition import PartitionInputs, PartitionManifest, PartitionParams, partition
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR

CHUNK = 16
MODELS = {
    "tiny-qwen3": TINY_MODEL_DIR,
    "qwen3-untied-int8-b32": FIXTURE_MODELS / "qwen3-untied-int8-b32",
    "llama-int4-cw": FIXTURE_MODELS / "llama-int4-cw",
}


class Built:
    """One model fetched, sampled and partitioned in a temp dir."""

    def __init__(self, root: Path, src: Path, **params: object) -> None:
        self.src = src
        self.model_dir = root / "model"
        self.io_dir = root / "io"
        self.out = root / "partition"
        if not self.model_dir.exists():
            fetch(
                FetchInputs(model="m", source=LocalSource(local=str(src)), source_dir=src),
                FetchParams(),
                self.model_dir,
            )
            generate_io(IoInputs(model="m", model_dir=self.model_dir), IoParams(chunk_size=CHUNK), self.io_dir)
        self.manifest = run_partition(self.model_dir, self.io_dir, self.out, **params)
        self.qnn = self.out / "qnn"
        self.result = load_model(self.qnn / "llm.mnn")
        self.source = load_model(src / "llm.mnn")
        self.report = json.loads((self.out / "partition.json").read_text())

    @property
    def layers(self) -> int:
        return int(json.loads((self.src / "llm_config.json").read_text())["layer_nums"])

    def plugins(self) -> list[Op]:
        return self.result.ops_of_type("Plugin")

    def sample(self, seq: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        d = self.io_dir / "testdir" / str(seq)
        return load_vars(d / "input.mnn"), load_vars(d / "output.mnn")


def run_partition(model_dir: Path, io_dir: Path, out: Path, **params: object) -> PartitionManifest:
    support = params.pop("support", unsupported_reason)
    return partition(
        PartitionInputs(model="m", model_dir=model_dir, io_dir=io_dir),
        PartitionParams(chunk_size=CHUNK, **params),  # type: ignore[arg-type]
        out,
        support=support,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Built]:
    cache: dict[str, Built] = {}

    def get(name: str) -> Built:
        if name not in cache:
            cache[name] = Built(tmp_path_factory.mktemp(name), MODELS[name])
        return cache[name]

    return get


@pytest.fixture(scope="module")
def tiny(built: Callable[[str], Built]) -> Built:
    return built("tiny-qwen3")


def compute_types(model: MnnModel) -> list[str]:
    return [op.type for op in model.ops if op.type not in ("Input", "Const")]


def run_hybrid(
    src: Path, qnn_dir: Path, feeds: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], list[PluginCall]]:
    """Run ``qnn_dir/llm.mnn`` with every plugin replaced by its source subgraph; returns outputs and calls."""
    calls: list[PluginCall] = []
    with SourceSubgraphRunner(src / "llm.mnn", src / "llm.mnn.weight", qnn_dir) as reference:

        def runner(call: PluginCall) -> list[np.ndarray]:
            calls.append(call)
            return reference(call)

        executor = HybridExecutor(qnn_dir / "llm.mnn", src / "llm.mnn.weight", runner)
        return executor.run(feeds), calls


# ---- structure ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_one_plugin_per_attention_boundary(built: Callable[[str], Built], name: str) -> None:
    b = built(name)
    types = compute_types(b.result)
    # plugin, then per layer: Attention (CPU) + plugin; the region after the last attention is cut once
    # more at the logits_index slice (its output shape follows logits_index's content): layers + 2 plugins
    expected = ["Plugin"] + ["Attention", "Plugin"] * b.layers + ["StridedSlice", "Plugin"]
    assert types == expected
    assert len(b.plugins()) == b.layers + 2 == len(b.manifest.plugins)
    assert b.result.ops_of_type("Convolution") == []
    assert len(b.source.ops_of_type("Attention")) == b.layers
    cpu = {c["name"]: c for c in b.report["cpu_ops"]}
    for op in b.source.ops_of_type("Attention"):
        assert "kv_cache" in cpu[op.name]["reason"]
    last = b.plugins()[-1]
    assert "logits" in [b.result.tensor_names[t] for t in last.outputs]
    assert b.result.output_names == b.source.output_names
    assert b.result.input_names == b.source.input_names


def test_plugin_attributes(tiny: Built) -> None:
    for k, op in enumerate(tiny.plugins()):
        attrs = plugin_attributes(op)
        assert op.main.type == "QNN"
        assert op.name == attrs["path"] == f"qnn/graph{k}.bin"
        assert attrs["allGraphName"] == [f"graph{k}", f"graph1_{k}"]
        assert set(attrs) == {"path", "inputs", "outputs", "allGraphName", "allInputShape"} | {
            f"o_{s}_{j}" for s in (0, 1) for j in range(len(op.outputs))
        }
        descs = [GraphDescription.read(tiny.qnn / g) for g in attrs["allGraphName"]]
        refs = [d.load_reference(tiny.qnn / d.graph) for d in descs]
        # names are t<source index>, in the op's input/output order
        assert attrs["inputs"] == [t.qnn_name for t in descs[0].inputs] == [f"t{t.index}" for t in descs[0].inputs]
        assert attrs["outputs"] == [t.qnn_name for t in descs[0].outputs]
        assert [tiny.result.tensor_names[t] for t in op.inputs] == [t.name for t in descs[0].inputs]
        assert [tiny.result.tensor_names[t] for t in op.outputs] == [t.name for t in descs[0].outputs]
        for t in descs[0].inputs + descs[0].outputs:
            assert tiny.source.tensor_names[t.index] == t.name
        # allInputShape: decode block then prefill block, equal to the reference inputs' shapes
        assert attrs["allInputShape"] == [d for ins, _ in refs for a in ins for d in a.shape]
        for s, (_, outs) in enumerate(refs):
            for j, a in enumerate(outs):
                blob = attrs[f"o_{s}_{j}"]
                assert list(blob.dims) == list(a.shape)
                assert blob.dataType == (1 if a.dtype == np.float32 else 3)
    postreat = json.loads((tiny.out / "npu_postreat.json").read_text())
    assert postreat == {
        "type": "QNN",
        "merge": {f"qnn/graph{k}.bin": [f"qnn/graph{k}", f"qnn/graph1_{k}"] for k in range(len(tiny.plugins()))},
        "cache": "qnn",
    }


def test_nc4hw4_outputs_keep_their_format(tiny: Built) -> None:
    # v_proj's convolution output feeds the CPU Attention directly: MNN keeps it in NC4HW4
    op = tiny.plugins()[0]
    names = [tiny.result.tensor_names[t] for t in op.outputs]
    j = names.index("/layers.0/self_attn/v_proj/Linear")
    attrs = plugin_attrs_of(op)
    assert attrs[f"o_0_{j}"]["dataFormat"] == 2  # NC4HW4
    assert attrs[f"o_1_{j}"]["dims"][0] == CHUNK


def test_promoted_internal_tensor(tiny: Built) -> None:
    # the rotary tables are made and used in plugin 0 (layer 0) and read again by plugin 1 (layer 1)
    desc0 = GraphDescription.read(tiny.qnn / "graph0")
    desc1 = GraphDescription.read(tiny.qnn / "graph1")
    rope = "/blocks.0/self_attn/Gather_2_output_0"
    assert rope in [t.name for t in desc0.outputs] and rope in [t.name for t in desc1.inputs]
    assert any(tiny.source.tensor_names[i] == rope for op in desc0.ops for i in op.inputs)


def test_graph_descriptions(tiny: Built) -> None:
    for op in tiny.plugins():
        attrs = plugin_attributes(op)
        for s, graph in enumerate(attrs["allGraphName"]):
            desc = GraphDescription.read(tiny.qnn / graph)
            assert desc.graph == graph and desc.shape_index == s and desc.binary == attrs["path"]
            for ref in desc.ops:
                src = tiny.source.ops[ref.index]
                assert (src.name, src.type) == (ref.name, ref.type)
            made = {t for ref in desc.ops for t in ref.outputs}
            boundary = {t.index for t in desc.inputs + desc.outputs}
            assert {t.index for t in desc.internal} == made - boundary
            seq = 1 if s == 0 else CHUNK
            for t in desc.internal + desc.outputs:
                assert all(d > 0 for d in t.shape)
            embeds = [t for t in desc.inputs if t.name == "input_ids"]
            assert all(t.shape[0] == seq for t in embeds)
            if desc.folded:
                folded = desc.load_folded(tiny.qnn / graph)
                for f in desc.folded:
                    assert list(folded[f.index].shape) == f.shape
                    if f.values is not None:
                        assert folded[f.index].reshape(-1).tolist() == f.values
    # the q reshape target folds to the sample's sequence length
    reshape = next(f for f in GraphDescription.read(tiny.qnn / "graph1_0").folded if f.name.endswith("Concat_output_0"))
    assert reshape.values is not None and reshape.values[1] == CHUNK


def test_reference_io_chains(tiny: Built) -> None:
    """Each graph's reference output is what its ops compute from its reference input."""
    with SourceSubgraphRunner(tiny.src / "llm.mnn", tiny.src / "llm.mnn.weight", tiny.qnn) as reference:
        for op in tiny.plugins():
            attrs = plugin_attributes(op)
            for s, graph in enumerate(attrs["allGraphName"]):
                desc = GraphDescription.read(tiny.qnn / graph)
                ins, outs = desc.load_reference(tiny.qnn / graph)
                call = PluginCall(
                    op_index=0,
                    name=op.name,
                    attrs=attrs,
                    shape_index=s,
                    input_names=[t.name for t in desc.inputs],
                    output_names=[t.name for t in desc.outputs],
                    inputs=ins,
                )
                for got, want in zip(reference(call), outs, strict=True):
                    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


# ---- CPU equivalence ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_cpu_equivalence_both_shapes(built: Callable[[str], Built], name: str) -> None:
    b = built(name)
    for s, seq in enumerate((1, CHUNK)):
        feeds, expected = b.sample(seq)
        outputs, calls = run_hybrid(b.src, b.qnn, feeds)
        assert sorted(outputs) == sorted(expected)
        for n, want in expected.items():
            np.testing.assert_allclose(outputs[n], want, rtol=0, atol=1e-5, err_msg=f"{name} seq {seq} {n}")
        assert [c.name for c in calls] == [op.name for op in b.plugins()]
        assert {c.shape_index for c in calls} == {s}
        assert {c.graph_name for c in calls} == {f"graph{k}" if s == 0 else f"graph1_{k}" for k in range(len(calls))}
    assert max(b.report["max_abs_diff"]) <= 1e-5


# ---- MNN reads the result ----------------------------------------------------------------------------


def test_mnnconvert_dump_shows_plugins(tiny: Built, tmp_path: Path) -> None:
    code = "import sys, _tools; sys.exit(0 if _tools.mnnconvert(['mnnconvert'] + sys.argv[1:]) else 1)"
    json_path = tmp_path / "llm.json"
    argv = ["-f", "MNN", "--modelFile", str(tiny.qnn / "llm.mnn"), "--JsonFile", str(json_path)]
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json_path.exists(), proc.stdout + proc.stderr
    dumped = json.loads(json_path.read_text())
    plugins = [op for op in dumped["oplists"] if op["type"] == "Plugin"]
    assert len(plugins) == len(tiny.plugins())
    for k, (op, ours) in enumerate(zip(plugins, tiny.plugins(), strict=True)):
        assert op["name"] == f"qnn/graph{k}.bin" and op["main"]["type"] == "QNN"
        attrs = {a["key"]: a for a in op["main"]["attr"]}
        mine = plugin_attributes(ours)
        assert set(attrs) == set(mine)
        assert attrs["path"]["s"] == mine["path"]
        for key in ("inputs", "outputs", "allGraphName"):
            assert attrs[key]["list"]["s"] == mine[key]
        assert attrs["allInputShape"]["list"]["i"] == mine["allInputShape"]
        for key in (k for k in mine if k.startswith("o_")):
            assert attrs[key]["tensor"]["dims"] == list(mine[key].dims)
            assert attrs[key]["tensor"]["dataType"] in ("DT_FLOAT", "DT_INT32")
    assert dumped["outputName"] == tiny.result.output_names


def test_mnn_runtime_loads_result_up_to_the_first_plugin(tiny: Built) -> None:
    """PyPI MNN is built without plugin support: it loads qnn/llm.mnn, schedules it and stops at the
    first Plugin op's shape computation, naming that op."""
    code = (
        "import sys, MNN, MNN.expr as F, numpy as np\n"
        "rt = MNN.nn.create_runtime_manager(({'backend': 0, 'precision': 'high', 'numThread': 1},))\n"
        "rt.set_external(sys.argv[2])\n"
        "names = ['input_ids', 'attention_mask', 'position_ids', 'logits_index']\n"
        "m = MNN.nn.load_module_from_file(sys.argv[1], names, ['logits'], runtime_manager=rt)\n"
        "print('loaded', m is not None, flush=True)\n"
        "vs = F.load_as_list(sys.argv[3])\n"
        "out = m.forward(vs)\n"
        "print('outputs', len(out) if isinstance(out, (list, tuple)) else 1, flush=True)\n"
    )
    argv = [str(tiny.qnn / "llm.mnn"), str(tiny.model_dir / "llm.mnn.weight"), str(tiny.io_dir / "testdir/1/input.mnn")]
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    text = proc.stdout + proc.stderr
    assert "loaded True" in text, text
    assert "Plugin is not supported" in text and "qnn/graph0.bin" in text, text


# ---- parameters: skips, unsupported ops, report ------------------------------------------------------


def test_skips_keep_op_on_cpu(tiny: Built, tmp_path: Path) -> None:
    skipped = "/layers.0/mlp/gate_proj/Linear"
    manifest = run_partition(tiny.model_dir, tiny.io_dir, tmp_path / "p", skips=(skipped,))
    assert len(manifest.plugins) == len(tiny.plugins()) + 1
    assert manifest.params.skips == (skipped,)
    result = load_model(tmp_path / "p" / "qnn" / "llm.mnn")
    assert [op.name for op in result.ops_of_type("Convolution")] == [skipped]
    report = json.loads((tmp_path / "p" / "partition.json").read_text())
    assert {"name": skipped, "reason": "named in skips"}.items() <= next(
        c for c in report["cpu_ops"] if c["name"] == skipped
    ).items()


def test_unsupported_kind_stays_on_cpu(tiny: Built, tmp_path: Path) -> None:
    def no_cast(op: Op, model: MnnModel, static: object) -> str | None:
        if op.type == "Cast":
            return "Cast is not lowered in this test"
        return unsupported_reason(op, model, static)  # type: ignore[arg-type]

    manifest = run_partition(tiny.model_dir, tiny.io_dir, tmp_path / "p", support=no_cast)
    out = tmp_path / "p"
    result = load_model(out / "qnn" / "llm.mnn")
    assert [op.type for op in result.ops if op.type == "Cast"] == ["Cast"]
    assert len(manifest.plugins) == len(tiny.plugins()) + 1
    report = json.loads((out / "partition.json").read_text())
    cast = next(c for c in report["cpu_ops"] if c["type"] == "Cast")
    assert cast["reason"] == "QNN lowering: Cast is not lowered in this test"
    assert "Cast is not lowered in this test" in (out / "partition.txt").read_text()
    # the result still computes the same outputs
    feeds, expected = tiny.sample(CHUNK)
    outputs, calls = run_hybrid(tiny.src, out / "qnn", feeds)
    assert len(calls) == len(manifest.plugins)
    np.testing.assert_allclose(outputs["logits"], expected["logits"], rtol=0, atol=1e-5)


def test_report_and_manifest(tiny: Built) -> None:
    report = tiny.report
    assert report["sample_shapes"] == [1, CHUNK]
    assert len(report["plugins"]) == len(tiny.plugins())
    for p, op in zip(report["plugins"], tiny.plugins(), strict=True):
        assert p["name"] == op.name and p["op_count"] == sum(p["op_types"].values())
        assert p["op_types"].get("Convolution", 0) >= 1 and p["weight_bytes"] > 0
        for b in p["inputs"] + p["outputs"]:
            assert len(b["shapes"]) == 2
    assert 0 < report["npu_weight_bytes"] <= report["total_weight_bytes"]
    text = (tiny.out / "partition.txt").read_text()
    assert "qnn/graph0.bin" in text and "ops left on the CPU (3)" in text
    manifest = PartitionManifest.read(tiny.out)
    assert manifest == tiny.manifest
    paths = {r.path for r in manifest.outputs}
    assert {"qnn/llm.mnn", "npu_postreat.json", "partition.json", "qnn/graph0/graph.json"} <= paths
    assert "qnn/graph1_0/input.mnn" in paths and "qnn/graph1_0/output.mnn" in paths
    assert {r.path for r in manifest.inputs} >= {"model/llm.mnn", "model/llm.mnn.weight", "io/testdir/1/input.mnn"}
    assert manifest.tools["MNN"]


# ---- bad input -----------------------------------------------------------------------------------------


def copy_io(tiny: Built, tmp_path: Path) -> Path:
    io_dir = tmp_path / "io"
    shutil.copytree(tiny.io_dir, io_dir)
    return io_dir


def test_missing_testdir_file(tiny: Built, tmp_path: Path) -> None:
    io_dir = copy_io(tiny, tmp_path)
    (io_dir / "testdir" / str(CHUNK) / "input.mnn").unlink()
    with pytest.raises(StageError, match=rf"testdir/{CHUNK}/input.mnn: sample file missing"):
        run_partition(tiny.model_dir, io_dir, tmp_path / "p")
    assert not (tmp_path / "p").exists()
    shutil.rmtree(io_dir / "testdir")
    with pytest.raises(StageError, match="sample file missing"):
        run_partition(tiny.model_dir, io_dir, tmp_path / "p")


def test_missing_io_manifest(tiny: Built, tmp_path: Path) -> None:
    with pytest.raises(StageError, match=r"io.manifest.json: manifest missing; run the io stage"):
        run_partition(tiny.model_dir, tmp_path / "nothing", tmp_path / "p")


def test_input_names_must_match_model(tiny: Built, tmp_path: Path) -> None:
    io_dir = copy_io(tiny, tmp_path)
    path = io_dir / "testdir" / "1" / "input.mnn"
    feeds = load_vars(path)
    feeds["inputs_embeds"] = feeds.pop("input_ids")
    save_vars(path, feeds)
    with pytest.raises(StageError, match=r"testdir/1/input.mnn: input names do not match .*llm.mnn.*inputs_embeds"):
        run_partition(tiny.model_dir, io_dir, tmp_path / "p")


def test_chunk_size_must_match_io(tiny: Built, tmp_path: Path) -> None:
    with pytest.raises(StageError, match=r"field 'params.chunk_size' is 16, the partition expects 32"):
        partition(
            PartitionInputs(model="m", model_dir=tiny.model_dir, io_dir=tiny.io_dir),
            PartitionParams(chunk_size=32),
            tmp_path / "p",
        )


def test_unknown_skip_name(tiny: Built, tmp_path: Path) -> None:
    with pytest.raises(StageError, match=r"field 'skips' names 'no/such/op'"):
        run_partition(tiny.model_dir, tiny.io_dir, tmp_path / "p", skips=("no/such/op",))
