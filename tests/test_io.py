"""io: the decode and prefill reference samples of the whole graph."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.base.errors import ModelDirError
from mnnbuild.cpu import CpuRuntime, load_module, load_vars, to_numpy, to_var
from mnnbuild.model.spec import LocalSource
from mnnbuild.stages.fetch import FetchInputs, FetchParams, fetch
from mnnbuild.stages.io import IoInputs, IoManifest, IoParams, generate_io
from tests.conftest import TINY_MODEL_DIR


def fetched(src: Path, out: Path) -> Path:
    fetch(FetchInputs(model="m", source=LocalSource(local=str(src)), source_dir=src), FetchParams(), out)
    return out


@pytest.fixture(scope="module")
def tiny_io(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, IoManifest]:
    tmp = tmp_path_factory.mktemp("io")
    model_dir = fetched(TINY_MODEL_DIR, tmp / "model")
    manifest = generate_io(IoInputs(model="m", model_dir=model_dir), IoParams(chunk_sizes=(16,), seed=3), tmp / "io")
    return model_dir, tmp / "io", manifest


def test_writes_decode_and_prefill_samples(tiny_io: tuple[Path, Path, IoManifest]) -> None:
    _, io_dir, manifest = tiny_io
    assert [s.seq_len for s in manifest.samples] == [1, 16]
    for seq in (1, 16):
        inputs = load_vars(io_dir / "testdir" / str(seq) / "input.mnn")
        assert list(inputs) == ["input_ids", "attention_mask", "position_ids", "logits_index"]
        hidden = json.loads((TINY_MODEL_DIR / "llm_config.json").read_text())["hidden_size"]
        assert inputs["input_ids"].shape == (seq, 1, hidden) and inputs["input_ids"].dtype == np.float32
        mask = inputs["attention_mask"].reshape(seq, seq)
        lowest = np.finfo(np.float32).min
        assert (mask[np.triu_indices(seq, 1)] == lowest).all() and (mask[np.tril_indices(seq)] == 0).all()
        assert inputs["position_ids"].dtype == np.int32
        np.testing.assert_array_equal(inputs["position_ids"], np.arange(seq).reshape(1, seq))
        assert inputs["logits_index"].tolist() == ([-1] if seq == 1 else [0])
        outputs = load_vars(io_dir / "testdir" / str(seq) / "output.mnn")
        assert "logits" in outputs and np.isfinite(outputs["logits"]).all()
    assert manifest.params.runtime == CpuRuntime()
    assert manifest.tools["MNN"]
    assert {r.path for r in manifest.inputs} == {"model/llm.mnn", "model/llm.mnn.weight", "model/llm_config.json"}


def test_each_prefill_length_also_gets_the_engines_whole_block_feed(tiny_io: tuple[Path, Path, IoManifest]) -> None:
    """MNN's engine runs a prefill block the prompt fills whole unpadded with ``logits_index`` -1 (only a padded block
    or a speculative step asks for every row): io samples that feed too, with the prefill sample's other inputs, and
    gets the last row's logits of the prefill sample (the causal mask keeps the rows apart). No graph is made for it:
    the partition reads the graph samples only."""
    _, io_dir, manifest = tiny_io
    (whole,) = manifest.whole_block_samples
    assert (whole.seq_len, whole.dir, whole.logits_index) == (16, "testdir/16-last", -1)
    feed, padded = load_vars(io_dir / whole.dir / "input.mnn"), load_vars(io_dir / "testdir/16/input.mnn")
    assert feed["logits_index"].tolist() == [-1] and padded["logits_index"].tolist() == [0]
    for name in ("input_ids", "attention_mask", "position_ids"):
        np.testing.assert_array_equal(feed[name], padded[name])
    got, rows = load_vars(io_dir / whole.dir / "output.mnn")["logits"], load_vars(io_dir / "testdir/16/output.mnn")
    assert got.shape[-2] == 1 and rows["logits"].shape[-2] == 16
    np.testing.assert_allclose(got.reshape(-1), rows["logits"].reshape(16, -1)[-1], rtol=1e-4, atol=1e-4)
    assert [s.seq_len for s in manifest.samples] == [1, 16]


def test_outputs_equal_a_fresh_mnn_run(tiny_io: tuple[Path, Path, IoManifest]) -> None:
    model_dir, io_dir, manifest = tiny_io
    for sample in [*manifest.samples, *manifest.whole_block_samples]:
        rt = manifest.params.runtime.create(model_dir / "llm.mnn.weight")
        module = load_module(model_dir / "llm.mnn", rt)
        info = module.get_info()
        inputs = load_vars(io_dir / sample.dir / "input.mnn")
        got = module.forward([to_var(inputs[n]) for n in info["inputNames"]])
        expected = load_vars(io_dir / sample.dir / "output.mnn")
        assert list(expected) == list(info["outputNames"])
        for name, var in zip(info["outputNames"], got, strict=True):
            np.testing.assert_array_equal(to_numpy(var), expected[name])


@pytest.mark.slow
def test_same_seed_same_files(tiny_io: tuple[Path, Path, IoManifest], tmp_path: Path) -> None:
    model_dir, io_dir, manifest = tiny_io
    again = generate_io(IoInputs(model="m", model_dir=model_dir), manifest.params, tmp_path / "io")
    assert again.outputs == manifest.outputs
    other = generate_io(IoInputs(model="m", model_dir=model_dir), IoParams(chunk_sizes=(16,), seed=4), tmp_path / "io2")
    assert other.output("testdir/16/input.mnn").sha256 != manifest.output("testdir/16/input.mnn").sha256


def test_non_float_mask_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(TINY_MODEL_DIR, src)
    config = json.loads((src / "llm_config.json").read_text())
    config["attention_mask"] = "int"
    (src / "llm_config.json").write_text(json.dumps(config))
    model_dir = fetched(src, tmp_path / "model")
    with pytest.raises(ModelDirError, match=r"llm_config.json: field 'attention_mask' is 'int'; only \"float\""):
        generate_io(IoInputs(model="m", model_dir=model_dir), IoParams(chunk_sizes=(4,)), tmp_path / "io")
    assert not (tmp_path / "io").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_chunk_sizes_must_exceed_decode_and_differ() -> None:
    with pytest.raises(ValueError, match="greater than 1"):
        IoParams(chunk_sizes=(16, 1))
    with pytest.raises(ValueError, match=r"prefill lengths \[16, 16\] repeat a length"):
        IoParams(chunk_sizes=(16, 16))
    with pytest.raises(ValueError, match="the llm part takes chunk_sizes"):
        IoParams(chunk_sizes=())
    # a VL encoder's io (the visual part) takes image sizes instead, never prefill lengths
    with pytest.raises(ValueError, match="the visual part takes a visual_encoder and image_sizes, no chunk_sizes"):
        IoParams(part="visual", visual_encoder="qwen3-vl", image_sizes=("64x64",), chunk_sizes=(16,))


def test_each_sample_is_written_before_the_next_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """io holds one sample at a time: a sample's inputs and outputs are on disk before the next sample's inputs are
    made (it used to build every sample first: 4 GB and nothing written for chunk_sizes [2 ... 1024])."""
    import mnnbuild.stages.io as io_stage

    events: list[str] = []
    make, save = io_stage.make_inputs, io_stage.save_vars

    def making(seq_len: int, *args, **kwargs):
        events.append(f"make {seq_len}")
        return make(seq_len, *args, **kwargs)

    def saving(path: Path, *args, **kwargs) -> None:
        events.append(f"write {path.parent.name}/{path.name}")
        save(path, *args, **kwargs)

    monkeypatch.setattr(io_stage, "MNN_IN_CHILD", False)  # the steps are watched in this process
    monkeypatch.setattr(io_stage, "make_inputs", making)
    monkeypatch.setattr(io_stage, "save_vars", saving)
    model_dir = fetched(TINY_MODEL_DIR, tmp_path / "model")
    manifest = generate_io(IoInputs(model="m", model_dir=model_dir), IoParams(chunk_sizes=(16, 8)), tmp_path / "io")
    assert [s.seq_len for s in manifest.samples] == [1, 16, 8]
    assert [s.seq_len for s in manifest.whole_block_samples] == [16, 8]
    made = [(seq, str(seq)) for seq in (1, 16, 8)] + [(seq, f"{seq}-last") for seq in (16, 8)]
    assert events == [
        step for seq, d in made for step in (f"make {seq}", f"write {d}/input.mnn", f"write {d}/output.mnn")
    ]
    assert sorted(p.name for p in (tmp_path / "io").iterdir()) == ["io.manifest.json", "testdir"], "no spill dir left"


@pytest.mark.parametrize("op_type", ["Convolution", "LayerNorm"])
def test_a_model_that_crashes_mnn_is_one_line_naming_the_file(tmp_path: Path, op_type: str) -> None:
    """An op without the parameters its type needs makes MNN itself crash (SIGSEGV): io's MNN runs in a child, so the
    build gets one line naming the model file and the signal, and no half io directory (it used to end the whole
    doit process with rc -11 and nothing said)."""
    from mnnbuild.mnn import load_model, save_model

    src = tmp_path / "src"
    shutil.copytree(TINY_MODEL_DIR, src)
    model = load_model(src / "llm.mnn")
    next(op for op in model.ops if op.type == op_type).main = None
    save_model(model, src / "llm.mnn")
    model_dir = fetched(src, tmp_path / "model")
    with pytest.raises(ModelDirError) as exc:
        generate_io(IoInputs(model="m", model_dir=model_dir), IoParams(chunk_sizes=(4,)), tmp_path / "io")
    line = str(exc.value)
    assert "\n" not in line and line.startswith(f"{model_dir / 'llm.mnn'}: MNN crashed (SIGSEGV)"), line
    assert not (tmp_path / "io").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_prefill_longer_than_the_models_positions_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(TINY_MODEL_DIR, src)
    config = json.loads((src / "llm_config.json").read_text())
    (src / "llm_config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    model_dir = fetched(src, tmp_path / "model")
    with pytest.raises(ModelDirError) as err:
        generate_io(IoInputs(model="m", model_dir=model_dir), IoParams(chunk_sizes=(128, 32)), tmp_path / "io")
    assert str(err.value) == (
        f"{model_dir / 'llm_config.json'}: field 'max_position_embeddings' is 64: the model has no positions beyond "
        "it, but spec field 'chunk_sizes' asks for a prefill length of 128; expected lengths <= 64"
    )
    assert not (tmp_path / "io").exists()
    assert generate_io(IoInputs(model="m", model_dir=model_dir), IoParams(chunk_sizes=(64,)), tmp_path / "io").samples


@pytest.mark.slow
def test_image_larger_than_the_models_pixel_cap_is_refused(tmp_path: Path) -> None:
    from tests.conftest import FIXTURE_MODELS

    src = tmp_path / "src"
    shutil.copytree(FIXTURE_MODELS / "qwen3-vl-tiny", src)
    config = json.loads((src / "llm_config.json").read_text())
    (src / "llm_config.json").write_text(json.dumps({**config, "image_max_pixels": 4096}))
    from mnnbuild.model.modeldir import VISUAL_FILES, family_files

    params = FetchParams(files=(*family_files("llm"), *VISUAL_FILES), visual_encoder="qwen3-vl")
    fetch(FetchInputs(model="m", source=LocalSource(local=str(src)), source_dir=src), params, tmp_path / "model")
    io_params = IoParams(part="visual", visual_encoder="qwen3-vl", image_sizes=("64x64", "128x64"))
    with pytest.raises(ModelDirError, match=r"llm_config.json: field 'image_max_pixels' is 4096: MNN's engine resizes "
                       r"every image to at most that many pixels, so spec field 'image_sizes' entry '128x64' \(8192 "
                       r"pixels\) would never run"):  # fmt: skip
        generate_io(IoInputs(model="m", model_dir=tmp_path / "model"), io_params, tmp_path / "io")
