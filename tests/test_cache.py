"""The content-addressed artifact cache and precise rebuilds, on the shipped tiny model."""

from __future__ import annotations

import errno
import importlib
import json
import logging
import os
import pkgutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from mnnbuild.base.fsutil import KnownHashes, sha256_file
from mnnbuild.manifests.twin import TwinManifest
from mnnbuild.pipeline.cache import ArtifactCache, CacheEntry, cache_key
from mnnbuild.verify.verdict import VerifyReport
from tests.conftest import RunDoit, copy_project, doit, executed_tasks, skipped_tasks

# fetch only links files (never cached: links belong to one checkout); every other stage of the default bundle is
# restorable
NOT_CACHED = {"fetch:tiny-qwen3"}


def summary(proc: subprocess.CompletedProcess[str]) -> dict[str, list[str]]:
    """What a doit run built, restored (from which tier, without bytes) and found up to date (the lists that are not
    empty), from its record."""
    record = proc.record  # type: ignore[attr-defined]  # tests.conftest.attach_record
    assert record is not None, f"the run wrote no record:\n{proc.stdout}\n{proc.stderr}"
    rows = {"built": record["built"], "from cache": record["from_cache"]}
    rows |= {f"from {tier}": names for tier, names in sorted(record["by_tier"].items())}
    rows |= {"no bytes": record["no_bytes"], "up to date": record["up_to_date"]}
    return {label: names for label, names in rows.items() if names}


def guard_env(tmp_path: Path) -> dict[str, str]:
    """An environment in which importing MNN or loading a QNN library fails: proof of no MNN/QNN work."""
    guard = tmp_path / "guard"
    (guard / "MNN").mkdir(parents=True)
    (guard / "MNN" / "__init__.py").write_text("raise ImportError('MNN must not be used by a cached build')\n")
    (guard / "sitecustomize.py").write_text(
        "import cffi\n"
        "_dlopen = cffi.FFI.dlopen\n"
        "def _guard(self, name, *args, **kwargs):\n"
        "    if 'Qnn' in str(name):\n"
        "        raise OSError('QNN must not be loaded by a cached build: ' + str(name))\n"
        "    return _dlopen(self, name, *args, **kwargs)\n"
        "cffi.FFI.dlopen = _guard\n"
    )
    return {"PYTHONPATH": str(guard)}


def fill_cache(root: Path) -> tuple[Path, list[str]]:
    """A cold build of the default tasks into ``root/artifacts`` filling the cache ``root/cache``; returns the cache
    and the tasks that ran."""
    cache = root / "cache"
    first = doit(root, env={"MNNBUILD_CACHE": str(cache)}, check=True, timeout=600)
    built = summary(first)["built"]
    assert {"io:tiny-qwen3", "partition:tiny-qwen3", "bundle:tiny-qwen3-v79"} <= set(built)
    assert any(t.startswith("context:tiny-qwen3-v79:") for t in built)
    assert "from cache" not in summary(first)
    return cache, built


@pytest.fixture
def warm_cache(tmp_path: Path) -> tuple[Path, list[str]]:
    """A cache of its own filled by a cold build into ``tmp_path/artifacts``, for a test that corrupts the cache or
    those artifacts (the blobs are their inodes)."""
    return fill_cache(tmp_path)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """One cold build filling a cache, for the tests that only restore from it into artifact roots of their own and
    edit nothing the cache holds (its cold artifacts are ``cache.parent / "artifacts"``): the same build each of them
    made for itself before, made once."""
    return fill_cache(tmp_path_factory.mktemp("shared"))


def test_the_key_is_every_thing_an_entry_was_made_from(tmp_path: Path) -> None:
    """An entry is restored only for what made it: its stage, its config (code fingerprint, params, tools) and each
    input file by name and content. A key that dropped one of them would hand a stale output to a changed run."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text("1")
    b.write_text("2")
    key = cache_key("io", '{"seed": 0}', [a, b])
    assert cache_key("io", '{"seed": 0}', [a, b], KnownHashes()) == key, "known hashes change nothing"
    changed = {
        "stage": cache_key("partition", '{"seed": 0}', [a, b]),
        "config": cache_key("io", '{"seed": 7}', [a, b]),
        "an input's name": cache_key("io", '{"seed": 0}', [a, b.rename(tmp_path / "c.json")]),
    }
    (tmp_path / "c.json").rename(b)
    a.write_text("3")
    changed["an input's content"] = cache_key("io", '{"seed": 0}', [a, b])
    assert {what: k for what, k in changed.items() if k == key} == {}


@pytest.mark.slow
def test_guard_catches_mnn_and_qnn_work(tmp_path: Path, run_doit: RunDoit) -> None:
    proc = run_doit(env=guard_env(tmp_path), check=False)
    assert proc.returncode != 0
    assert "MNN must not be used" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_fresh_clone_restores_everything(
    tmp_path: Path, run_doit: RunDoit, shared_cache: tuple[Path, list[str]]
) -> None:
    cache, built = shared_cache
    clone = copy_project(tmp_path / "clone")
    env = {"MNNBUILD_CACHE": str(cache), "MNNBUILD_ARTIFACTS": str(tmp_path / "clone-artifacts"), **guard_env(tmp_path)}
    proc = run_doit(env=env, project=clone)
    rows = summary(proc)
    assert sorted(rows["from cache"]) == sorted(set(built) - NOT_CACHED), proc.stdout
    assert sorted(rows["built"]) == sorted(NOT_CACHED)
    for task_dir in ("tiny-qwen3/io/io", "tiny-qwen3/partition/partition", "tiny-qwen3/v79/context/graphllm0/context"):
        origin = json.loads((tmp_path / "clone-artifacts" / f"{task_dir}.origin.json").read_text())
        assert origin["origin"] == "cache"
    # byte-identical to the cold build
    for rel in ("tiny-qwen3/io/io.manifest.json", "tiny-qwen3/v79/bundle/bundle.manifest.json"):
        assert (tmp_path / "clone-artifacts" / rel).read_bytes() == (cache.parent / "artifacts" / rel).read_bytes()
    # and then it is simply up to date
    again = run_doit(env=env, project=clone)
    assert "built" not in summary(again) and "from cache" not in summary(again)


FINALIZED = "context: finalized"
"""What ``compose_context`` logs at DEBUG for every graph it composes (in the context stage's worker process too)."""


@pytest.mark.slow
def test_warm_cache_restores_without_the_bytes_and_a_named_task_with_them(
    tmp_path: Path, run_doit: RunDoit, shared_cache: tuple[Path, list[str]]
) -> None:
    """The cache policy: on a warm cache a fresh artifact root gets every task from the cache; the big outputs
    that no task of the run reads (reference io, context binaries, twins, the bundle) come as their manifest and
    origin record only ("without the bytes"), and no graph is composed. ``doit bundle`` then restores the bundle with
    its files, byte for byte the cold build's, as copies (the bundle ships them), its binaries' blobs being the
    context stage's."""
    cache, built = shared_cache
    assert (cache / "partition").is_dir() and (cache / "context").is_dir() and (cache / "twin").is_dir()
    artifacts = tmp_path / "warm-artifacts"
    env = {"MNNBUILD_CACHE": str(cache), "MNNBUILD_ARTIFACTS": str(artifacts), "MNNBUILD_LOG_LEVEL": "DEBUG"}
    proc = run_doit(env=env)  # DEBUG: a composed graph would be logged
    rows = summary(proc)
    assert sorted(rows["built"]) == sorted(NOT_CACHED), proc.stdout
    restored = rows["from cache"]
    assert len([t for t in restored if t.startswith("context:tiny-qwen3-v79:")]) == 4
    assert len([t for t in restored if t.startswith("twin:tiny-qwen3-v79:")]) == 4
    assert {"partition:tiny-qwen3", "verify:tiny-qwen3-v79", "bundle:tiny-qwen3-v79"} <= set(restored)
    deferred = {t for t in restored if t.startswith(("io:", "partition:", "context:", "twin:", "bundle:"))}
    assert sorted(rows["no bytes"]) == sorted(deferred), proc.stdout
    assert FINALIZED not in proc.stdout + proc.stderr
    bundle = artifacts / "tiny-qwen3" / "v79" / "bundle"
    origin = json.loads((bundle / "bundle.origin.json").read_text())
    assert origin["origin"] == "cache" and origin["deferred"] is True and origin["tier"] == "local"
    assert sorted(p.name for p in bundle.iterdir()) == ["bundle.manifest.json", "bundle.origin.json"]
    # the ending says so, and offers no push.sh that is not there
    ending = [line for line in proc.stdout.splitlines() if line.startswith(("bundle  ", "push    "))]
    assert len(ending) == 1 and "in the cache" in ending[0] and "`doit bundle:tiny-qwen3-v79`" in ending[0], ending
    # the plugins hit, so nothing read the partition's graphs and weights: they stay in the cache (the plugin tasks
    # are keyed on the partition manifest's records of the graph files, not on the files)
    partition = artifacts / "tiny-qwen3" / "partition"
    assert json.loads((partition / "partition.origin.json").read_text()).get("deferred") is True
    assert not (partition / "qnn").exists() and not list(partition.glob("*.weight"))
    assert (partition / "npu_postreat.json").is_file(), "what declares the plugin tasks comes with the manifest"
    cold = cache.parent / "artifacts" / "tiny-qwen3" / "v79" / "bundle"
    assert (bundle / "bundle.manifest.json").read_bytes() == (cold / "bundle.manifest.json").read_bytes()
    # verify, restored too, has its files; and the run after is up to date
    assert (artifacts / "tiny-qwen3" / "v79" / "verify" / "verify.json").is_file()
    assert executed_tasks(run_doit(env=env).stdout) in ([], ["verify:tiny-qwen3-v79"])

    named = run_doit("bundle:tiny-qwen3-v79", env=env)
    assert summary(named)["from cache"] == ["bundle:tiny-qwen3-v79"], named.stdout
    assert any(line.startswith("push    ") for line in named.stdout.splitlines()), named.stdout
    assert "no bytes" not in summary(named)
    files = {p.relative_to(cold).as_posix() for p in cold.rglob("*") if p.is_file() and "origin" not in p.name}
    for rel in files:
        assert (bundle / rel).read_bytes() == (cold / rel).read_bytes(), rel
        assert (bundle / rel).stat().st_nlink == 1, f"{rel} is a link to a blob, not a copy"
    entry = CacheEntry.model_validate_json(next((cache / "bundle").glob("*.json")).read_text())
    binaries = {f.sha256 for f in entry.files if f.path.endswith(".bin")}
    contexts = [CacheEntry.model_validate_json(p.read_text()) for p in (cache / "context").glob("*.json")]
    assert binaries and binaries <= {f.sha256 for e in contexts for f in e.files}, "one blob per binary"


@pytest.mark.slow
def test_verify_that_runs_again_composes_no_twin(tmp_path: Path, run_doit: RunDoit) -> None:
    """The unshared twins verify runs are the twin stage's outputs: a cold build composes every graph twice, once
    in its context task (the shipped binary) and once in its twin task, and never in verify. When only verify must
    run again (its spec'd max_new_tokens changed) in a fresh clone on a warm cache, the contexts and the twins
    are restored and nothing is composed."""
    cache = tmp_path / "cache"
    debug = {"MNNBUILD_LOG_LEVEL": "DEBUG"}  # where each composed graph is logged
    first = run_doit(env={"MNNBUILD_CACHE": str(cache), **debug})
    graphs = [d for d in (tmp_path / "artifacts" / "tiny-qwen3" / "partition" / "qnn").iterdir() if d.is_dir()]
    assert len(graphs) == 8 and (first.stdout + first.stderr).count(FINALIZED) == 2 * len(graphs)

    clone = copy_project(tmp_path / "clone")
    spec = clone / "models" / "tiny-qwen3.toml"
    spec.write_text(spec.read_text() + "verify = { max_new_tokens = 8 }\n")
    artifacts = tmp_path / "clone-artifacts"
    proc = run_doit(env={"MNNBUILD_CACHE": str(cache), "MNNBUILD_ARTIFACTS": str(artifacts), **debug}, project=clone)
    rows = summary(proc)
    assert sorted(rows["built"]) == sorted(NOT_CACHED | {"verify:tiny-qwen3-v79", "report:tiny-qwen3-v79"}), proc.stdout
    assert len([t for t in rows["from cache"] if t.startswith("context:tiny-qwen3-v79:")]) == 4
    assert len([t for t in rows["from cache"] if t.startswith("twin:tiny-qwen3-v79:")]) == 4
    assert FINALIZED not in proc.stdout + proc.stderr
    report = VerifyReport.model_validate_json((artifacts / "tiny-qwen3" / "v79" / "verify" / "verify.json").read_text())
    assert report.passed and report.generation is not None and len(report.generation.cpu_tokens) == 8
    for p in report.plugins:  # the restored twins ran, checked against the hashes the twin stage recorded
        ctx_dir = artifacts / "tiny-qwen3" / "v79" / "context" / Path(p.path).stem
        assert json.loads((ctx_dir / "context.origin.json").read_text())["origin"] == "cache"
        twin_dir = artifacts / "tiny-qwen3" / "v79" / "twin" / Path(p.path).stem
        origin = json.loads((twin_dir / "twin.origin.json").read_text())
        # restored without its file, which verify then needed: fetched, and checked against the entry's sha256
        assert origin["origin"] == "cache" and "deferred" not in origin and origin["fetched"]["tier"] == "local"
        fetched = (twin_dir / Path(p.path).name).stat().st_size + (twin_dir / "twin.manifest.json").stat().st_size
        assert origin["fetched"]["bytes"] == fetched
        twin = TwinManifest.read(twin_dir)
        assert twin.binary == p.path and p.executed == "override"
        assert p.twin_sha256 == twin.output(twin.twin).sha256 == sha256_file(twin_dir / twin.twin)
    assert sorted(rows["no bytes"]) == sorted(
        t for t in rows["from cache"] if t.startswith(("io:", "partition:", "context:", "twin:", "bundle:"))
    )

    # a twin blob corrupted in the cache (its bytes changed, not its size) before a runner whose verify needs it:
    # the fetch catches it, one warning names the twin's dir, and the twin stage builds it again in that run
    twin_entry = next(CacheEntry.model_validate_json(e.read_text()) for e in (cache / "twin").glob("*.json"))
    blob = Path(ArtifactCache(str(cache))._blob(twin_entry.files[0].sha256))
    if twin_entry.files[0].path.endswith(".json"):
        blob = Path(ArtifactCache(str(cache))._blob(twin_entry.files[1].sha256))
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    spec.write_text(spec.read_text().replace("max_new_tokens = 8", "max_new_tokens = 6"))
    other = {"MNNBUILD_CACHE": str(cache), "MNNBUILD_ARTIFACTS": str(tmp_path / "other")}
    fixed = run_doit(env=other, project=clone)
    warnings = [line for line in fixed.stderr.splitlines() if line.startswith("W ")]
    assert len(warnings) == 1 and "/twin/" in warnings[0], fixed.stderr
    assert "does not match its sha256; entry discarded" in warnings[0] and warnings[0].endswith("building it again")
    assert "verify:tiny-qwen3-v79" in summary(fixed)["built"]
    origins = [json.loads(p.read_text()) for p in (tmp_path / "other").rglob("twin.origin.json")]
    assert sorted(o["origin"] for o in origins) == ["built", "cache", "cache", "cache"], origins
    assert run_doit(env=other, project=clone).record["built"] == []  # type: ignore[attr-defined]


@pytest.mark.slow
def test_files_the_cache_off_cannot_give_are_built_in_the_same_run(
    tmp_path: Path, run_doit: RunDoit, shared_cache: tuple[Path, list[str]]
) -> None:
    """A root restored from a warm cache without the bytes, verify cleaned, then verify with the cache off: it must
    run and reads the twins and the bundle, which the cache (off) cannot give, so their stages (and the stages whose
    files those read) build them in that run: one warning, verify passes, and the next run is up to date."""
    cache, _ = shared_cache
    env = {"MNNBUILD_CACHE": str(cache), "MNNBUILD_ARTIFACTS": str(tmp_path / "warm")}
    assert "bundle:tiny-qwen3-v79" in summary(run_doit(env=env))["no bytes"]
    run_doit("clean", "verify:tiny-qwen3-v79", env=env)
    off = {**env, "MNNBUILD_CACHE": "off"}
    proc = run_doit("verify:tiny-qwen3-v79", env=off)
    assert summary(proc)["built"] == ["verify:tiny-qwen3-v79"], proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("W ")]
    assert len(warnings) == 1 and "the cache is off" in warnings[0], proc.stderr
    for stage in ("io/io", "partition/partition", "v79/bundle/bundle", "v79/twin/graphllm0/twin",
                  "v79/context/graphllm2/context"):  # fmt: skip
        origin = json.loads((tmp_path / "warm" / "tiny-qwen3" / f"{stage}.origin.json").read_text())
        assert origin["origin"] == "built", stage
    report = VerifyReport.model_validate_json((tmp_path / "warm/tiny-qwen3/v79/verify/verify.json").read_text())
    assert report.passed
    again = run_doit("verify:tiny-qwen3-v79", env=off)
    assert again.record["built"] == [] and not again.stderr.strip(), again.stdout  # type: ignore[attr-defined]


def edit_keeping_size_and_mtime(path: Path, old: bytes, new: bytes) -> None:
    """Replace the first ``old`` in ``path`` by ``new`` (as long) in place, then put its mtime back (``touch -r``)."""
    st = path.stat()
    data = path.read_bytes()
    assert len(old) == len(new) and old in data
    with open(path, "r+b") as f:
        f.write(data.replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


@pytest.mark.slow
def test_a_restored_verify_sees_a_bundle_file_edited_keeping_size_and_mtime(
    tmp_path: Path, run_doit: RunDoit, shared_cache: tuple[Path, list[str]]
) -> None:
    """Verify's result restored from the cache (not run in this root), then a bundle file edited in place with its
    size and mtime kept: verify's up-to-date check sees it by the ctime its record holds, runs, and fails on the
    bundle (the runtime refuses it), pointing at no stale PASSED report. The file put back as it was verifies."""
    cache, _ = shared_cache
    env = {"MNNBUILD_CACHE": str(cache), "MNNBUILD_ARTIFACTS": str(tmp_path / "warm")}
    first = run_doit("bundle:tiny-qwen3-v79", "verify:tiny-qwen3-v79", env=env)
    assert {"bundle:tiny-qwen3-v79", "verify:tiny-qwen3-v79"} <= set(summary(first)["from cache"]), first.stdout
    config = tmp_path / "warm/tiny-qwen3/v79/bundle/model/tiny-qwen3/llm_config.json"
    text = config.read_text()
    tied = text.index('"tie_embeddings"')
    at = text.index("64", tied)
    edit_keeping_size_and_mtime(config, text[tied : at + 2].encode(), (text[tied:at] + "65").encode())
    proc = run_doit("verify:tiny-qwen3-v79", env=env, check=False)
    assert proc.returncode != 0 and list(proc.record["failed"]) == ["verify:tiny-qwen3-v79"], proc.stdout
    assert "llm_config.json" in proc.stdout or "llm.mnn.weight" in proc.stdout, proc.stdout
    report = tmp_path / "warm/tiny-qwen3/v79/verify/verify.txt"
    offered = "verify.txt" in proc.stdout
    assert not offered or "FAILED" in report.read_text(), "a report offered as the reason is this run's"
    edit_keeping_size_and_mtime(config, (text[tied:at] + "65").encode(), text[tied : at + 2].encode())
    fixed = run_doit("verify:tiny-qwen3-v79", env=env)  # the files it passed on: its result stands
    assert executed_tasks(fixed.stdout) == ["verify:tiny-qwen3-v79"] and fixed.record["failed"] == {}  # type: ignore[attr-defined]


@pytest.mark.slow
def test_corrupted_entry_is_discarded_and_rebuilt(
    tmp_path: Path, run_doit: RunDoit, warm_cache: tuple[Path, list[str]]
) -> None:
    warm, built = warm_cache
    cache = ArtifactCache(str(warm))
    entry_path = next((warm / "io").glob("*.json"))
    entry = CacheEntry.model_validate_json(entry_path.read_text())
    output = next(f for f in entry.files if f.path == "testdir/128/output.mnn")
    blob = Path(cache._blob(output.sha256))
    built_bytes = blob.read_bytes()  # the blob is the built artifact's inode: this corrupts both
    data = bytearray(built_bytes)
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))

    env = {"MNNBUILD_CACHE": str(warm), "MNNBUILD_ARTIFACTS": str(tmp_path / "other")}
    # io asked for by name: restored with its files, which are checked (a run that reads none would restore its
    # manifest alone: see test_a_re_verify_fetches_and_checks_the_twins_it_needs)
    proc = run_doit("io:tiny-qwen3", *DEFAULT, env=env)
    rows = summary(proc)
    # io rebuilt (identical content), so everything after it is restored again
    assert sorted(rows["built"]) == sorted(NOT_CACHED | {"io:tiny-qwen3"}), proc.stdout
    assert sorted(rows["from cache"]) == sorted(set(built) - NOT_CACHED - {"io:tiny-qwen3"})
    assert "does not match its sha256; entry discarded" in proc.stderr
    rebuilt = tmp_path / "other" / "tiny-qwen3" / "io" / "testdir" / "128" / "output.mnn"
    assert rebuilt.read_bytes() == built_bytes
    # the rebuild stored a good entry again
    assert cache.has("io", entry.key)


CACHED_STAGES = {"io", "partition", "config", "context", "twin", "bundle", "verify", "report"}


def stage_dirs_by_entry(artifacts: Path, cache: Path) -> dict[Path, CacheEntry]:
    """Each stage dir under ``artifacts`` that a cache entry describes (its origin record names the key)."""
    found = {}
    for origin in artifacts.rglob("*.origin.json"):
        stage, record = origin.name.removesuffix(".origin.json"), json.loads(origin.read_text())
        entry = cache / stage / f"{record.get('key')}.json"
        if record.get("key") and entry.is_file():
            found[origin.parent] = CacheEntry.model_validate_json(entry.read_text())
    return found


@pytest.mark.slow
def test_blobs_are_the_artifacts_and_a_corrupt_one_is_never_restored(
    tmp_path: Path, run_doit: RunDoit, warm_cache: tuple[Path, list[str]]
) -> None:
    """Cache and artifacts on one file system: every blob is a hard link to a built artifact with its content
    (nothing written twice) but the bundle's own (it ships copies), a fresh artifact root restores by linking the
    blobs, and a binary edited in place after the build (which edits its blob) is caught by the restore's sha256:
    that entry is discarded and the context rebuilt, byte for byte what was built first, and linked into the cache
    again."""
    cache_dir, built = warm_cache
    cache, artifacts = ArtifactCache(str(cache_dir)), tmp_path / "artifacts"
    entries = stage_dirs_by_entry(artifacts, cache_dir)
    assert {e.stage for e in entries.values()} == CACHED_STAGES
    inodes: dict[str, set[tuple[int, int]]] = {}
    for out_dir, entry in entries.items():
        for f in entry.files:
            if entry.stage != "bundle":
                st = (out_dir / f.path).stat()
                inodes.setdefault(f.sha256, set()).add((st.st_dev, st.st_ino))
    for sha, names in inodes.items():
        blob = Path(cache._blob(sha)).stat()
        assert (blob.st_dev, blob.st_ino) in names, f"blob {sha[:12]} is a copy, not an artifact file"
        assert blob.st_nlink >= 2
    bundle_dir, bundle = next((d, e) for d, e in entries.items() if e.stage == "bundle")
    for f in bundle.files:
        assert not os.path.samefile(bundle_dir / f.path, cache._blob(f.sha256)), f"bundle file {f.path} is a blob"
    usage = cache.usage()
    own = {f.sha256: f.size for f in bundle.files if f.sha256 not in inodes}  # blobs only the bundle has: copies
    assert usage.shared_bytes == usage.total_bytes - sum(own.values()) > 0

    # a fresh artifact root (no MNN, no QNN): restored files are the blobs, checked; the dirs restored without
    # their files hold their manifest and origin record only
    fresh = tmp_path / "fresh"
    env = {"MNNBUILD_CACHE": str(cache_dir), "MNNBUILD_ARTIFACTS": str(fresh)}
    guard = guard_env(tmp_path)
    proc = run_doit(env={**env, **guard})
    assert sorted(summary(proc)["from cache"]) == sorted(set(built) - NOT_CACHED), proc.stdout
    restored = stage_dirs_by_entry(fresh, cache_dir)
    assert {e.stage for e in restored.values()} == CACHED_STAGES
    for out_dir, entry in restored.items():
        origin = json.loads((out_dir / f"{entry.stage}.origin.json").read_text())
        left = set(origin.get("deferred_files", []))
        assert bool(left) == bool(origin.get("deferred")), out_dir
        for f in entry.files:
            if f.path in left:
                assert not (out_dir / f.path).exists(), f"{out_dir / f.path} was left in the cache"
            elif f.link is None:  # the bundle's are copies, the others the blobs
                linked = os.path.samefile(out_dir / f.path, cache._blob(f.sha256))
                assert linked == (entry.stage != "bundle"), out_dir / f.path
    # the bundle asked for: copies (never links) of what it ships, so editing it never reaches the cache
    run_doit("bundle:tiny-qwen3-v79", env={**env, **guard})
    shipped = fresh / "tiny-qwen3" / "v79" / "bundle" / "model" / "tiny-qwen3" / "qnn" / "graphllm0.bin"
    assert shipped.stat().st_nlink == 1

    # edit a context binary in place in the first root: its blob is the same inode, now corrupt
    binary = artifacts / "tiny-qwen3" / "v79" / "context" / "graphllm0" / "qnn" / "graphllm0.bin"
    good = binary.read_bytes()
    entry = next(e for d, e in entries.items() if d == binary.parent.parent)
    blob = Path(cache._blob(next(f.sha256 for f in entry.files if f.path == "qnn/graphllm0.bin")))
    with open(binary, "r+b") as fh:
        fh.seek(len(good) // 2)
        fh.write(bytes([good[len(good) // 2] ^ 0xFF]))
    assert blob.read_bytes() != good, "the blob shares the artifact's inode"

    again = tmp_path / "again"
    proc = run_doit(
        "context:tiny-qwen3-v79", *DEFAULT, env={"MNNBUILD_CACHE": str(cache_dir), "MNNBUILD_ARTIFACTS": str(again)}
    )
    rows = summary(proc)
    assert "does not match its sha256; entry discarded" in proc.stderr
    assert sorted(rows["built"]) == sorted(NOT_CACHED | {"context:tiny-qwen3-v79:graphllm0"}), proc.stdout
    assert sorted(rows["from cache"]) == sorted(set(built) - NOT_CACHED - {"context:tiny-qwen3-v79:graphllm0"})
    rebuilt = again / "tiny-qwen3" / "v79" / "context" / "graphllm0" / "qnn" / "graphllm0.bin"
    assert rebuilt.read_bytes() == good
    assert os.path.samefile(rebuilt, blob), "the rebuilt binary is the cache's blob again"
    assert cache.has("context", entry.key)


DEFAULT = ("verify:tiny-qwen3-v79", "report:tiny-qwen3-v79")
"""What a bare `doit` runs, to name beside another task."""


@pytest.mark.slow
def test_cache_off_builds(tmp_path: Path, run_doit: RunDoit, shared_cache: tuple[Path, list[str]]) -> None:
    env = {"MNNBUILD_CACHE": "off", "MNNBUILD_ARTIFACTS": str(tmp_path / "other")}
    assert sorted(summary(run_doit(env=env))["built"]) == sorted(shared_cache[1])


@pytest.mark.slow
def test_editing_a_stage_reruns_it_and_dependents_only(tmp_path: Path, run_doit: RunDoit) -> None:
    clone = copy_project(tmp_path / "clone")
    first = executed_tasks(run_doit(project=clone).stdout)
    src = clone / "mnnbuild" / "stages" / "partition.py"
    src.write_text(src.read_text() + "\n# a comment is not code\n")
    assert executed_tasks(run_doit(project=clone).stdout) == []
    # a code change whose outputs differ (the postreat file's indentation) re-runs the partition and what reads
    # those outputs; its graph files come out identical, so no context binary is rebuilt (early cutoff)
    text = src.read_text()
    assert "json.dumps(postreat, indent=4)" in text
    src.write_text(text.replace("json.dumps(postreat, indent=4)", "json.dumps(postreat, indent=2)"))
    proc = run_doit(project=clone)
    downstream = ("partition:", "bundle:", "verify:", "report:")
    assert sorted(executed_tasks(proc.stdout)) == sorted(t for t in first if t.startswith(downstream))
    assert {"fetch:tiny-qwen3", "io:tiny-qwen3", "config:tiny-qwen3-v79"} <= set(skipped_tasks(proc.stdout))


@pytest.mark.slow
def test_bumping_a_manifest_schema_reruns_its_stages(tmp_path: Path, run_doit: RunDoit) -> None:
    clone = copy_project(tmp_path / "clone")
    first = executed_tasks(run_doit(project=clone).stdout)
    src = clone / "mnnbuild" / "manifests" / "config.py"
    text = src.read_text()
    anchor = "    config: ConfigQnn\n"
    assert anchor in text
    src.write_text(text.replace(anchor, anchor + "    note: str = ''\n"))
    # the config manifest changed shape: config and the stage that reads it (bundle) re-run, nothing else; the
    # bundle comes out byte-identical, so verify stays up to date (early cutoff)
    proc = run_doit(project=clone)
    # report re-runs as well: it reads the config manifest (its cost table), so its code key covers that model
    assert sorted(executed_tasks(proc.stdout)) == sorted(
        t for t in first if t.startswith(("config:", "bundle:", "report:"))
    )
    assert {"io:tiny-qwen3", "partition:tiny-qwen3", "verify:tiny-qwen3-v79"} <= set(skipped_tasks(proc.stdout))


@pytest.mark.slow
def test_new_target_runs_only_target_stages(tmp_path: Path, run_doit: RunDoit) -> None:
    clone = copy_project(tmp_path / "clone")
    first = executed_tasks(run_doit("config:tiny-qwen3-v79", "io:tiny-qwen3", project=clone).stdout)
    assert "config:tiny-qwen3-v79" in first and "io:tiny-qwen3" in first
    spec = clone / "models" / "tiny-qwen3.toml"
    spec.write_text(spec.read_text().replace('targets = ["v79"]', 'targets = ["v79", "v75"]'))
    proc = run_doit("config:tiny-qwen3-v79", "config:tiny-qwen3-v75", "io:tiny-qwen3", project=clone)
    assert executed_tasks(proc.stdout) == ["config:tiny-qwen3-v75"]
    assert "config:tiny-qwen3-v79" in skipped_tasks(proc.stdout)


def make_tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(bytes(range(256)) * 64)
    (root / "sub" / "b.json").write_text('{"x": 1}')
    return root


@pytest.mark.parametrize("url", ["memory://mnnbuild-test", "file://{tmp}/cache-url", "{tmp}/cache-dir"])
def test_cache_backends_round_trip(tmp_path: Path, url: str) -> None:
    cache = ArtifactCache(url.format(tmp=tmp_path))
    src = make_tree(tmp_path / "src")
    assert cache.restore("stage", "k1", tmp_path / "out") is None
    stored = cache.store("stage", "k1", src)
    assert stored == (src / "a.bin").stat().st_size + (src / "sub" / "b.json").stat().st_size
    assert cache.store("stage", "k2", src) == 0, "blobs are content-addressed: nothing new to upload"
    assert cache.restore("stage", "k1", tmp_path / "out") == stored
    for rel in ("a.bin", "sub/b.json"):
        assert (tmp_path / "out" / rel).read_bytes() == (src / rel).read_bytes()


@pytest.mark.parametrize("bad", [0, 3, 5])
def test_a_corrupt_blob_among_several_restored_at_once_fails_the_restore(tmp_path: Path, bad: int) -> None:
    """A local cache restores two blobs at a time: whichever one is bad (first, middle, last), the restore is a miss
    that leaves no stage dir, the entry is discarded and the bad blob removed; the good blobs stay."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"part{i}.bin").write_bytes(bytes([i]) * (70_000 + i))
    cache = ArtifactCache(str(tmp_path / "cache"))
    cache.store("stage", "k", src, link=False)
    entry = cache.read_entry("stage", "k")
    assert entry is not None
    bad_sha = next(f.sha256 for f in entry.files if f.path == f"part{bad}.bin")
    blob = Path(cache._blob(bad_sha))
    blob.write_bytes(b"x" * blob.stat().st_size)  # same size, other bytes: only the hash tells
    out = tmp_path / "out"
    assert cache.restore("stage", "k", out, link=False) is None
    assert not out.exists(), "a failed restore leaves no stage dir"
    assert cache.read_entry("stage", "k") is None and not blob.exists()
    good = [f for f in entry.files if f.sha256 != bad_sha]
    assert all(Path(cache._blob(f.sha256)).exists() for f in good)


def test_same_content_is_stored_once_and_restored_as_hard_links(tmp_path: Path) -> None:
    """modellib hard-links the weights its graphs share: the cache keeps one blob, the restore one file."""
    src = make_tree(tmp_path / "src")
    os.link(src / "a.bin", src / "sub" / "a-again.bin")
    (src / "copy.bin").write_bytes((src / "a.bin").read_bytes())
    cache = ArtifactCache(str(tmp_path / "cache"))
    assert cache.store("stage", "k", src) == (src / "a.bin").stat().st_size + (src / "sub" / "b.json").stat().st_size
    out = tmp_path / "out"
    assert cache.restore("stage", "k", out) == (src / "a.bin").stat().st_size + (src / "sub" / "b.json").stat().st_size
    assert os.path.samefile(out / "a.bin", out / "sub" / "a-again.bin") and os.path.samefile(
        out / "a.bin", out / "copy.bin"
    )
    assert (out / "copy.bin").read_bytes() == (src / "a.bin").read_bytes()


def test_concurrent_writers_of_one_key(tmp_path: Path) -> None:
    """Two runners storing the same key at once leave one valid entry (temp name + rename)."""
    from concurrent.futures import ThreadPoolExecutor

    src = make_tree(tmp_path / "src")
    url = str(tmp_path / "shared")
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: ArtifactCache(url).store("stage", "same", src), range(8)))
    assert not [p for p in (tmp_path / "shared").rglob("*") if ".tmp-" in p.name]
    assert ArtifactCache(url).restore("stage", "same", tmp_path / "out") is not None


def test_from_env() -> None:
    assert ArtifactCache.from_env({"MNNBUILD_CACHE": "off"}) is None
    assert ArtifactCache.from_env({"MNNBUILD_CACHE": "memory://x"}).url == "memory://x"
    default = ArtifactCache.from_env({"XDG_CACHE_HOME": "/some/where"})
    assert default is not None and default.url == "/some/where/mnnbuild"


def test_prune_drops_least_recently_used_entries_and_their_blobs(tmp_path: Path) -> None:
    cache = ArtifactCache(str(tmp_path / "cache"))
    sizes = {}
    for n, key in enumerate(("old", "mid", "new")):
        src = tmp_path / key
        src.mkdir()
        (src / "data.bin").write_bytes(bytes([n]) * 1000 * (n + 1))
        sizes[key] = cache.store("stage", key, src)
        entry = tmp_path / "cache" / "stage" / f"{key}.json"
        os.utime(entry, (time.time() - 100 + n, time.time() - 100 + n))
    assert cache.usage().total_bytes == sum(sizes.values())
    # using "old" makes it the most recently used
    assert cache.restore("stage", "old", tmp_path / "restored") is not None
    removed, freed = cache.prune(sizes["old"] + sizes["new"], grace_seconds=0)
    assert removed == 1 and freed == sizes["mid"]
    assert not cache.has("stage", "mid") and cache.has("stage", "old") and cache.has("stage", "new")
    assert cache.restore("stage", "new", tmp_path / "again") is not None
    assert cache.usage().total_bytes == sizes["old"] + sizes["new"]


@pytest.mark.slow
def test_cache_cli(tmp_path: Path) -> None:
    import subprocess
    import sys

    from mnnbuild.__main__ import parse_size

    assert parse_size("20GiB") == 20 << 30 and parse_size("1.5MiB") == int(1.5 * (1 << 20)) and parse_size("512") == 512
    assert parse_size("20G") == parse_size("20GB") == 20 * 10**9, "pydantic's ByteSize: G and GB are decimal"
    cache = ArtifactCache(str(tmp_path / "cache"))
    cache.store("io", "k", make_tree(tmp_path / "src"))
    proc = subprocess.run([sys.executable, "-m", "mnnbuild", "cache", "info", "--url", str(tmp_path / "cache")],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert "1 entries (io 1), 2 blobs" in proc.stdout
    assert "of it hard links to artifact files" in proc.stdout, "the blobs are the files of src"


@pytest.mark.parametrize(
    "argv",
    [
        ["t:a", "x=1", "--project", "{project}"],
        ["--project", "{project}", "t:a", "x=1"],
        ["t:a", "--project", "{project}", "x=1"],
    ],
    ids=["tasks-first", "project-first", "between"],
)
def test_cache_materialize_takes_its_options_in_any_order(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each order reaches the task check with both words as tasks (``x=1``, a doit setting, is refused before doit
    runs: no build), instead of argparse refusing the words after ``--project``."""
    from mnnbuild.__main__ import main

    (tmp_path / "dodo.py").write_text("")
    assert main(["cache", "materialize", *(a.format(project=tmp_path) for a in argv)]) == 2
    assert (
        capsys.readouterr().err
        == "error: cache materialize 'x=1': not a task name; expected one such as io:tiny-qwen3\n"
    )


@pytest.mark.parametrize("task", ["", " "])
def test_cache_materialize_of_an_empty_name_is_one_line(task: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 43, item 4: ``cache materialize ''`` was doit's IndexError (it reads an argument's first character)."""
    from mnnbuild.__main__ import main

    assert main(["cache", "materialize", task]) == 2
    assert capsys.readouterr().err == (
        f"error: cache materialize {task!r}: not a task name; expected one such as io:tiny-qwen3\n"
    )


def test_unknown_options_are_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from mnnbuild.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["cache", "materialize", "t:a", "--no-such-option"])
    assert exc.value.code == 2 and "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_same_device_stores_and_restores_hard_links(tmp_path: Path) -> None:
    """A local cache beside the artifacts: a stored blob is the artifact file, a restored file is the blob."""
    src = make_tree(tmp_path / "src")
    cache = ArtifactCache(str(tmp_path / "cache"))
    size = (src / "a.bin").stat().st_size + (src / "sub" / "b.json").stat().st_size
    assert cache.store("stage", "k", src) == size
    for rel in ("a.bin", "sub/b.json"):
        assert os.path.samefile(src / rel, cache._blob(sha256_file(src / rel)))
    assert cache.restore("stage", "k", tmp_path / "out") == size
    for rel in ("a.bin", "sub/b.json"):
        assert os.path.samefile(tmp_path / "out" / rel, src / rel)
    assert (src / "a.bin").stat().st_nlink == 3
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name], "no temp link is left behind"


@pytest.mark.parametrize("err", [errno.EXDEV, errno.EPERM, errno.EMLINK])
def test_a_refused_link_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """Another device (EXDEV), a file system or policy without links (EPERM), a file linked too often (EMLINK):
    the blob and the restored file are copies, as they always were."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(err, os.strerror(err))

    src = make_tree(tmp_path / "src")
    cache = ArtifactCache(str(tmp_path / "cache"))
    monkeypatch.setattr(os, "link", refuse)
    stored = cache.store("stage", "k", src)
    assert stored == (src / "a.bin").stat().st_size + (src / "sub" / "b.json").stat().st_size
    blob = Path(cache._blob(sha256_file(src / "a.bin")))
    assert blob.read_bytes() == (src / "a.bin").read_bytes() and not os.path.samefile(blob, src / "a.bin")
    assert cache.restore("stage", "k", tmp_path / "out") == stored
    assert (tmp_path / "out" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert (tmp_path / "out" / "a.bin").stat().st_nlink == 1
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


def test_another_device_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Artifacts on another device than the cache (st_dev differs): no link is even tried."""
    cache_dir = tmp_path / "cache"

    def other_device(real: Callable[..., os.stat_result]) -> Callable[..., os.stat_result]:
        def fake(path: object, *args: object, **kwargs: object) -> os.stat_result:
            st = real(path, *args, **kwargs)
            if str(path).startswith(str(cache_dir)):
                return os.stat_result((st.st_mode, st.st_ino, st.st_dev + 1, *st[3:]))
            return st

        return fake

    tried = []
    monkeypatch.setattr(os, "stat", other_device(os.stat))
    monkeypatch.setattr(os, "lstat", other_device(os.lstat))
    monkeypatch.setattr(os, "link", lambda *a, **k: tried.append(a))
    src = make_tree(tmp_path / "src")
    cache = ArtifactCache(str(cache_dir))
    assert cache.store("stage", "k", src) > 0
    assert cache.restore("stage", "k", tmp_path / "out") is not None
    assert not tried and (src / "a.bin").stat().st_nlink == 1
    assert (tmp_path / "out" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()


def test_remote_cache_copies(tmp_path: Path) -> None:
    """A remote fsspec backend (memory:// stands in for s3:// and the like) never links."""
    cache = ArtifactCache("memory://mnnbuild-links")
    assert not cache.local and ArtifactCache(str(tmp_path / "c")).local
    src = make_tree(tmp_path / "src")
    assert cache.store("stage", "k", src) > 0 and cache.restore("stage", "k", tmp_path / "out") is not None
    assert (tmp_path / "out" / "a.bin").stat().st_nlink == 1 and (src / "a.bin").stat().st_nlink == 1


def test_an_artifact_edited_in_place_is_not_restored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An artifact is its blob: editing it in place edits the blob, which the restore's sha256 catches (the entry is
    discarded and the blob removed; the edited artifact itself is left to its owner)."""
    src = make_tree(tmp_path / "src")
    cache = ArtifactCache(str(tmp_path / "cache"))
    cache.store("stage", "k", src)
    sha = sha256_file(src / "a.bin")
    with open(src / "a.bin", "r+b") as fh:
        fh.write(b"edited")
    with caplog.at_level(logging.WARNING, logger="mnnbuild.pipeline.cache"):
        assert cache.restore("stage", "k", tmp_path / "out") is None
    assert "does not match its sha256; entry discarded" in caplog.text
    assert not (tmp_path / "out").exists() and not cache.has("stage", "k")
    assert not Path(cache._blob(sha)).exists() and (src / "a.bin").read_bytes().startswith(b"edited")


def test_clean_and_prune_with_linked_blobs(tmp_path: Path) -> None:
    """Blobs with other names are normal: `doit clean` (removing a stage dir) leaves the cache whole, usage counts
    each blob's size once, and prune removes blobs whose bytes a restored artifact still holds, which stays intact."""
    import shutil

    src = make_tree(tmp_path / "src")
    cache = ArtifactCache(str(tmp_path / "cache"))
    size = cache.store("stage", "k", src)
    usage = cache.usage()
    assert usage.total_bytes == size == usage.shared_bytes and len(usage.blobs) == 2
    shutil.rmtree(src)  # what `doit clean` does
    usage = cache.usage()
    assert usage.total_bytes == size and usage.shared_bytes == 0
    out = tmp_path / "out"
    assert cache.restore("stage", "k", out) == size
    assert cache.usage().shared_bytes == size
    want = {p: (out / p).read_bytes() for p in ("a.bin", "sub/b.json")}
    assert cache.prune(0, grace_seconds=0) == (1, size)
    assert not list((tmp_path / "cache" / "blobs").rglob("*.*")) and cache.usage().total_bytes == 0
    assert {p: (out / p).read_bytes() for p in want} == want and (out / "a.bin").stat().st_nlink == 1


def test_a_blob_linked_just_now_is_young_for_prune(tmp_path: Path) -> None:
    """A hard link keeps the artifact's mtime; prune's grace must count from when the blob entered the cache
    (its ctime), or a blob of an entry being written could be deleted as an old unreferenced one."""
    src = make_tree(tmp_path / "src")
    old = time.time() - 7200
    for p in (src / "a.bin", src / "sub" / "b.json"):
        os.utime(p, (old, old))
    cache = ArtifactCache(str(tmp_path / "cache"))
    cache.store("stage", "k", src)
    cache.discard("stage", "k")  # as if the entry were not written yet
    assert cache.prune(1 << 30) == (0, 0)
    assert len(cache.usage().blobs) == 2


def test_origin_record_is_never_written_in_place(tmp_path: Path) -> None:
    """A restored stage dir's files may be cache blobs: its origin record replaces the name, never the content."""
    from mnnbuild.pipeline.origin import write_origin

    out = tmp_path / "out"
    out.mkdir()
    blob = tmp_path / "blob"
    blob.write_text("cached content")
    os.link(blob, out / "io.origin.json")
    write_origin(out, "io", {"origin": "cache"})
    assert blob.read_text() == "cached content"
    assert json.loads((out / "io.origin.json").read_text()) == {"origin": "cache"}


def test_hashes_the_stage_recorded_are_not_computed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage's manifest already holds its outputs' sha256: storing them hashes nothing again (3.4 GB of
    context binaries at Qwen3-1.7B size), and a recorded hash that is wrong never restores a file."""
    src = make_tree(tmp_path / "src")
    recorded = {rel: ((src / rel).stat().st_size, sha256_file(src / rel)) for rel in ("a.bin", "sub/b.json")}
    hashed: list[str] = []
    for module in cache_modules():
        if hasattr(module, "sha256_file"):
            monkeypatch.setattr(module, "sha256_file", lambda p: hashed.append(Path(p).name) or sha256_file(p))
    cache = ArtifactCache(str(tmp_path / "cache"))
    cache.store("stage", "k", src, recorded)
    assert hashed == []
    assert cache.restore("stage", "k", tmp_path / "out") is not None
    assert (tmp_path / "out" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    # a size that differs from the file's means the record is not this file's: hashed after all
    cache.store("stage", "k2", src, {"a.bin": (recorded["a.bin"][0] + 1, "0" * 64)})
    assert "a.bin" in hashed
    # a recorded hash that lies (same size) is caught when restoring: the entry is dropped, nothing restored
    other = make_tree(tmp_path / "other")
    (other / "a.bin").write_bytes(b"x" * (other / "a.bin").stat().st_size)
    lie = {"a.bin": ((other / "a.bin").stat().st_size, "1" * 64)}
    fresh = ArtifactCache(str(tmp_path / "cache2"))
    fresh.store("stage", "k", other, lie)
    assert fresh.restore("stage", "k", tmp_path / "out2") is None and not fresh.has("stage", "k")


def test_verify_trusts_the_stamps_of_files_the_bundle_hashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify's integrity check hashes no bundle file whose stamp (size, mtime, ctime, inode) is the one recorded when
    the bundle stage (or a checked restore) hashed it; an edit, even one that puts the old mtime back, is hashed and
    caught."""
    from mnnbuild.pipeline.manifest import record_outputs
    from mnnbuild.pipeline.origin import stamps
    from mnnbuild.verify import checks

    bundle = make_tree(tmp_path / "bundle")
    records = record_outputs(bundle)
    trusted = stamps(bundle, [r.path for r in records])
    hashed: list[str] = []
    monkeypatch.setattr(checks, "sha256_file", lambda p: hashed.append(Path(p).name) or sha256_file(p))
    result = checks.check_integrity(bundle, records, trusted)
    assert result.passed and result.hashed == 0 and hashed == []
    assert checks.check_integrity(bundle, records).hashed == len(records), "no stamps: every file hashed"

    target = bundle / "a.bin"
    before = target.stat()
    time.sleep(0.01)
    with open(target, "r+b") as fh:
        fh.write(b"X")
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # the old mtime back: the ctime still moved
    hashed.clear()
    result = checks.check_integrity(bundle, records, trusted)
    assert not result.passed and hashed == ["a.bin"] and "changed after bundling" in result.problems[0]


def aged_tree(root: Path) -> Path:
    """`make_tree`, its files as if written a while ago (an old mtime; their ctime is now): their stamps prove their
    content (`settled`), as a build's big outputs are by the time they are hashed."""
    make_tree(root)
    old = time.time() - 3600
    for p in (root / "a.bin", root / "sub" / "b.json"):
        os.utime(p, (old, old))
    return root


def count_hashing(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file the cache hashes from now on (by name: a blob's is its sha256), by any of its ways to hash one."""
    hashed: list[str] = []
    for module in cache_modules():
        for name in ("sha256_file", "hash_stamped", "copy_hashed"):
            if hasattr(module, name):
                real = getattr(module, name)
                hook = lambda p, *a, real=real: hashed.append(Path(p).name) or real(p, *a)  # noqa: E731
                monkeypatch.setattr(module, name, hook)
    return hashed


def cache_modules() -> list[ModuleType]:
    """The modules of the cache package (each binds the helpers it calls)."""
    import mnnbuild.pipeline.cache as cache_package

    names = [info.name for info in pkgutil.iter_modules(cache_package.__path__)]
    return [importlib.import_module(f"mnnbuild.pipeline.cache.{name}") for name in names]


def test_a_blob_hashed_once_is_restored_without_hashing_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A file stored with the stamp it had while its stage hashed it is vouched for: restores link or copy its blob
    without hashing it, and the copies are its bytes. Edited in place (its blob is the same inode) with the old mtime
    put back, it is hashed and caught: the entry is discarded, the blob and its stamp record removed."""
    import mnnbuild.pipeline.cache.misses as cache_misses
    from mnnbuild.pipeline.manifest import record_outputs

    src = aged_tree(tmp_path / "src")
    records = record_outputs(src)
    assert all(r.stamp is not None for r in records)
    cache = ArtifactCache(str(tmp_path / "cache"))
    cache.store(
        "stage",
        "k",
        src,
        {r.path: (r.size, r.sha256) for r in records},
        proven={r.path: (r.stamp, r.sha256) for r in records if r.stamp},
    )
    blob = Path(cache._blob(sha256_file(src / "a.bin")))
    assert Path(f"{blob}.stamp").is_file()

    hashed = count_hashing(monkeypatch)
    assert cache.restore("stage", "k", tmp_path / "linked") is not None
    assert cache.restore("stage", "k", tmp_path / "copied", link=False) is not None
    assert hashed == [], "a vouched-for blob is not hashed again"
    assert os.path.samefile(tmp_path / "linked" / "a.bin", blob)
    copied = tmp_path / "copied" / "a.bin"
    assert copied.read_bytes() == (src / "a.bin").read_bytes() and copied.stat().st_nlink == 1
    assert cache.restore("stage", "k", tmp_path / "again") is not None and hashed == [], "a link moves only the ctime"

    before = (src / "a.bin").stat()
    with open(src / "a.bin", "r+b") as fh:
        fh.write(b"edited")
    os.utime(src / "a.bin", ns=(before.st_atime_ns, before.st_mtime_ns))  # the old mtime back: the ctime still moved
    assert (src / "a.bin").stat().st_size == before.st_size
    for out, link in ((tmp_path / "out-copy", False), (tmp_path / "out-link", True)):
        # a new process each time: one run does not fetch a blob it found bad again (`cache.misses.LEARNED`)
        monkeypatch.setattr(cache_misses.LEARNED, "bad", {})
        monkeypatch.setattr(cache_misses.LEARNED, "dead", {})
        cache.store("stage", "k", src, {r.path: (r.size, r.sha256) for r in records})  # the entry, as before
        with caplog.at_level(logging.WARNING, logger="mnnbuild.pipeline.cache"):
            assert cache.restore("stage", "k", out, link=link) is None
        assert {"a.bin", blob.name} & set(hashed) and "does not match its sha256; entry discarded" in caplog.text
        assert not out.exists() and not cache.has("stage", "k")
        assert not blob.exists() and not Path(f"{blob}.stamp").exists()
        os.link(src / "a.bin", blob)  # the edited bytes under the old name again, for the other way to restore
        hashed.clear()
        caplog.clear()


def test_a_blob_is_vouched_for_only_by_what_proves_its_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No stamp record without proof: a recorded sha256 without the stamp it was taken with (a stage's record that
    lies, or one copied with another sha256) is hashed on restore and caught; a blob hashed by a restore is vouched
    for from then on; a copy into the cache is hashed as it is written."""
    from mnnbuild.pipeline.manifest import record_outputs

    src = aged_tree(tmp_path / "src")
    (rec,) = [r for r in record_outputs(src) if r.path == "a.bin"]
    lie = rec.model_copy(update={"sha256": "1" * 64})
    assert rec.stamp is not None and lie.stamp is None
    cache = ArtifactCache(str(tmp_path / "cache"))
    cache.store("stage", "lie", src, {"a.bin": (lie.size, lie.sha256)}, proven={"a.bin": (rec.stamp, rec.sha256)})
    assert not Path(f"{cache._blob(lie.sha256)}.stamp").exists(), (
        "a stamp vouches only for the sha256 it was taken with"
    )
    assert cache.restore("stage", "lie", tmp_path / "out-lie") is None and not cache.has("stage", "lie")

    # stored without stamps: the first restore hashes (and vouches), the next does not
    other = ArtifactCache(str(tmp_path / "other"))
    other.store("stage", "k", src)
    blob = Path(other._blob(rec.sha256))
    os.utime(blob, ns=(blob.stat().st_atime_ns, blob.stat().st_mtime_ns))  # its last change a tick ago, as in a build
    hashed = count_hashing(monkeypatch)
    assert other.restore("stage", "k", tmp_path / "first", link=False) is not None and blob.name in hashed
    hashed.clear()
    assert other.restore("stage", "k", tmp_path / "second", link=False) is not None and hashed == []

    # a local copy into the cache (links refused) is hashed as it is written, and a file that is not its record is
    # refused: no entry
    monkeypatch.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EXDEV, "cross-device")))
    third = ArtifactCache(str(tmp_path / "third"))
    assert (
        third.store("stage", "k", src, {"a.bin": (rec.size, rec.sha256)}, proven={"a.bin": (rec.stamp, rec.sha256)}) > 0
    )
    assert "a.bin" in hashed and Path(f"{third._blob(rec.sha256)}.stamp").is_file()
    assert third.store("stage", "bad", src, {"a.bin": (rec.size, "2" * 64)}) == 0 and not third.has("stage", "bad")


def test_a_stamp_proves_content_only_once_a_write_would_move_it() -> None:
    """git's "racily clean" files: a write in the clock tick of a file's last change leaves its stamp as it was, so a
    stamp taken in that tick proves nothing (unless the mtime differs from the ctime: a later write moves both)."""
    from mnnbuild.base.fsutil import settled

    ms = 1_000_000
    changed = 1_700_000_000_123_456_789
    assert not settled([10, changed, changed, 1], changed + 5 * ms)
    assert settled([10, changed, changed, 1], changed + 25 * ms)
    assert settled([10, changed - 3600 * 1000 * ms, changed, 1], changed), "an mtime older than the ctime"
    whole = 1_700_000_000_000_000_000  # a file system with whole-second times: a tick may be 2 s
    assert not settled([10, whole, whole, 1], whole + 1500 * ms) and settled([10, whole, whole, 1], whole + 2000 * ms)


def test_one_run_hashes_a_file_once(tmp_path: Path) -> None:
    """doit's file check (sha256 where doit has md5, the same rule: the mtime it had, else size and content) and the
    task keys take the hashes the run took already, by the stamp the file had then; a file edited since, its mtime
    put back, is hashed again and seen to differ."""
    from mnnbuild.base.fsutil import KnownHashes
    from mnnbuild.dag.project import content_checker

    path = aged_tree(tmp_path / "src") / "a.bin"
    good = sha256_file(path)
    hashes = KnownHashes()
    checker = content_checker(hashes)()
    state = checker.get_state(str(path), None)
    assert state is not None and state[2] == good
    calls: list[Path] = []
    import mnnbuild.base.fsutil as fsutil

    real = fsutil.sha256_file
    fsutil_hash = lambda p: calls.append(Path(p)) or real(p)  # noqa: E731
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsutil, "sha256_file", fsutil_hash)
        assert hashes.sha256(path) == good and calls == [], "known by its stamp"
        before = path.stat()
        with open(path, "r+b") as fh:
            fh.write(b"edited")
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))  # a new mtime: hashed, differs
        assert checker.check_modified(str(path), path.stat(), state) and calls == [path]


def test_outputs_made_after_their_task_ran_are_held_to_their_stamps_not_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage dir whose files came after its task ran (fetched from the cache, or built again by a task that read
    it) has no mtime on doit's record: its up-to-date check takes the stamps its origin record took as it hashed
    them, hashing nothing (GBs at real size, every run); an edit that keeps size and mtime moves the ctime, and is
    hashed and caught."""
    import mnnbuild.dag.uptodate as uptodate
    from mnnbuild.pipeline.manifest import Manifest, record_outputs
    from mnnbuild.pipeline.origin import stamps, write_origin

    class ProbeManifest(Manifest):
        stage = "probe"

    out = aged_tree(tmp_path / "probe")
    outputs = record_outputs(out)
    ProbeManifest(model="m", outputs=outputs).write(out)
    write_origin(out, "probe", {"origin": "built", "stamps": stamps(out, [r.path for r in outputs])})
    hashed: list[str] = []
    real = uptodate.sha256_file
    monkeypatch.setattr(uptodate, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    check = uptodate.outputs_intact(out, ProbeManifest)
    assert check.intact({}) and hashed == []
    edit_keeping_size_and_mtime(out / "a.bin", b"A", b"B")
    assert not check.intact({}) and hashed == ["a.bin"]
    assert check.problems({}) == ["output edited or replaced: a.bin"]


@pytest.mark.slow
def test_status_and_doit_list_agree_with_doit_after_a_warm_build(
    tmp_path: Path, run_doit: RunDoit, shared_cache: tuple[Path, list[str]]
) -> None:
    """Issue 43, item 7: after a warm bare `doit` (the bundle restored without its files) `status` said verify would
    run ("model missing") while the next `doit` ran nothing; and the subtasks `doit list --all` shows
    (context:tiny-qwen3-v79:graphllm0) were "Invalid parameter" to `doit` and `cache materialize`."""
    cache, _ = shared_cache
    env = {"MNNBUILD_CACHE": str(cache), "MNNBUILD_ARTIFACTS": str(tmp_path / "warm-artifacts")}
    run_doit(env=env)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    status = subprocess.run(
        [sys.executable, "-m", "mnnbuild", "status"],
        cwd=tmp_path, env={**full_env, "HF_HUB_OFFLINE": "1", **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert status.returncode == 0 and status.stdout.strip().endswith("nothing would run"), status.stdout
    assert executed_tasks(run_doit(env=env).stdout) == []

    listed = run_doit("list", "--all", env=env).stdout.split()
    subtasks = [t for t in listed if t.startswith(("context:tiny-qwen3-v79:", "twin:tiny-qwen3-v79:"))]
    assert len(subtasks) == 8, listed
    named = run_doit(*subtasks[:2], env=env)
    assert sorted(summary(named)["from cache"]) == sorted(subtasks[:2]), named.stdout
    materialize = subprocess.run(
        [sys.executable, "-m", "mnnbuild", "cache", "materialize", subtasks[2]],
        cwd=tmp_path, env={**full_env, "HF_HUB_OFFLINE": "1", **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert materialize.returncode == 0 and "Invalid parameter" not in materialize.stdout + materialize.stderr
