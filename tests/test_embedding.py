"""The embedding family (docs/families.md, section 4): the committed Qwen3-Embedding fixture builds and verifies
for v79 and v75, its bundle is what upstream's export script writes for an embedding model, and an embedding
spec on a text LLM is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mnnbuild_runtime import Bundle

from mnnbuild.base.errors import ModelDirError
from mnnbuild.cpu import load_vars
from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.model.modeldir import ModelPart, check_part_graph, model_part
from mnnbuild.pipeline.layout import BUNDLE_MODEL_DIR, CONFIG_FILE, LLM_GRAPHS, QNN_DIR, binary_path, graph_name
from mnnbuild.stages.verify import REPORT_JSON, VerifyManifest
from mnnbuild.verify.report import VerifyReport
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR, RunDoit, doit

FIXTURE = FIXTURE_MODELS / "qwen3-embedding-tiny"
NAME = "qwen3-embedding-tiny"
ARCHS = ("v79", "v75")
CHUNK = 32
EMBEDDING_INPUTS = ["input_ids", "attention_mask", "position_ids"]


def embedding_spec(directory: Path, name: str, source: Path) -> Path:
    """A spec of the embedding family, as a user writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    spec = directory / f"{name}.toml"
    spec.write_text(
        f'name = "{name}"\nsource = {{ local = "{source}" }}\nfamily = "embedding"\n'
        f"chunk_size = {CHUNK}\ntargets = {json.dumps(list(ARCHS))}\n"
    )
    return spec


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedding fixture built and verified for both targets, from scratch through doit."""
    cwd = tmp_path_factory.mktemp("embedding")
    specs = embedding_spec(cwd / "specs", NAME, FIXTURE).parent
    tasks = [f"verify:{NAME}-{arch}" for arch in ARCHS]
    proc = doit(cwd, "-n", "2", *tasks, env={"MNNBUILD_MODELS_PATH": str(specs)})
    assert proc.returncode == 0, f"doit {' '.join(tasks)} failed:\n{proc.stdout}\n{proc.stderr}"
    return cwd / "artifacts" / NAME


def bundle_dir(root: Path, arch: str) -> Path:
    stage = root / arch / "bundle"
    return stage / BUNDLE_MODEL_DIR / BundleManifest.read(stage).model_name


def upstream_config(model_dir: Path, chunk: int) -> dict[str, object]:
    """The entries upstream's ``output_qnn`` (generate_llm_qnn.py at 4d40bdbd) sets for a model it takes for an
    embedding model (``embedding.mnn`` in the dir): the converted graph, its weights and the chunk limits."""
    assert (model_dir / "embedding.mnn").is_file()
    model_name = "embedding.mnn"
    return {"llm_model": f"qnn/{model_name}", "llm_weight": f"{model_name}.weight", "chunk_limits": [chunk, 1]}


@pytest.mark.slow
def test_fetch_records_the_embedding_graph(built: Path) -> None:
    part = FetchManifest.read(built / "model").part
    assert part == ModelPart(family="embedding", model_file="embedding.mnn", weight_file="embedding.mnn.weight")
    assert not part.generates and part.output == "sentence_embeddings"


@pytest.mark.slow
def test_io_samples_have_no_logits_index_and_a_float_mask(built: Path) -> None:
    """llm_config.json says "int"; the graph declares a float mask, and the samples follow the graph."""
    assert json.loads((FIXTURE / "llm_config.json").read_text())["attention_mask"] == "int"
    io = IoManifest.read(built / "io")
    assert [s.seq_len for s in io.samples] == [1, CHUNK]
    for sample_dir in io.sample_dirs(built / "io"):
        inputs = load_vars(sample_dir / "input.mnn")
        assert list(inputs) == EMBEDDING_INPUTS
        assert inputs["attention_mask"].dtype == np.float32
        outputs = load_vars(sample_dir / "output.mnn")
        assert list(outputs) == ["sentence_embeddings"] and outputs["sentence_embeddings"].shape[-1] == 64
    assert {r.path for r in io.inputs} == {"model/embedding.mnn", "model/embedding.mnn.weight", "model/llm_config.json"}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_builds_and_verifies(built: Path, arch: str) -> None:
    manifest = VerifyManifest.read(built / arch / "verify")
    assert manifest.passed and manifest.tokens_match is None  # an embedding model generates nothing
    report = VerifyReport.model_validate_json((built / arch / "verify" / REPORT_JSON).read_text(encoding="utf-8"))
    assert report.passed and not report.failures and report.generation is None
    partition = PartitionManifest.read(built / "partition")
    assert sorted(g.graph for g in report.graphs) == sorted(g for p in partition.plugins for g in p.graphs)
    assert all(g.passed and g.simulator_seconds for g in report.graphs)
    # the whole model, decode and prefill: the bundle's sentence embeddings vs MNN on the CPU
    assert [s.seq_len for s in report.whole_model] == [1, CHUNK]
    for shape in report.whole_model:
        assert shape.passed and shape.top1 is None
        assert [c.name for c in shape.outputs] == ["sentence_embeddings"]
        check = shape.outputs[0]
        assert check.passed and check.cosine is not None and check.cosine >= report.model_tolerance.min_cosine


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_bundle_is_what_upstream_writes(built: Path, arch: str) -> None:
    model_dir = bundle_dir(built, arch)
    config = json.loads((model_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    # the model's config.json, every entry kept, with upstream's set
    assert config == {**json.loads((FIXTURE / "config.json").read_text()), **upstream_config(FIXTURE, CHUNK)}
    plugins = PartitionManifest.read(built / "partition").plugins
    files = {str(p.relative_to(model_dir)) for p in model_dir.rglob("*") if p.is_file()}
    assert files == {
        CONFIG_FILE,
        "llm_config.json",
        "tokenizer.mtok",
        "embedding.mnn.weight",
        "embeddings_bf16.bin",
        "prompt.txt",
        f"{QNN_DIR}/embedding.mnn",
        *(binary_path(p.plugin) for p in plugins),
    }
    # the graph MNN's embedding engine loads: its inputs, and the one output it reads
    bundle = Bundle.open(model_dir)
    assert bundle.model_file == model_dir / QNN_DIR / "embedding.mnn"
    assert bundle.weight_file == model_dir / "embedding.mnn.weight"
    assert bundle.input_names == EMBEDDING_INPUTS and bundle.output_names == ["sentence_embeddings"]
    assert bundle.chunk_limits == [CHUNK, 1]
    # graphllm<k> binaries, as upstream names an embedding model's plugins, each with decode and prefill graphs
    assert [p.path for p in bundle.plugins] == [binary_path(p.plugin, LLM_GRAPHS) for p in plugins]
    for spec, p in zip(bundle.plugins, plugins, strict=True):
        assert list(spec.graph_names) == [graph_name(0, p.plugin), graph_name(1, p.plugin)]


@pytest.mark.slow
def test_embedding_spec_on_a_text_llm_is_refused(run_doit: RunDoit, tmp_path: Path) -> None:
    """The tiny text LLM outputs logits: as an embedding model it would build a bundle MNN's embedding engine cannot
    load, so fetch refuses it in one line saying which family the model is and the field to set."""
    specs = embedding_spec(tmp_path / "specs", "not-embedding", TINY_MODEL_DIR).parent
    proc = run_doit("fetch:not-embedding", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=False)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "the model is" in line]
    assert len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].endswith(
        f"model directory {TINY_MODEL_DIR} (source of not-embedding): llm.mnn outputs ['logits', 'hidden_states'] "
        "and llm_config.json has no 'is_visual': true: the model is a text LLM, but its spec says family = "
        "'embedding'; set spec field family = 'llm'"
    ), lines[0]
    assert not (tmp_path / "artifacts" / "not-embedding" / "model" / FetchManifest.filename()).exists()


def test_an_embedding_graph_needs_sentence_embeddings() -> None:
    part = ModelPart(family="embedding", model_file="embedding.mnn", weight_file="embedding.mnn.weight")
    check_part_graph(part, EMBEDDING_INPUTS, ["sentence_embeddings"], Path("m/embedding.mnn"))
    with pytest.raises(ModelDirError, match=r"^m/embedding.mnn: graph has no output 'sentence_embeddings' \(outputs"):
        check_part_graph(part, EMBEDDING_INPUTS, ["logits"], Path("m/embedding.mnn"))
    # a text LLM's graph is not held to it
    check_part_graph(ModelPart(), [*EMBEDDING_INPUTS, "logits_index"], ["logits"], Path("m/llm.mnn"))


def test_config_json_names_the_graph(tmp_path: Path) -> None:
    """A model file config.json names is taken, but only as a plain name inside the model dir."""
    (tmp_path / "config.json").write_text(json.dumps({"llm_model": "other.mnn"}))
    assert model_part(tmp_path, "embedding") == ModelPart(
        family="embedding", model_file="other.mnn", weight_file="other.mnn.weight"
    )
    (tmp_path / "config.json").write_text(json.dumps({"llm_model": "../../etc/x.mnn"}))
    with pytest.raises(ModelDirError, match=r"config.json: field 'llm_model' must name a file in the model dir"):
        model_part(tmp_path, "embedding")
