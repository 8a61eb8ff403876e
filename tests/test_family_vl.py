"""Vision-language models (family = "vl", docs/families.md section 3): the committed Qwen2.5-VL and Qwen3-VL test
models build and verify for v79 and v75, their language model with M-RoPE (and Qwen3-VL's deepstack) inputs.

Both fixtures are built once per module through doit, as a user runs it; the other cases call one stage or the
runtime directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mnnbuild_runtime import text_feeds

from mnnbuild.cpu import load_vars
from mnnbuild.errors import ModelDirError
from mnnbuild.layout import BUNDLE_MODEL_DIR, BUNDLE_README, CONFIG_FILE
from mnnbuild.manifests.fetch import FetchInputs, FetchParams
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.verify import VerifyManifest
from mnnbuild.modeldir import VISUAL_FILES, VL_FILES
from mnnbuild.spec import LocalSource
from mnnbuild.stages.fetch import fetch
from mnnbuild.verify.report import VerifyReport
from tests.conftest import FIXTURE_MODELS, doit

VL_MODELS = {"qwen2.5-vl-tiny": ("qwen2.5-vl", ["56x56", "84x56"]), "qwen3-vl-tiny": ("qwen3-vl", ["64x64", "96x64"])}
ARCHS = ("v79", "v75")
CHUNK = 32


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
    proc = doit(cwd, "-n", "2", "--continue", *tasks, env={"MNNBUILD_MODELS_PATH": str(specs)})
    assert proc.returncode == 0, f"doit {' '.join(tasks)} failed:\n{proc.stdout}\n{proc.stderr}"
    return cwd / "artifacts"


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
    assert {s.seq_len for s in report.whole_model} >= {1, CHUNK}
    for sample in report.whole_model:
        assert sample.passed and {c.name for c in sample.outputs} >= {"logits", "hidden_states"}
    gen = report.generation
    assert gen is not None and gen.passed and gen.cpu_tokens and gen.hybrid_tokens == gen.cpu_tokens


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


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(VL_MODELS))
def test_vl_bundle_ships_the_encoder_and_names_it(built: Path, name: str, arch: str) -> None:
    bundle = built / name / arch / "bundle"
    model_dir = bundle / BUNDLE_MODEL_DIR / name
    config = json.loads((model_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    visual = model_dir / config["visual_model"]
    assert visual.is_file() and Path(f"{visual}.weight").is_file()
    for file in VISUAL_FILES:
        assert (model_dir / file).read_bytes() == (FIXTURE_MODELS / name / file).read_bytes()
    readme = (bundle / BUNDLE_README).read_text(encoding="utf-8")
    assert all(size in readme for size in VL_MODELS[name][1])


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
