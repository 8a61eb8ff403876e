"""The doit DAG as a user drives it: listing, building, and not rebuilding what is up to date."""

from __future__ import annotations

import os
from pathlib import Path

from mnnbuild.stages.io import IoManifest
from tests.conftest import TINY_MODEL_DIR, RunDoit, executed_tasks, skipped_tasks


def test_list_shows_every_task_with_a_doc(run_doit: RunDoit) -> None:
    out = run_doit("list").stdout
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    for task in ("fetch:tiny-qwen3", "fetch:qwen3-1.7b", "io:tiny-qwen3", "io:qwen3-1.7b"):
        assert task in rows, out
        assert len(rows[task].split()) > 2, f"{task} has no doc: {rows[task]!r}"


def test_io_builds_once_then_nothing(run_doit: RunDoit, tmp_path: Path) -> None:
    first = run_doit("io:tiny-qwen3")
    assert executed_tasks(first.stdout) == ["fetch:tiny-qwen3", "io:tiny-qwen3"]
    io_dir = tmp_path / "artifacts" / "tiny-qwen3" / "io"
    files = sorted(p.relative_to(io_dir).as_posix() for p in io_dir.rglob("*.mnn"))
    assert files == ["testdir/1/input.mnn", "testdir/1/output.mnn", "testdir/128/input.mnn", "testdir/128/output.mnn"]
    assert (tmp_path / "artifacts" / ".doit.db").exists(), "doit state lives under the artifact root"

    second = run_doit("io:tiny-qwen3")
    assert executed_tasks(second.stdout) == []
    assert skipped_tasks(second.stdout) == ["fetch:tiny-qwen3", "io:tiny-qwen3"]


def test_touch_without_change_runs_nothing(run_doit: RunDoit, tmp_path: Path) -> None:
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    src = tmp_path / "src"
    src.mkdir()
    for p in TINY_MODEL_DIR.iterdir():
        (src / p.name).write_bytes(p.read_bytes())
    (spec_dir / "copy.toml").write_text(
        f'name = "copy"\nsource = {{ local = "{src}" }}\nchunk_size = 8\ntargets = ["v79"]\n'
    )
    env = {"MNNBUILD_MODELS_PATH": str(spec_dir)}
    assert executed_tasks(run_doit("io:copy", env=env).stdout) == ["fetch:copy", "io:copy"]
    os.utime(src / "llm.mnn.weight", (1, 1))
    assert executed_tasks(run_doit("io:copy", env=env).stdout) == []

    # a real content change re-runs both
    config = (src / "config.json").read_text()
    (src / "config.json").write_text(config.replace('"thread_num": 4', '"thread_num": 2'))
    assert executed_tasks(run_doit("io:copy", env=env).stdout) == ["fetch:copy", "io:copy"]

    # a new chunk size re-runs io, not fetch
    (spec_dir / "copy.toml").write_text(
        (spec_dir / "copy.toml").read_text().replace("chunk_size = 8", "chunk_size = 4")
    )
    assert executed_tasks(run_doit("io:copy", env=env).stdout) == ["io:copy"]
    manifest = IoManifest.read(tmp_path / "artifacts" / "copy" / "io")
    assert [s.seq_len for s in manifest.samples] == [1, 4]


def test_bad_spec_fails_cleanly(run_doit: RunDoit, tmp_path: Path) -> None:
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "bad.toml").write_text('name = "bad"\nsource = { local = "x" }\nchunk_size = 0\ntargets = ["v79"]\n')
    proc = run_doit("list", env={"MNNBUILD_MODELS_PATH": str(spec_dir)}, check=False)
    assert proc.returncode != 0
    assert f"{spec_dir / 'bad.toml'}: field 'chunk_size': Input should be greater than 1" in proc.stderr
    assert "Traceback" not in proc.stderr
