"""Trust, second round (issue 27), files and processes: nothing a user mistypes deletes their files, nothing in a
bundle reads outside it, no process outlives the build. Each case is reproduced as the issue reports it, then shown
handled; ``python -m tests.faults.replay`` replays them as a table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mnnbuild.base.errors import OutputError, SettingsError
from mnnbuild.base.fsutil import made_by_mnnbuild, staged_dir
from mnnbuild.pipeline.settings import Settings
from tests.conftest import PROJECT_ROOT, TINY_MODEL_DIR, copy_project, doit
from tests.test_cache import summary


def doit_in(project: Path, cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``doit`` on ``project``'s dodo.py in ``cwd`` with the MNNBUILD_* variables of ``env`` only (cache off unless it
    says otherwise); each caller names the artifact root (``MNNBUILD_ARTIFACTS``, empty for the unset case)."""
    return doit(cwd, *args, env=env, project=project, timeout=600)


def tree_state(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- 1. roots are checked before anything is written ----------------------------------------------------------


@pytest.mark.slow
def test_empty_artifact_root_does_not_replace_the_source_package(tmp_path: Path) -> None:
    """The issue's repro on a copy of the project: ``MNNBUILD_ARTIFACTS=`` made the checkout the artifact root, and
    ``doit partition:mnnbuild`` (a spec named like the package) replaced ``mnnbuild/partition/``."""
    project = copy_project(tmp_path / "clone")
    (project / "models" / "mnnbuild.toml").write_text(
        f'name = "mnnbuild"\nsource = {{ local = "{TINY_MODEL_DIR}" }}\ntargets = ["v79"]\n'
    )
    before = tree_state(project / "mnnbuild")
    proc = doit_in(project, tmp_path, "partition:mnnbuild", env={"MNNBUILD_ARTIFACTS": ""})
    out = proc.stdout + proc.stderr
    assert tree_state(project / "mnnbuild") == before, "the source package was written over"
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert "MNNBUILD_ARTIFACTS is set but empty" in out, out
    assert not (project / ".doit.db").exists() and not (project / "tiny-qwen3").exists()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "MNNBUILD_ARTIFACTS is set but empty"),
        ("  ", "MNNBUILD_ARTIFACTS is set but empty"),
        ("s3://bucket/art", "is a URL; expected a local directory"),
        ("{tmp}/a-file", "is not a directory"),
        (".", "is the project directory"),
        ("mnnbuild", "lies inside the project"),
        ("out", "lies inside the project"),
        ("{project}/..", "holds the project"),
        ("{tmp}/s/specs/sub", "lies inside spec directory"),
        ("{tmp}/s", "holds spec directory"),
    ],
)
def test_artifact_root_values_that_would_write_over_files_are_one_line(
    tmp_path: Path, value: str, expected: str
) -> None:
    project = tmp_path / "proj"
    (project / "models").mkdir(parents=True)
    (tmp_path / "s" / "specs").mkdir(parents=True)
    (tmp_path / "a-file").write_text("x")
    env = {
        "MNNBUILD_ARTIFACTS": value.format(tmp=tmp_path, project=project),
        "MNNBUILD_MODELS_PATH": str(tmp_path / "s" / "specs"),
    }
    with pytest.raises(SettingsError) as info:
        Settings.from_env(project, env)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_artifact_root_and_model_dirs_may_not_nest(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "proj", {"MNNBUILD_ARTIFACTS": str(tmp_path / "art")})
    with pytest.raises(SettingsError, match="lies inside model directory"):
        Settings.from_env(tmp_path / "proj", {"MNNBUILD_ARTIFACTS": str(tmp_path / "m" / "art")}).check_artifact_root(
            [tmp_path / "m"]
        )
    with pytest.raises(SettingsError, match="holds model directory"):
        settings.check_artifact_root([tmp_path / "art" / "m"])
    settings.check_artifact_root([tmp_path / "m"])  # side by side is fine


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("MNNBUILD_MODELS_PATH", "", "MNNBUILD_MODELS_PATH is set but empty"),
        ("MNNBUILD_MODELS_PATH", os.pathsep, "MNNBUILD_MODELS_PATH is set but empty"),
        ("MNNBUILD_MODELS_PATH", "{tmp}/a-file", "is not a directory"),
        ("MNNBUILD_MODELS_PATH", "https://example.com/specs", "holds a URL"),
    ],
)
def test_models_path_values_are_one_line(tmp_path: Path, name: str, value: str, expected: str) -> None:
    (tmp_path / "a-file").write_text("x")
    env = {"MNNBUILD_ARTIFACTS": str(tmp_path / "art"), name: value.format(tmp=tmp_path)}
    with pytest.raises(SettingsError, match=expected):
        Settings.from_env(tmp_path / "proj", env)


@pytest.mark.slow
def test_bad_roots_are_one_line_from_doit_and_the_cli(tmp_path: Path) -> None:
    """doit prints the problem as one line (InvalidDodoFile), and ``python -m mnnbuild conform`` as well (on a copy
    of the project: a regression would write into it)."""
    project = copy_project(tmp_path / "clone")
    for env in ({"MNNBUILD_ARTIFACTS": str(project / "mnnbuild")}, {"MNNBUILD_MODELS_PATH": ""}):
        proc = doit_in(project, tmp_path, "list", env={"MNNBUILD_ARTIFACTS": str(tmp_path / "a"), **env})
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Traceback" not in out, out
        assert [line for line in out.splitlines() if "MNNBUILD_" in line], out
        assert len(out.strip().splitlines()) <= 2, out  # doit's "ERROR: ..." line and at most a header
        cli = subprocess.run(
            [sys.executable, "-m", "mnnbuild", "conform", "tiny-qwen3-v79"],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")},
                 "MNNBUILD_ARTIFACTS": str(tmp_path / "a"), **env},
            capture_output=True, text=True, cwd=project,
        )  # fmt: skip
        assert cli.returncode != 0 and "Traceback" not in cli.stderr, cli.stderr
        assert len(cli.stderr.strip().splitlines()) == 1 and "MNNBUILD_" in cli.stderr, cli.stderr


# -- 1. a stage only ever replaces a directory it made ---------------------------------------------------------


def user_files(root: Path) -> dict[str, bytes]:
    (root / "notes").mkdir(parents=True, exist_ok=True)
    (root / "notes" / "thesis.tex").write_text("years of work")
    (root / "notes" / "partition.manifest").write_text("not ours")
    return tree_state(root)


def test_staged_dir_never_replaces_a_directory_it_did_not_make(tmp_path: Path) -> None:
    before = user_files(tmp_path)
    with pytest.raises(OutputError, match=r"notes: a directory mnnbuild did not make .* left it as it was"):
        with staged_dir(tmp_path / "notes") as tmp:
            (tmp / "x").write_text("output")
    assert tree_state(tmp_path) == before and not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    # a symlink and a file are not ours either; an empty directory or one of our stage dirs is replaced
    (tmp_path / "link").symlink_to(tmp_path / "notes")
    (tmp_path / "file").write_text("x")
    assert not made_by_mnnbuild(tmp_path / "link") and not made_by_mnnbuild(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    for name in ("empty", "built"):
        with staged_dir(tmp_path / name) as tmp:
            (tmp / "io.manifest.json").write_text(json.dumps({"schema_version": "x", "model": "m"}))
    with staged_dir(tmp_path / "built") as tmp:
        (tmp / "new").write_text("again")
    assert (tmp_path / "built" / "new").read_text() == "again"


@pytest.mark.slow
def test_a_stage_stops_at_a_foreign_directory_and_clean_leaves_it(tmp_path: Path) -> None:
    """An artifact root holding other directories (here a folder named like the model's fetch dir): the stage stops
    with one line naming the path, and ``doit clean`` does not remove it."""
    root = tmp_path / "art"
    before = user_files(root / "tiny-qwen3" / "model")
    env = {"MNNBUILD_ARTIFACTS": str(root)}
    proc = doit_in(PROJECT_ROOT, tmp_path, "fetch:tiny-qwen3", env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert f"{root / 'tiny-qwen3' / 'model'}: a directory mnnbuild did not make" in out, out
    proc = doit_in(PROJECT_ROOT, tmp_path, "clean", "fetch:tiny-qwen3", env=env)
    assert "not removed: mnnbuild did not make it" in proc.stderr, proc.stderr
    assert tree_state(root / "tiny-qwen3" / "model") == before


# -- 2. destructive cache commands act only on an mnnbuild cache, on names it writes ---------------------------


def mnnbuild_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "mnnbuild", *args], capture_output=True, text=True, env=full_env,
                          timeout=120)  # fmt: skip


def aged(path: Path, seconds: float = 7200) -> Path:
    old = __import__("time").time() - seconds
    os.utime(path, (old, old))
    return path


def small_cache(tmp_path: Path) -> Path:
    from mnnbuild.pipeline.cache import ArtifactCache

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"payload " * 100)
    ArtifactCache(str(tmp_path / "cache")).store("io", "k", src)
    return tmp_path / "cache"


@pytest.mark.slow
def test_prune_refuses_a_directory_that_is_not_a_cache(tmp_path: Path) -> None:
    """The issue's repro: ``cache prune --url <any dir> --max-size 0`` deleted every path with ``.tmp-`` older than an
    hour (``report.tmp-final.docx``), with no check that the directory is a cache."""
    docs = tmp_path / "Documents"
    (docs / "io").mkdir(parents=True)
    (docs / "report.tmp-final.docx").write_text("the report")
    (docs / "io" / "notes.json").write_text("{}")
    (docs / "blobs").mkdir()
    (docs / "blobs" / "photo.jpg").write_bytes(b"jpg")
    for p in docs.rglob("*"):
        aged(p)
    before = tree_state(docs)
    for args in (("prune", "--max-size", "1"), ("info",)):
        proc = mnnbuild_cli("cache", *args, "--url", str(docs))
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "not an mnnbuild cache" in proc.stderr, proc.stderr
    assert tree_state(docs) == before


@pytest.mark.slow
@pytest.mark.parametrize("size", ["-5G", "0", "1e999", "nan", "-inf", "lots"])
def test_prune_sizes_are_validated(tmp_path: Path, size: str) -> None:
    cache = small_cache(tmp_path)
    before = tree_state(cache)
    proc = mnnbuild_cli("cache", "prune", f"--max-size={size}", "--url", str(cache))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--max-size {size!r}" in lines[0] and "expected a size above 0" in lines[0], lines
    assert tree_state(cache) == before, "a refused size pruned the cache"


def test_prune_removes_only_names_the_cache_writes(tmp_path: Path) -> None:
    """In a real cache, a user's file that merely contains ``.tmp-`` (or sits among the blobs) stays; a stale partial
    write of the cache's own goes."""
    cache = small_cache(tmp_path)
    blob_dir = next((cache / "blobs").iterdir())
    foreign = [cache / "report.tmp-final.docx", blob_dir / "x.tmp-deadbeef", cache / "io" / "keep.tmp-cafebabe"]
    for path in foreign:
        aged(_write(path, b"mine"))
    stale = aged(_write(blob_dir / ("f" * 64 + ".tmp-deadbeef"), b"x" * 50))
    proc = mnnbuild_cli("cache", "prune", "--max-size", "1G", "--url", str(cache))
    assert proc.returncode == 0, proc.stderr
    assert all(p.read_text() == "mine" for p in foreign) and not stale.exists()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.slow
def test_a_cache_without_its_marker_is_recognised_by_its_contents(tmp_path: Path) -> None:
    """Caches made before the marker existed hold only names the cache writes: prune takes them (and marks them);
    one more foreign file and it is not a cache."""
    from mnnbuild.pipeline.cache import MARKER

    cache = small_cache(tmp_path)
    assert (cache / MARKER).is_file(), "a new cache is marked at creation"
    (cache / MARKER).unlink()
    (cache / "code-digests.json").write_text("{}")
    proc = mnnbuild_cli("cache", "prune", "--max-size", "1G", "--url", str(cache))
    assert proc.returncode == 0 and (cache / MARKER).is_file(), proc.stderr
    (cache / MARKER).unlink()
    (cache / "holiday.jpg").write_bytes(b"jpg")
    proc = mnnbuild_cli("cache", "prune", "--max-size", "1G", "--url", str(cache))
    assert proc.returncode != 0 and "holds holiday.jpg" in proc.stderr, proc.stderr
    assert not (cache / MARKER).exists()


@pytest.mark.slow
def test_a_build_never_writes_into_a_directory_that_is_not_a_cache(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "todo.txt").write_text("x")
    proc = doit_in(PROJECT_ROOT, tmp_path, "io:tiny-qwen3",
                   env={"MNNBUILD_ARTIFACTS": str(tmp_path / "art"), "MNNBUILD_CACHE": str(home)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "not an mnnbuild cache: building without it" in proc.stderr, proc.stderr
    assert sorted(p.name for p in home.iterdir()) == ["todo.txt"]


@pytest.mark.slow
def test_with_the_cache_off_the_code_memo_is_kept_in_the_user_cache_dir(tmp_path: Path) -> None:
    """The memo of our sources' digests is keyed by content, so every artifact root can share it: with the cache off
    it goes to the user cache dir, not into the artifact root (where each fresh root parsed every source again)."""
    from mnnbuild.pipeline.layout import CODE_DIGESTS

    art, xdg = tmp_path / "art", tmp_path / "xdg"
    env = {"MNNBUILD_ARTIFACTS": str(art), "MNNBUILD_CACHE": "off", "XDG_CACHE_HOME": str(xdg)}
    assert doit_in(PROJECT_ROOT, tmp_path, "list", env=env).returncode == 0
    memo = xdg / "mnnbuild" / CODE_DIGESTS
    assert json.loads(memo.read_text()), "the memo holds the digests of this doit's stage code"
    assert not (art.exists() and list(art.rglob(CODE_DIGESTS)))


# -- 8. cache messages say what is true -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "MNNBUILD_CACHE is set but empty"),
        ("cache-dir", "MNNBUILD_CACHE='cache-dir' is a relative path"),
        ("nosuchscheme://bucket/x", "MNNBUILD_CACHE='nosuchscheme://bucket/x' is unusable"),
        ("{tmp}/a-file", "is not a directory"),
    ],
)
def test_cache_info_with_an_unusable_cache_says_what_is_wrong(tmp_path: Path, value: str, expected: str) -> None:
    """Not "the artifact cache is off (MNNBUILD_CACHE=off)", which it is not."""
    (tmp_path / "a-file").write_text("x")
    proc = mnnbuild_cli("cache", "info", env={"MNNBUILD_CACHE": value.format(tmp=tmp_path)})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and expected in proc.stderr, proc.stderr
    assert "is off" not in proc.stderr
    # and a build with it: one warning, a normal build without the cache
    build = doit_in(
        PROJECT_ROOT,
        tmp_path,
        "io:tiny-qwen3",
        env={"MNNBUILD_ARTIFACTS": str(tmp_path / "art"), "MNNBUILD_CACHE": value.format(tmp=tmp_path)},
    )
    assert build.returncode == 0, build.stderr
    assert len([line for line in build.stderr.splitlines() if "building without" in line]) == 1, build.stderr


def restore_bad_blob_read_only(tmp_path: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`small_cache` with its blob corrupted, restored on a real read-only mount of it (a private mount namespace);
    the process prints what ``restore`` returned and logs warnings."""
    from tests.test_faults import in_namespace

    cache = small_cache(tmp_path)
    blob = next(p for p in (cache / "blobs").rglob("*") if p.is_file())
    blob.write_bytes(b"corrupt" + blob.read_bytes()[7:])
    code = (
        "import logging, pathlib; logging.basicConfig(level=logging.WARNING);"
        "from mnnbuild.pipeline.cache import ArtifactCache;"
        f"print(ArtifactCache({str(cache)!r}).restore('io', 'k', pathlib.Path({str(tmp_path / 'out')!r})))"
    )
    return cache, in_namespace([sys.executable, "-c", code], readonly=[cache], cwd=PROJECT_ROOT)


def test_a_read_only_cache_does_not_claim_to_discard_a_bad_entry(tmp_path: Path) -> None:
    """A real read-only mount: the bad blob's entry cannot be discarded, and the warning says so."""
    cache, proc = restore_bad_blob_read_only(tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stdout + proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, proc.stderr
    assert "does not match its sha256; entry kept: cannot remove it" in warnings[0], warnings
    assert "Read-only file system" in warnings[0] and "discarded" not in warnings[0]
    assert (cache / "io" / "k.json").is_file()


# -- a built tiny bundle (and verify's twins) shared by the next tests, each leaving it as it found it ----------


def doit_root(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return doit(root.parent, *args, env={"MNNBUILD_ARTIFACTS": str(root)}, check=check, timeout=600)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trust-fs") / "artifacts"
    doit_root(root, "bundle:tiny-qwen3-v79", "twin:tiny-qwen3-v79")
    return root


# -- 4. manifest paths are confined to their stage dir before they are stat'ed or hashed -------------------------


def test_outputs_outside_the_stage_dir_are_never_up_to_date(tmp_path: Path) -> None:
    """A manifest listing ``../../../../<a file outside>`` with that file's true size and hash: not up to date, and
    the file is never opened (the check refuses the path first)."""
    from mnnbuild.base.fsutil import sha256_file
    from mnnbuild.dag.uptodate import files_unchanged, outputs_intact
    from mnnbuild.manifests.bundle import BundleManifest
    from mnnbuild.pipeline.manifest import FileRecord

    secret = tmp_path / "secret.txt"
    secret.write_text("not the stage's")
    out = tmp_path / "a" / "b" / "c" / "bundle"
    out.mkdir(parents=True)
    (out / "link").symlink_to(tmp_path)
    record = {"size": secret.stat().st_size, "sha256": sha256_file(secret)}
    for path in ("../../../../secret.txt", str(secret), "link/secret.txt"):
        manifest = BundleManifest.model_construct(model="m", outputs=[FileRecord(path=path, **record)])
        manifest.schema_version = BundleManifest.schema_hash()
        (out / "bundle.manifest.json").write_text(manifest.model_dump_json())
        assert not outputs_intact(out, BundleManifest).intact(), path
        assert not outputs_intact(out, BundleManifest, links=True).intact(), path
    # verify's check of the bundle files: a link in the bundle to an outside file is not hashed through, and never
    # counts as unchanged (bundle files are copies)
    model = tmp_path / "bundle-model"
    model.mkdir()
    (model / "config_qnn.json").symlink_to(secret)
    check = files_unchanged(model)

    class Task:
        def __init__(self) -> None:
            self.value_savers: list = []

    first = Task()
    assert not check(first, {})
    state = first.value_savers[0]()
    assert state == {f"files_unchanged:{model}": {}}, "the link was hashed through"
    assert not check(Task(), state)


@pytest.mark.slow
def test_a_bundle_manifest_listing_an_outside_file_is_rebuilt(built: Path, tmp_path: Path) -> None:
    """The issue's repro at the doit level: the bundle manifest gains a record ``../../../../<outside file>`` that
    matches that file; the bundle used to stay up to date (its check hashed the outside file)."""
    from mnnbuild.base.fsutil import sha256_file

    bundle = built / "tiny-qwen3" / "v79" / "bundle"
    secret = tmp_path / "hostname"
    secret.write_text("box\n")
    rel = os.path.relpath(secret, bundle)
    path = bundle / "bundle.manifest.json"
    manifest = json.loads(path.read_text())
    manifest["outputs"].append({"path": rel, "size": secret.stat().st_size, "sha256": sha256_file(secret)})
    path.write_text(json.dumps(manifest, indent=2))
    proc = doit_root(built, "bundle:tiny-qwen3-v79")
    assert "bundle:tiny-qwen3-v79" in summary(proc).get("built", []), proc.stdout
    assert rel not in path.read_text()


# -- 6. self-consistent but misplaced outputs are caught ---------------------------------------------------------


def swap(a: Path, b: Path) -> None:
    tmp = a.with_name(a.name + "-swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


@pytest.mark.slow
def test_swapped_twin_dirs_are_rebuilt(built: Path) -> None:
    """``twin/graphllm0`` <-> ``twin/graphllm1``: each matches its own manifest, so both stayed up to date and verify
    failed forever. Now their records name the other plugin's task: both are built again, into the right places."""
    from mnnbuild.manifests.twin import TwinManifest

    twin = built / "tiny-qwen3" / "v79" / "twin"
    before = {d: (twin / d / f"{d}.bin").read_bytes() for d in ("graphllm0", "graphllm1")}
    swap(twin / "graphllm0", twin / "graphllm1")
    proc = doit_root(built, "twin:tiny-qwen3-v79")
    rebuilt = sorted(summary(proc).get("built", []))
    assert rebuilt == ["twin:tiny-qwen3-v79:graphllm0", "twin:tiny-qwen3-v79:graphllm1"], proc.stdout
    for d, data in before.items():
        assert (twin / d / f"{d}.bin").read_bytes() == data
        assert [r.path for r in TwinManifest.read(twin / d).outputs] == [f"{d}.bin"]


@pytest.mark.slow
def test_swapped_context_dirs_are_rebuilt_not_a_traceback(built: Path) -> None:
    """Swapped context dirs made the bundle fail with a FileNotFoundError traceback on every run."""
    context = built / "tiny-qwen3" / "v79" / "context"
    swap(context / "graphllm0", context / "graphllm1")
    proc = doit_root(built, "bundle:tiny-qwen3-v79")
    assert "Traceback" not in proc.stdout + proc.stderr
    rows = summary(proc)
    assert {"context:tiny-qwen3-v79:graphllm0", "context:tiny-qwen3-v79:graphllm1"} <= set(rows.get("built", []))
    assert "bundle:tiny-qwen3-v79" in rows.get("up to date", []), "the same binaries: the bundle is what it was"


# -- 7. finished stages survive a kill -9 of doit with the cache off ----------------------------------------------


@pytest.mark.slow
def test_finished_stages_survive_kill_9_with_the_cache_off(tmp_path: Path) -> None:
    """doit writes its state file at the end of a run; a ``kill -9`` (the OOM killer) lost the record of every
    stage that had finished, and the next run built them all again. The stage dirs' own records (manifest, origin
    with the task key and input hashes) now count: the next run builds only what had not finished."""
    import signal
    import time

    from tests.test_faults import context_temps, start_doit, wait_until

    root = tmp_path / "artifacts"
    proc = start_doit(root, "bundle:tiny-qwen3-v79")
    wait_until("a context stage's temp dir", lambda: context_temps(root), proc, root)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {
        p.parent: (json.loads(p.read_text()), p.parent.stat().st_ino)
        for p in root.rglob("*.origin.json")
        if json.loads(p.read_text()).get("origin") == "built"
    }
    assert {"model", "io", "partition"} <= {d.name for d in finished}, sorted(map(str, finished))
    time.sleep(0.05)
    again = doit_root(root, "bundle:tiny-qwen3-v79")
    rows = summary(again)
    for d, (origin, inode) in finished.items():
        stage = next(p for p in d.glob("*.origin.json")).name.removesuffix(".origin.json")
        assert json.loads((d / f"{stage}.origin.json").read_text())["run"] == origin["run"], f"{d} was built again"
        assert d.stat().st_ino == inode
    assert {"fetch:tiny-qwen3", "io:tiny-qwen3", "partition:tiny-qwen3"} <= set(rows.get("up to date", [])), rows
    assert "bundle:tiny-qwen3-v79" in rows.get("built", []), rows


# -- 5. no process outlives doit --------------------------------------------------------------------------------


def marked_processes(marker: str) -> dict[int, tuple[int, str]]:
    """Live processes (pid -> (parent pid, command line)) whose environment holds ``FAULT_MARKER=<marker>``: every
    descendant of a doit started with it, however it was started (forked, exec'ed, forked by a forkserver)."""
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"FAULT_MARKER={marker}".encode() not in environ.read_bytes().split(b"\0"):
                continue
            fields = (environ.parent / "stat").read_text().rpartition(")")[2].split()
            command = (environ.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] not in "ZX":
            found[int(environ.parent.name)] = (int(fields[1]), command)
    return found


def composing(marker: str) -> bool:
    """Whether a compose process (a child of multiprocessing's forkserver) of that doit runs."""
    procs = marked_processes(marker)
    servers = {pid for pid, (_, cmd) in procs.items() if "multiprocessing.forkserver" in cmd}
    return any(parent in servers for parent, _ in procs.values())


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "sig"), [("0", "SIGKILL"), ("2", "SIGTERM")])  # the two cases
def test_no_process_outlives_doit(tmp_path: Path, workers: str, sig: str) -> None:
    """``kill -9 <doit pid>`` (that pid alone, as the OOM killer does) while a context binary is composed used to
    leave the forkserver, its compose child and the resource tracker running (reparented to pid 1); a SIGTERM of
    ``doit -n 2`` sometimes left three. Whatever the build started dies with it, within seconds."""
    import signal
    import time
    import uuid

    marker = uuid.uuid4().hex
    root = tmp_path / "artifacts"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    env.update(MNNBUILD_ARTIFACTS=str(root), MNNBUILD_CACHE="off", HF_HUB_OFFLINE="1", FAULT_MARKER=marker)
    with open(tmp_path / "doit.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), "-n", workers, "bundle:tiny-qwen3-v79"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not composing(marker):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "doit.log").read_text()
            time.sleep(0.01)
        assert len(marked_processes(marker)) >= 4, "doit (and workers), the tracker, the forkserver, a compose"
        os.kill(proc.pid, getattr(signal, sig))
        proc.wait(timeout=120)
        deadline = time.monotonic() + 10
        while marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = marked_processes(marker)
        assert not left, f"still running 10 s after doit died: {left}"
    finally:
        for pid in marked_processes(marker):  # never leave them to the next test
            os.kill(pid, signal.SIGKILL)


# -- 3. the runtime never follows a link in a bundle, on any open ------------------------------------------------

LINKED_FILES = ["qnn/graphllm0.bin", "qnn/llm.mnn", "llm.mnn.weight", "config_qnn.json", "llm_config.json"]


def bundle_model_copy(built: Path, tmp_path: Path) -> Path:
    import shutil

    bundle = tmp_path / "model" / "tiny-qwen3"
    shutil.copytree(built / "tiny-qwen3" / "v79" / "bundle" / "model" / "tiny-qwen3", bundle)
    return bundle


def link_out(bundle: Path, rel: str, tmp_path: Path) -> Path:
    """Move ``rel`` out of the bundle and leave a symlink to it in its place (the same bytes, read through a link)."""
    outside = tmp_path / "outside" / rel
    outside.parent.mkdir(parents=True, exist_ok=True)
    (bundle / rel).rename(outside)
    (bundle / rel).symlink_to(outside)
    return outside


@pytest.mark.slow
@pytest.mark.parametrize("rel", [*LINKED_FILES, "tokenizer.mtok"])
def test_bundle_files_that_are_symlinks_are_refused(built: Path, tmp_path: Path, rel: str) -> None:
    """The issue's repro: ``qnn/graphllm0.bin``, ``qnn/llm.mnn``, ``llm.mnn.weight``, ``config_qnn.json`` may each
    link anywhere, and the runtime read them (the binary went to QNN's parser). Each is refused, naming the file."""
    from mnnbuild_runtime import Bundle, BundleError, Tokenizer

    bundle = bundle_model_copy(built, tmp_path)
    link_out(bundle, rel, tmp_path)
    read = (lambda: Tokenizer(bundle / "config_qnn.json")) if rel == "tokenizer.mtok" else lambda: Bundle.open(bundle)
    with pytest.raises(BundleError) as info:
        read()
    message = str(info.value)
    assert f"{bundle / rel} is a symlink" in message and "\n" not in message, message


@pytest.mark.slow
def test_a_link_inside_the_bundle_is_refused_too(built: Path, tmp_path: Path) -> None:
    """A bundle's files are copies: a link is refused even when it points at another file of the bundle."""
    from mnnbuild_runtime import Bundle, BundleError

    bundle = bundle_model_copy(built, tmp_path)
    (bundle / "qnn" / "llm.mnn").rename(bundle / "other.mnn")
    (bundle / "qnn" / "llm.mnn").symlink_to("../other.mnn")
    with pytest.raises(BundleError, match=r"qnn/llm.mnn is a symlink \(to \.\./other\.mnn\)"):
        Bundle.open(bundle)


@pytest.mark.slow
def test_files_are_checked_at_every_open_not_only_at_bundle_open(built: Path, tmp_path: Path) -> None:
    """A bundle opened while sound, whose files become links afterwards: the next read of each refuses it (the
    context binary handed to QNN, the weights MNN maps for a segment, the embedding rows)."""
    from mnnbuild_runtime import Bundle, BundleError, Embeddings, HybridModel

    bundle = bundle_model_copy(built, tmp_path)
    opened = Bundle.open(bundle)
    embed = Embeddings(bundle)
    model = HybridModel(opened)
    link_out(bundle, "qnn/graphllm0.bin", tmp_path)
    with pytest.raises(BundleError, match=r"qnn/graphllm0.bin is a symlink"):
        opened.plugin("qnn/graphllm0.bin").read_binary()
    link_out(bundle, "llm.mnn.weight", tmp_path)
    with pytest.raises(BundleError, match=r"llm.mnn.weight is a symlink"):
        model.executor.load_segments()
    with pytest.raises(BundleError, match=r"llm.mnn.weight is a symlink"):
        embed([1, 2, 3])
    model.close()
