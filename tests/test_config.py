"""config: config_qnn.json as upstream's export writes it (the model's config.json plus the NPU entries)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from mnnbuild_runtime.errors import BundleError

from mnnbuild.base.errors import ModelDirError
from mnnbuild.manifests.fetch import FetchParams
from mnnbuild.model.modeldir import VISUAL_FILES, VISUAL_PART, PartFamily, family_files
from mnnbuild.model.spec import LocalSource
from mnnbuild.stages.config import ConfigInputs, ConfigManifest, ConfigParams, write_config
from mnnbuild.stages.fetch import FetchInputs, fetch
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR

EMBEDDING = FIXTURE_MODELS / "qwen3-embedding-tiny"
VL = FIXTURE_MODELS / "qwen3-vl-tiny"


def build_config(
    src: Path, tmp_path: Path, *chunks: int, family: PartFamily = "llm", encoder: str | None = None
) -> tuple[dict[str, Any], ConfigManifest]:
    model_dir = tmp_path / "model"
    files = (*family_files(family), *VISUAL_FILES) if encoder else family_files(family)
    params = FetchParams(family=family, files=files, visual_encoder=encoder)
    fetch(FetchInputs(model="m", source=LocalSource(local=str(src)), source_dir=src), params, model_dir)
    manifest = write_config(
        ConfigInputs(model="m", target="v79", model_dir=model_dir),
        ConfigParams(chunk_sizes=chunks, visual_model=VISUAL_PART.result_model if encoder else None),
        tmp_path / "config",
    )
    return json.loads((tmp_path / "config" / "config_qnn.json").read_text()), manifest


def upstream_config(model_dir: Path, chunks: list[int], visual: bool) -> dict[str, Any]:
    """What upstream's ``output_qnn`` writes: config.json with its entries set (``llm_weight`` from the model
    file's name, as upstream forms it), the chunk limits ours (every prefill length, then 1)."""
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    model_name = config.get("llm_model", "llm.mnn")
    config.update(llm_model=f"qnn/{model_name}", llm_weight=f"{model_name}.weight", chunk_limits=[*chunks, 1])
    if visual:
        config["visual_model"] = "qnn/visual.mnn"
    return config


@pytest.mark.parametrize(
    ("src", "family", "encoder"),
    [(TINY_MODEL_DIR, "llm", None), (EMBEDDING, "embedding", None), (VL, "llm", "qwen3-vl")],
    ids=["llm", "embedding", "vl"],
)
def test_config_is_the_model_config_with_upstream_entries(
    tmp_path: Path, src: Path, family: PartFamily, encoder: str | None
) -> None:
    config, manifest = build_config(src, tmp_path, 64, 16, family=family, encoder=encoder)
    assert config == upstream_config(src, [64, 16], visual=encoder is not None)
    assert manifest.config.model_dump() == config and manifest.config.chunk_limits == [64, 16, 1]
    # the model's own runtime settings are shipped, not ours
    assert config["sampler_type"] == json.loads((src / "config.json").read_text())["sampler_type"]
    # llm_config.json too: it ships with the bundle and is checked against the config (below)
    read = ["model/config.json", "model/llm_config.json", "model/tokenizer.mtok"]
    assert sorted(r.path for r in manifest.inputs) == read


def test_config_names_the_shipped_tokenizer_when_config_json_does_not(tmp_path: Path) -> None:
    """The bundle ships the tokenizer the model dir holds; MNN reads ``tokenizer_file`` (default tokenizer.txt)."""
    src = tmp_path / "src"
    shutil.copytree(TINY_MODEL_DIR, src)
    data = json.loads((src / "config.json").read_text())
    del data["tokenizer_file"]
    (src / "config.json").write_text(json.dumps(data))
    config, _ = build_config(src, tmp_path / "mtok", 128)
    assert config["tokenizer_file"] == "tokenizer.mtok"
    (src / "tokenizer.mtok").rename(src / "tokenizer.txt")
    config, _ = build_config(src, tmp_path / "txt", 128)
    assert "tokenizer_file" not in config and config == upstream_config(src, [128], visual=False)
    # config.json naming a tokenizer the model dir does not hold: the shipped one is named instead
    (src / "config.json").write_text(json.dumps({**data, "tokenizer_file": "tokenizer.mtok"}))
    config, _ = build_config(src, tmp_path / "other", 128)
    assert config["tokenizer_file"] == "tokenizer.txt"


def test_config_keeps_entries_upstream_keeps(tmp_path: Path) -> None:
    """Every entry of config.json but upstream's is written as is: nested objects, nulls, unknown keys, and
    ``llm_weight`` is always written (MNN's default included), as upstream does."""
    src = tmp_path / "src"
    shutil.copytree(TINY_MODEL_DIR, src)
    data = json.loads((src / "config.json").read_text())
    extra = {"mllm": {"backend_type": "cpu", "thread_num": 2}, "hidden_states": None, "a_new_key": [1, "x"]}
    data.update(extra, chunk_limits=[7, 1], llm_weight="llm.mnn.weight")
    (src / "config.json").write_text(json.dumps(data))
    config, manifest = build_config(src, tmp_path, 32)
    assert config == upstream_config(src, [32], visual=False) and config["llm_weight"] == "llm.mnn.weight"
    assert {k: config[k] for k in extra} == extra and ConfigManifest.read(tmp_path / "config") == manifest


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("context_file", "../../secret.json", r"field 'context_file': path '\.\./\.\./secret\.json' must be relative"),
        ("embedding_file", "/etc/passwd", r"field 'embedding_file': path '/etc/passwd' must be relative"),
        ("tmp_path", "/tmp/x", r"field 'tmp_path' is not supported"),
        ("base_dir", "/", r"field 'base_dir' is not supported"),
    ],
)
def test_config_json_naming_a_path_outside_is_refused(tmp_path: Path, field: str, value: str, expected: str) -> None:
    """config.json reaches config_qnn.json whole: a file name in it that leads out of the model dir (MNN's engine
    would read it on the phone and in verify) fails the config stage with one line naming the file and field."""
    src = tmp_path / "src"
    shutil.copytree(TINY_MODEL_DIR, src)
    data = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**data, field: value}))
    with pytest.raises(BundleError, match=rf"model/config\.json: {expected}"):
        build_config(src, tmp_path, 32)
    assert not (tmp_path / "config").exists()


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("chunk_limits", [64, 1], "field 'chunk_limits' is [64, 1]; MNN's engine merges this file over "
         "config_qnn.json, so it would override [32, 1] there; expected it only in the config"),
        ("speculative_type", "lookahead", "field 'speculative_type' is 'lookahead'; MNN's engine merges this file "
         "over config_qnn.json, so it would override its leaving it out"),
        ("draft_predict_length", 7, "field 'draft_predict_length' is 7;"),
        ("precision", "high", "field 'precision' is 'high'; MNN's engine merges this file over config_qnn.json, so "
         "it would override 'low' there"),
    ],
)  # fmt: skip
def test_llm_config_json_overriding_the_config_is_refused(
    tmp_path: Path, field: str, value: object, expected: str
) -> None:
    """MNN's engine merges llm_config.json over the config (its fields win): one that would run the phone on other
    settings than config_qnn.json says, or speculate where the bundle has no verify-length graph, fails the config
    stage in one line naming the file and field; the same value as the config's is left alone."""
    src = tmp_path / "src"
    shutil.copytree(TINY_MODEL_DIR, src)
    llm = json.loads((src / "llm_config.json").read_text())
    assert json.loads((src / "config.json").read_text())["precision"] == "low"
    (src / "llm_config.json").write_text(json.dumps({**llm, "precision": "low"}))  # the config's own value
    build_config(src, tmp_path / "same", 32)
    (src / "llm_config.json").write_text(json.dumps({**llm, field: value}))
    with pytest.raises(ModelDirError) as info:
        build_config(src, tmp_path / "over", 32)
    assert f"model/llm_config.json: {expected}" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "over" / "config").exists()
