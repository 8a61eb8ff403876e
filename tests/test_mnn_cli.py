"""``python -m mnnbuild inspect``: text and JSON summaries, clear failure on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mnnbuild.__main__ import main
from mnnbuild.mnn import load_model
from tests.test_mnn_model import MODEL_DIRS, ROOT, model_dirs


@model_dirs
def test_inspect_json(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(model_dir / "llm.mnn"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    model = load_model(model_dir / "llm.mnn")
    assert summary["ops"] == len(model.ops) and summary["tensors"] == len(model.tensor_names)
    assert sum(summary["op_types"].values()) == len(model.ops)
    assert summary["op_types"]["Convolution"] == summary["convolutions"]["count"] > 0
    assert [i["name"] for i in summary["inputs"]] == ["input_ids", "attention_mask", "position_ids", "logits_index"]
    assert summary["inputs"][3]["dtype"] == "DT_INT32"
    assert [o["name"] for o in summary["outputs"]] == ["logits", "hidden_states"]
    weight_file = (model_dir / "llm.mnn.weight").stat().st_size
    assert summary["weight_file"]["bytes"] == weight_file
    assert summary["weight_bytes"]["external"] == weight_file  # every byte of the file is referenced once


def test_inspect_storage_labels(capsys: pytest.CaptureFixture[str]) -> None:
    labels = {}
    for key, model_dir in MODEL_DIRS.items():
        main(["inspect", str(model_dir / "llm.mnn"), "--json"])
        labels[key] = json.loads(capsys.readouterr().out)["convolutions"]["storage"]
    assert labels["tiny-qwen3"] == {"int4 asym block64": 15}
    assert labels["qwen3-untied-int8-b32"] == {"int8 asym block32": 22}
    assert labels["llama-int4-cw"] == {"int4 sym channel": 15}


@pytest.mark.slow
def test_inspect_text_from_another_directory(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "mnnbuild", "inspect", str(MODEL_DIRS["tiny-qwen3"] / "llm.mnn")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "ops: 254" in out and "Convolution" in out and "input_ids" in out and "logits" in out
    assert "int4 asym block64: 15" in out and "weight bytes:" in out


def test_inspect_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.mnn"
    bad.write_bytes(b"definitely not a flatbuffer\n" * 3)
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "MNN model" in err


def _inspect_cli(path: Path) -> subprocess.CompletedProcess[str]:
    # a child process with a timeout: a FIFO used to block `inspect` forever, waiting for a writer
    return subprocess.run(
        [sys.executable, "-m", "mnnbuild", "inspect", str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: os.mkfifo(p), "is a FIFO, not an MNN model file"),
        (lambda p: os.symlink("/dev/zero", p), "is a character device, not an MNN model file"),
        (lambda p: p.mkdir(), "is a directory, not an MNN model file"),
        # 3 GB of holes: refused from its size, never read (it used to be read whole first)
        (lambda p: os.truncate(p.open("wb").name, 3 << 30), "3221225472 bytes is more than any flatbuffer holds"),
        (
            lambda p: os.truncate(p.open("wb").name, 1 << 30),
            "not an MNN model: root table offset 0 is outside the file",
        ),
    ],
    ids=["fifo", "dev-zero", "directory", "sparse-3g", "sparse-1g"],
)
def test_inspect_refuses_what_is_no_model_file_without_reading_it(tmp_path: Path, make, expected: str) -> None:
    path = tmp_path / "x.mnn"
    make(path)
    proc = _inspect_cli(path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: {path}: ") and expected in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1


@pytest.mark.slow
def test_inspect_a_text_file_says_not_a_model_and_a_cut_model_truncated(tmp_path: Path) -> None:
    """``inspect README.md`` (any size): "not an MNN model", never "truncated"; a real model cut to a size that is
    not a multiple of 4 is still called truncated (its header is intact)."""
    readme = ROOT / "README.md"
    for text in (readme, tmp_path / "odd.md"):
        if text != readme:
            text.write_text(readme.read_text(encoding="utf-8")[:4001])
        proc = _inspect_cli(text)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"error: {text}: not an MNN model") and "truncated" not in proc.stderr
    model = (ROOT / "models" / "tiny-qwen3" / "llm.mnn").read_bytes()
    cut = tmp_path / "cut.mnn"
    cut.write_bytes(model[: len(model) - 3])
    proc = _inspect_cli(cut)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {cut}: ") and "truncated" in proc.stderr, proc.stderr
