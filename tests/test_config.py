"""config: config_qnn.json as the phone's llm_demo expects it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mnnbuild.spec import LocalSource
from mnnbuild.stages.config import ConfigInputs, ConfigManifest, ConfigParams, write_config
from mnnbuild.stages.fetch import FetchInputs, FetchParams, fetch
from tests.conftest import TINY_MODEL_DIR


def build_config(src: Path, tmp_path: Path, *chunks: int) -> tuple[dict, ConfigManifest]:
    model_dir = tmp_path / "model"
    fetch(FetchInputs(model="m", source=LocalSource(local=str(src)), source_dir=src), FetchParams(), model_dir)
    manifest = write_config(
        ConfigInputs(model="m", target="v79", model_dir=model_dir),
        ConfigParams(chunk_sizes=chunks),
        tmp_path / "config",
    )
    return json.loads((tmp_path / "config" / "config_qnn.json").read_text()), manifest


def test_config_with_mtok_tokenizer(tmp_path: Path) -> None:
    config, manifest = build_config(TINY_MODEL_DIR, tmp_path, 64)
    assert config == {
        "llm_model": "qnn/llm.mnn",
        "backend_type": "cpu",
        "thread_num": 1,
        "precision": "low",
        "chunk_limits": [64, 1],
        "memory": "low",
        "sampler_type": "penalty",
        "penalty": 1.1,
        "tokenizer_file": "tokenizer.mtok",
    }
    assert manifest.target == "v79" and [r.path for r in manifest.inputs] == ["model/tokenizer.mtok"]


def test_config_with_txt_tokenizer_omits_tokenizer_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(TINY_MODEL_DIR, src)
    (src / "tokenizer.mtok").rename(src / "tokenizer.txt")
    config, _ = build_config(src, tmp_path, 128)
    assert "tokenizer_file" not in config and config["chunk_limits"] == [128, 1]


def test_config_lists_every_prefill_length_and_decode(tmp_path: Path) -> None:
    """MNN's engine reads every chunk_limits entry (llm.cpp Llm::set_config): each prefill graph's length and 1."""
    config, manifest = build_config(TINY_MODEL_DIR, tmp_path, 128, 32)
    assert config["chunk_limits"] == [128, 32, 1] and manifest.config.chunk_limits == [128, 32, 1]
