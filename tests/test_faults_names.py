"""Trust, third and fourth rounds: names read from records (an origin record's cache key, ``npu_postreat.json``'s
binaries, a bundle manifest's model name, a bundle config handed to MNN's engine, an HF lock, a plugin's binary
stem) never lead a read, write or delete outside the artifact root, the cache or the bundle; malformed records
(and driver results, model flatbuffers) are one line, not a traceback or a giant allocation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mnnbuild.base.errors import Unavailable
from mnnbuild.pipeline.cache import ArtifactCache, CacheTiers, Tier
from mnnbuild.pipeline.origin import write_origin


def _cache_with_entry(tmp_path: Path, stage: str = "io") -> ArtifactCache:
    cache = ArtifactCache(str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    cache.store(stage, "k", src)
    return cache


def test_an_origin_records_cache_key_cannot_delete_a_file_outside_the_cache(tmp_path: Path) -> None:
    """A deferred dir's origin record names its cache key, which became ``<cache>/<stage>/<key>.json``: the key
    ``../../victim/notes`` read the user's ``victim/notes.json``, found it no entry and "discarded" it."""
    from mnnbuild.pipeline.deferred import materialize
    from mnnbuild.stages.chain import CHAIN

    cache = _cache_with_entry(tmp_path, "fetch")
    victim = tmp_path / "victim" / "notes.json"
    victim.parent.mkdir()
    victim.write_text('{"mine": true}\n')
    out_dir = tmp_path / "art" / "m" / "model"
    out_dir.mkdir(parents=True)
    write_origin(out_dir, "fetch", {"origin": "cache", "deferred": True, "key": "../../victim/notes"})
    with pytest.raises(Unavailable):
        materialize(CHAIN["fetch"], out_dir, CacheTiers([Tier("local", cache)]))
    assert victim.read_text() == '{"mine": true}\n', "a file outside the cache was deleted"


@pytest.mark.parametrize("key", ["../../victim/notes", "a/b", "/abs"])
def test_a_cache_key_that_is_no_entry_name_is_refused_by_the_cache(tmp_path: Path, key: str) -> None:
    """The cache names an entry ``<stage>/<key>.json``; a key with a ``/`` writes, reads or deletes elsewhere."""
    cache = _cache_with_entry(tmp_path)
    (tmp_path / "victim").mkdir()
    victim = tmp_path / "victim" / "notes.json"
    victim.write_text("not an entry")
    src = tmp_path / "src"
    assert cache.store("io", key, src) == 0
    assert not cache.has("io", key)
    assert cache.restore("io", key, tmp_path / "out") is None
    assert victim.read_text() == "not an entry"
    assert not (tmp_path / "abs.json").exists() and not Path("/abs.json").exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"merge": {"/etc/hostname": ["qnn/graphllm0"]}}', "field 'merge': path '/etc/hostname' must be relative"),
        ('{"merge": {"qnn/../../x.bin": ["qnn/graphllm0"]}}', "field 'merge': path 'qnn/../../x.bin' must be relative"),
        ('{"merge": {"qnn/graphllm0.bin": [0]}}', "field 'merge' must map a binary path to a list of graph dirs"),
        ("[]", "expected a JSON object with field 'merge', got list"),
        ("{}", "field 'merge' missing"),
    ],
    ids=["absolute", "dotdot", "int-graph", "list", "missing"],
)
def test_merge_binaries_are_paths_inside_the_partition(tmp_path: Path, text: str, expected: str) -> None:
    """A merge key is a binary's path in the model dir (``qnn/graphllm0.bin``): the bundle copied
    ``<context plugin dir> / key`` (``/etc/hostname`` itself) into the bundle, conform hashed ``<bundle> / key``.
    A JSON list stopped every reader with a TypeError traceback."""
    from mnnbuild.base.errors import MnnbuildError
    from mnnbuild.manifests.partition import read_merge

    (tmp_path / "npu_postreat.json").write_text(text)
    with pytest.raises(MnnbuildError) as caught:
        read_merge(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / 'npu_postreat.json'}: {expected}"), caught.value


def _bundle_manifest_naming(bundle_dir: Path, model_name: str) -> Path:
    """A bundle manifest as the bundle stage writes it, but for ``model_name`` (written as a file would be edited)."""
    from mnnbuild.manifests.bundle import BundleManifest, BundleParams
    from mnnbuild.model.targets import soc_by_name

    bundle_dir.mkdir(parents=True, exist_ok=True)
    params = BundleParams(soc=soc_by_name("SM8750"))
    path = BundleManifest(model="m", target="v79", params=params, model_name="plain", qnn_build="b").write(bundle_dir)
    path.write_text(path.read_text().replace('"model_name": "plain"', f'"model_name": {json.dumps(model_name)}'))
    return path


@pytest.mark.parametrize("name", ["../../../elsewhere", "/tmp", "a/b", ""])
def test_a_bundle_manifests_model_name_is_a_plain_directory_name(tmp_path: Path, name: str) -> None:
    """verify opened ``<bundle>/model/<model_name>`` as the bundle, so ``../../../elsewhere`` loaded and ran a model
    outside it (only conform checked the name)."""
    from mnnbuild.base.errors import UpstreamError
    from mnnbuild.manifests.bundle import BundleManifest

    path = _bundle_manifest_naming(tmp_path / "bundle", name)
    with pytest.raises(UpstreamError) as caught:
        BundleManifest.read(tmp_path / "bundle")
    message = str(caught.value)
    assert message.startswith(f"{path}: invalid bundle manifest: field 'model_name': "), message
    assert "\n" not in message


def _conform_refusal(tmp_path: Path, bundle: Path, original: Path, partition: Path) -> str:
    """What conform refuses the bundle with (a ConformError), checked to come before its report dir is claimed."""
    from mnnbuild.base.errors import ConformError
    from mnnbuild.conform.run import conform_model
    from mnnbuild.model.targets import soc_by_name

    out_dir = tmp_path / "conform"
    with pytest.raises(ConformError) as caught:
        conform_model(
            model="m", arch="v79", soc=soc_by_name("SM8750"), bundle_model_dir=bundle, original_dir=original,
            context_dir=tmp_path, twin_dir=tmp_path, partition_dir=partition, out_dir=out_dir,
            build=None, driver=tmp_path / "driver",  # type: ignore[arg-type] - refused before any build is used
        )  # fmt: skip
    assert not out_dir.exists(), "refused before the report dir is claimed"
    return str(caught.value)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"tmp_path": "/tmp/elsewhere"}, "field 'tmp_path' is not supported"),
        ({"llm_model": "../../../elsewhere/llm.mnn"}, "field 'llm_model': path '../../../elsewhere/llm.mnn' must be"),
    ],
    ids=["tmp_path", "llm_model"],
)
def test_conform_hands_mnns_engine_no_bundle_config_naming_files_outside(
    tmp_path: Path, config: dict[str, object], expected: str
) -> None:
    """conform gave MNN's engine the bundle's config_qnn.json as it read it (a copy, beside links to the bundle's
    files): ``tmp_path`` made the engine write its memory-mapped files there, a file field read one outside the
    bundle. verify's runtime refuses both (`check_config_files`); conform now opens the bundle as the runtime does,
    before anything is written or run."""
    bundle = tmp_path / "bundle" / "model" / "m"
    bundle.mkdir(parents=True)
    (bundle / "config_qnn.json").write_text(json.dumps({"chunk_limits": [128], **config}))
    (bundle / "prompt.txt").write_text("hi")
    original = tmp_path / "original"
    original.mkdir()
    (original / "config.json").write_text("{}")
    message = _conform_refusal(tmp_path, bundle, original, tmp_path)
    assert expected in message and str(bundle) in message, message


@pytest.mark.parametrize("field", ["model_file", "weight_file"])
@pytest.mark.parametrize("name", ["../../../../elsewhere.mnn", "/tmp/llm.mnn", "qnn/llm.mnn"])
def test_a_fetch_manifests_part_names_files_of_the_model_dir(tmp_path: Path, field: str, name: str) -> None:
    """The fetch manifest's ``part`` says which files of the model dir the chain converts: io and partition read
    ``<model dir>/<model_file>`` and the partition saved ``<its dir>/qnn/<model_file>`` and ``split/<model_file>``,
    so ``../../../../elsewhere.mnn`` read and wrote outside the artifact root. fetch only ever writes a plain name
    (config.json's ``llm_model``, checked when fetched); one read back is checked too."""
    from mnnbuild.base.errors import UpstreamError
    from mnnbuild.manifests.fetch import FetchManifest, FetchParams, SourceRecord

    source = SourceRecord(kind="local", location=str(tmp_path))
    path = FetchManifest(model="m", params=FetchParams(), source=source).write(tmp_path)
    data = json.loads(path.read_text())
    data["part"][field] = name
    path.write_text(json.dumps(data))
    with pytest.raises(UpstreamError) as caught:
        FetchManifest.read(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{path}: invalid fetch manifest: field 'part.{field}': "), message
    assert "\n" not in message


@pytest.mark.parametrize("field", ["reference_input", "reference_output", "folded_values"])
def test_a_graph_records_reference_files_are_files_of_its_graph_dir(tmp_path: Path, field: str) -> None:
    """A partition graph dir's graph.json names its reference and folded-value files; the lowering and verify read
    ``<graph dir>/<name>`` as MNN variables, so ``../../../elsewhere.mnn`` was read from outside the partition."""
    from mnnbuild.base.errors import UnsafePathError
    from mnnbuild.partition.records import SubgraphRecord

    empty: dict[str, list[object]] = {k: [] for k in ("ops", "inputs", "outputs", "internal", "folded", "constants")}
    record = SubgraphRecord(
        graph="graphllm0", plugin=0, shape_index=0, binary="qnn/graphllm0.bin", source_model="llm.mnn",
        **empty, **{field: "../../../elsewhere.mnn"},  # type: ignore[arg-type]
    )  # fmt: skip
    graph_dir = tmp_path / "partition" / "qnn" / "graphllm0"
    graph_dir.mkdir(parents=True)
    with pytest.raises(UnsafePathError, match=f"graph.json: field '{field}': path '../../../elsewhere.mnn'"):
        record.load_reference(graph_dir) if field != "folded_values" else record.load_folded(graph_dir)


@pytest.mark.parametrize(
    ("graphs", "expected"),
    [
        (["../../../elsewhere"], "field 'graphs': path '../../../elsewhere' must be relative"),
        ([], "field 'graphs' lists no graph"),
    ],
    ids=["outside", "empty"],
)
def test_the_page_report_reads_a_plugins_graph_inside_the_partition(
    tmp_path: Path, graphs: list[str], expected: str
) -> None:
    """The page report read ``<partition>/qnn/<first graph of partition.json>/graph.json``: a graph name with ``..``
    was read from outside, and a plugin listing none stopped the report with an IndexError traceback."""
    from mnnbuild.base.errors import MnnbuildError
    from mnnbuild.stages import report

    with pytest.raises(MnnbuildError, match=expected):
        report.plugin_graph_dir(tmp_path, "plugin0", graphs)


def test_a_manifest_or_graph_record_with_a_wrong_field_is_one_line(tmp_path: Path) -> None:
    """An invalid manifest or graph.json raised pydantic's dump: a line per field, a line per URL, in the task's
    failure line. Now one line naming each field."""
    from mnnbuild.base.errors import UpstreamError
    from mnnbuild.manifests.bundle import BundleManifest
    from mnnbuild.partition.records import GRAPH_FILE, SubgraphRecord

    path = _bundle_manifest_naming(tmp_path / "bundle", "plain")
    data = json.loads(path.read_text())
    data["qnn_build"], data["outputs"] = 5, [{"path": 1}]
    path.write_text(json.dumps(data))
    with pytest.raises(UpstreamError) as caught:
        BundleManifest.read(tmp_path / "bundle")
    assert str(caught.value) == (
        f"{path}: invalid bundle manifest: field 'outputs.0.path': Input should be a valid string (got 1); "
        "field 'outputs.0.size': Field required; field 'outputs.0.sha256': Field required; "
        "field 'qnn_build': Input should be a valid string (got 5)"
    )
    (tmp_path / "graph").mkdir()
    (tmp_path / "graph" / GRAPH_FILE).write_text('{"graph": 0}')
    with pytest.raises(UpstreamError) as caught:
        SubgraphRecord.read(tmp_path / "graph")
    assert str(caught.value).startswith(f"{tmp_path / 'graph' / GRAPH_FILE}: invalid graph description: field 'graph'")
    assert "\n" not in str(caught.value)


def test_a_manifest_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    """A directory where the manifest should be (or a file it may not read) raised IsADirectoryError from the read."""
    from mnnbuild.base.errors import UpstreamError
    from mnnbuild.manifests.bundle import BundleManifest

    (tmp_path / BundleManifest.filename()).mkdir()
    with pytest.raises(UpstreamError) as caught:
        BundleManifest.read(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / BundleManifest.filename()}: cannot read the manifest (Is a directory); the bundle stage must be "
        "re-run"
    )


@pytest.mark.parametrize("binary", ["qnn/...bin", "qnn/..bin"])
def test_a_plugin_binary_names_a_plugin_dir_of_its_own(tmp_path: Path, binary: str) -> None:
    """A plugin's context and twin dirs are ``<arch>/context/<binary's stem>``: ``qnn/...bin`` is a file name inside
    the partition, but its stem is ``..``, so the context task's dir was the target dir itself (only
    ``check_replaceable`` kept it from being written over; the report, verify and conform read its manifests there),
    and ``qnn/..bin`` (stem ``.``) the group dir."""
    from mnnbuild.base.errors import StageError, UpstreamError
    from mnnbuild.manifests.partition import read_merge
    from mnnbuild.stages import report

    (tmp_path / "npu_postreat.json").write_text(json.dumps({"merge": {binary: ["qnn/graphllm0"]}}))
    with pytest.raises(UpstreamError) as caught:
        read_merge(tmp_path)
    expected = f"{tmp_path / 'npu_postreat.json'}: field 'merge': binary {binary!r} names no plugin dir"
    assert str(caught.value).startswith(expected), caught.value
    plugin = {"plugin": 0, "name": binary, "graphs": ["graphllm0"], "op_count": 1, "op_types": {}, "first_op": "a",
              "last_op": "a", "inputs": [], "outputs": [], "weight_bytes": 0, "parameters": 0}  # fmt: skip
    partition = {"model": "m", "sample_shapes": [1], "source_ops": 1, "needed_ops": 1, "folded_ops": 0,
                 "plugins": [plugin], "cpu_ops": [], "npu_op_count": 1, "npu_weight_bytes": 0,
                 "total_weight_bytes": 0, "result_ops": 1, "max_abs_diff": [0.0]}  # fmt: skip
    (tmp_path / "partition.json").write_text(json.dumps(partition))
    from mnnbuild.partition.records import PartitionReport

    with pytest.raises(StageError) as read:
        report._read_json_model(tmp_path / "partition.json", PartitionReport, "partition.json")
    assert "field 'plugins.0.name': binary" in str(read.value) and "\n" not in str(read.value), read.value


def test_conform_names_a_shipped_binary_the_bundle_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """conform hashes each binary ``npu_postreat.json`` names in the bundle (``<bundle>/qnn/graphllm0.bin``): a
    bundle without it stopped conform with a FileNotFoundError traceback, after it had claimed its report dir."""
    import mnnbuild_runtime
    import mnnbuild_runtime.bundle

    from tests.conftest import TINY_MODEL_DIR

    bundle = tmp_path / "bundle" / "model" / "m"
    bundle.mkdir(parents=True)
    (bundle / "prompt.txt").write_text("hi")
    opened = type("Opened", (), {"config": {"chunk_limits": [128, 1]}})()
    monkeypatch.setattr(mnnbuild_runtime.Bundle, "open", classmethod(lambda cls, *a, **k: opened))
    monkeypatch.setattr(mnnbuild_runtime.bundle, "check_engine_files", lambda *a, **k: None)
    partition = tmp_path / "partition"
    partition.mkdir()
    (partition / "npu_postreat.json").write_text('{"merge": {"qnn/graphllm0.bin": ["qnn/graphllm0"]}}')
    message = _conform_refusal(tmp_path, bundle, TINY_MODEL_DIR, partition)
    assert message.startswith(f"bundle {bundle}: cannot read its plugin binary 'qnn/graphllm0.bin' (No such file"), (
        message
    )
    assert message.endswith("run `doit bundle:m-v79`") and "\n" not in message


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ('{"stepped": ["a"], "generated": [1], "text": "x", "load_s": 0, "prefill_s": 0, "decode_s": 0, '
         '"generate_s": 0}', "invalid result line: field 'stepped.0': Input should be a valid integer"),
        ('{"stepped": [1], "generated": [1]}', "invalid result line: field 'text': Field required"),
        ('{"stepped": [1, 2], "generated": [1], "text": "x", "load_s": 0, "prefill_s": 0, "decode_s": 0, '
         '"generate_s": 0}', "2 stepped tokens and 8 logits in x.f32; expected 1 and a row each"),
    ],
    ids=["string-token", "missing-field", "more-tokens"],
)  # fmt: skip
def test_a_malformed_driver_result_is_a_failed_run_of_one_line(tmp_path: Path, result: str, expected: str) -> None:
    """conform read the driver's result fields as they came (``doc["stepped"]``): a missing one was a KeyError
    traceback, a token that is no number went into the report, and more tokens than logits rows a reshape error."""
    import types

    from mnnbuild.conform.run import run_driver

    driver = tmp_path / "driver"
    logits = tmp_path / "x.f32"
    driver.write_text(f"#!/bin/sh\nhead -c 32 /dev/zero > {logits}\necho '{result}'\n")
    driver.chmod(0o755)
    (tmp_path / "config.json").write_text("{}")
    build = types.SimpleNamespace(lib_dirs=lambda: [])
    run, rows, output = run_driver(driver, build, tmp_path / "config.json", [1, 2], 1, 4, logits)  # type: ignore[arg-type]
    assert run is None and rows is None
    assert output.splitlines()[-1].startswith(f"{driver}: {expected}"), output


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\xff\xfe{", "invalid lock file: 'utf-8' codec can't decode byte 0xff"),
        (b"{", "invalid lock file: field '(top level)': Invalid JSON: EOF while parsing an object"),
        (b'{"repo": "a/b", "revision": "main", "commit": 5}', "invalid lock file: field 'commit': Input should be a"),
        (b'{"repo": "a/b", "revision": "main", "commit": "../../../../victim"}', "field 'commit': String should"),
    ],
    ids=["not-utf8", "not-json", "int-commit", "dotdot-commit"],
)
def test_an_hf_lock_file_is_read_as_one_line_naming_the_field(tmp_path: Path, content: bytes, expected: str) -> None:
    """``models/<name>.lock.json`` pins the commit fetch downloads: a file that is not UTF-8 stopped fetch with a
    UnicodeDecodeError traceback, a wrong field was pydantic's first message without its field, and any string
    was taken as the commit (huggingface-hub looks a name that is no commit hash up in ``<its cache>/refs/<name>``:
    ``../../../../victim`` read a file outside its cache)."""
    from mnnbuild.base.errors import ModelDirError
    from mnnbuild.model.spec import HfSource
    from mnnbuild.stages.fetch import read_lock

    lock = tmp_path / "m.lock.json"
    lock.write_bytes(content)
    with pytest.raises(ModelDirError) as caught:
        read_lock(lock, HfSource(hf="a/b"))
    message = str(caught.value)
    assert message.startswith(f"{lock}: ") and expected in message and "\n" not in message, message
    assert message.endswith("; delete it to re-resolve")


@pytest.mark.parametrize("revision", ["../../../../victim", "/etc", "a//b", ""])
def test_an_hf_sources_revision_is_a_ref_name(tmp_path: Path, revision: str) -> None:
    """A spec's ``revision`` went to huggingface-hub as is, which keeps a branch's commit in ``<its cache>/refs/
    <revision>``: ``../../../../victim`` named a file outside its cache, read there offline."""
    from mnnbuild.base.errors import SpecError
    from mnnbuild.model.spec import load_spec

    spec = tmp_path / "m.toml"
    spec.write_text(f'name = "m"\nsource = {{ hf = "a/b", revision = {json.dumps(revision)} }}\ntargets = ["v79"]\n')
    with pytest.raises(SpecError, match=r"field 'source.*revision': expected a branch, tag or commit name"):
        load_spec(spec)


def test_a_validation_error_a_task_or_worker_reports_is_one_line() -> None:
    """A stage entry (or a cluster worker's task) raising pydantic's ValidationError failed with ``error_line``,
    which is the task's failure line and a worker's answer: pydantic's dump, a line per field and per URL."""
    from pydantic import ValidationError

    from mnnbuild.base.errors import error_line
    from mnnbuild.manifests.fetch import HfLock

    with pytest.raises(ValidationError) as caught:
        HfLock.model_validate({"repo": 1, "revision": "main"})
    assert error_line(caught.value) == (
        "ValidationError: invalid HfLock: field 'repo': Input should be a valid string (got 1); "
        "field 'commit': Field required"
    )


def _net_sharing(shared: str, copies: int, size: int) -> bytes:
    """A Net flatbuffer whose ``copies`` tensor names (``shared == "string"``) or ops (``"vector"``) are offsets to
    one string of ``size`` bytes, or one op whose output indexes are a vector of ``size`` ints."""
    import flatbuffers

    from mnnbuild.mnn._generated import mnn_fb as fb

    b = flatbuffers.Builder(0)
    text = b.CreateString("x" * (size if shared == "string" else 1))
    fb.NetStartTensorNameVector(b, copies if shared == "string" else 1)
    for _ in range(copies if shared == "string" else 1):
        b.PrependUOffsetTRelative(text)
    names = b.EndVector()
    op_name = b.CreateString("in")
    fb.OpStartOutputIndexesVector(b, size if shared == "vector" else 1)
    for _ in range(size if shared == "vector" else 1):
        b.PrependInt32(0)
    outputs = b.EndVector()
    fb.OpStart(b)
    fb.OpAddName(b, op_name)
    fb.OpAddOutputIndexes(b, outputs)
    op = fb.OpEnd(b)
    fb.NetStartOplistsVector(b, copies if shared == "vector" else 1)
    for _ in range(copies if shared == "vector" else 1):
        b.PrependUOffsetTRelative(op)
    ops = b.EndVector()
    fb.NetStart(b)
    fb.NetAddOplists(b, ops)
    fb.NetAddTensorName(b, names)
    b.Finish(fb.NetEnd(b))
    return bytes(b.Output())


@pytest.mark.parametrize(
    ("shared", "expected"),
    [("string", "its strings add up to more than its"), ("vector", "its vectors take 4000804 bytes of its 20896")],
)
def test_a_model_whose_offsets_share_its_strings_or_vectors_is_refused(
    tmp_path: Path, shared: str, expected: str
) -> None:
    """A flatbuffer names each string and vector by offset, and nothing stops many offsets naming one: a 50 KB
    ``.mnn`` whose 200 tensor names are one 50 KB string decoded to 10 MB of copies (a 1.4 MB one to 100 GB), and
    the ops sharing one vector of output indexes became a list of ints per op. MNN writes each once."""
    from mnnbuild.base.errors import MNNFormatError
    from mnnbuild.mnn import load_model

    path = tmp_path / "shared.mnn"
    path.write_bytes(_net_sharing(shared, 200, 50_000 if shared == "string" else 5_000))
    with pytest.raises(MNNFormatError) as caught:
        load_model(path)
    assert str(caught.value).startswith(f"{path}: ") and expected in str(caught.value), caught.value
    path.write_bytes(_net_sharing(shared, 1, 50))
    assert load_model(path, check_outputs=False).tensor_names, "the same Net, nothing shared, is read"


def test_names_from_the_model_cannot_put_markup_on_the_page() -> None:
    """The page shows op, tensor, graph, plugin and model names read from the model and its records, in HTML
    (Jinja2, autoescaped) and in inline SVG (`mnnbuild.report.svg`, escaped by hand): none may add an element."""
    from mnnbuild.base.compare import TensorCheck, Tolerance
    from mnnbuild.partition.records import CpuOpReport, PartitionReport, PluginReport
    from mnnbuild.pipeline.manifest import FileRecord
    from mnnbuild.report import OpCell, ReportData
    from mnnbuild.report.data import StageCost
    from mnnbuild.report.render import render_html
    from mnnbuild.verify.verdict import GraphCheck, VerifyReport

    evil = "<script>alert(1)</script>"
    binary = f"qnn/{evil}.bin"
    plugin = PluginReport(plugin=0, name=binary, graphs=[evil], op_count=1, op_types={evil: 1}, first_op=evil,
                          last_op=evil, inputs=[], outputs=[], weight_bytes=10, parameters=10)  # fmt: skip
    partition = PartitionReport(model=evil, sample_shapes=[1], source_ops=2, needed_ops=2, folded_ops=0,
                                plugins=[plugin], cpu_ops=[CpuOpReport(index=1, name=evil, type=evil, reason=evil)],
                                npu_op_count=1, npu_weight_bytes=10, total_weight_bytes=20, result_ops=2,
                                max_abs_diff=[0.0])  # fmt: skip
    output = TensorCheck(name=evil, shape=[1], max_abs_err=0.0, ref_max_abs=1.0, rel_err=0.0, cosine=1.0, passed=True)
    verify = VerifyReport(model=evil, target="v79", soc="SM8750", bundle=evil, passed=False, failures=[evil],
                          headline=[evil], graph_tolerance=Tolerance(), model_tolerance=Tolerance(),
                          executed_note=evil,
                          graphs=[GraphCheck(graph=evil, binary=binary, outputs=[output], passed=True)])  # fmt: skip
    data = ReportData(
        model=evil, target="v79", verify=verify, partition=partition,
        ops=[OpCell(index=0, name=evil, type=evil, where=binary), OpCell(index=1, name=evil, type=evil, where="CPU",
                                                                          reason=evil)],
        plugin_binaries={binary: 100}, bundle_files=[FileRecord(path=evil, size=5, sha256="0" * 64)],
        bundle_path=evil, costs=[StageCost(stage="io", label=evil, status="built", seconds=1.0, peak_rss=1)],
    )  # fmt: skip
    page = render_html(data)
    assert "<svg" in page and evil.replace("<", "&lt;").replace(">", "&gt;") in page, "the names are shown"
    assert "<script" not in page and "alert(1)</" not in page, "a name added markup"
