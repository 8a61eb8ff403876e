"""Faults and hostile inputs (issue 12): each reproduced here, then shown handled.

Read-only and full file systems are real ones: a read-only bind mount or a small tmpfs, mounted in a
private user + mount namespace (``unshare -rm``), so nothing here needs root or touches the host.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from mnnbuild.base.fsutil import sha256_file
from mnnbuild.dag.reporter import LAST_RUN
from mnnbuild.pipeline.cache import ArtifactCache
from tests.conftest import PROJECT_ROOT, RunDoit, doit, executed_tasks


def in_namespace(
    argv: Sequence[str],
    *,
    tmpfs: dict[Path, str] | None = None,
    readonly: Sequence[Path] = (),
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a private mount namespace with small tmpfs mounts (path -> size) and read-only dirs."""
    steps = [f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(p))}" for p, size in (tmpfs or {}).items()]
    steps += [
        f"mount --bind {shlex.quote(str(p))} {shlex.quote(str(p))} && mount -o remount,bind,ro {shlex.quote(str(p))}"
        for p in readonly
    ]
    steps.append("exec " + shlex.join(argv))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    full_env.update(env or {})
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", " && ".join(steps)],
        capture_output=True, text=True, env=full_env, cwd=cwd, timeout=600,
    )  # fmt: skip


def doit_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), *args]


# -- the artifact cache -------------------------------------------------------------------------


def stored_tree(tmp_path: Path) -> tuple[ArtifactCache, Path]:
    """A local cache holding one entry ``stage/k`` with files ``a.bin`` and ``sub/b.json``."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"payload " * 100)
    (src / "sub" / "b.json").write_text('{"x": 1}')
    cache = ArtifactCache(str(tmp_path / "cache"))
    cache.store("stage", "k", src)
    return cache, tmp_path / "cache" / "stage" / "k.json"


@pytest.mark.parametrize(
    "files",
    [
        pytest.param(lambda out, sha: [{"path": "../../escaped.bin", "size": 800, "sha256": sha}], id="dotdot"),
        pytest.param(
            lambda out, sha: [{"path": str(out.parent / "escaped.bin"), "size": 800, "sha256": sha}], id="absolute"
        ),  # fmt: skip
        pytest.param(
            lambda out, sha: [
                {"path": "d", "size": 0, "sha256": sha, "link": "../../.."},
                {"path": "d/escaped.bin", "size": 800, "sha256": sha},
            ],
            id="through-a-symlink",
        ),
        pytest.param(
            lambda out, sha: [{"path": "l", "size": 0, "sha256": sha, "link": str(out.parent / "escaped.bin")}],
            id="absolute-link",
        ),
        pytest.param(lambda out, sha: [{"path": "a.bin", "size": 800, "sha256": "../../../x"}], id="blob-name"),
    ],
)
def test_cache_entry_cannot_write_outside_its_stage_dir(
    tmp_path: Path, files: Callable[[Path, str], list[dict]], caplog: pytest.LogCaptureFixture
) -> None:
    cache, entry_path = stored_tree(tmp_path)
    entry = json.loads(entry_path.read_text())
    sha = entry["files"][0]["sha256"]
    out = tmp_path / "artifacts" / "model" / "stage"
    entry["files"] = files(out, sha)
    entry_path.write_text(json.dumps(entry))
    with caplog.at_level(logging.WARNING, logger="mnnbuild.pipeline.cache"):
        assert cache.restore("stage", "k", out) is None
    assert not [p for p in tmp_path.rglob("escaped.bin")], "a cache entry wrote outside the stage dir"
    assert not out.exists(), "a rejected entry leaves no stage dir"
    assert not cache.has("stage", "k"), "a hostile entry is discarded"
    assert any("discard" in r.getMessage() or "unreadable" in r.getMessage() for r in caplog.records)


def test_failed_cache_write_leaves_no_partial_blob(tmp_path: Path) -> None:
    """A real full file system (a 64 KB tmpfs) under the cache: the store fails, no temp file stays."""
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(1 << 20))
    code = (
        "import sys; from mnnbuild.pipeline.cache import ArtifactCache;"
        f"c = ArtifactCache({str(cache_dir)!r}); print('moved', c.store('stage', 'k', __import__('pathlib').Path("
        f"{str(src)!r})));"
        "import os; print('left', [f for _, _, fs in os.walk(c.root) for f in fs])"
    )
    proc = in_namespace([sys.executable, "-c", code], tmpfs={cache_dir: "64k"}, cwd=PROJECT_ROOT)
    assert proc.returncode == 0, proc.stderr
    # the cache's marker (written when it was created) stays; no partial blob does
    assert "moved 0" in proc.stdout and "left ['CACHEDIR.TAG']" in proc.stdout, proc.stdout + proc.stderr
    assert "could not store stage" in proc.stderr and "No space left" in proc.stderr


@pytest.mark.slow
def test_stale_partial_writes_are_reported_and_swept(tmp_path: Path) -> None:
    """A writer killed mid-upload leaves ``<blob>.tmp-*``: `cache info` counts it and prune removes it."""
    cache, _ = stored_tree(tmp_path)
    blob_dir = next((tmp_path / "cache" / "blobs").iterdir())
    stale = blob_dir / ("f" * 64 + ".tmp-deadbeef")
    stale.write_bytes(b"x" * 5000)
    old = time.time() - 7200
    os.utime(stale, (old, old))
    fresh = blob_dir / ("e" * 64 + ".tmp-cafebabe")  # a write in progress right now: kept
    fresh.write_bytes(b"y" * 10)
    proc = subprocess.run([sys.executable, "-m", "mnnbuild", "cache", "info", "--url", str(tmp_path / "cache")],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert "2 partial writes" in proc.stdout, proc.stdout
    _, freed = cache.prune(1 << 30)
    assert freed == 5000 and not stale.exists() and fresh.exists()
    assert cache.restore("stage", "k", tmp_path / "out") is not None


@pytest.mark.parametrize(
    "url, why",
    [("nosuchscheme://bucket/x", "unknown URL scheme"), ("{tmp}/a-file", "a cache path that is a file")],
)
def test_unusable_cache_is_a_warning(tmp_path: Path, url: str, why: str, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    src = tmp_path / "src"
    src.mkdir()
    (src / "x.bin").write_bytes(b"1234")
    with caplog.at_level(logging.WARNING, logger="mnnbuild.pipeline.cache"):
        cache = ArtifactCache.from_env({"MNNBUILD_CACHE": url.format(tmp=tmp_path)})
        if cache is not None:
            assert cache.restore("stage", "k", tmp_path / "out") is None
            assert cache.store("stage", "k", src) == 0
            assert not cache.has("stage", "k")
    assert caplog.records, f"{why}: expected a warning"
    assert (tmp_path / "a-file").read_text() == "not a directory"


@pytest.mark.slow
def test_read_only_cache_with_corrupt_blob_degrades_to_a_build(tmp_path: Path, run_doit: RunDoit) -> None:
    """A shared read-only cache (a real read-only mount) whose blob is corrupt: every run still builds."""
    cache_dir = tmp_path / "cache"
    run_doit("io:tiny-qwen3", env={"MNNBUILD_CACHE": str(cache_dir)})
    blob = max((p for p in (cache_dir / "blobs").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    blob.write_bytes(b"corrupt" + blob.read_bytes()[7:])
    env = {"MNNBUILD_CACHE": str(cache_dir), "MNNBUILD_ARTIFACTS": str(tmp_path / "fresh"), "HF_HUB_OFFLINE": "1"}
    for _ in range(2):
        proc = in_namespace(doit_argv("io:tiny-qwen3"), readonly=[cache_dir], env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "does not match its sha256" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
        assert "2 built, 0 up to date" in proc.stdout and "restored" not in proc.stdout, proc.stdout
        subprocess.run(["rm", "-rf", str(tmp_path / "fresh")], check=True)
    assert blob.read_bytes().startswith(b"corrupt"), "the read-only cache was not modified"


# -- names that reach shell scripts --------------------------------------------------------------

FAKE_ADB = """#!/usr/bin/env python3
# A fake adb: records its argv; 'shell' runs the command line with sh (as the device would), 'push' copies.
import json, os, shutil, subprocess, sys
with open(os.environ["FAKE_ADB_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "shell":
    sys.exit(subprocess.run(["sh", "-c", " ".join(sys.argv[2:])]).returncode)
if sys.argv[1] == "push":
    src, dst = sys.argv[2], sys.argv[3]
    if dst.endswith("/"):
        dst = os.path.join(dst, os.path.basename(src.rstrip("/")))
    (shutil.copytree(src, dst, dirs_exist_ok=True) if os.path.isdir(src) else shutil.copyfile(src, dst))
"""
FAKE_LLM_DEMO = """#!/bin/sh
# the device's llm_demo: records the arguments it was started with
printf '%s\\n' "$@" > "$FAKE_DEMO_ARGS"
"""


QNN_BUILD = "v2.51.0.260929181845"
"""A QNN build id as onnxruntime-qnn's libraries report it (the bundle manifest's ``qnn_build``)."""
V79_LIBS = ("aarch64-android/libQnnHtp.so", "aarch64-android/libQnnHtpV79Stub.so",
            "hexagon-v79/unsigned/libQnnHtpV79Skel.so", "aarch64-android/libQnnSystem.so")  # fmt: skip


def fake_sdk(root: Path, version: str | None, libs: tuple[str, ...] = V79_LIBS) -> Path:
    """A QAIRT SDK tree as push.sh reads it: ``sdk.yaml`` (its version) and ``lib/<arch dir>/<library>``."""
    for lib in libs:
        (root / "lib" / lib).parent.mkdir(parents=True, exist_ok=True)
        (root / "lib" / lib).write_text(lib)
    if version is not None:
        (root / "sdk.yaml").write_text(f"name: qairt\nversion: {version}\n")
    return root


V75_LIBS = tuple(lib.replace("79", "75") for lib in V79_LIBS)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("version", "libs", "expected"),
    [
        ("2.51.0.260929", V79_LIBS, None),  # the release that built the binaries
        ('"2.52.1.251120"', V79_LIBS, None),  # newer (a quoted YAML string)
        ("3.0.0", V79_LIBS, None),
        ("2.36.1.250708", V79_LIBS, "is QAIRT 2.36.1, older than the QNN 2.51.0 that built these context binaries"),
        ("2.51.0.1", V75_LIBS, "has no lib/aarch64-android/libQnnHtpV79Stub.so, which a SM8750 (HTP v79) phone"),
        (None, V79_LIBS, "no QAIRT version in"),
        ("$(touch pwned)", V79_LIBS, "no QAIRT version in"),
    ],
)
def test_push_checks_the_sdk_before_pushing(
    tmp_path: Path, version: str | None, libs: tuple[str, ...], expected: str | None
) -> None:
    """push.sh against a fake SDK tree and the fake adb: an SDK older than the QNN that built the context binaries,
    one without the target's Stub/Skel, or one whose sdk.yaml gives no version is one line on stderr saying what
    is needed, and nothing reaches adb; a matching or newer SDK pushes."""
    from mnnbuild.model.targets import soc_by_name
    from mnnbuild.stages.bundle import device_scripts

    bundle = tmp_path / "bundle"
    (bundle / "model" / "m" / "qnn").mkdir(parents=True)
    for rel in ("config_qnn.json", "prompt.txt", "qnn/graphllm0.bin"):
        (bundle / "model" / "m" / rel).write_text(rel)
    (bundle / "push.sh").write_text(device_scripts("m", soc_by_name("SM8750"), "tokenizer.txt", QNN_BUILD)["push.sh"])
    tools, mnn = tmp_path / "bin", tmp_path / "mnn-build"
    tools.mkdir()
    mnn.mkdir()
    (tools / "adb").write_text(FAKE_ADB)
    (tools / "adb").chmod(0o755)
    (mnn / "llm_demo").write_text(FAKE_LLM_DEMO)
    (mnn / "libMNN.so").write_text("")
    sdk = fake_sdk(tmp_path / "sdk", version, libs)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", "FAKE_ADB_LOG": str(tmp_path / "adb.log")}
    env.update({"QNN_SDK_ROOT": str(sdk), "MNN_BUILD_DIR": str(mnn), "PHONE_DIR": str(tmp_path / "device")})
    proc = subprocess.run(["bash", str(bundle / "push.sh")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert not list(tmp_path.rglob("pwned")), "the SDK's version string was executed"
    if expected is None:
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "device" / "libQnnHtpV79Skel.so").exists()
        return
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"push.sh: QNN_SDK_ROOT={sdk}") and expected in line, line
    if "older" in expected or "version" in expected:
        assert line.endswith("use QAIRT 2.51.0 or newer") or "need QAIRT 2.51.0 or newer" in line, line
    assert not (tmp_path / "adb.log").exists(), "something was pushed before the SDK was checked"


@pytest.mark.slow
def test_hostile_names_in_device_scripts_never_execute(tmp_path: Path) -> None:
    """A model folder named ``m$(touch pwned)`` and a PHONE_DIR full of shell syntax: the scripts run
    against a fake adb (whose 'device shell' really is a shell) and nothing but the intended commands run."""
    from mnnbuild.model.targets import soc_by_name
    from mnnbuild.stages.bundle import device_scripts

    name = "m$(touch pwned)`touch pwned2`;touch pwned3 'q"
    bundle = tmp_path / "bundle"
    (bundle / "model" / name / "qnn").mkdir(parents=True)
    for rel in ("config_qnn.json", "llm.mnn.weight", "prompt.txt", "qnn/graphllm0.bin"):
        (bundle / "model" / name / rel).write_text(rel)
    for script, text in device_scripts(name, soc_by_name("SM8750"), "tokenizer.txt", QNN_BUILD).items():
        (bundle / script).write_text(text)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "adb").write_text(FAKE_ADB)
    (tools / "adb").chmod(0o755)
    sdk, mnn = fake_sdk(tmp_path / "sdk", "2.51.0.260929"), tmp_path / "mnn-build"
    mnn.mkdir()
    (mnn / "llm_demo").write_text(FAKE_LLM_DEMO)
    (mnn / "libMNN.so").write_text("")
    phone = tmp_path / "device" / "data $(touch pwned4) `touch pwned5`;'x"
    work = tmp_path / "cwd"
    work.mkdir()
    env = {
        **os.environ,
        "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
        "FAKE_ADB_LOG": str(tmp_path / "adb.log"),
        "FAKE_DEMO_ARGS": str(tmp_path / "demo.args"),
        "QNN_SDK_ROOT": str(sdk),
        "MNN_BUILD_DIR": str(mnn),
        "PHONE_DIR": str(phone),
    }
    for script in ("push.sh", "run.sh"):
        proc = subprocess.run(["bash", str(bundle / script)], cwd=work, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{script}: {proc.stdout}{proc.stderr}"
    assert not [p for p in tmp_path.rglob("pwned*")], "a name from the bundle was executed by a shell"
    calls = [json.loads(line) for line in (tmp_path / "adb.log").read_text().splitlines()]
    assert all(call[0] in ("shell", "push") for call in calls) and len(calls) > 8
    # everything arrived under the exact (hostile) names, and llm_demo got exactly two arguments
    assert (phone / "model" / name / "qnn" / "graphllm0.bin").read_text() == "qnn/graphllm0.bin"
    assert (phone / "llm_demo").exists() and (phone / "prompt.txt").read_text() == "prompt.txt"
    args = (tmp_path / "demo.args").read_text().splitlines()
    assert args == [f"{phone}/model/{name}/config_qnn.json", f"{phone}/prompt.txt"]


def write_spec(tmp_path: Path, body: str, local: str = "model") -> Path:
    (tmp_path / local).mkdir(exist_ok=True)
    path = tmp_path / "m.toml"
    path.write_text(f'name = "m"\nsource = {{ local = {json.dumps(local)} }}\n{body}\n')
    return path


@pytest.mark.parametrize(
    ("local", "body", "field", "expected"),
    [
        ("m$(touch pwned)", 'targets = ["v79"]', "source.local", "may only hold letters, digits"),
        ("model", 'targets = ["v79"]\nsocs = { v75 = "SM8650" }', "socs.v75", "v75 is not in targets ['v79']"),
        ("model", 'targets = ["v79"]\nsocs = { v79 = "SM8650" }', "socs.v79", "SoC SM8650 is v75, not v79"),
    ],
)
def test_spec_gaps_are_one_line_naming_the_field(
    tmp_path: Path, local: str, body: str, field: str, expected: str
) -> None:
    from mnnbuild.base.errors import SpecError
    from mnnbuild.model.spec import load_spec

    path = write_spec(tmp_path, body, local)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}: field {field!r}: ") and expected in message
    assert "\n" not in message and "spec_path" not in message and "'targets':" not in message, "no spec dump"


def test_non_utf8_spec_is_one_line(tmp_path: Path) -> None:
    from mnnbuild.base.errors import SpecError
    from mnnbuild.model.spec import load_spec

    path = tmp_path / "m.toml"
    path.write_bytes(b'name = "m\xff"\n')
    with pytest.raises(SpecError, match=r"m\.toml: not UTF-8 text \(byte 9"):
        load_spec(path)


# -- the bundle and reproducibility (two real builds) -------------------------------------------


def run_in_root(root: Path, *doit_args: str) -> subprocess.CompletedProcess[str]:
    """`doit <doit_args>` into the artifact root ``root`` (run in its parent), cache off; it must succeed."""
    return doit(root.parent, *doit_args, env={"MNNBUILD_ARTIFACTS": str(root)}, check=True, timeout=600)


def build_bundle(root: Path, *doit_args: str) -> Path:
    """`doit bundle:tiny-qwen3-v79 twin:tiny-qwen3-v79` (the bundle and verify's twins) into the artifact root
    ``root``, cache off."""
    run_in_root(root, *doit_args, "bundle:tiny-qwen3-v79", "twin:tiny-qwen3-v79")
    return root


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("faults") / "artifacts")


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (links followed), except what records how it was made."""
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".origin.json") and not p.name.startswith(".doit")
    }


@pytest.mark.slow
def test_two_cold_cache_off_builds_are_byte_identical(built: Path, tmp_path: Path) -> None:
    """Context binaries and their unshared twins included: their bytes no longer depend on what the process built
    before (the second build runs two workers, so each process builds other contexts in another order)."""
    other = build_bundle(tmp_path / "artifacts", "-n", "2")
    first, second = tree_hashes(built), tree_hashes(other)
    assert any(p.endswith("/qnn/graphllm3.bin") for p in first)
    assert any(p.endswith("/twin/graphllm3/graphllm3.bin") for p in first), "verify's twins are outputs too"
    differing = sorted(p for p in first.keys() | second.keys() if first.get(p) != second.get(p))
    assert not differing, f"files that differ between two builds of the same inputs: {differing}"


@pytest.mark.slow
def test_context_bytes_do_not_depend_on_build_order(built: Path, tmp_path: Path) -> None:
    """One process builds plugin 0, then plugin 1, then plugin 0 again, shipped binaries and twins interleaved:
    both plugin-0 binaries of each kind are equal, and equal to what doit built."""
    from mnnbuild.manifests.partition import read_merge
    from mnnbuild.model.targets import soc_by_name
    from mnnbuild.stages.context import ContextInputs, ContextParams, build_context
    from mnnbuild.stages.twin import TwinInputs, TwinParams, build_twin

    model = built / "tiny-qwen3"
    merge = read_merge(model / "partition")
    soc = soc_by_name("SM8750")

    def build(binary: str, out: Path) -> tuple[bytes, bytes]:
        fields = {"model": "tiny-qwen3", "model_dir": model / "model", "partition_dir": model / "partition",
                  "binary": binary, "graphs": merge[binary]}  # fmt: skip
        build_context(ContextInputs(**fields), ContextParams(soc=soc), out / "context")
        build_twin(TwinInputs(**fields), TwinParams(soc=soc), out / "twin")
        return (out / "context" / binary).read_bytes(), (out / "twin" / Path(binary).name).read_bytes()

    first = build("qnn/graphllm0.bin", tmp_path / "a")
    build("qnn/graphllm1.bin", tmp_path / "b")
    assert build("qnn/graphllm0.bin", tmp_path / "c") == first
    assert first == (
        (model / "v79" / "context" / "graphllm0" / "qnn" / "graphllm0.bin").read_bytes(),
        (model / "v79" / "twin" / "graphllm0" / "graphllm0.bin").read_bytes(),
    )


@pytest.mark.slow
def test_qnn_numbers_tensors_per_process(built: Path) -> None:
    """The evidence behind the fresh process per binary: composed twice in one process, the same graphs give
    different bytes (QNN serializes tensor ids taken from a process-wide counter)."""
    from mnnbuild.lowering.graph import compose_context
    from mnnbuild.plugin.lowered import PluginGraphs
    from mnnbuild.qnn import HtpTarget, QnnLibrary

    lib = QnnLibrary()
    model = built / "tiny-qwen3"
    graphs = PluginGraphs(
        model / "model" / "llm.mnn",
        model / "model" / "llm.mnn.weight",
        model / "partition",
        ("qnn/graphllm0", "qnn/graphllm1_0"),
    )()
    one = compose_context(lib, HtpTarget(69, 79), graphs, weight_sharing=True)
    two = compose_context(lib, HtpTarget(69, 79), graphs, weight_sharing=True)
    assert len(one) == len(two) and one != two


@pytest.mark.slow
def test_editing_a_bundle_file_leaves_the_source_untouched(built: Path, tiny_model_dir: Path) -> None:
    bundle = built / "tiny-qwen3" / "v79" / "bundle" / "model" / "tiny-qwen3"
    sources = {
        "llm_config.json": tiny_model_dir / "llm_config.json",
        "llm.mnn.weight": tiny_model_dir / "llm.mnn.weight",
        "qnn/graphllm0.bin": built / "tiny-qwen3" / "v79" / "context" / "graphllm0" / "qnn" / "graphllm0.bin",
        "qnn/llm.mnn": built / "tiny-qwen3" / "partition" / "qnn" / "llm.mnn",
    }
    before = {rel: src.read_bytes() for rel, src in sources.items()}
    for rel in sources:
        shipped = bundle / rel
        assert not shipped.is_symlink() and shipped.stat().st_nlink == 1, f"{rel} is a link"
        with open(shipped, "r+b") as f:  # in place, as an editor that keeps the inode would
            f.write(b"tampered")
    assert {rel: src.read_bytes() for rel, src in sources.items()} == before


# -- interruptions: kill -9, SIGTERM, a killed parent of `doit -n 2` -------------------------------

CONTEXT_TEMP = ".graph"  # a context stage's temp dir: <arch>/context/.graphllm<k>.tmp-...


def start_doit(root: Path, *args: str) -> subprocess.Popen[str]:
    """`doit <args>` into the artifact root ``root`` (cache off), in a session of its own (a process group).

    Its output goes to ``doit.log`` beside ``root`` (a pipe would stay open as long as any worker lives)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")},
           "MNNBUILD_ARTIFACTS": str(root), "MNNBUILD_CACHE": "off", "HF_HUB_OFFLINE": "1"}  # fmt: skip
    with open(root.parent / "doit.log", "w") as log:
        return subprocess.Popen(doit_argv(*args), env=env, cwd=root.parent, stdout=log, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)  # fmt: skip


def doit_log(root: Path) -> str:
    return (root.parent / "doit.log").read_text()


def temps_under(root: Path) -> list[str]:
    """Every temp file or dir a writer left under ``root`` (staged dirs, atomic writes, replaced dirs)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if ".tmp-" in p.name or ".old-" in p.name)


def wait_until(
    what: str, ready: Callable[[], object], proc: subprocess.Popen[str], root: Path, timeout: float = 300
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.wait()
            pytest.fail(f"never saw {what} (doit exited {proc.returncode}):\n{doit_log(root)}")
        time.sleep(0.005)


def context_temps(root: Path) -> list[Path]:
    context = root / "tiny-qwen3" / "v79" / "context"
    try:
        return [p for p in context.iterdir() if p.name.startswith(CONTEXT_TEMP) and ".tmp-" in p.name]
    except FileNotFoundError:
        return []


def test_only_temps_of_gone_processes_are_removed(tmp_path: Path) -> None:
    """A temp is removed only when its writer is known to be gone: not one of this process, of a running one, or of
    another machine/container; yes for a process that exited and for a reused pid (another start time)."""
    from mnnbuild.base.fsutil import process_start, remove_stale_temps, temp_path

    out = tmp_path / "stage"
    mine = temp_path(out)
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    try:
        started = process_start(runner.pid)
        assert started is not None
        pid, start, scope, rand = mine.name.split(".tmp-")[1].split("-")
        name = f".stage.tmp-{{}}-{{}}-{scope}-{rand}"
        kept = {
            "mine": mine,
            "running": tmp_path / name.format(runner.pid, started[0]),
            "elsewhere": tmp_path / f".stage.tmp-{runner.pid + 1}-{start}-{'0' * 8}-{rand}",
            "other output": tmp_path / f".stage2.tmp-{exited.pid}-{start}-{scope}-{rand}",
        }
        gone = {
            "exited": tmp_path / name.format(exited.pid, start),
            "reused pid": tmp_path / name.format(runner.pid, int(started[0]) + 1),
            "replaced dir": tmp_path / name.format(exited.pid, start).replace(".tmp-", ".old-"),
        }
        for path in [*kept.values(), *gone.values()]:
            path.mkdir()
            (path / "half").write_text("x")
        assert sorted(remove_stale_temps(out)) == sorted(gone.values())
        assert all(p.exists() for p in kept.values()) and not any(p.exists() for p in gone.values())
    finally:
        runner.kill()
        runner.wait()


@pytest.mark.slow
def test_kill_9_mid_stage_then_a_clean_identical_rebuild(tmp_path: Path) -> None:
    """kill -9 (no handler runs) while a context binary is being built: its temp dir stays; the next run removes
    it, finishes, and gives the same bytes as a build that was never interrupted."""
    import signal

    (tmp_path / "clean").mkdir()
    clean = build_bundle(tmp_path / "clean" / "artifacts")  # not `built`: other tests edit its bundle
    root = tmp_path / "artifacts"
    proc = start_doit(root, "bundle:tiny-qwen3-v79")
    wait_until("a context stage's temp dir", lambda: context_temps(root), proc, root)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert context_temps(root), "the kill left the stage's temp dir behind (the fault this test is about)"
    build_bundle(root)
    assert temps_under(root) == [], "a rerun left stale temps of the killed run"
    assert tree_hashes(root) == tree_hashes(clean)


def finished_stages(root: Path) -> set[str]:
    """Stage dirs holding a manifest, by path under ``root``."""
    return {p.parent.relative_to(root).as_posix() for p in root.rglob("*.manifest.json")}


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_sigterm_cleans_up_like_ctrl_c(tmp_path: Path, sig: str) -> None:
    """A CI cancel (SIGTERM to doit) or a Ctrl-C (SIGINT to its process group) mid-stage: temp dir removed, no half
    artifact, a non-zero exit, one line saying so (no traceback), and the stages that had finished are not built
    again by the next run."""
    import signal

    root = tmp_path / "artifacts"
    root.mkdir()
    old_record = {"built": [f"context:tiny-qwen3-v79:graphllm{k}" for k in range(4)], "interrupted": None}
    (root / LAST_RUN).write_text(json.dumps(old_record))  # a previous run's, which said they were built
    proc = start_doit(root, "bundle:tiny-qwen3-v79")
    wait_until("a context stage's temp dir", lambda: context_temps(root), proc, root)
    interrupted = context_temps(root)[0].name.split(".")[1]  # graphllm<k>
    if sig == "SIGTERM":
        os.kill(proc.pid, signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) != 0, doit_log(root)
    log = doit_log(root)
    said = [line for line in log.splitlines() if not line.startswith((".  ", "-- "))]
    how = "stopped by SIGTERM" if sig == "SIGTERM" else "stopped by Ctrl-C"
    assert len(said) == 1 and said[0].startswith(how) and "resume" in said[0], log
    # issue 43, item 8: the record for scripts is written on this ending too, and says so
    record = json.loads((root / LAST_RUN).read_text())
    assert record["interrupted"] == how and f"context:tiny-qwen3-v79:{interrupted}" in record["running"], record
    assert f"context:tiny-qwen3-v79:{interrupted}" not in record["built"] and "fetch:tiny-qwen3" in record["built"]
    assert temps_under(root) == [], "SIGTERM left temps behind"
    done = finished_stages(root)
    assert f"tiny-qwen3/v79/context/{interrupted}" not in done and "tiny-qwen3/partition" in done
    assert not (root / "tiny-qwen3" / "v79" / "context" / interrupted).exists(), "a half artifact"
    rebuilt = executed_tasks(run_in_root(root, "bundle:tiny-qwen3-v79").stdout)
    assert f"context:tiny-qwen3-v79:{interrupted}" in rebuilt
    for task in ("fetch:tiny-qwen3", "io:tiny-qwen3", "partition:tiny-qwen3"):
        assert task not in rebuilt, f"{task} had finished before SIGTERM but was built again: {rebuilt}"


def group_members(pgid: int) -> dict[int, str]:
    """Processes (pid -> state letter) of process group ``pgid`` that are still alive (zombies are dead)."""
    members = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            members[int(stat.parent.name)] = fields[0]
    return members


@pytest.mark.slow
def test_workers_of_doit_n_die_with_their_parent(tmp_path: Path) -> None:
    """kill -9 the parent of `doit -n 2` while its workers build context binaries in parallel: within seconds no
    process of that run is left (a worker whose parent is gone used to wait for its next task forever)."""
    import signal

    root = tmp_path / "artifacts"
    proc = start_doit(root, "-n", "2", "bundle:tiny-qwen3-v79")
    wait_until("two context stages at once", lambda: len(context_temps(root)) >= 2, proc, root)
    assert len(group_members(proc.pid)) >= 3, "doit and its two workers"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = group_members(proc.pid)
    for pid in left:  # never leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the killed doit still running 30 s later: {left}"


def damage_state(path: Path, damage: str) -> None:
    import sqlite3

    if damage == "garbage":
        path.write_bytes(os.urandom(5000))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2] + bytes(100))
    else:  # a sound sqlite file whose task state is not JSON
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE doit SET task_data = '{cut off' WHERE task_id = 'io:tiny-qwen3'")
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["garbage", "truncated", "bad-row"])
def test_corrupt_doit_state_is_set_aside_with_one_warning(tmp_path: Path, run_doit: RunDoit, damage: str) -> None:
    state = tmp_path / "artifacts" / ".doit.db"
    run_doit("io:tiny-qwen3")
    damage_state(state, damage)
    damaged = state.read_bytes()
    proc = run_doit("io:tiny-qwen3")
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    warnings = [line for line in out.splitlines() if ".doit.db" in line]
    assert len(warnings) == 1 and warnings[0].startswith("W ") and "corrupt" in warnings[0], out
    aside = [p for p in state.parent.iterdir() if p.name.startswith(".doit.db.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == damaged and str(aside[0]) in warnings[0]
    # the new state is sound: the next run finds everything up to date, without a warning
    again = run_doit("io:tiny-qwen3")
    assert "corrupt" not in again.stderr and "io:tiny-qwen3" not in executed_tasks(again.stdout)


# -- doit clean, by every name doit list shows ------------------------------------------------------


def task_dirs(root: Path) -> dict[str, Path]:
    """The tasks whose outputs are under ``root`` and their directories, by the stage manifests there
    (``<model>/<stage dir>/``, ``<model>/<arch>/<stage>/``, ``<model>/<arch>/{context,twin}/<graph>/``)."""
    tasks = {}
    for manifest in root.rglob("*.manifest.json"):
        parts, stage = manifest.relative_to(root).parts, manifest.name.removesuffix(".manifest.json")
        if len(parts) == 3:
            tasks[f"{stage}:{parts[0]}"] = manifest.parent
        elif len(parts) == 4:
            tasks[f"{stage}:{parts[0]}-{parts[1]}"] = manifest.parent
        else:
            tasks[f"{stage}:{parts[0]}-{parts[1]}:{parts[3]}"] = manifest.parent
    return tasks


def built_tasks(root: Path) -> set[str]:
    return set(task_dirs(root))


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare doit's artifact root: the whole chain of the tiny model, verify and report included. Tests using it
    leave it as they found it."""
    root = tmp_path_factory.mktemp("verified") / "artifacts"
    run_in_root(root)
    return root


@pytest.mark.slow
def test_doit_clean_works_for_every_listed_task(verified: Path) -> None:
    """`doit clean <name>` for every name `doit list --all` prints (context subtasks and the tasks created after
    the partition included): it succeeds, removes exactly that task's outputs (a group's: its members'), and the
    next run builds exactly those again (once per set of removed outputs)."""
    root = verified
    everything = built_tasks(root)
    names = run_in_root(root, "list", "--all", "--quiet").stdout.split()
    assert {
        "context:tiny-qwen3-v79:graphllm0",
        "twin:tiny-qwen3-v79:graphllm0",
        "twin",
        "bundle:tiny-qwen3-v79",
    } <= set(names)
    assert "report:tiny-qwen3-v79" in names
    assert everything <= set(names), "every task that built something is listed"
    # the names of the other models' tasks own no output in this root: cleaned in one run, which must succeed and
    # remove nothing (were one of them to remove a file, the union would not be empty)
    idle = [n for n in names if ":" in n and not any(t == n or t.startswith(f"{n}:") for t in everything)]
    assert idle, names
    proc = run_in_root(root, "clean", *idle)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert built_tasks(root) == everything, f"clean {' '.join(idle)} removed outputs"
    # a group and its one member (``context``, ``context:tiny-qwen3-v79``) remove the same outputs: the rebuild
    # from that state is checked once; after the other, the removed stage dirs are put back as they last were
    rebuilt_from: set[frozenset[str]] = set()
    dirs = task_dirs(root)
    kept = Path(tempfile.mkdtemp(dir=root.parent))

    def keep(tasks: set[str]) -> None:
        for task in tasks:
            shutil.rmtree(kept / task, ignore_errors=True)
            shutil.copytree(dirs[task], kept / task)

    keep(everything)
    for name in (n for n in names if n not in idle):
        proc = run_in_root(root, "clean", name)
        assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
        removed = everything - built_tasks(root)
        assert removed == {t for t in everything if t == name or t.startswith(f"{name}:")}, name
        if not removed:
            continue
        if removed in rebuilt_from:
            for task in removed:
                shutil.copytree(kept / task, dirs[task])
            assert built_tasks(root) == everything
            continue
        rebuilt_from.add(frozenset(removed))
        rebuilt = set(executed_tasks(run_in_root(root).stdout))
        # verify's report holds timings, so a verify run always gives its page a new input
        follows = {t.replace("verify:", "report:") for t in removed if t.startswith("verify:")}
        assert rebuilt == removed | follows, f"clean {name}: rebuilt {sorted(rebuilt)}"
        assert built_tasks(root) == everything
        keep(rebuilt)
    shutil.rmtree(kept)
    # the put-back outputs are what doit's state expects: a run finds nothing to do
    assert executed_tasks(run_in_root(root).stdout) == []


@pytest.mark.slow
def test_deleted_or_edited_outputs_are_rebuilt(verified: Path) -> None:
    """A context binary deleted and push.sh edited after the build: the next run builds exactly those two tasks
    again (and nothing after them: the rebuilt files are the same bytes)."""
    root = verified / "tiny-qwen3" / "v79"
    binary, script = root / "context" / "graphllm0" / "qnn" / "graphllm0.bin", root / "bundle" / "push.sh"
    before = {p: p.read_bytes() for p in (binary, script)}
    binary.unlink()
    script.write_text(before[script].decode() + "echo edited\n")
    rebuilt = executed_tasks(run_in_root(verified).stdout)
    assert sorted(rebuilt) == ["bundle:tiny-qwen3-v79", "context:tiny-qwen3-v79:graphllm0"], rebuilt
    assert {p: p.read_bytes() for p in before} == before


# -- bad model files and file systems: one line naming the file, never a traceback ---------------


def hostile_model(tmp_path: Path, tiny_model_dir: Path, damage: str) -> dict[str, str]:
    """A copy of the tiny model damaged as ``damage`` says, with its spec; returns doit's env."""
    import shutil

    model = tmp_path / "bad"
    shutil.copytree(tiny_model_dir, model)
    if damage == "truncated-llm.mnn":
        (model / "llm.mnn").write_bytes((model / "llm.mnn").read_bytes()[:3000])
    elif damage == "random-llm.mnn":
        (model / "llm.mnn").write_bytes(os.urandom((model / "llm.mnn").stat().st_size))
    elif damage == "short-weight":
        weight = model / "llm.mnn.weight"
        weight.write_bytes(weight.read_bytes()[: weight.stat().st_size // 2])
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "bad.toml").write_text(f'name = "bad"\nsource = {{ local = "{model}" }}\ntargets = ["v79"]\n')
    return {"MNNBUILD_MODELS_PATH": str(specs)}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("truncated-llm.mnn", r"bad/llm\.mnn: truncated or not an MNN model"),
        ("random-llm.mnn", r"bad/llm\.mnn: not an MNN model"),
        ("short-weight", r"bad/llm\.mnn\.weight: op '.*' needs bytes \[\d+, \d+\) but the weight file has \d+ bytes"),
    ],
)
def test_broken_model_files_are_one_line(
    tmp_path: Path, run_doit: RunDoit, tiny_model_dir: Path, damage: str, expected: str
) -> None:
    import re

    env = hostile_model(tmp_path, tiny_model_dir, damage)
    proc = run_doit("io:bad", env=env, check=False)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("ModelDirError: ")]
    assert len(lines) == 1 and re.search(expected, lines[0]), proc.stdout + proc.stderr


@pytest.mark.slow
def test_read_only_artifact_root_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    env = {"MNNBUILD_ARTIFACTS": str(root), "MNNBUILD_CACHE": "off", "HF_HUB_OFFLINE": "1"}
    proc = in_namespace(doit_argv("fetch:tiny-qwen3"), readonly=[root], env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert f"{root}" in out and "Read-only file system" in out, out


@pytest.mark.slow
def test_full_disk_is_one_line_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    """A real full file system: the artifact root is a 2 MB tmpfs, io's outputs do not fit."""
    root = tmp_path / "artifacts"
    root.mkdir()
    env = {"MNNBUILD_ARTIFACTS": str(root), "MNNBUILD_CACHE": "off", "HF_HUB_OFFLINE": "1"}
    code = (
        "import subprocess, sys, os;"
        f"p = subprocess.run({doit_argv('modellib:tiny-qwen3')!r}, capture_output=True, text=True);"
        "sys.stdout.write(p.stdout + p.stderr);"
        f"print('LEFT', sorted(n for _, ds, fs in os.walk({str(root)!r}) for n in ds + fs if '.tmp-' in n));"
        "sys.exit(p.returncode)"
    )
    proc = in_namespace([sys.executable, "-c", code], tmpfs={root: "2m"}, env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert "No space left on device" in out and str(root) in out, out
    assert "LEFT []" in out, "a stage that ran out of space left its temp dir behind"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("chunk", "verify", "expected"),
    [
        # 'hello' is 3 tokens for the tiny tokenizer: chunk_size 3 leaves generation no room
        (3, "", "spec field 'chunk_size' is 3, but verify's prompt 'hello' is 3 tokens"),
        # the spec's own prompt is the one that must fit (here 'hello' would)
        (
            8,
            'verify = { prompt = "the model runs the attention layers with a key value cache" }\n',
            "spec field 'chunk_size' is 8, but verify's prompt 'the model runs the attention layers",
        ),
    ],
)
def test_chunk_too_small_for_verify_prompt_is_refused_up_front(
    tmp_path: Path, run_doit: RunDoit, tiny_model_dir: Path, chunk: int, verify: str, expected: str
) -> None:
    """A prompt that leaves generation no room in the longest prefill length is refused by io, before the build."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "small.toml").write_text(
        f'name = "small"\nsource = {{ local = "{tiny_model_dir}" }}\ntargets = ["v79"]\nchunk_size = {chunk}\n' + verify
    )
    proc = run_doit("io:small", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    assert f"small: {expected}" in out, out
    assert "expected chunk_size >= " in out
    assert not (tmp_path / "artifacts" / "small" / "io").exists()


def test_bundle_manifest_paths_stay_in_the_bundle(tmp_path: Path) -> None:
    """verify's integrity check reads only inside the bundle, whatever its manifest lists."""
    from mnnbuild.pipeline.manifest import FileRecord
    from mnnbuild.verify.checks import check_integrity

    secret = tmp_path / "secret.txt"
    secret.write_text("not the bundle's")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "link").symlink_to(tmp_path)
    records = [
        FileRecord(path="../secret.txt", size=secret.stat().st_size, sha256=sha256_file(secret)),
        FileRecord(path=str(secret), size=secret.stat().st_size, sha256=sha256_file(secret)),
        FileRecord(path="link/secret.txt", size=secret.stat().st_size, sha256=sha256_file(secret)),
    ]
    check = check_integrity(bundle, records)
    assert not check.passed and len(check.problems) == 3
    assert all("must be relative" in p or "leads outside" in p for p in check.problems), check.problems
