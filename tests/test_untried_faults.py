"""Faults the other fault tests never tried (a fresh-eyes audit): each used to end in a traceback, a signal death, a
hang or a wrong file blamed, and is now one line naming the file and field, or refused before it does harm."""

from __future__ import annotations

import json
import os
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


# ---- lookahead's settings and lookup file ------------------------------------------------------------

TRAINED_DIR = TINY_MODEL_DIR.parent / "tiny-qwen3-trained"
STRICTNESS = "must be one of 'low', 'medium', 'high' (MNN's engine runs its default 'low' for anything else)"
RULE = "must be one of 'freqxlen', 'fcfs' (MNN's engine runs its default 'freqxlen' for anything else)"
KEY = "must be a positive int and at most 8 (the engine's longest key)"
LOOKAHEAD_FAULTS = [
    ("draft_match_strictness", "odd", STRICTNESS),
    ("draft_match_strictness", "HIGH", STRICTNESS),
    ("draft_match_strictness", None, STRICTNESS),
    ("draft_selection_rule", "FCFS", RULE),
    ("draft_selection_rule", 1, RULE),
    ("ngram_match_maxlen", True, KEY),
    ("ngram_match_maxlen", 0, KEY),
    ("ngram_match_maxlen", 10**12, KEY),
    ("ngram_match_maxlen", "4", KEY),
    ("ngram_update", 1, "must be true or false"),
    ("ngram_update", None, "must be true or false"),
]
DRAFT_LENGTH_FAULTS = [("draft_predict_length", v, "must be a positive integer at most 64") for v in (10**12, 65)]
"""Read from the config alone, as every reader of it does (an ``llm_config.json`` one is under Not checked)."""


def _lookahead_model(tmp_path: Path, config_name: str, llm: dict[str, object], **config: object) -> Path:
    """The trained tiny model set to lookahead, ``config`` in ``config_name`` and ``llm`` in ``llm_config.json``."""
    model = _model_copy(tmp_path, TRAINED_DIR)
    settings = {**json.loads((model / "config.json").read_text()), "speculative_type": "lookahead", **config}
    (model / config_name).write_text(json.dumps(settings))
    llm_path = model / "llm_config.json"
    llm_path.write_text(json.dumps({**json.loads(llm_path.read_text()), **llm}))
    return model


def _lookahead_problem(model: Path, side: str, links: bool = False) -> str:
    """The one line fetch (``build``: the model dir's config.json) or the runtime (its config_qnn.json) says."""
    from mnnbuild_runtime import BundleError
    from mnnbuild_runtime.lookahead import LookaheadSettings

    error = ModelDirError if side == "build" else BundleError
    with pytest.raises(error) as info:
        if side == "build":
            _resolve(model)
        else:
            LookaheadSettings.of(model / "config_qnn.json", links=links)
    return str(info.value)


@pytest.mark.parametrize("side", ["build", "runtime"])
@pytest.mark.parametrize(
    ("field", "value", "rule", "in_llm_config"),
    [(*fault, False) for fault in LOOKAHEAD_FAULTS + DRAFT_LENGTH_FAULTS] + [(*f, True) for f in LOOKAHEAD_FAULTS],
    ids=[f"config.json:{f}={v!r}" for f, v, _ in LOOKAHEAD_FAULTS + DRAFT_LENGTH_FAULTS]
    + [f"llm_config.json:{f}={v!r}" for f, v, _ in LOOKAHEAD_FAULTS],
)
def test_lookahead_settings_the_engine_cannot_run_are_one_line(
    tmp_path: Path, side: str, field: str, value: object, rule: str, in_llm_config: bool
) -> None:
    """fetch took every lookahead setting as it came and the config stage shipped it (`ngram_match_maxlen` 10^12
    overruns the engine's 8-key array, a misspelt rule ran the default while the bundle said otherwise, a
    `draft_predict_length` of 10^12 never ended the runtime's draft loop); the runtime ran an unknown strictness or
    rule as the default and never looked at `llm_config.json`, whose fields win in the engine."""
    config_name = "config.json" if side == "build" else "config_qnn.json"
    overrides = {field: value}
    model = _lookahead_model(tmp_path, config_name, overrides if in_llm_config else {},
                             **({} if in_llm_config else overrides))  # fmt: skip
    where = model / ("llm_config.json" if in_llm_config else config_name)
    assert _lookahead_problem(model, side) == f"{where}: field {field!r} {rule}, got {value!r}"


def test_the_bundle_says_the_lookahead_settings_the_engine_runs(tmp_path: Path) -> None:
    """MNN's engine merges `llm_config.json` into the config, so its `ngram_match_maxlen` wins: config_qnn.json
    said config.json's (the engine's default 4) while the engine ran 2."""
    from mnnbuild.model.speculation import model_lookahead_settings
    from mnnbuild.stages.config import speculative_entries

    model = _lookahead_model(tmp_path, "config.json", {"ngram_match_maxlen": 2}, draft_selection_rule="fcfs")
    speculation = _resolve(model)
    entries = speculative_entries(speculation, json.loads((model / "config.json").read_text()),  # type: ignore[arg-type]
                                  model_lookahead_settings(model)[0])  # fmt: skip
    assert (entries["ngram_match_maxlen"], entries["draft_selection_rule"]) == (2, "fcfs")


LOOKUP_FAULTS = {
    "directory": "the lookup file is not a regular file (a directory, FIFO or device); expected a text file of prior "
    "text, or none",
    "fifo": "the lookup file is not a regular file (a directory, FIFO or device); expected a text file of prior text, "
    "or none",
    "dev-zero": "the lookup file is not a regular file (a directory, FIFO or device); expected a text file of prior "
    "text, or none",
    "over-1-MiB": "the lookup file holds 1048577 bytes, more than the 1048576 taken (MNN's engine reads it whole and "
    "counts its n-grams at every generation); expected prior text of at most 1 MiB",
    "not-utf8": "the lookup file is not UTF-8 text (byte 2: b'\\xff'); expected prior text for the tokenizer",
}


@pytest.mark.parametrize("side", ["build", "runtime"])
@pytest.mark.parametrize("kind", list(LOOKUP_FAULTS))
def test_lookup_files_the_engine_cannot_read_are_one_line_without_waiting(tmp_path: Path, side: str, kind: str) -> None:
    """The lookup file MNN's engine reads whole at every generation when it is there: a FIFO made its ifstream wait
    for ever and `/dev/zero` never ends; fetch skipped such a file silently and the runtime did too, shipped a
    3 GiB one (the runtime read it whole: killed after 30 s) and ended in a UnicodeDecodeError traceback on bytes
    that are no UTF-8. (A link to one is refused in a bundle already; a fetched model dir's files are links.)"""
    import signal

    model = _lookahead_model(tmp_path, "config.json" if side == "build" else "config_qnn.json", {})
    lookup = model / "lookup_file.txt"
    if kind == "directory":
        lookup.mkdir()
    elif kind == "fifo":
        os.mkfifo(lookup)
    elif kind == "dev-zero":
        lookup.symlink_to("/dev/zero")
    elif kind == "over-1-MiB":
        with lookup.open("wb") as fh:
            fh.truncate((1 << 20) + 1)
    else:
        lookup.write_bytes(b"ab\xff\xfe")

    def hung(*_: object) -> None:
        raise TimeoutError(f"reading the {kind} lookup file did not return")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        got = _lookahead_problem(model, side, links=kind == "dev-zero")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    field = "config.json" if side == "build" else "config_qnn.json"
    assert got == f"{lookup}: {LOOKUP_FAULTS[kind]} ({field} field 'lookup_file')"
