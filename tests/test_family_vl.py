"""Vision-language models (family = "vl", docs/families.md section 3): the committed Qwen2.5-VL and Qwen3-VL test
models build and verify for v79 and v75, their language model with M-RoPE (and Qwen3-VL's deepstack) inputs and
their visual encoder on the NPU at every image size (graphvisual* beside graphllm* in one qnn/).

Both fixtures are built once per module through doit, as a user runs it; the other cases call one stage or the
runtime directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mnnbuild_runtime import text_feeds

from mnnbuild.base.errors import ModelDirError
from mnnbuild.cpu import load_vars
from mnnbuild.manifests.fetch import FetchInputs, FetchParams
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.verify import VerifyManifest
from mnnbuild.mnn import load_model, plugin_attributes
from mnnbuild.model.modeldir import VISUAL_FILES, VISUAL_WEIGHT_FILE, family_files
from mnnbuild.model.spec import VISUAL_ENCODERS, ImageSize, LocalSource
from mnnbuild.pipeline.layout import BUNDLE_MODEL_DIR, BUNDLE_README, CONFIG_FILE, LLM_GRAPHS, VISUAL_GRAPHS, graph_name
from mnnbuild.qnn import QnnLibrary, read_binary_info, same_element_order
from mnnbuild.stages.fetch import fetch
from mnnbuild.verify.report import VerifyReport
from tests.conftest import FIXTURE_MODELS, doit, executed_tasks, skipped_tasks
from tests.test_strip import reads_weights

VL_MODELS = {"qwen2.5-vl-tiny": ("qwen2.5-vl", ["56x56", "84x56"]), "qwen3-vl-tiny": ("qwen3-vl", ["64x64", "96x64"])}
ARCHS = ("v79", "v75")
CHUNK = 32
VL_FILES = (*family_files("llm"), *VISUAL_FILES)


def vl_spec(name: str, archs: tuple[str, ...] = ARCHS) -> str:
    encoder, sizes = VL_MODELS[name]
    return (
        f'name = "{name}"\nsource = {{ local = "{FIXTURE_MODELS / name}" }}\nchunk_size = {CHUNK}\n'
        f'targets = {json.dumps(list(archs))}\nfamily = "vl"\nvisual_encoder = "{encoder}"\n'
        f"image_sizes = {json.dumps(sizes)}\n"
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both VL fixtures verified for both targets; returns the artifact root."""
    cwd = tmp_path_factory.mktemp("vl")
    specs = cwd / "specs"
    specs.mkdir()
    for name in VL_MODELS:
        (specs / f"{name}.toml").write_text(vl_spec(name))
    tasks = [f"verify:{m}-{a}" for m in VL_MODELS for a in ARCHS]
    proc = doit(cwd, "--continue", *tasks, env={"MNNBUILD_MODELS_PATH": str(specs)})
    assert proc.returncode == 0, f"doit {' '.join(tasks)} failed:\n{proc.stdout}\n{proc.stderr}"
    return cwd / "artifacts"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(VL_MODELS))
def test_vl_language_model_verifies(built: Path, name: str, arch: str) -> None:
    out = built / name / arch / "verify"
    assert VerifyManifest.read(out).passed
    report = VerifyReport.model_validate_json((out / "verify.json").read_text(encoding="utf-8"))
    assert report.passed and report.target == arch
    llm_graphs = [g for g in report.graphs if g.graph.startswith("graphllm")]
    assert llm_graphs and all(g.passed for g in llm_graphs)
    # the whole model at decode and prefill, every output the model declares kept (llmexport's hidden_states too)
    text_samples = [s for s in report.whole_model if s.image_size is None]
    assert {s.seq_len for s in text_samples} == {1, CHUNK}
    for sample in text_samples:
        assert sample.passed and {c.name for c in sample.outputs} >= {"logits", "hidden_states"}
    gen = report.generation
    assert gen is not None and gen.passed and gen.cpu_tokens and gen.hybrid_tokens == gen.cpu_tokens


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VL_MODELS))
def test_vl_io_feeds_mrope_positions_and_deepstack(built: Path, name: str) -> None:
    """The prefill sample holds a stand-in image: its tokens share a time position and take grid rows, and
    Qwen3-VL's deepstack rows are non-zero there and zero for text tokens."""
    io_dir = built / name / "io"
    manifest = IoManifest.read(io_dir)
    hidden = json.loads((FIXTURE_MODELS / name / "llm_config.json").read_text())["hidden_size"]
    for sample, where in zip(manifest.samples, manifest.sample_dirs(io_dir), strict=True):
        feed = load_vars(where / "input.mnn")
        seq = sample.seq_len
        pos = feed["position_ids"]
        assert pos.shape == (3, seq)
        # the image's tokens share one time position; their height/width rows differ from it
        values, counts = np.unique(pos[0], return_counts=True)
        image = np.isin(pos[0], values[counts > 1])
        assert image.any() == (seq > 1) and np.any(pos != pos[0], axis=0).any() == (seq > 1)
        assert (pos[:, ~image] == pos[0, ~image]).all()  # decode and text tokens: every row the position
        if "deepstack_embeds" in feed or VL_MODELS[name][0] == "qwen3-vl":
            deep = feed["deepstack_embeds"]
            assert deep.shape == (3, seq, hidden)
            rows = np.any(deep != 0, axis=(0, 2))
            assert np.array_equal(rows, image)
    if VL_MODELS[name][0] == "qwen2.5-vl":
        assert all("deepstack_embeds" not in {t.name for t in s.inputs} for s in manifest.samples)


def read_report(built: Path, name: str, arch: str) -> VerifyReport:
    return VerifyReport.model_validate_json((built / name / arch / "verify" / "verify.json").read_text("utf-8"))


def bundle_model_dir(built: Path, name: str, arch: str) -> Path:
    return built / name / arch / "bundle" / BUNDLE_MODEL_DIR / name


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(VL_MODELS))
def test_vl_encoder_verifies_at_every_image_size(built: Path, name: str, arch: str) -> None:
    """Per graph (one per image size and plugin) and the whole encoder at every size, vs MNN on the CPU, every
    output visual.mnn declares kept (Qwen3-VL's deepstack_feature too)."""
    report = read_report(built, name, arch)
    encoder, sizes = VL_MODELS[name]
    visual = [s for s in report.whole_model if s.image_size is not None]
    assert [s.image_size for s in visual] == sizes
    declared = load_model(FIXTURE_MODELS / name / "visual.mnn").output_names
    assert ("deepstack_feature" in declared) == (encoder == "qwen3-vl")
    for sample, size in zip(visual, sizes, strict=True):
        assert sample.passed and sample.seq_len == ImageSize.parse(size).patch_count(VISUAL_ENCODERS[encoder])
        assert [c.name for c in sample.outputs] == declared and all(c.passed for c in sample.outputs)
    graphs = [g for g in report.graphs if g.graph.startswith(VISUAL_GRAPHS)]
    plugins = {g.binary for g in graphs}
    assert plugins and all(g.passed and g.outputs for g in graphs)
    expected = {graph_name(s, int(b.removeprefix(f"qnn/{VISUAL_GRAPHS}").removesuffix(".bin")), VISUAL_GRAPHS)
                for b in plugins for s in range(len(sizes))}  # fmt: skip
    assert {g.graph for g in graphs} == expected


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(VL_MODELS))
def test_vl_bundle_binaries_match_their_plugins(built: Path, name: str, arch: str) -> None:
    """One qnn/ holds graphvisual* and graphllm* binaries; each holds its plugin's allGraphName (a graph per image
    size for the encoder) with the plugin's input names and, graph by graph, its allInputShape block."""
    model_dir = bundle_model_dir(built, name, arch)
    config = json.loads((model_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    assert config["visual_model"] == "qnn/visual.mnn" and config["llm_model"] == "qnn/llm.mnn"
    # MNN loads the encoder with the weights beside it: what its CPU ops read of the original file (the same bytes at
    # their moved offsets), nothing else
    shipped = (model_dir / "qnn" / VISUAL_WEIGHT_FILE).read_bytes()
    source = (FIXTURE_MODELS / name / VISUAL_WEIGHT_FILE).read_bytes()
    cpu = load_model(model_dir / "qnn" / "visual.mnn")
    by_name = {op.name: op for op in load_model(FIXTURE_MODELS / name / "visual.mnn").ops}
    read = [(op.name, [int(v) for v in op.main.external]) for op in cpu.ops if reads_weights(op)]
    assert len(shipped) == sum(sum(ext[1:]) for _, ext in read) < len(source)  # the ranges do not overlap here
    for op_name, ext in read:
        was = [int(v) for v in by_name[op_name].main.external]
        assert ext[1:] == was[1:] and shipped[ext[0] :][: sum(ext[1:])] == source[was[0] :][: sum(was[1:])]
    lib = QnnLibrary()
    binaries = {p.name for p in (model_dir / "qnn").glob("*.bin")}
    attrs = [
        plugin_attributes(op)
        for model in ("llm.mnn", "visual.mnn")
        for op in load_model(model_dir / "qnn" / model).ops
        if op.type == "Plugin"
    ]
    assert {a["path"].removeprefix("qnn/") for a in attrs} == binaries
    assert any(b.startswith(LLM_GRAPHS) for b in binaries) and any(b.startswith(VISUAL_GRAPHS) for b in binaries)
    encoder, sizes = VL_MODELS[name]
    for attr in attrs:
        info = read_binary_info(lib, (model_dir / attr["path"]).read_bytes())
        assert info.graph_names == attr["allGraphName"]
        info.check_target(69 if arch == "v79" else 57, int(arch[1:]))
        if attr["path"].startswith(f"qnn/{VISUAL_GRAPHS}"):
            assert len(info.graphs) == len(sizes)
        shapes = iter(attr["allInputShape"])
        for graph in info.graphs:
            assert [t.name for t in graph.inputs] == attr["inputs"]
            assert [t.name for t in graph.outputs] == attr["outputs"]
            for t in graph.inputs:
                assert same_element_order(t.dims, [next(shapes) for _ in t.dims])  # 1s may move: same bytes
        assert next(shapes, None) is None
    # an encoder graph fed by a graph input takes it in the spec's shape at that graph's image size
    visual = load_model(FIXTURE_MODELS / name / "visual.mnn")  # QNN names are the source model's t<index>
    fed = 0
    for attr in (a for a in attrs if a["path"].startswith(f"qnn/{VISUAL_GRAPHS}")):
        info = read_binary_info(lib, (model_dir / attr["path"]).read_bytes())
        for size, graph in zip(sizes, info.graphs, strict=True):
            shapes = VISUAL_ENCODERS[encoder].input_shapes(ImageSize.parse(size))
            for t in graph.inputs:
                source = visual.tensor_names[int(t.name[1:])] if t.name[1:].isdigit() else ""
                if source in shapes:
                    assert list(t.dims) == shapes[source], (attr["path"], size, source)
                    fed += 1
    assert fed >= len(sizes)  # patches at least, at every size
    readme = (built / name / arch / "bundle" / BUNDLE_README).read_text(encoding="utf-8")
    assert all(size in readme for size in sizes) and "qnn/graphvisual" in readme


@pytest.mark.slow
def test_vl_parts_are_tasks_of_one_model_rebuilt_on_their_own(tmp_path: Path) -> None:
    """doit list shows the visual part's stages as tasks of the model; a new image size re-runs the encoder's io
    only, the language model's stays up to date (and a new prefill length the reverse)."""
    specs = tmp_path / "specs"
    specs.mkdir()
    name = "qwen3-vl-tiny"
    spec = specs / f"{name}.toml"
    spec.write_text(vl_spec(name, ("v79",)))
    env = {"MNNBUILD_MODELS_PATH": str(specs)}
    listed = doit(tmp_path, "list", "--all", env=env).stdout
    for stage in ("io", "partition", "modellib"):
        assert f"{stage}:{name}:visual " in listed and f"{stage}:{name} " in listed
    tasks = (f"io:{name}", f"io:{name}:visual")
    first = doit(tmp_path, *tasks, env=env)
    assert first.returncode == 0, first.stderr
    assert set(executed_tasks(first.stdout)) >= set(tasks)
    spec.write_text(vl_spec(name, ("v79",)).replace('"64x64", "96x64"', '"64x64", "96x64", "128x64"'))
    second = doit(tmp_path, *tasks, env=env)
    assert second.returncode == 0, second.stderr
    assert executed_tasks(second.stdout) == [f"io:{name}:visual"] and f"io:{name}" in skipped_tasks(second.stdout)
    spec.write_text(spec.read_text().replace(f"chunk_size = {CHUNK}", "chunk_size = 16"))
    third = doit(tmp_path, *tasks, env=env)
    assert third.returncode == 0, third.stderr
    assert executed_tasks(third.stdout) == [f"io:{name}"] and f"io:{name}:visual" in skipped_tasks(third.stdout)


def test_fetch_refuses_an_encoder_of_another_kind(tmp_path: Path) -> None:
    source = FIXTURE_MODELS / "qwen3-vl-tiny"
    inputs = FetchInputs(model="m", source=LocalSource(local=str(source)), source_dir=source)
    with pytest.raises(ModelDirError) as info:
        fetch(inputs, FetchParams(files=VL_FILES, visual_encoder="qwen2.5-vl"), tmp_path / "out")
    message = str(info.value)
    assert "\n" not in message and "spec field 'visual_encoder' is 'qwen2.5-vl'" in message
    assert "a qwen3-vl encoder" in message and not (tmp_path / "out").exists()


def test_fetch_refuses_a_vl_model_without_its_encoder(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for f in (FIXTURE_MODELS / "qwen3-vl-tiny").iterdir():
        if f.name != "visual.mnn.weight":
            (source / f.name).symlink_to(f)
    inputs = FetchInputs(model="m", source=LocalSource(local=str(source)), source_dir=source)
    with pytest.raises(ModelDirError, match="required file visual.mnn.weight is missing"):
        fetch(inputs, FetchParams(files=VL_FILES, visual_encoder="qwen3-vl"), tmp_path / "out")


def test_text_feeds_complete_a_text_prompt_for_mrope_and_deepstack() -> None:
    declared = {"input_ids": [1, 1, 8], "position_ids": [3, -1], "deepstack_embeds": [3, 1, 8]}
    feeds = {"input_ids": np.ones((5, 1, 8), np.float32), "position_ids": np.arange(5, dtype=np.int32)[None]}
    got = text_feeds(feeds, declared)
    assert got["position_ids"].shape == (3, 5) and (got["position_ids"] == np.arange(5)).all()
    assert got["deepstack_embeds"].shape == (3, 5, 8) and not got["deepstack_embeds"].any()
    # a text LLM's and complete VL feeds pass unchanged
    assert text_feeds(feeds, {"position_ids": [1, -1]})["position_ids"].shape == (1, 5)
    full = {**feeds, "position_ids": np.zeros((3, 5), np.int32), "deepstack_embeds": np.ones((3, 5, 8), np.float32)}
    assert all(text_feeds(full, declared)[k] is v for k, v in full.items())
