"""modellib, context, twin and bundle (issue 5): real HTP context binaries for the tiny model, read back.

The context and twin stages lower the partition graphs themselves; the model-lib is `doit modellib`'s, built
here on the same root after the bundle (`modellib` fixture) and checked to compose the very same binaries."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.base.errors import MnnbuildError
from mnnbuild.base.fsutil import sha256_file
from mnnbuild.lowering.graph import QnnRefusal, compose_context, read_graph_description, read_graph_dirs
from mnnbuild.manifests.context import ContextManifest
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.manifests.plugin import plugin_sources
from mnnbuild.manifests.twin import TwinManifest
from mnnbuild.mnn import load_model, plugin_attributes
from mnnbuild.model.targets import soc_by_name
from mnnbuild.partition.records import SubgraphRecord
from mnnbuild.plugin.compose import compose_in_fresh_process
from mnnbuild.qnn import HtpTarget, QnnLibrary, load_context, read_binary_info, same_element_order
from mnnbuild.stages.bundle import BundleManifest
from mnnbuild.stages.context import ContextInputs, ContextParams, build_context
from mnnbuild.stages.modellib import ModellibManifest
from mnnbuild.stages.twin import TwinInputs, TwinParams, build_twin
from mnnbuild.verify.report import VerifyReport
from tests.conftest import PROJECT_ROOT, executed_tasks

DTYPES = {1: "float32", 3: "int32"}  # MNN DataType -> numpy


def run_task(root: Path, task: str) -> subprocess.CompletedProcess[str]:
    """`doit <task>` with artifacts in ``root`` (cache off)."""
    env = {**os.environ, "MNNBUILD_ARTIFACTS": str(root), "MNNBUILD_CACHE": "off"}
    proc = subprocess.run(
        [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), task],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[Path]]:
    """`doit bundle:tiny-qwen3-v79` on a fresh root: the root, the tasks it ran and the twin dirs right after."""
    root = tmp_path_factory.mktemp("ctx") / "artifacts"
    proc = run_task(root, "bundle:tiny-qwen3-v79")
    return root, executed_tasks(proc.stdout), list((root / "tiny-qwen3").rglob("twin"))


@pytest.fixture(scope="module")
def built(bundled: tuple[Path, list[str], list[Path]]) -> Path:
    """The artifact root after `doit bundle:tiny-qwen3-v79`."""
    return bundled[0]


@pytest.fixture(scope="module")
def modellib(bundled: tuple[Path, list[str], list[Path]]) -> Path:
    """Then `doit modellib:tiny-qwen3` on the same root: the model-lib dir (no bundle or verify builds one)."""
    root = bundled[0]
    ran = executed_tasks(run_task(root, "modellib:tiny-qwen3").stdout)
    assert ran == ["modellib:tiny-qwen3"], ran
    return root / "tiny-qwen3" / "modellib"


@pytest.fixture(scope="module")
def verified(bundled: tuple[Path, list[str], list[Path]]) -> tuple[Path, list[str]]:
    """Then `doit verify:tiny-qwen3-v79` on the same root: the root and the tasks it ran."""
    root = bundled[0]
    return root, executed_tasks(run_task(root, "verify:tiny-qwen3-v79").stdout)


@pytest.mark.slow
def test_a_bundle_builds_no_twin_and_verify_builds_them(
    bundled: tuple[Path, list[str], list[Path]], verified: tuple[Path, list[str]]
) -> None:
    """The twins are verify's alone: a bundle on a fresh root runs no twin task and writes no twin dir; the
    verify after it builds one twin per plugin (and nothing of the bundle's again) and passes."""
    root, bundle_ran, twin_dirs = bundled
    assert "bundle:tiny-qwen3-v79" in bundle_ran and any(t.startswith("context:") for t in bundle_ran)
    assert not [t for t in bundle_ran if t.startswith("twin:")], bundle_ran
    assert twin_dirs == [], "no twin dir after a bundle"
    # the contexts lower the partition graphs themselves: no model-lib is written for a bundle or a verify
    _, verify_ran = verified
    assert not [t for t in bundle_ran + verify_ran if t.startswith("modellib")], bundle_ran + verify_ran
    twins = sorted(t for t in verify_ran if t.startswith("twin:tiny-qwen3-v79:"))
    assert twins == sorted(f"twin:tiny-qwen3-v79:{Path(a['path']).stem}" for a in plugins(root))
    assert "verify:tiny-qwen3-v79" in verify_ran
    assert not [t for t in verify_ran if t.startswith(("context:", "bundle:"))], verify_ran
    report = VerifyReport.model_validate_json((root / "tiny-qwen3" / "v79" / "verify" / "verify.json").read_text())
    assert report.passed and {p.executed for p in report.plugins} == {"override"}


@pytest.fixture(scope="module")
def lib() -> QnnLibrary:
    return QnnLibrary()


def bundle_dir(root: Path) -> Path:
    return root / "tiny-qwen3" / "v79" / "bundle" / "model" / "tiny-qwen3"


def plugins(root: Path) -> list[dict]:
    model = load_model(bundle_dir(root) / "qnn" / "llm.mnn")
    return [plugin_attributes(op) for op in model.ops if op.type == "Plugin"]


@pytest.mark.slow
def test_bundle_layout_and_manifest(built: Path) -> None:
    model_dir = bundle_dir(built)
    names = {p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file()}
    expected = {"config_qnn.json", "llm_config.json", "tokenizer.mtok", "llm.mnn.weight", "prompt.txt", "qnn/llm.mnn"}
    assert expected <= names
    binaries = {n for n in names if n.startswith("qnn/graph")}
    assert binaries == {p["path"] for p in plugins(built)}
    config = json.loads((model_dir / "config_qnn.json").read_text())
    assert config["chunk_limits"] == [128, 1] and config["tokenizer_file"] == "tokenizer.mtok"
    manifest = BundleManifest.read(model_dir.parent.parent)
    assert manifest.qnn_build.startswith("v2.") and manifest.target == "v79"
    for rec in manifest.outputs:
        assert sha256_file(model_dir.parent.parent / rec.path) == rec.sha256
    push = (model_dir.parent.parent / "push.sh").read_text()
    assert "libQnnHtpV79Stub.so" in push and "hexagon-v79/unsigned/libQnnHtpV79Skel.so" in push
    release = ".".join(manifest.qnn_build.lstrip("v").split(".")[:3])
    assert f"\nneed={release}  #" in push, "push.sh checks the SDK against the QNN that built the binaries"


@pytest.mark.slow
def test_binaries_hold_the_plugin_graphs(built: Path, lib: QnnLibrary) -> None:
    """Each graphllm<k>.bin holds allGraphName in order, with the plugin's IO names, shapes and dtypes."""
    attrs = plugins(built)
    assert len(attrs) >= 2
    for attr in attrs:
        info = read_binary_info(lib, (bundle_dir(built) / attr["path"]).read_bytes())
        assert info.graph_names == attr["allGraphName"]
        info.check_target(69, 79)
        assert info.soc_type and "SM8750" in info.soc_type
        assert info.weight_shared
        shapes = iter(attr["allInputShape"])
        for s, graph in enumerate(info.graphs):
            assert [t.name for t in graph.inputs] == attr["inputs"]
            assert [t.name for t in graph.outputs] == attr["outputs"]
            for t in graph.inputs:
                assert same_element_order(t.dims, [next(shapes) for _ in t.dims])  # 1s may move: same bytes
            for j, t in enumerate(graph.outputs):
                blob = attr[f"o_{s}_{j}"]
                assert same_element_order(t.dims, [int(d) for d in blob.dims])
                assert np.dtype(t.dtype) == np.dtype(DTYPES[blob.dataType])
        assert next(shapes, None) is None


def context_dir(root: Path, binary: str) -> Path:
    return root / "tiny-qwen3" / "v79" / "context" / Path(binary).stem


def twin_dir(root: Path, binary: str) -> Path:
    return root / "tiny-qwen3" / "v79" / "twin" / Path(binary).stem


@pytest.mark.slow
def test_each_plugin_has_an_unshared_twin_the_bundle_does_not_ship(
    verified: tuple[Path, list[str]], lib: QnnLibrary
) -> None:
    """The twin stage writes each binary's unshared twin (what the x86 simulator can load) in a dir per plugin
    and records its sha256: the same graphs, tensors and target, without weight sharing, built from the very files
    the shipped binary was (its graph dirs and the model's weights). The bundle ships none."""
    built = verified[0]
    fetch = FetchManifest.read(built / "tiny-qwen3" / "model")
    partition = PartitionManifest.read(built / "tiny-qwen3" / "partition")
    for attr in plugins(built):
        where = twin_dir(built, attr["path"])
        manifest = TwinManifest.read(where)
        assert manifest.binary == attr["path"] and manifest.twin == Path(attr["path"]).name
        assert manifest.graphs == attr["allGraphName"] and manifest.target == "v79"
        graphs = [f"qnn/{g}" for g in attr["allGraphName"]]
        sources = {r.path for r in manifest.inputs}
        assert {"fetch/llm.mnn", "fetch/llm.mnn.weight", *(f"partition/{g}/graph.json" for g in graphs)} <= sources
        own = {Path(p).parent.as_posix() for p in sources if p.startswith("partition/qnn/")}
        assert own == {f"partition/{g}" for g in graphs}, "its own graph dirs only"
        assert sources - {p for p in sources if p.startswith("partition/qnn/")} == {
            "fetch/llm.mnn",
            "fetch/llm.mnn.weight",
            "partition/lowered_from.json",
        }
        assert manifest.inputs == plugin_sources(fetch, partition, graphs)
        assert ContextManifest.read(context_dir(built, attr["path"])).inputs == manifest.inputs
        twin_file = where / manifest.twin
        assert manifest.output(manifest.twin).sha256 == sha256_file(twin_file)
        twin = read_binary_info(lib, twin_file.read_bytes())
        shipped = read_binary_info(lib, (context_dir(built, attr["path"]) / attr["path"]).read_bytes())
        assert shipped.weight_shared and not twin.weight_shared
        twin.check_target(69, 79)
        assert twin.graph_names == shipped.graph_names == attr["allGraphName"]
        for a, b in zip(twin.graphs, shipped.graphs, strict=True):
            assert [(t.name, list(t.dims)) for t in (*a.inputs, *a.outputs)] == [
                (t.name, list(t.dims)) for t in (*b.inputs, *b.outputs)
            ]
    shipped_files = [p.name for p in (built / "tiny-qwen3" / "v79" / "bundle").rglob("*") if p.is_file()]
    assert not [n for n in shipped_files if "twin" in n]
    assert sorted(n for n in shipped_files if n.endswith(".bin")) == sorted(
        Path(a["path"]).name for a in plugins(built)
    )


@pytest.mark.slow
def test_graphs_match_their_references_in_the_simulator(verified: tuple[Path, list[str]], lib: QnnLibrary) -> None:
    """Every graph, run in the x86 HTP simulator (the unshared twin of its plugin's context), reproduces
    the partition's reference outputs: cosine >= 0.999, max abs error <= 2% of the reference max."""
    built = verified[0]
    partition = built / "tiny-qwen3" / "partition"
    for attr in plugins(built):
        where = twin_dir(built, attr["path"])
        twin = (where / TwinManifest.read(where).twin).read_bytes()
        with load_context(lib, twin) as runner:
            for graph in attr["allGraphName"]:
                record = SubgraphRecord.read(partition / "qnn" / graph)
                ins, outs = record.load_reference(partition / "qnn" / graph)
                got = runner.execute(graph, {t.qnn_name: a for t, a in zip(record.inputs, ins, strict=True)})
                for t, ref in zip(record.outputs, outs, strict=True):
                    out = got[t.qnn_name].reshape(ref.shape).astype(np.float64)
                    ref = ref.astype(np.float64)
                    scale = float(np.abs(ref).max())
                    if scale == 0.0:  # e.g. sin at position 0: the output must be zero too
                        assert float(np.abs(out).max()) <= 1e-3, f"{graph} {t.qnn_name}: expected zeros"
                        continue
                    cos = float(out.ravel() @ ref.ravel() / (np.linalg.norm(out) * np.linalg.norm(ref)))
                    err = float(np.abs(out - ref).max() / scale)
                    assert cos >= 0.999 and err <= 0.02, f"{graph} {t.qnn_name}: cosine {cos}, rel max err {err}"


@pytest.mark.slow
def test_weight_sharing_keeps_one_copy(modellib: Path, lib: QnnLibrary) -> None:
    """decode + prefill in one shared context is at most 1.2x the prefill graph alone."""
    manifest = ModellibManifest.read(modellib)
    biggest = max(manifest.graphs, key=lambda g: g.static_bytes)
    decode, prefill = f"qnn/graphllm{biggest.plugin}", f"qnn/graphllm1_{biggest.plugin}"
    target = HtpTarget(69, 79)
    shared = compose_context(lib, target, read_graph_dirs(modellib, [decode, prefill]), weight_sharing=True)
    alone = compose_context(lib, target, read_graph_dirs(modellib, [prefill]), weight_sharing=True)
    unshared = compose_context(lib, target, read_graph_dirs(modellib, [decode, prefill]), weight_sharing=False)
    assert len(shared) <= 1.2 * len(alone), (len(shared), len(alone))
    assert len(unshared) > len(shared)


@pytest.mark.slow
def test_decode_and_prefill_name_weights_alike(modellib: Path) -> None:
    modellib = modellib / "qnn"
    decode, prefill = read_graph_description(modellib / "graphllm0"), read_graph_description(modellib / "graphllm1_0")
    d = {t.name: t.raw for t in decode.static_tensors}
    p = {t.name: t.raw for t in prefill.static_tensors}
    shared = set(d) & set(p)
    assert any(n.endswith(".weight") for n in shared)
    for name in shared:
        assert (modellib / "graphllm0" / d[name]).read_bytes() == (modellib / "graphllm1_0" / p[name]).read_bytes()
        # stored once on disk: the prefill graph's raw is a hard link to the decode graph's
        assert os.path.samefile(modellib / "graphllm0" / d[name], modellib / "graphllm1_0" / p[name])


@pytest.mark.slow
def test_modellib_writes_each_weight_once(modellib: Path) -> None:
    """The graph dir (graph.json + raws) is the whole model-lib: no second copy of the weights, each stored in
    fp16 (QNN float32 tensors, widened exactly when composed; the test below shows the binary is the same)."""
    files = [p for p in modellib.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix == ".bin"], "no tar of the raws beside them"
    raws = [p for p in files if p.suffix == ".raw"]
    desc = read_graph_description(modellib / "qnn" / "graphllm0")
    weights = [t for t in desc.static_tensors if t.name.endswith(".weight")]
    assert weights and all(t.dtype == "float32" and t.storage == "float16" for t in weights)
    for t in weights:
        assert (modellib / "qnn" / "graphllm0" / str(t.raw)).stat().st_size == 2 * int(np.prod(t.dims))
    others = [t for t in desc.static_tensors if not t.name.endswith(".weight")]
    assert others and all(t.storage is None for t in others), "biases, norms and constants keep their type"
    # bytes on disk: the weights of each plugin once, although both of its graphs list them
    on_disk = sum({(p.stat().st_dev, p.stat().st_ino): p.stat().st_size for p in raws}.values())
    decode_graphs = [d for d in (modellib / "qnn").iterdir() if not d.name.startswith("graphllm1_")]
    assert on_disk < 1.05 * sum(p.stat().st_size for d in decode_graphs for p in d.glob("*.raw"))


@pytest.mark.slow
def test_the_modellib_composes_the_shipped_binaries(built: Path, modellib: Path) -> None:
    """The model-lib a user hands to QNN tools holds the graphs the bundle ships: every plugin composed from its
    graph dirs (raws read back) is byte for byte the binary the context stage lowered and composed in memory."""
    soc = soc_by_name("SM8750")
    target = HtpTarget(soc.soc_id, soc.arch_number, soc.vtcm_mb)
    for attr in plugins(built):
        graphs = [f"qnn/{g}" for g in attr["allGraphName"]]
        dest = modellib.parent / "from-modellib" / attr["path"]
        compose_in_fresh_process(target, functools.partial(read_graph_dirs, modellib, graphs), True, dest)
        assert dest.read_bytes() == (context_dir(built, attr["path"]) / attr["path"]).read_bytes(), attr["path"]


@pytest.mark.slow
def test_fp16_stored_weights_give_the_same_binary(modellib: Path, tmp_path: Path) -> None:
    """Weights stored in fp16 cost the HTP nothing: the context composed from the modellib is byte for byte the
    one composed from the same graphs with every raw widened back to float32 (QNN rounds float32 weights to fp16
    as numpy does). Declared as float16 tensors instead, QNN would prepare other kernels: not what we do."""
    import shutil

    from mnnbuild.lowering.graph import GRAPH_JSON, read_static

    wide = tmp_path / "wide"
    shutil.copytree(modellib, wide)
    graphs = ["qnn/graphllm0", "qnn/graphllm1_0"]
    widened = 0
    for g in graphs:
        desc = read_graph_description(wide / g)
        for t in desc.static_tensors:
            if t.storage is not None:
                data = read_static(wide / g, t)
                (wide / g / str(t.raw)).unlink()  # a hard link to the other graph's raw: replace, not overwrite
                data.astype("<f4").tofile(wide / g / str(t.raw))
                widened += 1
        plain = [t.model_copy(update={"storage": None}) for t in desc.tensors]
        (wide / g / GRAPH_JSON).write_text(desc.model_copy(update={"tensors": plain}).model_dump_json())
    assert widened >= 2
    soc = soc_by_name("SM8750")
    target = HtpTarget(soc.soc_id, soc.arch_number, soc.vtcm_mb)
    compose_in_fresh_process(target, functools.partial(read_graph_dirs, modellib, graphs), True, tmp_path / "fp16.bin")
    compose_in_fresh_process(target, functools.partial(read_graph_dirs, wide, graphs), True, tmp_path / "fp32.bin")
    assert (tmp_path / "fp16.bin").read_bytes() == (tmp_path / "fp32.bin").read_bytes()


@pytest.mark.slow
def test_v75_build(built: Path, tmp_path: Path, lib: QnnLibrary) -> None:
    soc = soc_by_name("SM8650")
    inputs = ContextInputs(model="tiny-qwen3", model_dir=built / "tiny-qwen3" / "model",
                           partition_dir=built / "tiny-qwen3" / "partition",
                           binary="qnn/graphllm0.bin", graphs=["qnn/graphllm0", "qnn/graphllm1_0"])  # fmt: skip
    manifest = build_context(inputs, ContextParams(soc=soc), tmp_path / "ctx")
    assert sorted(p.relative_to(tmp_path / "ctx").as_posix() for p in (tmp_path / "ctx").rglob("*.bin")) == [
        "qnn/graphllm0.bin"
    ], "the context stage composes the shipped binary only"
    info = read_binary_info(lib, (tmp_path / "ctx" / "qnn" / "graphllm0.bin").read_bytes())
    info.check_target(57, 75)
    assert manifest.target == "v75" and manifest.tools["QNN"].startswith("v2.") and info.weight_shared
    twin_inputs = TwinInputs(**inputs.model_dump())
    twin_manifest = build_twin(twin_inputs, TwinParams(soc=soc), tmp_path / "twin")
    twin = read_binary_info(lib, (tmp_path / "twin" / "graphllm0.bin").read_bytes())
    twin.check_target(57, 75)
    assert not twin.weight_shared and twin.graph_names == info.graph_names == twin_manifest.graphs
    assert twin_manifest.target == "v75" and twin_manifest.params.soc == soc


@pytest.mark.slow
def test_refused_graph_names_graph_op_and_qnn_message(modellib: Path, tmp_path: Path, lib: QnnLibrary) -> None:
    import shutil

    shutil.copytree(modellib, tmp_path / "modellib")
    modellib = tmp_path / "modellib"
    graph_json = modellib / "qnn" / "graphllm1_0" / "graph.json"
    desc = json.loads(graph_json.read_text())
    node = next(n for n in desc["nodes"] if n["type"] == "Conv2d")
    node["type"] = "NoSuchQnnOp"
    graph_json.write_text(json.dumps(desc))
    with pytest.raises(QnnRefusal) as info:
        compose_context(
            lib, HtpTarget(69, 79), read_graph_dirs(modellib, ["qnn/graphllm0", "qnn/graphllm1_0"]), weight_sharing=True
        )
    message = str(info.value)
    assert "graphllm1_0" in message and node["mnn_op"] in message and "NoSuchQnnOp" in message


def test_missing_qnn_library_is_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path / "no-sdk"))
    with pytest.raises(MnnbuildError, match="QNN_SDK_ROOT"):
        QnnLibrary()


@pytest.mark.slow
def test_the_biggest_plugins_are_built_first(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With `doit -n 2` a big plugin (a real model's lm_head takes ~10x a layer) should start first rather than
    run alone after every other: context and twin subtasks are created biggest first, and the tasks that read
    them (bundle, verify) name their group, whose order doit keeps (the file_dep alone would be taken in set
    order)."""
    from mnnbuild import dag

    monkeypatch.setenv("MNNBUILD_ARTIFACTS", str(built))
    monkeypatch.setenv("MNNBUILD_CACHE", "off")
    project = dag.Project.load(PROJECT_ROOT)
    spec = project.specs["tiny-qwen3"]
    sizes = {p.path: p.parameters for p in PartitionManifest.read(built / "tiny-qwen3" / "partition").plugins}
    assert len(set(sizes.values())) > 1, "the plugins differ in size"
    for stage in ("context", "twin"):
        # the plugin subtasks, after their group rows (`group_tasks`: name None)
        order = [t["name"] for t in dag.stage_tasks(project, stage, spec) if t["name"] is not None]
        expected = sorted(sizes, key=lambda path: -sizes[path])
        assert order == [Path(p).stem for p in expected], (stage, order)
    for stage, groups in (
        ("bundle", ["context:tiny-qwen3-v79"]),
        ("verify", ["context:tiny-qwen3-v79", "twin:tiny-qwen3-v79"]),
    ):
        (task,) = dag.stage_tasks(project, stage, spec)
        assert task["task_dep"] == groups, (stage, task["task_dep"])


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["index out of range", "another model's op", "split model outside", "split model"])
def test_a_graph_dir_not_of_this_model_is_one_line(built: Path, tmp_path: Path, edit: str) -> None:
    """The context stage lowers from the partition's graph dirs: one whose ops are not the model's (edited, or
    copied from another model's partition) fails in one line naming graph.json and the field, before QNN runs,
    and leaves no output dir."""
    import shutil

    partition = tmp_path / "partition"
    shutil.copytree(built / "tiny-qwen3" / "partition", partition)
    graph_json = partition / "qnn" / "graphllm1_0" / "graph.json"
    desc = json.loads(graph_json.read_text())
    field = "ops"
    if edit == "index out of range":
        desc["ops"][0]["index"] = 10**6
    elif edit == "another model's op":
        desc["ops"][0]["name"] = "/some/other/model/op"
    elif edit == "split model":  # the decode graph indexes the source model, this one a split model
        desc["split_model"] = "split/llm.mnn"
        field = ""
    else:  # both graphs name a model outside the partition dir
        desc["split_model"] = "../../../../etc/passwd"
        field = "split_model"
        other = graph_json.parent.parent / "graphllm0" / "graph.json"
        other.write_text(json.dumps({**json.loads(other.read_text()), "split_model": desc["split_model"]}))
    graph_json.write_text(json.dumps(desc))
    inputs = ContextInputs(model="tiny-qwen3", model_dir=built / "tiny-qwen3" / "model", partition_dir=partition,
                           binary="qnn/graphllm0.bin", graphs=["qnn/graphllm0", "qnn/graphllm1_0"])  # fmt: skip
    with pytest.raises(MnnbuildError) as info:
        build_context(inputs, ContextParams(soc=soc_by_name("SM8750")), tmp_path / "ctx")
    message = str(info.value)
    assert "\n" not in message, message
    if field:
        assert f"field '{field}'" in message and str(graph_json.parent.parent) in message, message
    else:
        assert "index different models" in message, message
    assert not (tmp_path / "ctx").exists()
