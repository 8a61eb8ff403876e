"""No dead weights in a bundle (issue 26): the shipped weight file holds only what the phone reads of the model's.

The partition writes it (`mnnbuild.partition.strip`): the bytes the CPU ops of ``qnn/llm.mnn`` read and the tied
embeddings ``llm_config.json`` points at, the offsets in both moved to match. Shown here: MNN on the CPU computes the
same outputs bit for bit from the stripped pair as from the partitioned model with the source's offsets and file,
for the tiny model and the untied int8 and channel-wise fixtures (with ops that read the weight file kept on the
CPU through ``skips``, so the stripped file has something to serve); the file's size is the union of what those ops
and the embeddings read, computed from the source model's op records; the embeddings read through the moved
``tie_embeddings`` are the source's; the source model dir is never written; the bundle shares no inode with it; and
bad entries fail in one line.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from mnnbuild_runtime import Bundle, BundleError, Embeddings, HybridExecutor, PluginSpec, parse_plugins

from mnnbuild.base.errors import MNNFormatError, ModelDirError, StageError
from mnnbuild.cpu import CpuRuntime, load_module, to_numpy, to_var
from mnnbuild.manifests.bundle import BundleInputs, BundleParams
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.mnn import (
    MnnModel,
    Op,
    WeightRange,
    external_ranges,
    load_model,
    plan_weights,
    read_embeddings,
    relocate_model,
    save_model,
    schema,
    tie_embeddings,
    write_weights,
)
from mnnbuild.mnn.strip import LEAD
from mnnbuild.model.modeldir import validate_model_dir
from mnnbuild.model.targets import soc_for_arch
from mnnbuild.partition.reference import SourceSubgraphRunner
from mnnbuild.stages.bundle import assemble_bundle
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR, doit
from tests.test_partition import CHUNK, Built

MODELS = {
    "tiny-qwen3": TINY_MODEL_DIR,
    "qwen3-untied-int8-b32": FIXTURE_MODELS / "qwen3-untied-int8-b32",
    "llama-int4-cw": FIXTURE_MODELS / "llama-int4-cw",
}
TIED = "tiny-qwen3"
LM_HEAD = "/lm/lm_head/Linear"


def reads_weights(op: Op) -> bool:
    ext = getattr(op.main, "external", None) if op.main is not None else None
    return ext is not None and len(ext) > 1


def cpu_skips(source: MnnModel, tied: bool) -> tuple[str, ...]:
    """Ops that read the weight file, forced onto the CPU: the first LayerNorm and Convolution of the model and, for
    a tied model, the lm_head (whose codes the tied embeddings share: overlapping ranges)."""
    first = [next(op.name for op in source.ops if op.type == kind and reads_weights(op)) for kind in ("LayerNorm",
             "Convolution")]  # fmt: skip
    return (*first, LM_HEAD) if tied else tuple(first)


@pytest.fixture(scope="module")
def stripped(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Built]:
    """Each model fetched, sampled and partitioned with ops that read the weight file kept on the CPU."""
    cache: dict[str, Built] = {}

    def get(name: str) -> Built:
        if name not in cache:
            source = load_model(MODELS[name] / "llm.mnn")
            skips = cpu_skips(source, name == TIED)
            cache[name] = Built(tmp_path_factory.mktemp(name), MODELS[name], skips=skips)
        return cache[name]

    return get


def source_ranges(partitioned: MnnModel, source: MnnModel) -> list[tuple[int, int]]:
    """What the CPU ops of ``partitioned`` read of the source's weight file, from the source ops' own records."""
    by_name = {op.name: op for op in source.ops}
    found = []
    for op in partitioned.ops:
        if reads_weights(op):
            ext = [int(v) for v in by_name[op.name].main.external]
            found.append((ext[0], ext[0] + sum(ext[1:])))
    return found


def tie_range(model_dir: Path) -> tuple[int, int] | None:
    tie = json.loads((model_dir / "llm_config.json").read_text()).get("tie_embeddings")
    return (tie[0], tie[1] + tie[2]) if tie else None


def union_size(ranges: Sequence[tuple[int, int]]) -> int:
    covered: set[int] = set()
    for start, end in ranges:
        covered.update(range(start, end))
    return len(covered)


def expected_size(cpu: list[tuple[int, int]], tied: tuple[int, int] | None) -> int:
    """The union of what the CPU ops and the tied embeddings read, after `LEAD` zero bytes when the embeddings come
    first (a tied weight_offset of 0 would name a separate file)."""
    ranges = cpu + ([tied] if tied else [])
    lead = LEAD if tied and min(start for start, _ in ranges) == tied[0] else 0
    return union_size(ranges) + lead


def with_source_offsets(partitioned: MnnModel, source: MnnModel) -> MnnModel:
    """``partitioned`` with every CPU op's parameters the source's: the partitioned model as it reads the source's
    weight file (what the bundle shipped before the weights were stripped)."""
    by_name = {op.name: op for op in source.ops}
    ops = [dataclasses.replace(op, main=by_name[op.name].main) if reads_weights(op) else op for op in partitioned.ops]
    return dataclasses.replace(partitioned, ops=ops)


def run_on_cpu(model_file: Path, weight_file: Path, b: Built, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``model_file`` on MNN's CPU with ``weight_file``: its CPU ops between plugins, each plugin computed by its
    source ops (the partition's graph dirs, the source weight file)."""
    model = load_model(model_file)

    with SourceSubgraphRunner(b.src / "llm.mnn", b.src / "llm.mnn.weight", b.qnn) as reference:

        def run_plugin(spec: PluginSpec, index: int, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], float]:
            return reference.run(spec.graph_names[index], spec.input_tensors, spec.output_tensors, inputs), 0.0

        plugins = parse_plugins(model, b.out, model_file, binaries=False)
        return HybridExecutor(model_file, model, plugins, weight_file, run_plugin).run(feeds).outputs


# ---- MNN on the CPU: the stripped pair computes what the source's did ----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_stripped_weight_file_serves_the_cpu_ops_bit_exactly(
    stripped: Callable[[str], Built], name: str, tmp_path: Path
) -> None:
    b = stripped(name)
    weights = b.out / b.manifest.weights.file
    cpu_readers = [op.name for op in b.result.ops if reads_weights(op)]
    assert set(cpu_skips(b.source, name == TIED)) <= set(cpu_readers), "the skipped ops read the weight file"
    original = tmp_path / "qnn" / "llm.mnn"
    save_model(with_source_offsets(b.result, b.source), original)
    for seq in (1, CHUNK):
        feeds, expected = b.sample(seq)
        want = run_on_cpu(original, b.src / "llm.mnn.weight", b, feeds)
        got = run_on_cpu(b.qnn / "llm.mnn", weights, b, feeds)
        assert sorted(got) == sorted(want) == sorted(expected)
        for out in want:
            np.testing.assert_array_equal(got[out], want[out], err_msg=f"{name} seq {seq} {out}")
            np.testing.assert_allclose(got[out], expected[out], rtol=0, atol=1e-5)  # and it is the model's answer
    # the pair belongs together: the stripped model with the source's file reads other bytes
    feeds, _ = b.sample(1)
    try:
        wrong = run_on_cpu(b.qnn / "llm.mnn", b.src / "llm.mnn.weight", b, feeds)
    except BundleError:
        return  # MNN refused the bytes it found there
    assert any(not np.array_equal(wrong[n], want[n]) for n in want)


@pytest.mark.parametrize("name", list(MODELS))
def test_stripped_size_is_what_the_cpu_ops_and_embeddings_read(stripped: Callable[[str], Built], name: str) -> None:
    b = stripped(name)
    cpu = source_ranges(b.result, b.source)
    tied = tie_range(b.src)
    shipped = b.manifest.weights
    size = (b.out / shipped.file).stat().st_size
    assert size == shipped.bytes == expected_size(cpu, tied)
    assert shipped.cpu_op_bytes == union_size(cpu) and shipped.tie_embedding_bytes == (tied[1] - tied[0] if tied else 0)
    assert shipped.source_bytes == (b.src / "llm.mnn.weight").stat().st_size > size
    # every block is the source's bytes
    data, source = (b.out / shipped.file).read_bytes(), (b.src / "llm.mnn.weight").read_bytes()
    for block in shipped.blocks:
        assert data[block.offset : block.offset + block.size] == source[block.source_offset :][: block.size]


def test_tie_embeddings_point_at_the_same_bytes(stripped: Callable[[str], Built]) -> None:
    b = stripped(TIED)
    src_tie = json.loads((b.src / "llm_config.json").read_text())["tie_embeddings"]
    config = json.loads((b.out / "llm_config.json").read_text())
    tie = config["tie_embeddings"]
    assert tie[2:] == src_tie[2:] and tie[1] - tie[0] == src_tie[1] - src_tie[0]
    assert tie[0] > 0, "weight_offset 0 would send MNN's engine to a separate embedding file"
    data, source = (b.out / "llm.mnn.weight").read_bytes(), (b.src / "llm.mnn.weight").read_bytes()
    assert data[tie[0] : tie[1] + tie[2]] == source[src_tie[0] : src_tie[1] + src_tie[2]]
    # nothing else in llm_config.json changed
    assert {k: v for k, v in config.items() if k != "tie_embeddings"} == {
        k: v for k, v in json.loads((b.src / "llm_config.json").read_text()).items() if k != "tie_embeddings"
    }
    # the embedding lookup, as verify's generation and the runtime do it, is the source model's bit for bit
    np.testing.assert_array_equal(read_embeddings(b.out), read_embeddings(b.src))
    ids = [0, 5, 1023, 5, 17]
    np.testing.assert_array_equal(Embeddings(b.out)(ids), Embeddings(b.src)(ids))


@pytest.mark.parametrize("name", ["qwen3-untied-int8-b32", "llama-int4-cw"])
def test_an_untied_model_keeps_its_llm_config_as_it_is(stripped: Callable[[str], Built], name: str) -> None:
    b = stripped(name)
    assert (b.out / "llm_config.json").read_bytes() == (b.src / "llm_config.json").read_bytes()
    assert b.manifest.weights.tie_embedding_bytes == 0


# ---- the format layer ------------------------------------------------------------------------------------


def _conv(offset: int, sizes: Sequence[int]) -> object:
    conv = schema.Convolution2DT()
    conv.common = schema.Convolution2DCommonT()
    conv.external = [offset, *sizes]
    return conv


def test_external_ranges_find_every_kind_of_external_data() -> None:
    """Any parameter table with external data, nested ones included; an op naming its own file reads that one."""
    norm = schema.LayerNormT()
    norm.external = [100, 8, 8]
    blob = schema.BlobT()
    blob.external = [300, 16]
    scale = schema.ScaleT()
    scale.external = [400, 4, 4]
    fused = schema.FusedLinearParamT()
    fused.convs = [_conv(500, [32, 8, 4, 0])]
    fused.ln = schema.LayerNormT()
    fused.ln.external = [600, 4, 4]
    rope = schema.RoPEParamT()
    rope.qNorm = schema.LayerNormT()
    rope.qNorm.external = [700, 4, 0]
    inline = schema.LayerNormT()
    inline.gamma = [1.0]
    ops = [
        Op("Convolution", "conv", [0], [1], _conv(0, [64, 16, 8, 0])),
        Op("LayerNorm", "norm", [1], [2], norm),
        Op("LayerNorm", "inline", [2], [3], inline),
        Op("Const", "const", [], [4], blob),
        Op("Scale", "scale", [4], [5], scale),
        Op("FusedLinear", "fused", [5], [6], fused),
        Op("RoPE", "rope", [6], [7], rope),
        Op("Const", "elsewhere", [], [8], copy.deepcopy(blob), external_path="other.weight"),
    ]
    model = MnnModel(ops=ops, tensor_names=[f"t{i}" for i in range(9)])
    found = {(r.reader, r.offset, r.size) for r in external_ranges(model)}
    assert found == {
        ("op 'conv'", 0, 88),
        ("op 'norm'", 100, 16),
        ("op 'const'", 300, 16),
        ("op 'scale'", 400, 8),
        ("op 'fused'", 500, 44),
        ("op 'fused'", 600, 8),
        ("op 'rope'", 700, 4),
    }


def test_plan_merges_ranges_and_keeps_the_tied_embeddings_off_zero(tmp_path: Path) -> None:
    source = tmp_path / "w"
    source.write_bytes(bytes(range(256)) * 4)
    ranges = [WeightRange(100, 20, "a"), WeightRange(110, 30, "b"), WeightRange(140, 10, "c"), WeightRange(500, 5, "d")]
    plan = plan_weights(source, ranges)
    assert [(k.source_offset, k.offset, k.size) for k in plan.blocks] == [(100, 0, 50), (500, 50, 5)]
    assert plan.size == 55 and plan.moved(110, 30) == 10 and plan.moved(502) == 52
    with pytest.raises(MNNFormatError, match="not kept"):
        plan.moved(150, 1)
    write_weights(plan, tmp_path / "out")
    data = source.read_bytes()
    assert (tmp_path / "out").read_bytes() == data[100:150] + data[500:505]
    # a tied weight_offset never lands at 0 (MNN would read a separate embedding file)
    led = plan_weights(source, ranges, never_at_zero=[100])
    assert led.moved(100) == LEAD and led.size == 55 + LEAD
    write_weights(led, tmp_path / "led")
    assert (tmp_path / "led").read_bytes() == bytes(LEAD) + data[100:150] + data[500:505]
    assert plan_weights(source, ranges, never_at_zero=[500]).blocks[0].offset == 0
    assert plan_weights(source, []).size == 0
    with pytest.raises(MNNFormatError, match=r"/w: op 'x' needs bytes \[1000, 1100\) but the weight file has 1024"):
        plan_weights(source, [WeightRange(1000, 100, "op 'x'")])


@pytest.mark.parametrize("name", list(MODELS))
def test_the_whole_model_moved_computes_the_same_on_mnn(name: str, tmp_path: Path) -> None:
    """Every op of the source model reading a relocated file (each offset moved by `LEAD`): MNN gives the same
    logits bit for bit, and the source model object is left as it was."""
    src = MODELS[name]
    model = load_model(src / "llm.mnn")
    before = [list(op.main.external) for op in model.ops if reads_weights(op)]
    ranges = external_ranges(model)
    plan = plan_weights(src / "llm.mnn.weight", ranges, never_at_zero=[min(r.offset for r in ranges)])
    moved = relocate_model(model, plan)
    assert [list(op.main.external) for op in model.ops if reads_weights(op)] == before
    assert all(op.main.external[0] == old[0] + LEAD for op, old in zip(
        [o for o in moved.ops if reads_weights(o)], before, strict=True))  # fmt: skip
    save_model(moved, tmp_path / "llm.mnn")
    write_weights(plan, tmp_path / "llm.mnn.weight")
    hidden = json.loads((src / "llm_config.json").read_text())["hidden_size"]
    seq = 3
    feeds = {
        "input_ids": np.random.default_rng(0).standard_normal((seq, 1, hidden)).astype(np.float32) * 0.05,
        "attention_mask": np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), 1).reshape(1, 1, 3, 3),
        "position_ids": np.arange(seq, dtype=np.int32).reshape(1, seq),
        "logits_index": np.array([-1], np.int32),
    }
    outs = []
    for where in (src, tmp_path):
        module = load_module(where / "llm.mnn", CpuRuntime().create(where / "llm.mnn.weight"), list(feeds), ["logits"])
        outs.append(to_numpy(module.forward([to_var(v) for v in feeds.values()])[0]))
    np.testing.assert_array_equal(outs[1], outs[0])


def engine_logits(config: Path, prompt: Sequence[int]) -> np.ndarray:
    """The prompt's last logits from MNN's own LLM engine (PyPI ``MNN.llm``: it embeds the tokens itself, from
    ``tie_embeddings``), on the CPU, one thread."""
    import MNN.llm  # never MNN.tools

    engine = MNN.llm.create(str(config))
    engine.set_config({"backend_type": "cpu", "thread_num": 1, "sampler_type": "greedy"})
    engine.load()
    logits = engine.forward(list(prompt))
    values = to_numpy(logits).copy()
    del logits  # before the engine (freeing its output after the engine crashes)
    del engine
    return values


def test_mnn_engine_embeds_through_the_moved_tie_embeddings(tmp_path: Path) -> None:
    """MNN's engine on the tiny model with every offset moved (the ops' and ``tie_embeddings``, `LEAD` bytes in
    front, as the partition lays the tied embeddings out): the source's logits bit for bit; with ``tie_embeddings``
    left where they were, other logits."""
    src = TINY_MODEL_DIR
    model = load_model(src / "llm.mnn")
    config = json.loads((src / "llm_config.json").read_text())
    tie = tie_embeddings(config, src / "llm_config.json")
    assert tie is not None and (tied := tie.weight_range()) is not None
    ranges = [*external_ranges(model), tied]
    plan = plan_weights(src / "llm.mnn.weight", ranges, never_at_zero=[min(r.offset for r in ranges)])
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("config.json", "tokenizer.mtok"):
        shutil.copy(src / name, moved / name)
    save_model(relocate_model(model, plan), moved / "llm.mnn")
    write_weights(plan, moved / "llm.mnn.weight")
    moved_config = tie.moved(config, plan.moved(tied.offset, tied.size))
    assert moved_config["tie_embeddings"][0] == plan.moved(tie.weight_offset) != tie.weight_offset
    (moved / "llm_config.json").write_text(json.dumps(moved_config))
    prompt = [1, 2, 3, 40, 500, 7]
    want = engine_logits(src / "config.json", prompt)
    np.testing.assert_array_equal(engine_logits(moved / "config.json", prompt), want)
    (moved / "llm_config.json").write_text(json.dumps(config))  # the ops moved, the embeddings' offsets not
    assert not np.array_equal(engine_logits(moved / "config.json", prompt), want)


# ---- the bundle ----------------------------------------------------------------------------------------------


def tree_hashes(root: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


BUNDLED = (TIED, "llama-int4-cw")


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, tuple[str, int]]]]:
    """The tiny model and the untied channel-wise fixture bundled by doit; with each source dir's hashes before."""
    cwd = tmp_path_factory.mktemp("bundled")
    specs = cwd / "specs"
    specs.mkdir()
    (specs / "cw.toml").write_text(
        f'name = "llama-int4-cw"\nsource = {{ local = "{MODELS["llama-int4-cw"]}" }}\ntargets = ["v79"]\n'
    )
    before = {name: tree_hashes(MODELS[name]) for name in BUNDLED}
    proc = doit(cwd, "-n", "2", *(f"bundle:{n}-v79" for n in BUNDLED), env={"MNNBUILD_MODELS_PATH": str(specs)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cwd / "artifacts", before


@pytest.mark.slow
@pytest.mark.parametrize("name", BUNDLED)
def test_bundle_ships_the_stripped_file_and_never_touches_the_source(
    bundled: tuple[Path, dict[str, dict[str, tuple[str, int]]]], name: str
) -> None:
    root, before = bundled
    src = MODELS[name]
    assert tree_hashes(src) == before[name], "the source model dir was written"
    partition = root / name / "partition"
    shipped = PartitionManifest.read(partition).weights
    bundle = root / name / "v79" / "bundle" / "model" / src.name
    assert (bundle / "llm.mnn.weight").read_bytes() == (partition / shipped.file).read_bytes()
    assert (bundle / "llm_config.json").read_bytes() == (partition / "llm_config.json").read_bytes()
    result = load_model(bundle / "qnn" / "llm.mnn")
    cpu = source_ranges(result, load_model(src / "llm.mnn"))
    tied = tie_range(src)
    assert (bundle / "llm.mnn.weight").stat().st_size == expected_size(cpu, tied)
    if tied:
        assert not (bundle / "embeddings_bf16.bin").exists()
        assert (bundle / "llm.mnn.weight").stat().st_size < (src / "llm.mnn.weight").stat().st_size / 3
    else:  # the embeddings ship as they are; no layer weights do
        assert (bundle / "embeddings_bf16.bin").read_bytes() == (src / "embeddings_bf16.bin").read_bytes()
        assert (bundle / "llm.mnn.weight").stat().st_size == union_size(cpu) == 0
    # a bundle never shares an inode with the user's files
    sources = {(p.stat().st_dev, p.stat().st_ino) for p in src.rglob("*") if p.is_file()}
    for f in (p for p in bundle.rglob("*") if p.is_file()):
        assert not f.is_symlink() and f.stat().st_nlink == 1, f
        assert (f.stat().st_dev, f.stat().st_ino) not in sources, f
    # the runtime opens it and reads the source model's embeddings
    opened = Bundle.open(bundle)
    assert opened.weight_file == bundle / "llm.mnn.weight"
    ids = [1, 2, 3, 40, 2]
    np.testing.assert_array_equal(Embeddings(bundle)(ids), Embeddings(src)(ids))


# ---- bad entries: one line ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tie", "expected"),
    [
        ([190794, 256330, 16384], r"llm_config.json: field 'tie_embeddings' \[.*\] needs 5 numbers"),
        ("190794", r"llm_config.json: field 'tie_embeddings' must be a list of 5 integers or an object"),
        (
            [190794, 256330, 16384, 4, "64"],
            r"llm_config.json: field 'tie_embeddings' entry 4 must be an integer, got '64'",
        ),
        ([256330, 190794, 16384, 4, 64], r"alpha_offset 190794 must follow weight_offset 256330"),
        ([190794, 256330, 16384, 5, 64], r"field 'tie_embeddings': quant_bit 5, expected"),
        (
            [190794, 300000, 16384, 4, 64],
            r"llm.mnn.weight: llm_config.json field 'tie_embeddings' needs bytes \[190794, 316384\) but the weight "
            r"file has 272714 bytes",
        ),
    ],
)
def test_a_bad_tie_embeddings_entry_is_one_line_at_fetch(tmp_path: Path, tie: object, expected: str) -> None:
    model = tmp_path / "m"
    shutil.copytree(TINY_MODEL_DIR, model)
    config = json.loads((model / "llm_config.json").read_text())
    config["tie_embeddings"] = tie
    (model / "llm_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelDirError, match=expected) as err:
        validate_model_dir(model)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_bad_tie_embeddings_entry_fails_the_build_in_one_line(tmp_path: Path) -> None:
    model = tmp_path / "m"
    shutil.copytree(TINY_MODEL_DIR, model)
    config = json.loads((model / "llm_config.json").read_text())
    config["tie_embeddings"][1] = 10**9
    (model / "llm_config.json").write_text(json.dumps(config))
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "bad.toml").write_text(f'name = "bad"\nsource = {{ local = "{model}" }}\ntargets = ["v79"]\n')
    proc = doit(tmp_path, "partition:bad", env={"MNNBUILD_MODELS_PATH": str(specs)})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    lines = [line for line in out.splitlines() if line.startswith("ModelDirError: ")]
    assert len(lines) == 1 and "llm.mnn.weight: llm_config.json field 'tie_embeddings' needs bytes" in lines[0], out


@pytest.mark.slow
def test_a_missing_shipped_weight_file_is_one_line_at_the_bundle(
    bundled: tuple[Path, dict[str, dict[str, tuple[str, int]]]], tmp_path: Path
) -> None:
    root = bundled[0] / TIED
    partition = tmp_path / "partition"
    shutil.copytree(root / "partition", partition)
    (partition / "llm.mnn.weight").unlink()
    inputs = BundleInputs(
        model=TIED,
        model_name=TIED,
        model_dir=root / "model",
        config_dir=root / "v79" / "config",
        partition_dir=partition,
        context_dir=root / "v79" / "context",
    )
    with pytest.raises(StageError, match=r"partition/llm.mnn.weight: file missing; .*partition.manifest.json lists it"):
        assemble_bundle(inputs, BundleParams(soc=soc_for_arch("v79")), tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()


@pytest.mark.slow
def test_a_short_shipped_weight_file_is_one_line_at_the_runtime(
    bundled: tuple[Path, dict[str, dict[str, tuple[str, int]]]], tmp_path: Path
) -> None:
    bundle = tmp_path / TIED
    shutil.copytree(bundled[0] / TIED / "v79" / "bundle" / "model" / TIED, bundle)
    weights = bundle / "llm.mnn.weight"
    weights.write_bytes(weights.read_bytes()[:-1])
    with pytest.raises(
        BundleError, match=r"llm.mnn.weight: llm_config.json 'tie_embeddings' reads bytes up to \d+ but"
    ):
        Bundle.open(bundle)
