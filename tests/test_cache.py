"""The content-addressed artifact cache and precise rebuilds, on the shipped tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mnnbuild.cache import ArtifactCache, CacheEntry
from tests.conftest import RunDoit, copy_project, executed_tasks, skipped_tasks

DEFAULT_CHAIN = ["fetch:tiny-qwen3", "io:tiny-qwen3"]


def summary(output: str) -> dict[str, list[str]]:
    rows = {}
    for line in output.splitlines():
        for label in ("built", "from cache", "up to date"):
            if line.strip().startswith(label + ":"):
                rows[label] = line.split(":", 1)[1].split()
    return rows


def no_mnn_env(tmp_path: Path) -> dict[str, str]:
    """An environment in which importing MNN fails, to prove a build did no MNN work."""
    fake = tmp_path / "no-mnn"
    (fake / "MNN").mkdir(parents=True)
    (fake / "MNN" / "__init__.py").write_text("raise ImportError('MNN must not be used by a cached build')\n")
    return {"PYTHONPATH": str(fake)}


@pytest.fixture
def warm_cache(tmp_path: Path, run_doit: RunDoit) -> Path:
    cache = tmp_path / "cache"
    first = run_doit(env={"MNNBUILD_CACHE": str(cache)})
    assert executed_tasks(first.stdout) == DEFAULT_CHAIN
    assert summary(first.stdout)["built"] == DEFAULT_CHAIN
    return cache


def test_fresh_clone_restores_everything(tmp_path: Path, run_doit: RunDoit, warm_cache: Path) -> None:
    clone = copy_project(tmp_path / "clone")
    env = {
        "MNNBUILD_CACHE": str(warm_cache),
        "MNNBUILD_ARTIFACTS": str(tmp_path / "clone-artifacts"),
        **no_mnn_env(tmp_path),
    }
    proc = run_doit(env=env, project=clone)
    assert summary(proc.stdout) == {"from cache": DEFAULT_CHAIN}, proc.stdout
    io_dir = tmp_path / "clone-artifacts" / "tiny-qwen3" / "io"
    origin = json.loads((io_dir / "io.origin.json").read_text())
    assert origin["origin"] == "cache"
    built = tmp_path / "artifacts" / "tiny-qwen3" / "io"
    assert (io_dir / "io.manifest.json").read_bytes() == (built / "io.manifest.json").read_bytes()
    for rel in ("testdir/1/output.mnn", "testdir/128/input.mnn"):
        assert (io_dir / rel).read_bytes() == (built / rel).read_bytes()
    # and then it is simply up to date
    again = run_doit(env=env, project=clone)
    assert summary(again.stdout) == {"up to date": DEFAULT_CHAIN}


def test_corrupted_entry_is_discarded_and_rebuilt(tmp_path: Path, run_doit: RunDoit, warm_cache: Path) -> None:
    cache = ArtifactCache(str(warm_cache))
    entry_path = next((warm_cache / "io").glob("*.json"))
    entry = CacheEntry.model_validate_json(entry_path.read_text())
    output = next(f for f in entry.files if f.path == "testdir/128/output.mnn")
    blob = Path(cache._blob(output.sha256))
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))

    env = {"MNNBUILD_CACHE": str(warm_cache), "MNNBUILD_ARTIFACTS": str(tmp_path / "other")}
    proc = run_doit(env=env)
    assert summary(proc.stdout) == {"built": ["io:tiny-qwen3"], "from cache": ["fetch:tiny-qwen3"]}, proc.stdout
    assert "does not match its sha256; entry discarded" in proc.stderr
    rebuilt = tmp_path / "other" / "tiny-qwen3" / "io" / "testdir" / "128" / "output.mnn"
    assert (
        rebuilt.read_bytes()
        == (tmp_path / "artifacts" / "tiny-qwen3" / "io" / "testdir" / "128" / "output.mnn").read_bytes()
    )
    # the rebuild stored a good entry again
    assert cache.has("io", entry.key)


def test_cache_off_builds(tmp_path: Path, run_doit: RunDoit, warm_cache: Path) -> None:
    env = {"MNNBUILD_CACHE": "off", "MNNBUILD_ARTIFACTS": str(tmp_path / "other")}
    assert summary(run_doit(env=env).stdout) == {"built": DEFAULT_CHAIN}


def test_editing_a_stage_reruns_it_and_dependents_only(tmp_path: Path, run_doit: RunDoit) -> None:
    clone = copy_project(tmp_path / "clone")
    assert executed_tasks(run_doit(project=clone).stdout) == DEFAULT_CHAIN
    io_src = clone / "mnnbuild" / "stages" / "io.py"
    io_src.write_text(io_src.read_text() + "\n# an edit\n")
    proc = run_doit(project=clone)
    assert executed_tasks(proc.stdout) == ["io:tiny-qwen3"] and skipped_tasks(proc.stdout) == ["fetch:tiny-qwen3"]


def test_bumping_a_manifest_schema_reruns_its_stages(tmp_path: Path, run_doit: RunDoit) -> None:
    clone = copy_project(tmp_path / "clone")
    assert executed_tasks(run_doit(project=clone).stdout) == DEFAULT_CHAIN
    fetch_src = clone / "mnnbuild" / "stages" / "fetch.py"
    text = fetch_src.read_text()
    assert "class SourceRecord(BaseModel):\n" in text
    fetch_src.write_text(
        text.replace("class SourceRecord(BaseModel):\n", "class SourceRecord(BaseModel):\n    note: str = ''\n")
    )
    # fetch's manifest changed shape: fetch and io (which reads it) re-run
    assert executed_tasks(run_doit(project=clone).stdout) == DEFAULT_CHAIN


def test_new_target_runs_only_target_stages(tmp_path: Path, run_doit: RunDoit) -> None:
    clone = copy_project(tmp_path / "clone")
    first = executed_tasks(run_doit("config:tiny-qwen3-v79", "io:tiny-qwen3", project=clone).stdout)
    assert "config:tiny-qwen3-v79" in first and "io:tiny-qwen3" in first
    spec = clone / "models" / "tiny-qwen3.toml"
    spec.write_text(spec.read_text().replace('targets = ["v79"]', 'targets = ["v79", "v75"]'))
    proc = run_doit("config:tiny-qwen3-v79", "config:tiny-qwen3-v75", "io:tiny-qwen3", project=clone)
    assert executed_tasks(proc.stdout) == ["config:tiny-qwen3-v75"]
    assert "config:tiny-qwen3-v79" in skipped_tasks(proc.stdout)
