"""Faults the other fault tests never tried (a fresh-eyes audit): each used to end in a traceback, a signal death, a
hang or a wrong file blamed, and is now one line naming the file and field, or refused before it does harm."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
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


EAGLE_DIR = TINY_MODEL_DIR.parent / "tiny-qwen3-eagle"


def _eagle_copy(tmp_path: Path, **config: object) -> Path:
    model = _model_copy(tmp_path, EAGLE_DIR)
    path = model / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return model


def _resolve(model: Path) -> object:
    from mnnbuild.manifests.fetch import FetchParams
    from mnnbuild.model.modeldir import validate_model_dir
    from mnnbuild.stages.fetch import speculation_of

    part, files = validate_model_dir(model)
    return speculation_of(model, str(model), part, FetchParams(family="llm", files=tuple(files)))


@pytest.mark.parametrize(
    ("damage", "config", "expected"),
    [
        ({"eagle_d2t.mnn": b""}, {}, "eagle_d2t.mnn: 0 bytes is too small for an MNN model"),
        ({}, {"eagle_d2t": "eagle.mnn"}, "eagle.mnn: expected one int32 tensor of draft -> target id offsets"),
        ({}, {"eagle_model": "tokenizer.mtok"}, "tokenizer.mtok: not an MNN model"),
        (
            {},
            {"eagle_model": "llm.mnn"},
            "llm.mnn: config.json field 'eagle_model' names a graph without",
        ),
        ({}, {"eagle_depth": 10**12}, "config.json: field 'eagle_depth' must be a positive integer at most 64"),
        ({}, {"eagle_topk": 65}, "config.json: field 'eagle_topk' must be a positive integer at most 64"),
    ],
    ids=["empty-d2t", "graph-as-d2t", "tokenizer-as-draft", "target-as-draft", "depth-10e12", "topk-65"],
)
def test_eagle_draft_files_are_read_as_the_engine_reads_them(
    tmp_path: Path, damage: dict[str, bytes], config: dict[str, object], expected: str
) -> None:
    """fetch checked only draft files named ``*.mnn`` and never ``eagle_d2t``: an empty d2t passed and io died of a
    SIGSEGV blamed on llm.mnn; a tokenizer named as the draft graph was shipped; an Eagle tree of depth 10^12 passed
    fetch and never ended the runtime's draft loop."""
    model = _eagle_copy(tmp_path, **config)
    for name, data in damage.items():
        (model / name).write_bytes(data)
    with pytest.raises(ModelDirError) as info:
        _resolve(model)
    assert f"{model}/{expected}" in str(info.value), str(info.value)


def test_a_d2t_that_maps_past_the_models_vocabulary_is_refused(tmp_path: Path) -> None:
    """MNN's engine adds ``d2t[d]`` to a draft id and embeds the result unchecked."""
    from mnnbuild.mnn import load_model, save_model

    model = _eagle_copy(tmp_path)
    graph = load_model(model / "eagle_d2t.mnn")
    blob = graph.ops[0].main
    blob.int32s = [10**6] * len(blob.int32s)
    save_model(graph, model / "eagle_d2t.mnn")
    with pytest.raises(ModelDirError, match=r"eagle_d2t.mnn: maps draft ids to target ids 1000000\.\.1001023, but"):
        _resolve(model)


RUNTIME_PROBE = """
import sys
from mnnbuild_runtime import BundleError, Tokenizer
from mnnbuild_runtime.speculative import speculation_config
try:
    speculation_config(sys.argv[1])
    Tokenizer(sys.argv[1])
except BundleError as exc:
    print(f"BundleError: {exc}")
"""


@pytest.mark.parametrize(
    ("damage", "config", "expected"),
    [
        ({"eagle_d2t.mnn": b""}, {}, "eagle_d2t.mnn: 0 bytes is too small for an MNN model"),
        ({"eagle_d2t.mnn": (EAGLE_DIR / "eagle_d2t.mnn").read_bytes()[:200]}, {}, "eagle_d2t.mnn: truncated or not"),
        ({}, {"eagle_depth": 10**12}, "config.json: field 'eagle_depth' must be a positive int at most 64"),
        ({}, {"eagle_topk": 10**12}, "config.json: field 'eagle_topk' must be a positive int at most 64"),
    ],
    ids=["empty-d2t", "truncated-d2t", "depth-10e12", "topk-10e12"],
)
def test_the_runtime_reads_eagle_settings_before_mnn_does(
    tmp_path: Path, damage: dict[str, bytes], config: dict[str, object], expected: str
) -> None:
    """An empty or truncated d2t killed the runtime's process with SIGSEGV in MNN's loader (the Tokenizer loads the
    model by its config); ``eagle_topk`` 10^12 asked numpy for a 1 TiB mask and ``eagle_depth`` 10^12 never ended."""
    model = _eagle_copy(tmp_path, **config)
    for name, data in damage.items():
        (model / name).write_bytes(data)
    proc = subprocess.run(
        [sys.executable, "-c", RUNTIME_PROBE, str(model / "config.json")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"died with {proc.returncode}: {proc.stderr[-500:]}"
    assert f"BundleError: {model}/{expected}" in proc.stdout, proc.stdout + proc.stderr[-500:]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"MNNBUILD_SCHEDULER": "junk"}, "MNNBUILD_SCHEDULER='junk': expected a Dask scheduler address"),
        ({"MNNBUILD_SCHEDULER": "tcp://[::1"}, "MNNBUILD_SCHEDULER='tcp://[::1': expected a Dask scheduler address"),
        ({"MNNBUILD_SCHEDULER": "tcp://h:99999"}, "MNNBUILD_SCHEDULER='tcp://h:99999': expected a Dask scheduler"),
        ({"MNNBUILD_SCHEDULER": "zzz://h:1"}, "MNNBUILD_SCHEDULER='zzz://h:1': expected a Dask scheduler address"),
        *(
            ({"MNNBUILD_SCHEDULER": "tcp://h:8786", "MNNBUILD_SCHEDULER_TIMEOUT": t}, f"TIMEOUT={t!r}: expected a")
            for t in ("inf", "nan", "-5", "0", "abc")
        ),
    ],
)
def test_scheduler_settings_are_checked_before_dask_sees_them(env: dict[str, str], expected: str) -> None:
    """``junk`` made Dask's Client fail after it started, wait 20 s to close and print a TimeoutError traceback;
    a timeout of inf or nan was a KeyError out of Dask, -5 "could not convert string to float: '1-5.0'"."""
    from mnnbuild.base.errors import ClusterError
    from mnnbuild.cluster.client import Cluster

    with pytest.raises(ClusterError, match=re.escape(expected)):
        Cluster.from_env(env)


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:8786", "127.0.0.1:8786", "tls://h.example:1", "tcp://[::1]:8786"])
def test_scheduler_addresses_dask_takes_are_taken(address: str) -> None:
    from mnnbuild.cluster.client import Cluster

    cluster = Cluster.from_env({"MNNBUILD_SCHEDULER": address, "MNNBUILD_SCHEDULER_TIMEOUT": "2.5"})
    assert cluster is not None and cluster.address == address and cluster.timeout == 2.5


def test_a_boolean_in_chunk_limits_is_no_length(tmp_path: Path) -> None:
    """JSON ``true`` is a Python int: ``chunk_limits [128, true]`` passed as length 1, which MNN's engine reads with
    ``GetInt`` on a bool."""
    from mnnbuild_runtime import Bundle, BundleError

    model = tmp_path / "bundle"
    model.mkdir()
    (model / "config_qnn.json").write_text(json.dumps({"llm_model": "qnn/llm.mnn", "chunk_limits": [128, True]}))
    with pytest.raises(BundleError, match=r"field 'chunk_limits' must be a list of positive ints, got \[128, True\]"):
        Bundle.open(model)


@pytest.mark.parametrize(("flag", "value"), [("--jobs", "0"), ("--jobs", "-3"), ("--max-new-tokens", "-1"),
                                             ("--max-new-tokens", "many")])  # fmt: skip
def test_conform_counts_are_checked_before_the_mnn_build(tmp_path: Path, flag: str, value: str) -> None:
    """A count the MNN build or the engine cannot use was only found after the ~15-minute build: now argparse's
    one usage line, before anything runs."""
    run = subprocess.run(
        [sys.executable, "-m", "mnnbuild", "conform", "tiny-qwen3-v79", flag, value, "--out", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert re.search(f"argument {flag}: expected a whole number >= 1, got '?{re.escape(value)}'?$", run.stderr.strip())
    assert "Traceback" not in run.stderr and not (tmp_path / "c").exists()


@pytest.mark.parametrize("ratio", ["Infinity", "NaN", "true", "-1", "0"])
def test_the_chain_gates_stored_reference_must_be_a_finite_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ratio: str
) -> None:
    """chain.json's stored reference ratio is the gate's yardstick when no reference tree is given: JSON's Infinity
    passed as a positive number and let any chain through, `true` passed as 1."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_chain.py"
    spec = importlib.util.spec_from_file_location("bench_chain_under_test", path)
    assert spec is not None and spec.loader is not None
    bench_chain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_chain)
    (tmp_path / "chain.json").write_text(f'{{"reference": {{"ratio": {ratio}, "commit": "9f73eb1"}}}}')
    monkeypatch.setattr(bench_chain, "RESULTS", tmp_path)
    with pytest.raises(SystemExit, match="field 'reference' must hold a positive number 'ratio'"):
        bench_chain.read_reference()
