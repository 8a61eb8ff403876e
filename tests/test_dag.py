"""The doit DAG as a user drives it: listing, building, and not rebuilding what is up to date."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mnnbuild.stages.io import IoManifest
from tests.conftest import TINY_MODEL_DIR, RunDoit, executed_tasks, skipped_tasks

pytestmark = pytest.mark.slow  # every test here runs doit, a bundle or a whole model


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
    assert files == [
        "testdir/1/input.mnn",
        "testdir/1/output.mnn",
        "testdir/128-last/input.mnn",  # the full chunk as the engine feeds it, logits_index -1 (no graph)
        "testdir/128-last/output.mnn",
        "testdir/128/input.mnn",
        "testdir/128/output.mnn",
    ]
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
    """A bad spec is named in one line. It stops a command that asks for its model (by name, a whole stage, or a
    bare `doit` when it is the default model); `doit list` and the other models' builds go on without it (issue 43:
    one bad spec stopped every model's)."""
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "bad.toml").write_text('name = "bad"\nsource = { local = "x" }\nchunk_size = 0\ntargets = ["v79"]\n')
    env = {"MNNBUILD_MODELS_PATH": str(spec_dir)}
    problem = f"{spec_dir / 'bad.toml'}: field 'chunk_size': Input should be greater than 1 (got 0)"
    for asks in (["io:bad"], ["bundle:bad-v79"], ["io"]):
        proc = run_doit(*asks, env=env, check=False)
        assert proc.returncode != 0
        assert proc.stdout + proc.stderr == f"ERROR: {problem}\n", asks
    listed = run_doit("list", env=env)
    assert "io:tiny-qwen3" in listed.stdout and ":bad" not in listed.stdout
    assert listed.stderr == f"W mnnbuild.dag.project: {problem} (its model's tasks are left out)\n"
    other = run_doit("fetch:tiny-qwen3", env=env)
    assert executed_tasks(other.stdout) == ["fetch:tiny-qwen3"] and problem in other.stderr


def test_doit_k_from_a_subdirectory_finds_the_project(tmp_path: Path) -> None:
    """The README's answer to `doit` in a subdirectory ("could not find dodo file"): doit's -k seeks dodo.py in the
    parent dirs, and the artifact root stays the project's (or MNNBUILD_ARTIFACTS), not the cwd."""
    import os
    import subprocess
    import sys

    from tests.conftest import PROJECT_ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    env.update({"MNNBUILD_ARTIFACTS": str(tmp_path / "artifacts"), "HF_HUB_OFFLINE": "1", "MNNBUILD_CACHE": "off"})
    argv = [sys.executable, "-m", "doit", "-k", "list"]
    proc = subprocess.run(argv, cwd=PROJECT_ROOT / "docs", env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "io:tiny-qwen3" in proc.stdout, proc.stdout + proc.stderr
    assert not (PROJECT_ROOT / "docs" / "artifacts").exists() and not (PROJECT_ROOT / "docs" / ".doit.db").exists()


def test_doit_list_says_which_groups_take_every_model(run_doit: RunDoit) -> None:
    """Issue 43, first hour: `doit bundle` / `doit report` build every model's (offline they stopped at
    fetch:qwen3-1.7b) while `doit verify` builds the default bundles only; `doit list` now says which."""
    rows = {line.split()[0]: line for line in run_doit("list").stdout.splitlines() if line.strip()}
    for group in ("bundle", "report", "context", "twin"):
        assert f"every model's: {group}:qwen3-1.7b-v79, " in rows[group] and f"{group}:tiny-qwen3-v79" in rows[group]
    assert "Verify the default bundles" in rows["verify"] and "every model's" not in rows["verify"]
