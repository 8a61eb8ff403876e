"""Faults the other fault tests never tried (a fresh-eyes audit): each used to end in a traceback, a signal death, a
hang or a wrong file blamed, and is now one line naming the file and field, or refused before it does harm."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mnnbuild.base.errors import ModelDirError, UpstreamError
from tests.conftest import TINY_MODEL_DIR

DEEP = "[" * 100_000 + "]" * 100_000
"""JSON nested deeper than Python's recursion limit: ``json.loads`` raises RecursionError, not ValueError."""


def _model_copy(tmp_path: Path, src: Path = TINY_MODEL_DIR) -> Path:
    model = tmp_path / src.name
    shutil.copytree(src, model)
    return model


@pytest.mark.parametrize("name", ["config.json", "llm_config.json"])
def test_json_nested_too_deep_in_a_model_dir_is_one_line(tmp_path: Path, name: str) -> None:
    from mnnbuild.model.modeldir import validate_model_dir

    model = _model_copy(tmp_path)
    (model / name).write_text(f'{{"a": {DEEP}}}')
    with pytest.raises(ModelDirError, match=f"^{model / name}: not valid JSON: nested deeper than a JSON reader goes"):
        validate_model_dir(model)


def test_json_nested_too_deep_in_a_bundle_config_is_one_line(tmp_path: Path) -> None:
    from mnnbuild_runtime import BundleError
    from mnnbuild_runtime.bundle import read_config

    config = tmp_path / "config_qnn.json"
    config.write_text(f'{{"llm_model": {DEEP}}}')
    with pytest.raises(BundleError, match=f"^{config}: not valid JSON: nested deeper than a JSON reader goes"):
        read_config(config)


@pytest.mark.parametrize(("text", "problem"), [("[1, 2]", "expected a JSON object, got list"), (DEEP, "nested deeper")])
def test_a_manifest_that_is_no_json_object_is_one_line(tmp_path: Path, text: str, problem: str) -> None:
    """A manifest holding a list was ``AttributeError: 'list' object has no attribute 'get'`` and a deeply nested one
    a RecursionError, both tracebacks out of doit; a stage reading it now says which file (and doit builds it
    again, as for any manifest that does not read)."""
    from mnnbuild.manifests.io import IoManifest

    path = tmp_path / IoManifest.filename()
    path.write_text(text)
    with pytest.raises(UpstreamError, match=f"^{path}: .*{problem}"):
        IoManifest.read(tmp_path)


def test_origin_records_and_stage_markers_nested_too_deep_read_as_none(tmp_path: Path) -> None:
    from mnnbuild.base.fsutil import made_by_mnnbuild
    from mnnbuild.pipeline.layout import origin_file
    from mnnbuild.pipeline.origin import read_origin

    (tmp_path / origin_file("io")).write_text(DEEP)
    assert read_origin(tmp_path, "io") == {}
    assert not made_by_mnnbuild(tmp_path)
