"""Conformance tooling that runs without the 15-minute MNN build: patches, the build key, prompts, comparison.

The conformance run itself (MNN built from source, bundles through its Llm engine) is `python -m mnnbuild
conform`, recorded in benchmarks/results/conformance.json; it is not part of CI (see README "Conformance").
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.__main__ import main
from mnnbuild.conform.build import (
    BuildRecord,
    ConformBuildError,
    build_key,
    ensure_build,
    prepare_source,
    resolve_qnn_headers,
    resolve_source,
    unpack_source,
)
from mnnbuild.conform.patches import PatchError, check_patches, load_patches, parse_patch
from mnnbuild.conform.run import (
    ConformError,
    EngineRun,
    PromptCheck,
    compare_runs,
    driver_result,
    prompt_ids,
    stage_dir,
)
from mnnbuild.verify.compare import Tolerance

PATCHES = load_patches()


def fake_source(root: Path, patches=PATCHES) -> Path:
    """A tree holding exactly the lines the patches expect, at their line numbers (filler elsewhere)."""
    files: dict[str, list[str]] = {}
    for patch in patches:
        for fp in patch.files:
            lines = files.setdefault(fp.path, [])
            for hunk in fp.hunks:
                start = hunk.old_start - 1
                while len(lines) < start:
                    lines.append(f"// filler {len(lines) + 1}")
                lines[start : start + len(hunk.old)] = list(hunk.old)
    (root / "transformers" / "llm").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text("project(MNN)\n")
    for rel, lines in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("\n".join([*lines, "// end"]) + "\n", encoding="utf-8")
    return root


def tarball(src: Path, dest: Path) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(src, arcname="mnn-fake")
    return dest


def test_every_patch_says_why_and_names_files_in_the_tree() -> None:
    assert [p.name for p in PATCHES] == sorted(p.name for p in PATCHES) and len(PATCHES) >= 4
    for patch in PATCHES:
        assert len(patch.why) > 80, f"{patch.name}: the comment header must say why"
        assert patch.files and all(fp.path.startswith(("source/", "transformers/", "tools/")) for fp in patch.files)
    touched = {fp.path for p in PATCHES for fp in p.files}
    assert "source/backend/cpu/CPUKVCacheManager.cpp" in touched  # the short-prompt CPU bug fix


def test_patches_apply_to_a_matching_source(tmp_path: Path) -> None:
    src = fake_source(tmp_path / "src")
    patched = check_patches(src, PATCHES)
    assert set(patched) == {fp.path for p in PATCHES for fp in p.files}
    for patch in PATCHES:
        for fp in patch.files:
            for hunk in fp.hunks:
                added = [ln for ln in hunk.new if ln not in hunk.old]
                assert all(ln in patched[fp.path].splitlines() for ln in added), (patch.name, fp.path)
    # nothing was written by the check
    assert all("QNN_COMMON_ERROR_NOT_SUPPORTED != error" not in p.read_text() for p in src.rglob("*.cpp"))


def test_a_patch_that_no_longer_fits_names_the_patch_and_file(tmp_path: Path) -> None:
    src = fake_source(tmp_path / "src")
    target = src / "source/backend/cpu/CPUKVCacheManager.cpp"
    target.write_text(target.read_text().replace("c4Offset(token, channel, seqLen, pack)", "c4Offset(t, c, n, p)"))
    with pytest.raises(PatchError) as err:
        check_patches(src, PATCHES)
    msg = str(err.value)
    assert "\n" not in msg
    assert "0004-cpu-attention-padded-nc4hw4.patch" in msg and "source/backend/cpu/CPUKVCacheManager.cpp" in msg


def test_a_missing_file_names_the_patch(tmp_path: Path) -> None:
    src = fake_source(tmp_path / "src")
    (src / "source/backend/qnn/CMakeLists.txt").unlink()
    with pytest.raises(
        PatchError, match=r"0002-qnn-flatbuffers-util-on-linux.patch .*source/backend/qnn/CMakeLists.txt"
    ):
        check_patches(src, PATCHES)


def test_a_patch_without_a_reason_is_refused(tmp_path: Path) -> None:
    bare = tmp_path / "0009-bare.patch"
    bare.write_text("--- a/x.cpp\n+++ b/x.cpp\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match="0009-bare.patch: no comment header"):
        parse_patch(bare)
    escape = tmp_path / "0010-escape.patch"
    escape.write_text("why\n--- a/../x.cpp\n+++ b/../x.cpp\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match="0010-escape.patch: file '../x.cpp' must be a relative path"):
        parse_patch(escape)


def test_stale_source_stops_before_building(tmp_path: Path) -> None:
    """Given another MNN source where a patch no longer applies, the build stops with one line naming the
    patch and the file, and neither a source tree nor a build directory is left behind."""
    src = fake_source(tmp_path / "mnn")
    (src / "source/backend/qnn/backend/QNNBackend.cpp").write_text("// another MNN\n")
    tar = tarball(src, tmp_path / "mnn.tar.gz")
    headers = tmp_path / "qnn"
    headers.mkdir()
    (headers / "QnnInterface.h").write_text("// QNN\n")
    root = tmp_path / "cache"
    with pytest.raises(PatchError) as err:
        ensure_build(tar, headers, root=root)
    assert str(err.value).startswith("patch 0001-qnn-half-float-on-x86.patch does not apply to ")
    assert "source/backend/qnn/backend/QNNBackend.cpp" in str(err.value)
    (key_dir,) = root.iterdir()
    assert sorted(p.name for p in key_dir.iterdir()) == []  # no src/, no build/, no temp left


def test_prepare_source_patches_a_tarball(tmp_path: Path) -> None:
    tar = tarball(fake_source(tmp_path / "mnn"), tmp_path / "mnn.tar.gz")
    dest = tmp_path / "src"
    prepare_source(tar, PATCHES, dest)
    assert "QNN_COMMON_ERROR_NOT_SUPPORTED != error" in (dest / "source/backend/qnn/backend/QNNBackend.cpp").read_text()
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_a_hostile_tarball_is_refused(tmp_path: Path) -> None:
    tar_path = tmp_path / "evil.tar"
    with tarfile.open(tar_path, "w") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(ConformBuildError, match="evil.tar: cannot extract"):
        unpack_source(tar_path, tmp_path / "dest")
    assert not (tmp_path / "outside.txt").exists()


def test_build_key_follows_source_patches_headers_compiler() -> None:
    args = ("a" * 64, PATCHES, "h" * 64, "g++ 12.2.0", "cmake 3.25", ("-DX=ON",))
    base = build_key(*args)
    assert base == build_key(*args)
    changed_patch = parse_patch_text(PATCHES[0], "\n// one more reviewed word")
    assert build_key("b" * 64, *args[1:]) != base
    assert build_key(args[0], [changed_patch, *PATCHES[1:]], *args[2:]) != base
    assert build_key(args[0], PATCHES[:-1], *args[2:]) != base
    assert build_key(*args[:2], "i" * 64, *args[3:]) != base
    assert build_key(*args[:3], "clang 16", *args[4:]) != base
    assert build_key(*args[:4], "cmake 3.30", args[5]) != base
    assert build_key(*args[:5], ("-DX=OFF",)) != base


def parse_patch_text(patch, extra: str):
    from dataclasses import replace

    return replace(patch, text=patch.text + extra)


def test_source_and_headers_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConformBuildError, match="set MNN_SOURCE"):
        resolve_source(None, {})
    with pytest.raises(ConformBuildError, match="not an MNN source tree"):
        resolve_source(tmp_path, {})
    with pytest.raises(ConformBuildError, match="set QNN_SDK_ROOT"):
        resolve_qnn_headers(None, {})
    with pytest.raises(ConformBuildError, match=r"QNN_SDK_ROOT\): no QnnInterface.h"):
        resolve_qnn_headers(None, {"QNN_SDK_ROOT": str(tmp_path)})
    (tmp_path / "include" / "QNN").mkdir(parents=True)
    (tmp_path / "include" / "QNN" / "QnnInterface.h").write_text("")
    assert resolve_qnn_headers(None, {"QNN_SDK_ROOT": str(tmp_path)}) == tmp_path / "include" / "QNN"


def test_three_prompt_lengths() -> None:
    prompts = dict(prompt_ids([5, 6, 7], [1, 2], 128))
    assert prompts["short"][:5] == [5, 6, 7, 1, 2] and len(prompts["short"]) == 16  # padded, not one token
    assert len(prompts["chunk"]) == 128
    assert 128 < len(prompts["two chunks"]) < 256  # two chunks, the second one padded
    assert dict(prompt_ids(list(range(40)), [1], 128))["short"] == list(range(40))
    with pytest.raises(ConformError, match="must be below the chunk"):
        prompt_ids(list(range(128)), [1], 128)


def _run(tokens: list[int], loop: list[int] | None = None) -> EngineRun:
    return EngineRun(
        tokens=tokens,
        engine_loop_tokens=tokens if loop is None else loop,
        text="",
        load_s=0,
        prefill_s=0,
        decode_s=0,
        generate_s=0,
    )


def test_compare_runs_token_for_token() -> None:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(3, 50)).astype(np.float32)
    tokens = [int(r.argmax()) for r in rows]
    ok = PromptCheck(name="short", prompt_tokens=3, bundle=_run(tokens), original=_run(tokens), unchunked=_run(tokens))
    compare_runs(ok, rows + 1e-4, rows, Tolerance())
    assert ok.passed and ok.tokens_equal and ok.first_divergence is None and len(ok.steps) == 3

    other = [tokens[0], (tokens[1] + 1) % 50, tokens[2]]
    bad = PromptCheck(name="short", prompt_tokens=3, bundle=_run(other), original=_run(tokens), unchunked=_run(tokens))
    flipped = rows.copy()
    flipped[1, other[1]] = rows[1].max() + 5
    compare_runs(bad, flipped, rows, Tolerance())
    assert not bad.passed and bad.first_divergence == 1 and len(bad.steps) == 2

    loop = PromptCheck(
        name="short", prompt_tokens=3, bundle=_run(tokens, loop=[9, 9]), original=_run(tokens), unchunked=_run(tokens)
    )
    compare_runs(loop, rows, rows, Tolerance())
    assert not loop.passed and not loop.engine_loop_agrees


def test_cli_names_a_bad_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "tiny-qwen3-v99"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "target 'tiny-qwen3-v99': expected <model>-<arch>" in err


def test_a_finished_build_is_reused_without_building(tmp_path: Path) -> None:
    """A key whose build.json exists is returned as is; a changed patch set is another key (another dir)."""
    src = fake_source(tmp_path / "mnn")
    headers = tmp_path / "qnn"
    headers.mkdir()
    (headers / "QnnInterface.h").write_text("// QNN\n")
    root = tmp_path / "cache"
    with pytest.raises(PatchError):  # stops at the patch check: the key dir exists, nothing else
        ensure_build(src, headers, root=root, patches=[*PATCHES, parse_patch(_stale_patch(tmp_path))])
    (key_dir,) = root.iterdir()
    record = BuildRecord(
        key=key_dir.name,
        source=str(src),
        source_sha256="s",
        patches=[],
        qnn_headers=str(headers),
        compiler="c",
        cmake="m",
        options=[],
        seconds=1.0,
    )
    (key_dir / "build.json").write_text(record.model_dump_json())
    build = ensure_build(src, headers, root=root, patches=[*PATCHES, parse_patch(_stale_patch(tmp_path))])
    assert build.root == key_dir and build.record.key == key_dir.name
    assert not (key_dir / "build").exists()  # nothing was configured or compiled


def _stale_patch(tmp_path: Path) -> Path:
    path = tmp_path / "0099-stale.patch"
    path.write_text(
        "Why: a test patch for a file the source does not have.\n--- a/nope.cpp\n+++ b/nope.cpp\n@@ -1 +1 @@\n-a\n+b\n"
    )
    return path


def test_stage_dir_links_files_and_writes_replacements(tmp_path: Path) -> None:
    src = tmp_path / "bundle"
    (src / "qnn").mkdir(parents=True)
    (src / "qnn" / "graph0.bin").write_bytes(b"shipped")
    (src / "qnn" / "llm.mnn").write_bytes(b"graph")
    (src / "config_qnn.json").write_text("{}")
    config = stage_dir(
        src, tmp_path / "run", {"qnn/graph0.bin": b"twin"}, {"llm_model": "qnn/llm.mnn"}, "config_qnn.json"
    )
    run = tmp_path / "run"
    assert (run / "qnn" / "llm.mnn").is_symlink() and (run / "qnn" / "llm.mnn").read_bytes() == b"graph"
    assert not (run / "qnn" / "graph0.bin").is_symlink() and (run / "qnn" / "graph0.bin").read_bytes() == b"twin"
    assert (src / "qnn" / "graph0.bin").read_bytes() == b"shipped"  # the bundle itself is untouched
    assert config == run / "config_qnn.json" and '"llm_model": "qnn/llm.mnn"' in config.read_text()


def test_driver_result_survives_a_foreign_prefix_on_its_line() -> None:
    """Seen on x86: the QNN backend prints "unable to load libcdsprpc.so" with no newline before our JSON."""
    doc = '{"stepped": [1, 2], "generated": [1, 2], "text": "ab"}'
    assert driver_result(f"log line\nunable to load libcdsprpc.so{doc}\n") == json.loads(doc)
    assert driver_result(f"{doc}\n") == json.loads(doc)
    assert driver_result("no result here\n") is None
    assert driver_result('{"stepped": [1, \n') is None
