"""Conformance tooling that runs without the 15-minute MNN build: patches, the build key, prompts, comparison.

The conformance run itself (MNN built from source, bundles through its Llm engine) is `python -m mnnbuild
conform`, recorded in benchmarks/results/conformance.json; it is not part of CI (see docs/conformance.md).
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from mnnbuild_runtime.speculative import ENGINE_FULL_PRECISION

from mnnbuild.__main__ import main
from mnnbuild.base.compare import TensorCheck, compare
from mnnbuild.base.errors import PatchError
from mnnbuild.conform.boundaries import (
    BoundaryError,
    compare_sides,
    qnn_json,
    read_side,
    upstream_io_config,
)
from mnnbuild.conform.build import (
    BUILD_TARGETS,
    BuildRecord,
    ConformBuildError,
    MnnBuild,
    build_key,
    ensure_build,
    ensure_tools,
    prepare_source,
    resolve_qnn_headers,
    resolve_source,
    unpack_source,
)
from mnnbuild.conform.cli import parse_lengths, patch_name
from mnnbuild.conform.effect import (
    LengthEffect,
    PatchEffect,
    RunTokens,
    default_lengths,
    format_effect,
    length_effect,
    padding,
    summarize,
)
from mnnbuild.conform.patcher import check_patches, load_patches, parse_patch
from mnnbuild.conform.run import (
    ENGINE_SETTINGS,
    REFERENCE_PRECISION,
    ConformError,
    ConformReport,
    EngineRun,
    PromptCheck,
    compare_runs,
    driver_result,
    format_report,
    is_speculative,
    prompt_ids,
    run_configs,
    run_settings,
    split_engine_loop,
    stage_dir,
)
from mnnbuild.cpu import llm_engine_greedy
from mnnbuild.mnn.model import MnnModel, Op, make_blob, make_plugin_op
from mnnbuild.verify.compare import Tolerance
from tests.conftest import PROJECT_ROOT

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
    from mnnbuild.conform.workdir import claim_dir

    src = tmp_path / "bundle"
    (src / "qnn").mkdir(parents=True)
    (src / "qnn" / "graph0.bin").write_bytes(b"shipped")
    (src / "qnn" / "llm.mnn").write_bytes(b"graph")
    (src / "config_qnn.json").write_text("{}")
    out = claim_dir(tmp_path / "out")
    config = stage_dir(src, out / "run", {"qnn/graph0.bin": b"twin"}, {"llm_model": "qnn/llm.mnn"}, "config_qnn.json")
    run = out / "run"
    assert (run / "qnn" / "llm.mnn").is_symlink() and (run / "qnn" / "llm.mnn").read_bytes() == b"graph"
    assert not (run / "qnn" / "graph0.bin").is_symlink() and (run / "qnn" / "graph0.bin").read_bytes() == b"twin"
    assert (src / "qnn" / "graph0.bin").read_bytes() == b"shipped"  # the bundle itself is untouched
    assert config == run / "config_qnn.json" and '"llm_model": "qnn/llm.mnn"' in config.read_text()
    # a second run replaces what the first staged
    stage_dir(src, out / "run", {}, {}, "config_qnn.json")
    assert (run / "qnn" / "graph0.bin").is_symlink()


def test_conform_writes_only_into_a_report_dir_it_made(tmp_path: Path) -> None:
    """`--out ~/Documents` used to remove ~/Documents/bundle (and original/, unchunked/, compilefornpu/): conform
    writes only into a new or empty dir, or one an earlier run wrote (its marker, or its conform.json)."""
    from mnnbuild.base.errors import ConformDirError
    from mnnbuild.conform.workdir import claim_dir, fresh_dir

    docs = tmp_path / "Documents"
    (docs / "bundle").mkdir(parents=True)
    (docs / "bundle" / "thesis.tex").write_text("mine")
    with pytest.raises(ConformDirError, match=r"Documents: a directory conform did not make \(no .mnnbuild-conform"):
        claim_dir(docs)
    with pytest.raises(ConformDirError, match=r"Documents: not a report dir conform made"):
        stage_dir(tmp_path / "src", docs / "bundle", {}, {}, "config_qnn.json")
    with pytest.raises(ConformDirError):
        fresh_dir(docs / "compilefornpu")
    assert (docs / "bundle" / "thesis.tex").read_text() == "mine" and sorted(p.name for p in docs.iterdir()) == [
        "bundle"
    ]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConformDirError, match="a file or symlink"):
        claim_dir(tmp_path / "file")
    # an earlier run's report dir (written before the marker existed) is conform's; so is a new or empty one
    earlier = tmp_path / "earlier"
    (earlier / "bundle").mkdir(parents=True)
    (earlier / "conform.json").write_text('{"model": "m", "mnn_build": "k"}')
    assert fresh_dir(claim_dir(earlier) / "bundle").is_dir() and not list((earlier / "bundle").iterdir())
    assert claim_dir(tmp_path / "new").is_dir() and claim_dir(tmp_path / "new") == tmp_path / "new"


def test_run_configs_set_the_engine_settings_conform_needs() -> None:
    """config_qnn.json carries the model's own settings (a random sampler, 4 threads, any backend): every run is
    set to the CPU, one thread and greedy decoding; the bundle keeps its precision and memory, the originals take
    the bundle's chunk limits (the unchunked one none) and run at full precision, whatever the bundle's memory."""
    model = {"llm_model": "llm.mnn", "backend_type": "opencl", "thread_num": 4, "precision": "low",
             "memory": "low", "sampler_type": "mixed", "temperature": 0.8}  # fmt: skip
    bundle = {**model, "llm_model": "qnn/llm.mnn", "chunk_limits": [128, 1]}
    got_bundle, original, unchunked = run_configs(bundle, model)
    engine = {"backend_type": "cpu", "thread_num": 1, "sampler_type": "greedy"}
    assert got_bundle == {**bundle, **engine} and bundle["sampler_type"] == "mixed"  # the input is not changed
    assert got_bundle["memory"] == "low" and got_bundle["precision"] == "low"  # the phone's settings
    assert original == {**model, **engine, "precision": "high", "memory": "normal", "chunk_limits": [128, 1]}
    assert unchunked == {k: v for k, v in original.items() if k != "chunk_limits"}
    assert REFERENCE_PRECISION == ENGINE_FULL_PRECISION  # what verify's engine reference runs at


def test_the_report_says_each_runs_precision_and_why() -> None:
    bundle, original, unchunked = run_configs({"memory": "low", "precision": "low", "chunk_limits": [128, 1]}, {})
    runs = run_settings({"bundle": bundle, "original": original, "unchunked": unchunked})
    assert (runs["bundle"].memory, runs["bundle"].precision, runs["bundle"].chunk_limits) == ("low", "low", [128, 1])
    assert (runs["original"].memory, runs["original"].precision) == ("normal", "high")
    assert runs["unchunked"].chunk_limits is None and runs["unchunked"].memory == "normal"
    assert "config_qnn.json" in runs["bundle"].why and "int8" in runs["original"].why
    report = ConformReport(model="m", arch="v79", soc="SM8750", mnn_build="k", mnn_source="s", patches=[], chunk=128,
                           max_new_tokens=4, tolerance=Tolerance(), binaries=[], runs=runs, prompts=[])  # fmt: skip
    text = format_report(report)
    assert "  bundle    precision low, memory low, chunk_limits [128, 1] — the bundle's own config_qnn.json" in text
    assert "  original  precision high, memory normal, chunk_limits [128, 1] — full precision" in text
    assert "  unchunked precision high, memory normal, chunk_limits none" in text


def test_the_reference_run_gives_the_models_full_precision_logits(tmp_path: Path) -> None:
    """The original run's config, given to PyPI MNN's engine (the same engine code conform builds): its logits are
    the model's at full precision, as verify's engine reference computes them, even though the model and the bundle
    say ``memory: low`` (under which MNN's CPU quantizes activations to int8: the trained tiny model's logits move by
    up to 3.7% of their max, beyond conform's 2% bound)."""
    model_dir = PROJECT_ROOT / "models" / "tiny-qwen3-trained"
    model = json.loads((model_dir / "config.json").read_text())
    assert model["memory"] == "low"
    bundle = {**model, "llm_model": "qnn/llm.mnn", "chunk_limits": [128, 1]}
    _, _, unchunked = run_configs(bundle, model)  # the original's too, with the padded prefill PyPI MNN gets wrong
    from mnnbuild.conform.workdir import claim_dir

    staged = stage_dir(model_dir, claim_dir(tmp_path / "conform") / "unchunked", {}, unchunked, "config.json")
    prompt = list(range(3, 19))

    def rows(config: Path, settings: dict[str, object]) -> np.ndarray:
        found: list[np.ndarray] = []
        llm_engine_greedy(config, prompt, 4, settings, found)
        return np.stack(found)

    ref = rows(model_dir / "config.json", {**ENGINE_SETTINGS, **ENGINE_FULL_PRECISION})
    low = rows(model_dir / "config.json", {**ENGINE_SETTINGS, "memory": "low"})
    got = rows(staged, {})
    assert np.array_equal(got, ref)
    # the error the reference must not carry: 1.1% of the max |logit| here, 2.2-3.7% on conform's longer prompts
    assert compare("memory low", low, ref, Tolerance()).rel_err > 0.005


def test_driver_result_survives_a_foreign_prefix_on_its_line() -> None:
    """Seen on x86: the QNN backend prints "unable to load libcdsprpc.so" with no newline before our JSON."""
    doc = '{"stepped": [1, 2], "generated": [1, 2], "text": "ab"}'
    assert driver_result(f"log line\nunable to load libcdsprpc.so{doc}\n") == json.loads(doc)
    assert driver_result(f"{doc}\n") == json.loads(doc)
    assert driver_result("no result here\n") is None
    assert driver_result('{"stepped": [1, \n') is None


def patched_file(tmp_path: Path, patch: str, engine_file: str) -> tuple[str, str]:
    """The one file ``patch`` touches (``transformers/llm/engine/src/<engine_file>``), before and after every patch."""
    (found,) = [p for p in PATCHES if p.name == patch]
    (fp,) = found.files
    assert fp.path == f"transformers/llm/engine/src/{engine_file}"
    src = fake_source(tmp_path / "src")
    return (src / fp.path).read_text(), check_patches(src, PATCHES)[fp.path]


def test_eagle_patch_samples_the_valid_row_and_cuts_the_padding_from_the_draft(tmp_path: Path) -> None:
    """0005: EagleGeneration sampled every row of a padded prefill (the first token from padding) and drafted on the
    padding's hidden states; patched, it samples the row the engine marks valid, as ArGeneration does."""
    before, after = patched_file(tmp_path, "0005-eagle-padded-prefill.patch", "speculative_decoding/eagle.cpp")
    assert "mLlm->sample(param.outputs[0]);" in before and "mLlm->sample(param.outputs[0]);" not in after
    assert "mLlm->sample(param.outputs[0], param.validLogitStart, param.validLogitSize);" in after
    assert "hiddenStates = _Split(hiddenStates, {realLen, hiddenLen - realLen}, 1)[0];" in after
    # a prompt of several chunks: the draft (and the tree it gives the target) starts at the last chunk's position
    assert "mEaglePastLen   = mContext->all_seq_len - seqLen;" in after


def test_lookahead_patch_samples_the_valid_row(tmp_path: Path) -> None:
    """0006: LookaheadGeneration sampled every row of a padded prefill, as EagleGeneration did before 0005 (its
    first token came from the wrong row); patched, it samples the row the engine marks valid."""
    before, after = patched_file(tmp_path, "0006-lookahead-padded-prefill.patch", "speculative_decoding/lookahead.cpp")
    assert "current_token = mLlm->sample(param.outputs[0]);" in before
    assert "current_token = mLlm->sample(param.outputs[0]);" not in after
    assert "current_token = mLlm->sample(param.outputs[0], param.validLogitStart, param.validLogitSize);" in after


def test_eagle_engine_loop_gives_its_forward_count_apart_from_its_tokens(tmp_path: Path) -> None:
    """EagleGeneration appends its target forwards to Llm::generate's tokens; a plain run's list is all tokens."""
    assert split_engine_loop([7, 8, 9, 2], speculative=True) == ([7, 8, 9], 2)
    assert split_engine_loop([7, 8, 9, 2], speculative=False) == ([7, 8, 9, 2], None)
    for no_count in ([7, 8, 9], [7, 8, 0], [7], []):  # 9 > the 2 tokens after the first; 0 forwards; too short
        with pytest.raises(ConformError, match="count of target forwards"):
            split_engine_loop(no_count, speculative=True)
    eagle = tmp_path / "config.json"
    eagle.write_text(json.dumps({"speculative_type": "eagle", "llm_model": "llm.mnn"}))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"llm_model": "llm.mnn"}))
    assert is_speculative(eagle) and not is_speculative(plain)


def test_a_speculative_loop_may_run_past_the_requested_tokens_a_plain_one_not() -> None:
    rows = np.eye(4, 50, k=3, dtype=np.float32)
    tokens = [int(r.argmax()) for r in rows]
    spec = _run(tokens, loop=[*tokens, 11])  # the last forward accepted one more than asked
    spec.engine_forwards = 2
    check = PromptCheck(name="short", prompt_tokens=3, bundle=spec, original=_run(tokens), unchunked=_run(tokens))
    compare_runs(check, rows, rows, Tolerance())
    assert check.engine_loop_agrees and check.passed

    plain = PromptCheck(
        name="short", prompt_tokens=3, bundle=_run(tokens, loop=[*tokens, 11]), original=_run(tokens),
        unchunked=_run(tokens),
    )  # fmt: skip
    compare_runs(plain, rows, rows, Tolerance())
    assert not plain.engine_loop_agrees

    wrong = _run(tokens, loop=[tokens[0] + 1, *tokens[1:]])  # the first token from a padding row
    wrong.engine_forwards = 2
    bad = PromptCheck(name="short", prompt_tokens=3, bundle=wrong, original=_run(tokens), unchunked=_run(tokens))
    compare_runs(bad, rows, rows, Tolerance())
    assert not bad.engine_loop_agrees and not bad.passed


# ---- what a patch changes: padding arithmetic and the per-length verdict ---------------------------------


def test_padding_follows_the_engines_chunking() -> None:
    """MNN's Llm cuts a prompt into chunks of the largest limit and pads the remainder up to the smallest limit
    holding it: with [128, 1] only remainders 2..127 are padded."""
    limits = [128, 1]
    assert [padding(n, limits) for n in (1, 2, 16, 127, 128, 129, 130, 255, 256, 257)] == [
        0, 126, 112, 1, 0, 0, 126, 1, 0, 0,
    ]  # fmt: skip
    assert [padding(n, [128, 32, 1]) for n in (20, 32, 40, 160, 161)] == [12, 0, 88, 0, 95]
    lengths = default_lengths(128)
    assert {1, 2, 127, 128, 129, 130, 255, 256, 257} <= set(lengths) and lengths == sorted(set(lengths))


def _effect_runs(with_rows: np.ndarray, without_rows: np.ndarray, ref_rows: np.ndarray) -> dict:
    def run(rows: np.ndarray) -> tuple[RunTokens, np.ndarray]:
        return RunTokens(tokens=[int(r.argmax()) for r in rows], text=""), rows

    return {"with_patch": run(with_rows), "without_patch": run(without_rows), "reference": run(ref_rows)}


def test_length_effect_flags_changed_logits_and_tolerates_a_near_tie_against_the_reference() -> None:
    tol = Tolerance()
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(4, 50)).astype(np.float32)
    same = length_effect(128, 0, _effect_runs(rows, rows.copy(), rows), tol)
    assert not same.changed and same.first_divergence is None and same.with_patch_matches_reference

    broken = rng.normal(size=(4, 50)).astype(np.float32)
    changed = length_effect(16, 112, _effect_runs(rows, broken, rows), tol)
    assert changed.changed and not changed.first_token_logits.passed
    assert changed.first_divergence == next(i for i in range(4) if broken[i].argmax() != rows[i].argmax())

    # the patched bundle flips a near-tie of the reference: tolerated; a clear flip is not
    ref = rows.copy()
    top, other = int(ref[0].argmax()), int(np.argsort(ref[0])[-2])
    ref[0, other] = ref[0, top] - 1e-4
    flipped = rows.copy()
    flipped[0, other] = flipped[0, top] + 1e-3
    assert length_effect(255, 1, _effect_runs(flipped, flipped, ref), tol).with_patch_matches_reference
    ref[0, other] = ref[0, top] - 0.5 * np.abs(ref[0]).max()
    assert not length_effect(255, 1, _effect_runs(flipped, flipped, ref), tol).with_patch_matches_reference


def test_summary_says_whether_the_patch_changed_exactly_the_padded_prompts() -> None:
    def one(n: int, pad: int, changed: bool) -> LengthEffect:
        run = RunTokens(tokens=[1], text="")
        check = TensorCheck(name="x", shape=[1], max_abs_err=0.0, ref_max_abs=1.0, rel_err=0.0, cosine=1.0, passed=True)
        return LengthEffect(
            prompt_tokens=n,
            padding=pad,
            with_patch=run,
            without_patch=run,
            reference=run,
            first_token_logits=check,
            first_divergence=None,
            changed=changed,
            with_patch_matches_reference=True,
        )

    def effect(items: list[LengthEffect]) -> PatchEffect:
        return summarize(
            PatchEffect(
                patch="p", build_with="a", build_without="b", chunk_limits=[128, 1], max_new_tokens=1, lengths=items
            )
        )

    good = effect([one(1, 0, False), one(16, 112, True), one(128, 0, False)])
    assert good.changed_lengths == good.padded_lengths == [16] and good.changed_exactly_where_padded
    assert not effect([one(16, 112, True), one(129, 0, True)]).changed_exactly_where_padded
    assert "changed exactly where padded: True" in "\n".join(format_effect(good))


def test_patch_names_take_the_suffix_or_not_and_lengths_are_checked() -> None:
    assert patch_name("0004-cpu-attention-padded-nc4hw4", PATCHES, "--patch-effect") == (
        "0004-cpu-attention-padded-nc4hw4.patch"
    )
    assert patch_name("0001-qnn-half-float-on-x86.patch", PATCHES, "--skip-patch") == "0001-qnn-half-float-on-x86.patch"
    with pytest.raises(ConformError, match="--skip-patch 'nope': no such patch; have 0001-"):
        patch_name("nope", PATCHES, "--skip-patch")
    assert parse_lengths("16, 2,128,16") == [2, 16, 128]
    for bad in ("", "0,5", "a,b"):
        with pytest.raises(ConformError, match="--lengths"):
            parse_lengths(bad)


def test_missing_tools_of_a_finished_build_are_built_and_present_ones_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = BuildRecord(
        key="k", source="s", source_sha256="s", patches=[], qnn_headers="h", compiler="c", cmake="m", options=[],
        seconds=1.0,
    )  # fmt: skip
    build = MnnBuild(tmp_path, record)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "compilefornpu").write_text("")
    ran: list[list[str]] = []
    monkeypatch.setattr("mnnbuild.conform.build._run", lambda cmd, *a, **k: ran.append(cmd))
    ensure_tools(build, ("compilefornpu",))
    assert ran == []
    ensure_tools(build, ("compilefornpu", "generateIO"))
    (cmd,) = ran
    assert cmd[-2:] == ["--target", "generateIO"]
    assert "compilefornpu" not in cmd and "generateIO" in BUILD_TARGETS


# ---- plugin boundaries against compilefornpu ----------------------------------------------------------------


def _source_model() -> MnnModel:
    """x(t0), pos(t1) -> Cast(t2) -> Cos(t3); Mul(x, cos)(t4) -> Attention(t5) -> Add(t6 logits), Norm(t7)."""
    names = ["x", "pos", "cast", "cos", "mul", "attn", "logits", "hidden"]
    ops = [
        Op(type="Input", name="x", outputs=[0]),
        Op(type="Input", name="pos", outputs=[1]),
        Op(type="Cast", name="cast", inputs=[1], outputs=[2]),
        Op(type="UnaryOp", name="cos", inputs=[2], outputs=[3]),
        Op(type="BinaryOp", name="mul", inputs=[0, 3], outputs=[4]),
        Op(type="Attention", name="attn", inputs=[4], outputs=[5]),
        Op(type="BinaryOp", name="add", inputs=[5, 5], outputs=[6]),
        Op(type="LayerNorm", name="norm", inputs=[5], outputs=[7]),
    ]
    return MnnModel(ops=ops, tensor_names=names, output_names=["logits", "hidden"])


def _plugin(path: str, graphs: list[str], ins: list[int], outs: list[int], seqs: int, local: list[int]) -> Op:
    attrs: dict = {"path": path, "allGraphName": graphs, "inputs": [f"t{t}" for t in ins]}
    attrs["outputs"] = [f"t{t}" for t in outs]
    for s in range(seqs):
        for j in range(len(outs)):
            attrs[f"o_{s}_{j}"] = make_blob([1, 1 if s == 0 else 8, 4], "DT_FLOAT", "NC4HW4" if j else "NCHW")
    return make_plugin_op(path, local[: len(ins)], local[len(ins) :], attrs)


def test_boundaries_name_the_ops_and_tensors_where_two_cuts_differ() -> None:
    source = _source_model()
    # ours: Cast and Cos on the CPU, the plugin takes cos; the second plugin also gives hidden
    ours = MnnModel(
        ops=[
            Op(type="Input", name="x", outputs=[0]),
            Op(type="Input", name="pos", outputs=[1]),
            Op(type="Cast", name="cast", inputs=[1], outputs=[2]),
            Op(type="UnaryOp", name="cos", inputs=[2], outputs=[3]),
            _plugin("qnn/graph0.bin", ["graph0", "graph1_0"], [0, 3], [4], 2, [0, 3, 4]),
            Op(type="Attention", name="attn", inputs=[4], outputs=[5]),
            _plugin("qnn/graph1.bin", ["graph1", "graph1_1"], [5], [6, 7], 2, [5, 6, 7]),
        ],
        tensor_names=["x", "pos", "cast", "cos", "mul", "attn", "logits", "hidden"],
        output_names=["logits", "hidden"],
    )
    # upstream: Cast and Cos inside the first plugin; hidden cut away but still named as an output
    upstream = MnnModel(
        ops=[
            Op(type="Input", name="x", outputs=[0]),
            Op(type="Input", name="pos", outputs=[1]),
            _plugin("qnn/graphllm0.bin", ["graphllm0", "graphllm1_0"], [0, 1], [4], 2, [0, 1, 2]),
            Op(type="Attention", name="attn", inputs=[2], outputs=[3]),
            _plugin("qnn/graphllm1.bin", ["graphllm1", "graphllm1_1"], [5], [6], 2, [3, 4]),
            Op(type="Const", name="folded_shape", outputs=[5]),  # folded, then read by nothing
        ],
        tensor_names=["x", "pos", "mul", "attn", "logits", "folded_shape"],
        output_names=["logits", "hidden"],
    )
    ours_side = read_side(ours, source, [1, 8])
    up_side = read_side(upstream, source, [8, 1])
    assert ours_side.plugins[0].ops == ["BinaryOp mul"]
    assert up_side.plugins[0].ops == ["Cast cast", "UnaryOp cos", "BinaryOp mul"]
    assert ours_side.plugins[1].outputs[1].shapes == {1: "1x1x4 NC4HW4 DT_FLOAT", 8: "1x8x4 NC4HW4 DT_FLOAT"}
    assert up_side.dangling_outputs == ["hidden"] and ours_side.dangling_outputs == []

    report = compare_sides(ours_side, up_side, {"Cast cast": "keeps the phase in fp32"})
    p0, p1 = report.plugins
    assert p0.inputs_only_ours == ["t3 cos"] and p0.inputs_only_upstream == ["t1 pos"]
    assert p0.ops_only_upstream == ["Cast cast", "UnaryOp cos"] and not p0.same_cut
    assert p1.outputs_only_ours == ["t7 hidden"] and p1.ops_only_ours == ["LayerNorm norm"]
    assert report.cpu_only_ours == ["Cast cast", "UnaryOp cos"] and report.cpu_only_upstream == []
    text = "\n".join(report.differences)
    assert "plugin 0 shape order (seq per graph): ours [1, 8], upstream [8, 1]" in text
    assert "CPU ops only ours: Cast cast (ours: keeps the phase in fp32)" in text
    assert "upstream: model output names carried by no tensor: hidden" in text
    assert "unused Const ops: ours 0, upstream 1" in text
    # the same cut on both sides: only names and shape order differ
    same = compare_sides(ours_side, ours_side.model_copy(), {})
    assert all(d.same_cut for d in same.plugins) and same.differences == []


def test_upstream_samples_follow_the_export_script(tmp_path: Path) -> None:
    doc = upstream_io_config({"hidden_size": 64, "attention_mask": "float"}, 128)
    prefill, decode = doc["configs"]
    shapes = {i["name"]: i["shape"] for i in prefill["inputs"]}
    assert shapes == {"input_ids": [128, 1, 64], "attention_mask": [1, 1, 128, 128], "position_ids": [1, 128],
                      "logits_index": [1]}  # fmt: skip
    assert [i.get("value") for i in decode["inputs"]][-1] == -1 and decode["inputs"][0]["shape"] == [1, 1, 64]
    assert qnn_json(["a"], 0)["graph_name"] == "graphllm"
    with pytest.raises(BoundaryError, match="field 'hidden_size'"):
        upstream_io_config({}, 128)


# ---- locating a bundle and comparing cuts, on real build outputs (no MNN build) ----------------------------

UPSTREAM_CUT = PROJECT_ROOT / "tests" / "fixtures" / "conform" / "tiny-qwen3-compilefornpu.mnn"
SOURCE_FOLDER = "qwen3-tiny-folder"
"""The tiny model's copy is named unlike its spec (ho-x): the bundle names its model dir after the folder."""


@pytest.fixture(scope="module")
def renamed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Spec ``ho-x`` on a copy of the tiny model named ``qwen3-tiny-folder``, two prefill lengths, partitioned."""
    import shutil

    from tests.conftest import TINY_MODEL_DIR, doit

    root = tmp_path_factory.mktemp("renamed")
    shutil.copytree(TINY_MODEL_DIR, root / SOURCE_FOLDER)
    (root / "specs").mkdir()
    (root / "specs" / "ho-x.toml").write_text(
        f'name = "ho-x"\nsource = {{ local = "{root / SOURCE_FOLDER}" }}\ntargets = ["v79"]\nchunk_sizes = [128, 32]\n'
    )
    env = {"MNNBUILD_MODELS_PATH": str(root / "specs")}
    proc = doit(root, "partition:ho-x", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"root": root, "artifacts": root / "artifacts", "specs": root / "specs"}


def _finished_bundle(artifacts: Path, model_name: str) -> Path:
    """A bundle dir as the bundle stage leaves it: its manifest (the real class) and the model dir it names."""
    from mnnbuild.manifests.bundle import BundleManifest, BundleParams
    from mnnbuild.model.targets import soc_by_name
    from mnnbuild.pipeline.layout import bundle_model_dir
    from mnnbuild.stages.chain import stage_dir

    bundle_dir = stage_dir(artifacts, "bundle", "ho-x", "v79")
    bundle_dir.mkdir(parents=True, exist_ok=True)
    params = BundleParams(soc=soc_by_name("SM8750"))
    # unvalidated: a manifest edited to name another dir is what some cases read
    fields = {"model": "ho-x", "target": "v79", "params": params, "model_name": model_name, "qnn_build": "b"}
    BundleManifest.model_construct(schema_version=BundleManifest.schema_hash(), **fields).write(bundle_dir)
    if model_name == SOURCE_FOLDER:
        (bundle_model_dir(bundle_dir, model_name)).mkdir(parents=True, exist_ok=True)
        (bundle_model_dir(bundle_dir, model_name) / "config_qnn.json").write_text("{}")
    return bundle_dir


@pytest.mark.slow
def test_the_bundle_is_found_under_its_source_folders_name(renamed: dict[str, Path], tmp_path: Path) -> None:
    """conform built the bundle's model path by hand under the spec name (``model/ho-x``), while the bundle names it
    after the source folder: every path now comes from the layout module and the bundle manifest."""
    from mnnbuild.conform.cli import locate

    artifacts = tmp_path / "artifacts"
    with pytest.raises(ConformError, match=r"bundle: no finished bundle; run `doit bundle:ho-x-v79` first$"):
        locate(artifacts, "ho-x", "v79")
    bundle_dir = _finished_bundle(artifacts, SOURCE_FOLDER)
    paths = locate(artifacts, "ho-x", "v79")
    assert paths.bundle_model_dir == bundle_dir / "model" / SOURCE_FOLDER
    assert (
        paths.original_dir == artifacts / "ho-x" / "model" and paths.partition_dir == artifacts / "ho-x" / "partition"
    )
    assert (paths.context_dir, paths.twin_dir) == (
        artifacts / "ho-x" / "v79" / "context",
        artifacts / "ho-x" / "v79" / "twin",
    )
    assert paths.conform_dir == artifacts / "ho-x" / "v79" / "conform"
    _finished_bundle(artifacts, "../../../elsewhere")
    with pytest.raises(ConformError, match=r"field 'model_name': expected a plain directory name .*'\.\./\.\./\."):
        locate(artifacts, "ho-x", "v79")


@pytest.mark.slow
def test_conform_gets_past_locating_on_a_renamed_model(
    renamed: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command itself, on the spec whose folder is named otherwise: with the bundle in place it stops only at
    the next thing it needs (an MNN source), in one line."""
    monkeypatch.setenv("MNNBUILD_MODELS_PATH", str(renamed["specs"]))
    monkeypatch.setenv("MNNBUILD_ARTIFACTS", str(renamed["artifacts"]))
    monkeypatch.delenv("MNN_SOURCE", raising=False)
    _finished_bundle(renamed["artifacts"], SOURCE_FOLDER)
    assert main(["conform", "ho-x-v79"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "conform needs an MNN source: set MNN_SOURCE" in err, err


@pytest.mark.slow
def test_cut_settings_are_read_from_the_partition_manifest(renamed: dict[str, Path], tmp_path: Path) -> None:
    """The boundary comparison crashed on PartitionParams.chunk_size (renamed chunk_sizes for several lengths): it
    compiles upstream's one chunk at our longest length and reads our graphs in their shape order."""
    from mnnbuild.conform.boundaries import cut_settings

    cut = cut_settings(renamed["artifacts"] / "ho-x" / "partition")
    assert (cut.chunk, cut.seq_lens, cut.skips, cut.max_kv_size) == (128, [1, 128, 32], [], 0)
    with pytest.raises(BoundaryError, match=r"partition.manifest.json: manifest missing"):
        cut_settings(tmp_path)


@pytest.mark.slow
def test_our_cut_against_upstreams_recorded_cut(renamed: dict[str, Path]) -> None:
    """compilefornpu's own cut of the tiny model (recorded from a conform run, tests/fixtures/conform) against our
    partition of it: the findings docs/conformance.md lists, from the comparison code conform runs."""
    from mnnbuild.conform.boundaries import compare_cuts, cut_settings

    partition = renamed["artifacts"] / "ho-x" / "partition"
    report = compare_cuts(renamed["artifacts"] / "ho-x" / "model", partition, UPSTREAM_CUT, cut_settings(partition))
    assert report.ours is not None and report.upstream is not None
    assert len(report.ours.plugins) == len(report.upstream.plugins) == 4
    assert [d.same_cut for d in report.plugins] == [False, True, True, False]
    rotary = ["Cast /rotary/Cast_output_0", "Reshape /rotary/Reshape_output_0", "BinaryOp /rotary/Mul_output_0",
              "UnaryOp /rotary/Cos_output_0", "UnaryOp /rotary/Sin_output_0"]  # fmt: skip
    assert report.cpu_only_ours == rotary and report.cpu_only_upstream == []
    assert all("rotary phase" in report.cpu_reasons[op] for op in rotary)
    assert report.plugins[0].inputs_only_upstream == ["t0 position_ids"]
    assert report.plugins[3].outputs_only_ours == ["t232 hidden_states"]
    assert report.upstream.dangling_outputs == ["hidden_states"] and report.upstream.unused_constants == 134
    # our three shapes against upstream's two: the shared lengths (1, 128) compare, shape for shape
    assert report.ours.plugins[1].seq_order == [1, 128, 32] and report.upstream.plugins[1].seq_order == [128, 1]
    assert not any(d.shape_mismatches for d in report.plugins)
    assert report.settings == qnn_json([], 0)


def test_a_missing_twin_names_the_doit_task(tmp_path: Path) -> None:
    from mnnbuild.conform.run import _twins
    from mnnbuild.manifests.context import ContextManifest, ContextParams
    from mnnbuild.model.targets import soc_by_name

    merge = {"qnn/graphllm0.bin": ["qnn/graphllm0", "qnn/graphllm1_0"]}
    with pytest.raises(ConformError, match=r"context.manifest.json: manifest missing.*; run `doit bundle:ho-x-v79`$"):
        _twins(tmp_path / "context", tmp_path / "twin", merge, "ho-x-v79")
    ContextManifest(
        model="ho-x", params=ContextParams(soc=soc_by_name("SM8750")), binary="qnn/graphllm0.bin", graphs=[],
        weight_shared=True, soc_type=None, qnn={},
    ).write(tmp_path / "context" / "graphllm0")  # fmt: skip
    with pytest.raises(ConformError) as err:
        _twins(tmp_path / "context", tmp_path / "twin", merge, "ho-x-v79")
    assert str(err.value).endswith("; run `doit twin:ho-x-v79` (the unshared twins the simulator runs)")
    assert "twin.manifest.json: manifest missing" in str(err.value)


@pytest.fixture(scope="module")
def restored_without_bytes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A cache filled by a cold bare `doit`, and a fresh root a bare `doit` restored from it without the bytes."""
    from tests.conftest import doit

    work = tmp_path_factory.mktemp("warm")
    cache = work / "cache"
    for root in ("cold", "warm"):
        proc = doit(work, env={"MNNBUILD_CACHE": str(cache), "MNNBUILD_ARTIFACTS": str(work / root)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"cache": cache, "cold": work / "cold", "warm": work / "warm"}


@pytest.mark.slow
def test_conform_fetches_what_it_reads_from_the_cache(
    restored_without_bytes: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a root restored without the bytes, conform fetches the bundle, the partition (its ``qnn/llm.mnn``, which
    the boundary comparison reads) and the twins from the cache, hash-checked, before it runs anything; a dir the
    cache cannot give (its blob changed) is one line naming the doit task that writes it."""
    import shutil

    from mnnbuild.conform.cli import locate
    from mnnbuild.pipeline.cache import ArtifactCache, CacheEntry

    cache, cold = restored_without_bytes["cache"], restored_without_bytes["cold"]
    warm = tmp_path / "warm"
    shutil.copytree(restored_without_bytes["warm"], warm, symlinks=True)
    partition = warm / "tiny-qwen3" / "partition"
    assert not (partition / "qnn" / "llm.mnn").exists(), "restored without its files"
    monkeypatch.setenv("MNNBUILD_CACHE", str(cache))
    monkeypatch.delenv("MNNBUILD_CACHE_REMOTE", raising=False)
    paths = locate(warm, "tiny-qwen3", "v79")
    for rel in ("partition/qnn/llm.mnn", "v79/twin/graphllm1/graphllm1.bin", "v79/bundle/model/tiny-qwen3/qnn/llm.mnn"):
        assert (warm / "tiny-qwen3" / rel).read_bytes() == (cold / "tiny-qwen3" / rel).read_bytes(), rel
    assert paths.partition_dir == partition
    assert json.loads((partition / "partition.origin.json").read_text())["fetched"]["tier"] == "local"

    again = tmp_path / "again"
    shutil.copytree(restored_without_bytes["warm"], again, symlinks=True)
    bad_cache = tmp_path / "cache"
    shutil.copytree(cache, bad_cache)  # a copy: its blobs are not the cold root's files
    twin_key = json.loads((again / "tiny-qwen3/v79/twin/graphllm2/twin.origin.json").read_text())["key"]
    entry = CacheEntry.model_validate_json((bad_cache / "twin" / f"{twin_key}.json").read_text())
    blob = Path(ArtifactCache(str(bad_cache))._blob(next(f.sha256 for f in entry.files if f.path.endswith(".bin"))))
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.unlink()
    blob.write_bytes(bytes(data))
    monkeypatch.setenv("MNNBUILD_CACHE", str(bad_cache))
    with pytest.raises(ConformError) as err:
        locate(again, "tiny-qwen3", "v79")
    line = str(err.value)
    assert "twin/graphllm2: restored without its files" in line and "does not match its sha256" in line, line
    assert line.endswith("; run `doit twin:tiny-qwen3-v79`") and "\n" not in line


def test_the_twins_reason_says_what_happened(tmp_path: Path) -> None:
    """A driver that dies without a word (as MNN's engine did on the shipped weight-shared binaries) leaves its exit
    code as what it said, and the reason names the weight sharing this x86 library cannot load, not "(no output)"."""
    import types

    from mnnbuild.conform.run import run_driver, twin_reason

    driver = tmp_path / "driver"
    driver.write_text("#!/bin/sh\nkill -SEGV $$\n")
    driver.chmod(0o755)
    (tmp_path / "config.json").write_text("{}")
    build = types.SimpleNamespace(lib_dirs=lambda: [])
    run, rows, output = run_driver(driver, build, tmp_path / "config.json", [1, 2], 1, 4, tmp_path / "x.f32")  # type: ignore[arg-type]
    assert run is None and rows is None and output.strip() == "(exit code -11)"
    reason = twin_reason(output, ["qnn/graphllm0.bin", "qnn/graphllm1.bin"])
    assert reason == (
        "MNN's engine failed on the shipped binaries: (exit code -11); 2 of them share their weights, which this x86 "
        "QNN library cannot load: their unshared twins ran in their place"
    )
    refused = twin_reason("QnnContext: Shared weights buffer isn't supported on this platform\n(exit code 1)", [])
    assert refused.startswith("the x86 QNN library refuses the shipped weight-shared binaries")
