"""partition stage: Plugin model, graph dirs, reference IO, CPU equivalence, report, errors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mnnbuild_runtime import HybridExecutor, PluginSpec, Segment, parse_plugins

from mnnbuild.base.errors import ManifestMissing, StageError, UpstreamError
from mnnbuild.cpu import CpuRuntime, load_module, load_vars, save_vars, var_format
from mnnbuild.lowering.support import unsupported_reason
from mnnbuild.mnn import MnnModel, Op, blob_format, load_model, plugin_attributes
from mnnbuild.mnn.split import conv_parameters
from mnnbuild.model.spec import LocalSource
from mnnbuild.partition import reference as reference_module
from mnnbuild.partition.fold import forward
from mnnbuild.partition.records import SubgraphRecord
from mnnbuild.partition.reference import SourceSubgraphRunner
from mnnbuild.partition.rewrite import plugin_attrs_of
from mnnbuild.pipeline.layout import SPLIT_DIR
from mnnbuild.stages.fetch import FetchInputs, FetchParams, fetch
from mnnbuild.stages.io import IoInputs, IoParams, generate_io
from mnnbuild.stages.partition import PartitionInputs, PartitionManifest, PartitionParams, partition
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR
from tests.test_partition_cut import KV_ATTENTION, LOGITS_SLICE, ROTARY, input_only_ops, npu_runs, rotary_ops

pytestmark = pytest.mark.slow  # every test here runs doit, a bundle or a whole model

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
            generate_io(IoInputs(model="m", model_dir=self.model_dir), IoParams(chunk_sizes=(CHUNK,)), self.io_dir)
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
        PartitionParams(chunk_sizes=(CHUNK,), **params),  # type: ignore[arg-type]
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


def cpu_compute_ops(model: MnnModel) -> list[Op]:
    """Ops of a partitioned model that compute on the CPU."""
    return [op for op in model.ops if op.type not in ("Input", "Const", "Plugin")]


def o_blob(op: Op, shape: int, tensor: int) -> object:
    """The ``o_<shape>_<j>`` Blob of a plugin's output ``tensor``."""
    return plugin_attributes(op)[f"o_{shape}_{op.outputs.index(tensor)}"]


@dataclass(frozen=True)
class PluginCall:
    """What the hybrid executor handed one plugin."""

    name: str
    shape_index: int
    graph_name: str
    inputs: list[np.ndarray]


def reference_executor(qnn_dir: Path, reference: SourceSubgraphRunner, calls: list[PluginCall]) -> HybridExecutor:
    """``mnnbuild_runtime``'s hybrid executor on ``qnn_dir/llm.mnn`` with the weight file the partition wrote beside
    it (what the bundle ships), each plugin run by its source subgraph (the context binaries do not exist yet);
    every plugin call is appended to ``calls``."""
    model_file = qnn_dir / "llm.mnn"
    model = load_model(model_file)

    def run_plugin(spec: PluginSpec, index: int, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], float]:
        graph = spec.graph_names[index]
        calls.append(PluginCall(spec.name, index, graph, list(inputs)))
        return reference.run(graph, spec.input_tensors, spec.output_tensors, inputs), 0.0

    plugins = parse_plugins(model, qnn_dir.parent, model_file, binaries=False)
    weights = qnn_dir.parent / PartitionManifest.read(qnn_dir.parent).weights.file
    return HybridExecutor(model_file, model, plugins, weights, run_plugin)


def conv_weights_of(model: MnnModel, ops: list[int]) -> int:
    return sum(conv_parameters(model.ops[i]) for i in ops if model.ops[i].type == "Convolution")


def test_an_lm_head_over_max_plugin_parameters_is_split_over_plugins(
    built: Callable[[str], Built], tmp_path: Path
) -> None:
    base = built("qwen3-untied-int8-b32")  # its lm_head (98304 weights) is bigger than any layer's plugin
    lm_head = "/lm/lm_head/Linear"
    limit = 90000
    out = tmp_path / "p"
    manifest = run_partition(base.model_dir, base.io_dir, out, max_plugin_parameters=limit)
    # the lm_head in two plugins, each layer's plugin as it was
    assert len(manifest.plugins) == len(base.plugins()) + 1
    split = f"{SPLIT_DIR}/llm.mnn"
    assert [p.split_model for p in manifest.plugins] == [None] * (len(manifest.plugins) - 2) + [split, split]
    for p in manifest.plugins[:-2]:  # byte for byte the unsplit partition's graph dirs: no layer context rebuilds
        for g in p.graphs:
            for f in ("graph.json", "input.mnn", "output.mnn"):
                assert (out / "qnn" / g / f).read_bytes() == (base.qnn / g / f).read_bytes(), (g, f)
    split_model = load_model(out / split)
    for p in manifest.plugins[-2:]:
        record = SubgraphRecord.read(out / "qnn" / p.graphs[0])
        assert record.split_model == split
        assert 0 < conv_weights_of(split_model, [op.index for op in record.ops]) <= limit
        assert split in {r.path for r in manifest.plugin_files([f"qnn/{g}" for g in p.graphs])}
    assert split not in {r.path for r in manifest.plugin_files([f"qnn/{manifest.plugins[0].graphs[0]}"])}
    result = load_model(out / "qnn" / "llm.mnn")
    join = result.op_by_name(f"{lm_head}#concat")
    assert join.type == "Concat" and not result.ops_of_type("Convolution")
    report = json.loads((out / "partition.json").read_text())
    assert "joins the 2 parts" in next(c for c in report["cpu_ops"] if c["name"] == join.name)["reason"]
    # the plugins' source subgraphs (the lm_head's from the split model) chain to the whole model's logits
    for seq in (1, CHUNK):
        feeds, expected = base.sample(seq)
        outputs, calls = run_hybrid(base.src, out / "qnn", feeds)
        assert len(calls) == len(manifest.plugins)
        np.testing.assert_allclose(outputs["logits"], expected["logits"], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "limit",
    [
        100000,  # below the lm_head (131072) and a layer's plugin (147456): both split, the lm_head at the end
        30000,  # below each MLP conv (32768): convs split in every layer, every later op index moves
    ],
)
def test_no_plugin_holds_more_than_max_plugin_parameters(tiny: Built, tmp_path: Path, limit: int) -> None:
    out = tmp_path / "p"
    manifest = run_partition(tiny.model_dir, tiny.io_dir, out, max_plugin_parameters=limit)
    assert len(manifest.plugins) > len(tiny.plugins()) + 1
    for p in manifest.plugins:
        record = SubgraphRecord.read(out / "qnn" / p.graphs[0])
        model = load_model(out / record.split_model) if record.split_model else tiny.source
        assert 0 < conv_weights_of(model, [op.index for op in record.ops]) <= limit
    for seq in (1, CHUNK):
        feeds, expected = tiny.sample(seq)
        outputs, _ = run_hybrid(tiny.src, out / "qnn", feeds)
        np.testing.assert_allclose(outputs["logits"], expected["logits"], rtol=0, atol=1e-5)


def run_hybrid(
    src: Path, qnn_dir: Path, feeds: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], list[PluginCall]]:
    """Run ``qnn_dir/llm.mnn`` with every plugin replaced by its source subgraph; returns outputs and calls."""
    calls: list[PluginCall] = []
    with SourceSubgraphRunner(src / "llm.mnn", src / "llm.mnn.weight", qnn_dir) as reference:
        return reference_executor(qnn_dir, reference, calls).run(feeds).outputs, calls


# ---- structure ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_plugins_between_cpu_attention_rotary_and_logits_slice(built: Callable[[str], Built], name: str) -> None:
    b = built(name)
    names = b.result.tensor_names
    # one plugin per maximal NPU run of the source, counted without the cut
    assert len(b.plugins()) == len(npu_runs(b.source)) == len(b.manifest.plugins)
    assert len(b.plugins()) >= b.layers + 1
    assert b.result.ops_of_type("Convolution") == []
    # every Attention stays on the CPU between plugins: its q/k/v come from plugins, its output feeds one
    assert len(b.result.ops_of_type("Attention")) == len(b.source.ops_of_type("Attention")) == b.layers
    made_by_plugin = {t for op in b.plugins() for t in op.outputs}
    read_by_plugin = {t for op in b.plugins() for t in op.inputs}
    mask = b.result.tensor_index("attention_mask")
    for op in b.result.ops_of_type("Attention"):
        assert set(op.inputs) - {mask} <= made_by_plugin
        assert set(op.outputs) <= read_by_plugin
    # the CPU ops are exactly the report's, each with its reason
    cpu = {c["name"]: c for c in b.report["cpu_ops"]}
    assert sorted(op.name for op in cpu_compute_ops(b.result)) == sorted(cpu)
    assert all(c["reason"] for c in cpu.values())
    for op in b.source.ops_of_type("Attention"):
        assert KV_ATTENTION in cpu[op.name]["reason"]
    rotary = {b.source.ops[i].name for i in rotary_ops(b.source)}
    assert rotary and {n for n, c in cpu.items() if ROTARY in c["reason"]} == rotary
    assert "logits_index" in cpu[LOGITS_SLICE]["reason"]
    last = b.plugins()[-1]
    assert "logits" in [names[t] for t in last.outputs]
    assert b.result.output_names == b.source.output_names
    assert b.result.input_names == b.source.input_names


@pytest.mark.parametrize("name", list(MODELS))
def test_cpu_ops_between_plugins_are_attention_and_logits_slice(built: Callable[[str], Built], name: str) -> None:
    """qnn/llm.mnn runs its ops in a valid order, with the rotary phase ahead of the first plugin: between
    plugins only the attentions, the logits slice and ops that read nothing but graph inputs."""
    b = built(name)
    result = b.result
    made = set(result.input_indexes)
    for op in result.ops:
        assert all(t in made for t in op.inputs if t >= 0), op.name
        made.update(op.outputs)
    assert len(b.plugins()) == len(result.ops_of_type("Attention")) + 2
    kinds = [op.type == "Plugin" for op in result.ops]
    first, last = kinds.index(True), len(kinds) - 1 - kinds[::-1].index(True)
    between = [op for op in result.ops[first:last] if op.type not in ("Input", "Const", "Plugin")]
    allowed = {result.ops[i].name for i in input_only_ops(result)}
    odd = [op.name for op in between if op.type != "Attention" and op.name != LOGITS_SLICE and op.name not in allowed]
    assert between and not odd
    rotary = {b.source.ops[i].name for i in rotary_ops(b.source)}
    assert rotary <= {op.name for op in result.ops[:first]}


def test_plugin_attributes(tiny: Built) -> None:
    for k, op in enumerate(tiny.plugins()):
        attrs = plugin_attributes(op)
        assert op.main.type == "QNN"
        assert op.name == attrs["path"] == f"qnn/graphllm{k}.bin"
        assert attrs["allGraphName"] == [f"graphllm{k}", f"graphllm1_{k}"]
        assert set(attrs) == {"path", "inputs", "outputs", "allGraphName", "allInputShape"} | {
            f"o_{s}_{j}" for s in (0, 1) for j in range(len(op.outputs))
        }
        descs = [SubgraphRecord.read(tiny.qnn / g) for g in attrs["allGraphName"]]
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
        "merge": {
            f"qnn/graphllm{k}.bin": [f"qnn/graphllm{k}", f"qnn/graphllm1_{k}"] for k in range(len(tiny.plugins()))
        },
        "cache": "qnn",
    }


@pytest.mark.parametrize("name", list(MODELS))
def test_nc4hw4_outputs_keep_their_format(built: Callable[[str], Built], name: str) -> None:
    """``o_*``: dims of the dense logical-NCHW array the QNN graph writes, and the layout MNN keeps the
    tensor in within the whole source graph (into which the device runtime converts it)."""
    b = built(name)
    for s, seq in enumerate((1, CHUNK)):
        feeds, _ = b.sample(seq)
        outputs = [(op, t) for op in b.plugins() for t in op.outputs]
        names = [b.result.tensor_names[t] for _, t in outputs]
        rt = CpuRuntime().create(b.src / "llm.mnn.weight")
        whole = load_module(b.src / "llm.mnn", rt, list(feeds), names)
        layouts = [var_format(v) for v in forward(whole, list(feeds.values()))]
        for (op, t), n, layout in zip(outputs, names, layouts, strict=True):
            blob = o_blob(op, s, t)
            assert blob_format(blob) == layout, (n, s)
            desc = SubgraphRecord.read(b.qnn / plugin_attributes(op)["allGraphName"][s])
            spec = next(x for x in desc.outputs if x.name == n)
            _, refs = desc.load_reference(b.qnn / desc.graph)
            ref = refs[desc.outputs.index(spec)]
            assert [int(d) for d in blob.dims] == spec.shape == list(ref.shape)
            assert spec.format == layout
        # the v_proj outputs (Convolution -> CPU Attention) of every layer are NC4HW4, the logits not
        v_proj = [k for k, n in enumerate(names) if n.endswith("v_proj/Linear")]
        assert [layouts[k] for k in v_proj] == ["NC4HW4"] * b.layers
        for k in v_proj:  # as serialized: MNN_DATA_FORMAT_NC4HW4 = 2
            op, t = outputs[k]
            assert plugin_attrs_of(op)[f"o_{s}_{op.outputs.index(t)}"]["dataFormat"] == 2
        assert layouts[names.index("logits")] == "NCHW"


def test_executor_converts_layouts_at_plugin_boundaries(tiny: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the device runtime does: CPU segments read a plugin output in its ``o_*`` layout, plugins get
    dense logical-NCHW arrays of the shapes their graphs were built for."""
    fed: list[list[str]] = []

    class Spy:
        def __init__(self, module: Any) -> None:
            self.module = module

        def forward(self, variables: list[Any]) -> list[Any]:
            fed.append([var_format(v) for v in variables])
            return self.module.forward(variables)

    real = HybridExecutor._module
    monkeypatch.setattr(HybridExecutor, "_module", lambda self, seg: Spy(real(self, seg)))
    feeds, expected = tiny.sample(CHUNK)
    calls: list[PluginCall] = []
    with SourceSubgraphRunner(tiny.src / "llm.mnn", tiny.src / "llm.mnn.weight", tiny.qnn) as reference:
        executor = reference_executor(tiny.qnn, reference, calls)
        outputs = executor.run(feeds).outputs
    np.testing.assert_allclose(outputs["logits"], expected["logits"], rtol=0, atol=1e-5)
    # what each CPU segment was fed, against the o_* layout of the plugin output it reads
    made_by: dict[int, Op] = {t: op for op in tiny.plugins() for t in op.outputs}
    segments = [step for step in executor.steps if isinstance(step, Segment)]
    assert len(fed) == len(segments)
    converted = []
    for seg, formats in zip(segments, fed, strict=True):
        for name, got in zip(seg.inputs, formats, strict=True):
            t = tiny.result.tensor_index(name)
            if t in made_by:
                want = blob_format(o_blob(made_by[t], 1, t))
                assert got == want, tiny.result.tensor_names[t]
                converted.append(want)
    assert "NC4HW4" in converted  # v_proj -> Attention
    for call in calls:
        desc = SubgraphRecord.read(tiny.qnn / call.graph_name)
        assert [list(a.shape) for a in call.inputs] == [t.shape for t in desc.inputs]
        assert all(a.flags.c_contiguous for a in call.inputs)


def test_promoted_internal_tensor(tiny: Built) -> None:
    # the rotary tables are made and used in the plugin of layer 0 (mask 3) and read again by a later
    # plugin (layer 1): promoted to an output of the first
    rope = "/blocks.0/self_attn/Gather_2_output_0"
    graphs = [SubgraphRecord.read(tiny.qnn / f"graphllm{k}") for k in range(len(tiny.plugins()))]
    made = [{tiny.source.tensor_names[t] for o in d.ops for t in o.outputs} for d in graphs]
    maker = next(k for k, names in enumerate(made) if rope in names)
    assert rope in [t.name for t in graphs[maker].outputs]
    assert any(tiny.source.tensor_names[i] == rope for op in graphs[maker].ops for i in op.inputs)
    readers = [k for k, d in enumerate(graphs) if rope in [t.name for t in d.inputs]]
    assert readers and all(k > maker for k in readers)
    # in qnn/llm.mnn the plugins share the tensor
    rope_index = tiny.result.tensor_index(rope)
    assert rope_index in tiny.plugins()[maker].outputs
    assert all(rope_index in tiny.plugins()[k].inputs for k in readers)


def test_graph_descriptions(tiny: Built) -> None:
    for op in tiny.plugins():
        attrs = plugin_attributes(op)
        for s, graph in enumerate(attrs["allGraphName"]):
            desc = SubgraphRecord.read(tiny.qnn / graph)
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
    reshape = next(
        f for f in SubgraphRecord.read(tiny.qnn / "graphllm1_0").folded if f.name.endswith("Concat_output_0")
    )
    assert reshape.values is not None and reshape.values[1] == CHUNK


def test_reference_io_chains(tiny: Built) -> None:
    """Each graph's reference output is what its ops compute from its reference input."""
    with SourceSubgraphRunner(tiny.src / "llm.mnn", tiny.src / "llm.mnn.weight", tiny.qnn) as reference:
        for op in tiny.plugins():
            for graph in plugin_attributes(op)["allGraphName"]:
                desc = SubgraphRecord.read(tiny.qnn / graph)
                ins, outs = desc.load_reference(tiny.qnn / graph)
                got_outs = reference.run(graph, [t.name for t in desc.inputs], [t.name for t in desc.outputs], ins)
                for got, want in zip(got_outs, outs, strict=True):
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
        assert {c.graph_name for c in calls} == {
            f"graphllm{k}" if s == 0 else f"graphllm1_{k}" for k in range(len(calls))
        }
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
        assert op["name"] == f"qnn/graphllm{k}.bin" and op["main"]["type"] == "QNN"
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
    assert "Plugin is not supported" in text and "qnn/graphllm0.bin" in text, text


# ---- parameters: skips, unsupported ops, report ------------------------------------------------------


def test_each_subgraph_is_loaded_once_for_every_shape(
    tiny: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MNN prepares a module's weights when it first runs it: one load per subgraph serves the decode and the
    # prefill sample (a load per shape paid for every layer's weights twice), with the same outputs
    loads: list[tuple[tuple[str, ...], tuple[str, ...]]] = []

    def counting(model: Path, rt: Any, inputs: Sequence[str] = (), outputs: Sequence[str] = ()) -> Any:
        loads.append((tuple(inputs), tuple(outputs)))
        return load_module(model, rt, inputs, outputs)

    monkeypatch.setattr(reference_module, "load_module", counting)
    manifest = run_partition(tiny.model_dir, tiny.io_dir, tmp_path / "p")
    assert len(manifest.seq_lens) == 2
    assert len(loads) == len(set(loads)) > len(manifest.plugins)
    # and every shape's module runs chain to its sample's outputs (the stage checks that) with the same graph dirs
    for graph in (p for plugin in manifest.plugins for p in plugin.graphs):
        files = sorted(f.name for f in (tiny.qnn / graph).iterdir())
        assert files == sorted(f.name for f in (tmp_path / "p" / "qnn" / graph).iterdir())
        for name in files:
            assert (tmp_path / "p" / "qnn" / graph / name).read_bytes() == (tiny.qnn / graph / name).read_bytes()


def test_skips_keep_op_on_cpu(tiny: Built, tmp_path: Path) -> None:
    skipped = "/layers.0/mlp/gate_proj/Linear"
    manifest = run_partition(tiny.model_dir, tiny.io_dir, tmp_path / "p", skips=(skipped,))
    # the skipped Convolution splits its plugin in two
    assert len(manifest.plugins) == len(tiny.plugins()) + 1 == len(npu_runs(tiny.source, skips=(skipped,)))
    assert manifest.params.skips == (skipped,)
    result = load_model(tmp_path / "p" / "qnn" / "llm.mnn")
    assert [op.name for op in result.ops_of_type("Convolution")] == [skipped]
    report = json.loads((tmp_path / "p" / "partition.json").read_text())
    assert {"name": skipped, "reason": "named in skips"}.items() <= next(
        c for c in report["cpu_ops"] if c["name"] == skipped
    ).items()
    # a CPU Convolution between plugins reads and writes NC4HW4 tensors: still the same outputs
    for seq in (1, CHUNK):
        feeds, expected = tiny.sample(seq)
        outputs, _ = run_hybrid(tiny.src, tmp_path / "p" / "qnn", feeds)
        np.testing.assert_allclose(outputs["logits"], expected["logits"], rtol=0, atol=1e-5)


def test_unsupported_kind_stays_on_cpu(tiny: Built, tmp_path: Path) -> None:
    # Concat sits inside plugins (the rotary tables, the rope halves); refusing it splits them
    def no_concat(op: Op, model: MnnModel, static: object) -> str | None:
        if op.type == "Concat":
            return "Concat is not lowered in this test"
        return unsupported_reason(op, model, static)  # type: ignore[arg-type]

    assert any(tiny.source.ops[i].type == "Concat" for run in npu_runs(tiny.source) for i in run)
    manifest = run_partition(tiny.model_dir, tiny.io_dir, tmp_path / "p", support=no_concat)
    out = tmp_path / "p"
    result = load_model(out / "qnn" / "llm.mnn")
    assert len(manifest.plugins) == len(npu_runs(tiny.source, support=no_concat)) > len(tiny.plugins())
    report = json.loads((out / "partition.json").read_text())
    on_cpu = {c["name"]: c["reason"] for c in report["cpu_ops"] if c["type"] == "Concat"}
    assert sorted(on_cpu) == sorted(op.name for op in result.ops_of_type("Concat"))
    assert on_cpu and set(on_cpu.values()) == {"QNN lowering: Concat is not lowered in this test"}
    for p in report["plugins"]:
        assert "Concat" not in p["op_types"]
    assert "Concat is not lowered in this test" in (out / "partition.txt").read_text()
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
    cpu_ops = cpu_compute_ops(tiny.result)
    assert len(report["cpu_ops"]) == len(cpu_ops) == tiny.manifest.cpu_ops
    assert "qnn/graphllm0.bin" in text and f"ops left on the CPU ({len(cpu_ops)})" in text
    assert report["moved_ops"] > 0 and f"({report['moved_ops']} ops moved ahead of the source order)" in text
    for c in report["cpu_ops"]:
        assert f"{c['name']}: {c['reason']}" in text
    # boundary layouts: an output's is its o_* format
    for p, op in zip(report["plugins"], tiny.plugins(), strict=True):
        for j, b in enumerate(p["outputs"]):
            assert b["format"] == blob_format(plugin_attributes(op)[f"o_0_{j}"])
    assert "NC4HW4" in {b["format"] for p in report["plugins"] for b in p["outputs"]}
    manifest = PartitionManifest.read(tiny.out)
    assert manifest == tiny.manifest
    paths = {r.path for r in manifest.outputs}
    assert {"qnn/llm.mnn", "npu_postreat.json", "partition.json", "qnn/graphllm0/graph.json"} <= paths
    assert "qnn/graphllm1_0/input.mnn" in paths and "qnn/graphllm1_0/output.mnn" in paths
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
    with pytest.raises(UpstreamError, match=rf"testdir/{CHUNK}/input.mnn: sample file missing"):
        run_partition(tiny.model_dir, io_dir, tmp_path / "p")
    assert not (tmp_path / "p").exists()
    shutil.rmtree(io_dir / "testdir")
    with pytest.raises(UpstreamError, match="sample file missing"):
        run_partition(tiny.model_dir, io_dir, tmp_path / "p")


def test_missing_io_manifest(tiny: Built, tmp_path: Path) -> None:
    with pytest.raises(ManifestMissing, match=r"io.manifest.json: manifest missing; run the io stage"):
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
    with pytest.raises(StageError, match=r"field 'params.chunk_sizes' is \[16\], the partition expects \[16, 8\]"):
        partition(
            PartitionInputs(model="m", model_dir=tiny.model_dir, io_dir=tiny.io_dir),
            PartitionParams(chunk_sizes=(16, 8)),
            tmp_path / "p",
        )


def test_unknown_skip_name(tiny: Built, tmp_path: Path) -> None:
    with pytest.raises(StageError, match=r"field 'skips' names 'no/such/op'"):
        run_partition(tiny.model_dir, tiny.io_dir, tmp_path / "p", skips=("no/such/op",))


def test_a_damaged_graph_file_is_one_line_naming_it(tiny: Built, tmp_path: Path) -> None:
    """A graph dir's folded values or reference IO that lost a tensor (a damaged or foreign file) say which file
    and which tensor, not a KeyError (verify's per-graph check reads them)."""
    graph = next(
        g for g in sorted(p.name for p in tiny.qnn.iterdir() if p.is_dir()) if (tiny.qnn / g / "folded.mnn").exists()
    )
    copy = tmp_path / graph
    shutil.copytree(tiny.qnn / graph, copy)
    desc = SubgraphRecord.read(copy)
    (copy / "folded.mnn").write_bytes(b"garbage")
    folded = re.escape(str(copy / "folded.mnn"))
    with pytest.raises(UpstreamError, match=rf"{folded}: tensor '.+' expected with shape \[.*\], found no such tensor"):
        desc.load_folded(copy)
    (copy / desc.reference_output).unlink()
    with pytest.raises(
        UpstreamError, match=re.escape(f"{copy / desc.reference_output}: missing; run the partition stage")
    ):
        desc.load_reference(copy)
