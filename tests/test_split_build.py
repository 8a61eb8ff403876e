"""Convolutions over ``max_plugin_parameters``, through doit: a model's lm_head is built as two plugins (each
context holds half its weights), the bundle joins them on the CPU and `doit verify` proves it; turning the split
on rebuilds the lm_head's plugins only; convolutions split inside every layer verify too."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mnnbuild.manifests.context import ContextManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.mnn import load_model
from mnnbuild.pipeline.layout import REPORT_PAGE
from mnnbuild.stages.verify import REPORT_JSON, VerifyManifest
from mnnbuild.verify.report import VerifyReport
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR, doit, executed_tasks

pytestmark = pytest.mark.slow  # every test here runs doit, a bundle or a whole model

NAME = "qwen3-untied-int8-b32"  # its lm_head (98304 weights) is bigger than any layer's plugin (< 80000)
ARCH = "v79"
LIMIT = 90000
SPLIT = "split/llm.mnn"


def write_spec(specs: Path, limit: int | None) -> None:
    extra = f"max_plugin_parameters = {limit}\n" if limit is not None else ""
    (specs / f"{NAME}.toml").write_text(
        f'name = "{NAME}"\nsource = {{ local = "{FIXTURE_MODELS / NAME}" }}\nchunk_size = 128\n'
        f'targets = ["{ARCH}"]\n{extra}'
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], subprocess.CompletedProcess[str]]:
    """The bundle built without a split, then the spec's limit set and `doit report` (verify and its page) run:
    (artifacts, the tasks the second run executed, its process)."""
    cwd = tmp_path_factory.mktemp("split")
    specs = cwd / "specs"
    specs.mkdir()
    env = {"MNNBUILD_MODELS_PATH": str(specs)}
    write_spec(specs, None)
    first = doit(cwd, f"bundle:{NAME}-{ARCH}", env=env)
    assert first.returncode == 0, f"doit bundle failed:\n{first.stdout}\n{first.stderr}"
    write_spec(specs, LIMIT)
    proc = doit(cwd, f"report:{NAME}-{ARCH}", env=env)  # verify, then its page
    assert proc.returncode == 0, f"doit report failed:\n{proc.stdout}\n{proc.stderr}"
    return cwd / "artifacts" / NAME, executed_tasks(proc.stdout), proc


def test_the_split_lm_head_verifies(built: tuple[Path, list[str], subprocess.CompletedProcess[str]]) -> None:
    root, _, _ = built
    partition = PartitionManifest.read(root / "partition")
    assert partition.params.max_plugin_parameters == LIMIT
    parts = [p for p in partition.plugins if p.split_model]
    assert [p.split_model for p in parts] == [SPLIT, SPLIT] and parts == partition.plugins[-2:]
    out = root / ARCH / "verify"
    assert VerifyManifest.read(out).passed
    report = VerifyReport.model_validate_json((out / REPORT_JSON).read_text(encoding="utf-8"))
    assert report.passed and len(report.plugins) == len(partition.plugins)
    assert {g.graph for g in report.graphs} >= {g for p in parts for g in p.graphs}  # each part run and checked
    assert report.generation is not None and report.generation.hybrid_tokens == report.generation.cpu_tokens
    # the device's graph joins the parts on the CPU
    bundled = load_model(next((root / ARCH / "bundle" / "model").glob("*/qnn/llm.mnn")))
    assert bundled.op_by_name("/lm/lm_head/Linear#concat").type == "Concat"
    assert len(bundled.ops_of_type("Plugin")) == len(partition.plugins)
    page = (root / ARCH / "report" / REPORT_PAGE).read_text(encoding="utf-8")
    assert 'class="verdict pass"' in page and all(p.path in page for p in parts)


def test_only_the_split_plugins_read_the_split_model(
    built: tuple[Path, list[str], subprocess.CompletedProcess[str]],
) -> None:
    root, _, _ = built
    partition = PartitionManifest.read(root / "partition")
    for p in partition.plugins:
        inputs = {r.path for r in ContextManifest.read(root / ARCH / "context" / Path(p.path).stem).inputs}
        assert (f"partition/{SPLIT}" in inputs) == (p.split_model is not None), p.path


def test_turning_the_split_on_rebuilds_only_the_lm_head(
    built: tuple[Path, list[str], subprocess.CompletedProcess[str]],
) -> None:
    root, executed, _ = built
    partition = PartitionManifest.read(root / "partition")
    contexts = sorted(t for t in executed if t.startswith("context:"))
    # the layers' graph dirs came out byte-identical: their contexts are not built again (early cutoff)
    assert contexts == sorted(f"context:{NAME}-{ARCH}:{Path(p.path).stem}" for p in partition.plugins[-2:])
    assert f"partition:{NAME}" in executed and f"bundle:{NAME}-{ARCH}" in executed


def test_convolutions_split_inside_every_layer_verify(tmp_path: Path) -> None:
    """A limit under each MLP conv of the tiny model (32768 weights) splits convolutions inside every layer, so
    every later op indexes the split model, and CPU Concats sit between plugins mid-layer: still a bundle that
    `doit verify` passes."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "tiny-split.toml").write_text(
        f'name = "tiny-split"\nsource = {{ local = "{TINY_MODEL_DIR}" }}\nchunk_size = 128\ntargets = ["{ARCH}"]\n'
        "max_plugin_parameters = 30000\n"
    )
    proc = doit(tmp_path, f"verify:tiny-split-{ARCH}", env={"MNNBUILD_MODELS_PATH": str(specs)})
    assert proc.returncode == 0, f"doit verify failed:\n{proc.stdout}\n{proc.stderr}"
    root = tmp_path / "artifacts" / "tiny-split"
    partition = PartitionManifest.read(root / "partition")
    split = [p for p in partition.plugins if p.split_model]
    assert len(split) > len(partition.plugins) // 2  # everything after layer 0's first split conv
    assert VerifyManifest.read(root / ARCH / "verify").passed
    joins = [op for op in load_model(root / "partition" / "qnn" / "llm.mnn").ops if op.name.endswith("#concat")]
    assert len(joins) == 7  # gate, up, down of both layers and the lm_head
