"""Model specs, the SoC table and settings from the environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mnnbuild.errors import SpecError
from mnnbuild.settings import Settings
from mnnbuild.spec import HfSource, LocalSource, discover_specs, load_spec
from mnnbuild.targets import SOCS, soc_for_arch
from tests.conftest import PROJECT_ROOT, TINY_MODEL_DIR


def write_spec(directory: Path, text: str, name: str = "m.toml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_specs() -> None:
    specs = discover_specs([PROJECT_ROOT / "models"])
    tiny, big = specs["tiny-qwen3"], specs["qwen3-1.7b"]
    assert isinstance(tiny.source, LocalSource)
    assert tiny.local_dir() == TINY_MODEL_DIR
    assert isinstance(big.source, HfSource) and big.source.hf == "taobao-mnn/Qwen3-1.7B-MNN"
    assert big.targets == ["v79"]
    assert big.soc("v79").name == "SM8750" and big.soc("v79").soc_id == 69


def test_soc_table_defaults_match_arch() -> None:
    for soc in SOCS:
        assert soc.vtcm_mb == 8
    assert soc_for_arch("v75").soc_id == 57
    assert soc_for_arch("v79", "SM8735").soc_id == 85
    with pytest.raises(KeyError, match="SM8650 is v75, not v79"):
        soc_for_arch("v79", "SM8650")


def test_spec_overrides_soc(tmp_path: Path) -> None:
    path = write_spec(tmp_path, 'name = "m"\nsource = { local = "x" }\ntargets = ["v79"]\nsocs = { v79 = "SM8735" }\n')
    spec = load_spec(path)
    assert spec.soc("v79").name == "SM8735"
    assert spec.local_dir() == tmp_path / "x"
    assert spec.lock_path == tmp_path / "m.lock.json"


@pytest.mark.parametrize(
    ("body", "field", "expected"),
    [
        ('targets = ["v99"]', "targets", "unknown target 'v99'; expected one of v69"),
        ('targets = ["v79"]\nchunk_size = 0', "chunk_size", "greater than 1"),
        ('targets = ["v79"]\nchunk_size = 1', "chunk_size", "greater than 1"),
        ('targets = ["v79"]\nchunk_size = -4', "chunk_size", "greater than 1"),
        ("targets = []", "targets", "at least 1 item"),
        ('targets = ["v79"]\nchunk = 12', "chunk", "Extra inputs are not permitted"),
        ('targets = ["v79"]\nsocs = { v79 = "SM8650" }', "socs.v79", "SoC SM8650 is v75, not v79"),
    ],
)
def test_bad_spec_names_file_and_field(tmp_path: Path, body: str, field: str, expected: str) -> None:
    path = write_spec(tmp_path, f'name = "m"\nsource = {{ local = "x" }}\n{body}\n')
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert str(path) in message
    assert f"field {field!r}" in message
    assert expected in message


def test_spec_not_toml(tmp_path: Path) -> None:
    path = write_spec(tmp_path, "name = \n")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(path)


def test_duplicate_model_name_across_spec_dirs(tmp_path: Path) -> None:
    write_spec(tmp_path / "a", 'name = "m"\nsource = { local = "x" }\ntargets = ["v79"]\n')
    second = write_spec(tmp_path / "b", 'name = "m"\nsource = { local = "y" }\ntargets = ["v75"]\n')
    with pytest.raises(SpecError, match=f"{second}: model name 'm' is already defined by"):
        discover_specs([tmp_path / "a", tmp_path / "b"])


def test_settings_from_environment(tmp_path: Path) -> None:
    env = {
        "MNNBUILD_MODELS_PATH": os.pathsep.join([str(tmp_path / "a"), "rel"]),
        "MNNBUILD_ARTIFACTS": "out",
    }
    settings = Settings.from_env(tmp_path / "proj", env)
    assert settings.artifact_root == tmp_path / "proj" / "out"
    assert settings.spec_dirs == (tmp_path / "proj" / "models", tmp_path / "a", tmp_path / "proj" / "rel")
    assert Settings.from_env(tmp_path, {}).artifact_root == tmp_path / "artifacts"
    assert settings.target_root("m", "v79") == tmp_path / "proj" / "out" / "m" / "v79"
