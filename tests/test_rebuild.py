"""Exact rebuilds on the shipped tiny model: an edit re-runs the stages whose code or inputs it changes, and
a stage whose outputs come out byte-identical stops the rebuild there (early cutoff).

One project copy is built once; each test edits it and checks what the next `doit` runs. Every test first
checks that nothing is left to do, so it only sees its own edit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import Field

from mnnbuild.lowering.ops import REGISTRY
from mnnbuild.lowering.support import CHECKS, LOWERED_OP_TYPES
from mnnbuild.pipeline.fingerprint import DigestMemo, code_fingerprint, module_closure
from mnnbuild.pipeline.manifest import Manifest
from tests.conftest import copy_project, executed_tasks

Build = Callable[[], list[str]]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Build]:
    root = tmp_path_factory.mktemp("rebuild")
    project = copy_project(root / "clone")

    def build() -> list[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
        env.update({"MNNBUILD_ARTIFACTS": str(root / "artifacts"), "HF_HUB_OFFLINE": "1", "MNNBUILD_CACHE": "off"})
        proc = subprocess.run(
            [sys.executable, "-m", "doit", "-f", str(project / "dodo.py")],
            cwd=root, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, f"doit failed:\n{proc.stdout}\n{proc.stderr}"
        return sorted(executed_tasks(proc.stdout))

    first = build()
    assert "partition:tiny-qwen3" in first and any(t.startswith("context:") for t in first)
    return project, build


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_lowering_support_table_matches_the_rules() -> None:
    """The partition asks `support.CHECKS`; the lowering implements `ops.REGISTRY`: the same kinds, the same checks."""
    assert set(CHECKS) == set(REGISTRY)
    assert all(REGISTRY[kind].check is CHECKS[kind] for kind in CHECKS)
    assert LOWERED_OP_TYPES == set(REGISTRY) - {"Const"}


@pytest.mark.slow
def test_a_stage_key_covers_its_own_code_only() -> None:
    """No stage imports another (they share `mnnbuild.manifests`), the CLI, or the lowering rules it does not run."""
    stages = ("fetch", "io", "partition", "modellib", "config", "context", "twin", "bundle", "verify")
    for stage in stages:
        closure = {name for name, _ in module_closure(f"mnnbuild.stages.{stage}")}
        others = {f"mnnbuild.stages.{s}" for s in stages if s != stage}
        assert not closure & others, (stage, closure & others)
        assert "mnnbuild.__main__" not in closure and not any(n.startswith("mnnbuild.dag") for n in closure)
        if stage != "partition":
            assert "mnnbuild.partition.describe" not in closure, stage
    partition = {name for name, _ in module_closure("mnnbuild.stages.partition")}
    assert "mnnbuild.lowering.support" in partition and "mnnbuild.lowering.ops" not in partition


def test_a_stage_key_covers_the_runtime_code_it_runs() -> None:
    """verify runs bundles with mnnbuild_runtime: a change there must rebuild verify (not the bundle)."""
    verify = {name for name, _ in module_closure("mnnbuild.stages.verify")}
    assert {"mnnbuild_runtime.hybrid", "mnnbuild_runtime.generate", "mnnbuild_runtime.plugin"} <= verify
    bundle = {name for name, _ in module_closure("mnnbuild.stages.bundle")}
    assert "mnnbuild_runtime.generate" not in bundle


def test_schema_hash_ignores_descriptions_and_titles() -> None:
    class A(Manifest):
        stage = "probe"
        note: str = Field(default="", description="one wording")

    class B(Manifest):
        stage = "probe"
        note: str = Field(default="", description="another wording", title="Note")

    class C(Manifest):
        stage = "probe"
        note: str = Field(default="", description="one wording")
        extra: int = 0

    assert A.schema_hash() == B.schema_hash()
    assert A.schema_hash() != C.schema_hash()


def test_a_schema_hash_is_remembered_by_code_and_a_bad_entry_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every doit start keys its stages by their manifests' schema hashes: remembered, a run with unchanged code
    # builds no JSON schema; an entry that is not a hash (the memo is in the user cache dir) is made again
    from mnnbuild.manifests.config import ConfigManifest
    from mnnbuild.pipeline import manifest as manifest_module

    memo_file = tmp_path / "memo.json"
    honest = ConfigManifest.schema_hash()
    monkeypatch.setattr(manifest_module, "_SCHEMA_HASHES", {})
    memo = DigestMemo(memo_file)
    assert ConfigManifest.schema_hash(memo) == honest
    memo.save()
    (key,) = [k for k in json.loads(memo_file.read_text()) if k.startswith("schema ") and "ConfigManifest" in k]
    assert key.endswith(code_fingerprint(ConfigManifest.__module__)), "keyed by the code that makes the schema"

    made: list[str] = []

    def make(cls: type[Manifest]) -> str:
        made.append(cls.__name__)
        return honest

    monkeypatch.setattr(ConfigManifest, "_make_schema_hash", classmethod(make))
    monkeypatch.setattr(manifest_module, "_SCHEMA_HASHES", {})  # as a new process starts
    assert ConfigManifest.schema_hash(DigestMemo(memo_file)) == honest and made == []
    for bad in ("not a hash", "A" * 16, 16, ["0" * 16]):
        memo_file.write_text(json.dumps({key: bad}))
        manifest_module._SCHEMA_HASHES.clear()
        made.clear()
        assert ConfigManifest.schema_hash(DigestMemo(memo_file)) == honest and made == ["ConfigManifest"], bad


def test_code_digest_ignores_docs_not_code(tmp_path: Path) -> None:
    def digest(source: str) -> str:
        path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.py"
        path.write_text(source)
        return DigestMemo(None).digest(path)

    base = digest(
        '"""Doc."""\nfrom pydantic import Field\nX = Field(default=1, description="a")\n\ndef f():\n    return 1\n'
    )
    same = digest(
        '"""Other doc."""\n# a comment\nfrom pydantic import Field\n'
        'X = Field(default=1, description="b", title="T")\n\n'
        'def f():\n    """Why."""\n    return 1  # one\n'
    )
    changed = digest(
        '"""Doc."""\nfrom pydantic import Field\nX = Field(default=2, description="a")\n\ndef f():\n    return 1\n'
    )
    assert base == same
    assert base != changed


def test_memo_sees_an_edit(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("X = 1\n")
    memo = DigestMemo(tmp_path / "memo.json")
    first = memo.digest(path)
    memo.save()
    path.write_text("X = 22\n")  # another size: a new entry even within the mtime granularity
    assert DigestMemo(tmp_path / "memo.json").digest(path) != first


def test_memo_serves_a_fresh_clone_without_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # keyed by content: the same source elsewhere (a new clone, new mtimes) is a hit, not a parse
    from mnnbuild.pipeline import fingerprint

    original = tmp_path / "a" / "m.py"
    original.parent.mkdir()
    original.write_text("X = 1\n")
    memo = DigestMemo(tmp_path / "memo.json")
    first = memo.digest(original)
    memo.save()
    clone = tmp_path / "b" / "m.py"
    clone.parent.mkdir()
    clone.write_text("X = 1\n")

    def no_parse(path: Path) -> str:
        raise AssertionError(f"parsed {path}")

    monkeypatch.setattr(fingerprint, "_source_digest", no_parse)
    assert DigestMemo(tmp_path / "memo.json").digest(clone) == first


def test_a_memo_import_that_is_not_a_module_name_is_parsed_again(tmp_path: Path) -> None:
    # the memo is read from the user cache dir: an entry naming a path (which would make the closure read a file
    # outside our packages) is not believed; the source is parsed again instead
    from mnnbuild.pipeline.fingerprint import _content_sha

    memo_file = tmp_path / "memo.json"
    memo = DigestMemo(memo_file)
    (name, path), *_ = module_closure("mnnbuild.base.sizes", memo)
    honest = memo.imports(path, name)
    memo.save()
    entries = json.loads(memo_file.read_text())
    key = f"imports {name} {_content_sha(path)}"
    for bad in (["mnnbuild./etc/passwd"], ["mnnbuild..x"], [3], "mnnbuild"):
        memo_file.write_text(json.dumps({**entries, key: bad}))
        assert DigestMemo(memo_file).imports(path, name) == honest, bad


@pytest.mark.slow
def test_description_change_invalidates_nothing(clone: tuple[Path, Build]) -> None:
    project, build = clone
    assert build() == []
    edit(
        project / "mnnbuild" / "pipeline" / "manifest.py",
        'description="Model name from the spec."',
        'description="The model."',
    )
    edit(project / "mnnbuild" / "manifests" / "context.py", '"""context: ', '"""context (reworded): ')
    assert build() == []


@pytest.mark.slow
def test_report_formatter_edit_rebuilds_no_context(clone: tuple[Path, Build]) -> None:
    project, build = clone
    assert build() == []
    edit(
        project / "mnnbuild" / "partition" / "describe.py",
        'f"partition of {report.model}',
        'f"partition report of {report.model}',
    )
    ran = build()
    # partition's code changed, so it re-runs; its report differs, its graph files do not: the contexts depend on
    # those files (not on the partition manifest), so no context binary is rebuilt
    assert "partition:tiny-qwen3" in ran
    assert not [t for t in ran if t.startswith("context:")], ran
    assert not {"fetch:tiny-qwen3", "io:tiny-qwen3", "config:tiny-qwen3-v79"} & set(ran)


@pytest.mark.slow
def test_partition_code_change_with_identical_outputs_reruns_partition_only(clone: tuple[Path, Build]) -> None:
    project, build = clone
    assert build() == []
    src = project / "mnnbuild" / "stages" / "partition.py"
    src.write_text(src.read_text() + "\n\ndef _unused() -> int:\n    return 1\n")
    assert build() == ["partition:tiny-qwen3"]


@pytest.mark.slow
def test_cli_edit_rebuilds_nothing(clone: tuple[Path, Build]) -> None:
    project, build = clone
    assert build() == []
    src = project / "mnnbuild" / "__main__.py"
    src.write_text(src.read_text() + "\n\ndef _unused() -> int:\n    return 2\n")
    assert build() == []


@pytest.mark.slow
def test_new_context_manifest_field_invalidates_its_writer_and_readers(clone: tuple[Path, Build]) -> None:
    project, build = clone
    assert build() == []
    edit(
        project / "mnnbuild" / "manifests" / "context.py",
        "    weight_shared: bool\n",
        "    weight_shared: bool\n    note: str = ''\n",
    )
    ran = build()
    contexts = [t for t in ran if t.startswith("context:tiny-qwen3-v79:")]
    assert contexts, ran
    # written by context, read by bundle, verify and report (its cost table); nothing else
    assert ran == sorted([*contexts, "bundle:tiny-qwen3-v79", "verify:tiny-qwen3-v79", "report:tiny-qwen3-v79"])


@pytest.mark.slow
def test_new_twin_manifest_field_rebuilds_twins_and_verify_not_the_bundle(clone: tuple[Path, Build]) -> None:
    project, build = clone
    assert build() == []
    edit(
        project / "mnnbuild" / "manifests" / "twin.py",
        "    soc_type: str | None\n",
        "    soc_type: str | None\n    note: str = ''\n",
    )
    ran = build()
    twins = [t for t in ran if t.startswith("twin:tiny-qwen3-v79:")]
    assert len(twins) == 4, ran
    # written by twin, read by verify only (and the page of verify's new results): no context, no bundle
    assert ran == sorted([*twins, "verify:tiny-qwen3-v79", "report:tiny-qwen3-v79"])


@pytest.mark.slow
def test_lowering_rule_edit_rebuilds_contexts_onwards(clone: tuple[Path, Build]) -> None:
    project, build = clone
    assert build() == []
    # a lowering change that alters the QNN graphs (node names) but not their results
    edit(
        project / "mnnbuild" / "lowering" / "ops.py",
        'ctx.node("Reshape", [ctx.input(op.inputs[0])], [ctx.output(op.outputs[0])])',
        'ctx.node("Reshape", [ctx.input(op.inputs[0])], [ctx.output(op.outputs[0])], suffix="r")',
    )
    ran = build()
    contexts = [t for t in ran if t.startswith("context:tiny-qwen3-v79:")]
    twins = [t for t in ran if t.startswith("twin:tiny-qwen3-v79:")]
    assert contexts and len(twins) == len(contexts), ran
    # and the page of verify's new results
    expected = [*contexts, *twins, "bundle:tiny-qwen3-v79", "verify:tiny-qwen3-v79"]
    assert ran == sorted([*expected, "report:tiny-qwen3-v79"])


@pytest.mark.slow
def test_changing_only_chunk_sizes_reruns_io_onward(clone: tuple[Path, Build]) -> None:
    """A prefill length more changes the io samples, so every stage from io on; the order the lengths are written
    in changes nothing (graphs are named longest first, and MNN sorts ``chunk_limits`` itself)."""
    project, build = clone
    assert build() == []
    spec = project / "models" / "tiny-qwen3.toml"
    edit(spec, "chunk_size = 128", "chunk_sizes = [128, 32]")
    ran = build()
    contexts = [t for t in ran if t.startswith("context:tiny-qwen3-v79:")]
    twins = [t for t in ran if t.startswith("twin:tiny-qwen3-v79:")]
    assert contexts and len(twins) == len(contexts), ran
    after_io = ["io:tiny-qwen3", "partition:tiny-qwen3", "config:tiny-qwen3-v79"]
    assert ran == sorted(
        [*after_io, *contexts, *twins, "bundle:tiny-qwen3-v79", "verify:tiny-qwen3-v79", "report:tiny-qwen3-v79"]
    )
    edit(spec, "chunk_sizes = [128, 32]", "chunk_sizes = [32, 128]")
    assert build() == []


@pytest.mark.slow
def test_a_model_config_edit_rebuilds_no_binary(clone: tuple[Path, Build]) -> None:
    """The context and twin stages depend on the fetched model and weight files (through the partition's
    ``lowered_from.json``), not on the whole fetch: a sampler setting in config.json changes the bundle's config,
    not a graph."""
    project, build = clone
    assert build() == []
    edit(project / "models" / "tiny-qwen3" / "config.json", '"temperature": 0.8', '"temperature": 0.7')
    ran = build()
    assert {"fetch:tiny-qwen3", "partition:tiny-qwen3", "config:tiny-qwen3-v79", "bundle:tiny-qwen3-v79"} <= set(ran)
    assert not [t for t in ran if t.startswith(("context:", "twin:"))], ran
