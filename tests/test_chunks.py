"""Several prefill lengths per plugin (spec ``chunk_sizes``): which graph a prompt runs on, and a two-length
build of the tiny model and a v79 fixture, verified, with every binary's graphs matching its Plugin op.

The block plan is checked against a line-by-line transcription of MNN's ``Llm::forward`` (llm.cpp): full blocks
of the largest ``chunk_limits`` entry, the remainder padded to the entry its downward scan stops at.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mnnbuild_runtime import (
    Bundle,
    Embeddings,
    HybridModel,
    draft_feeds,
    draft_rows,
    fit_block,
    follow_draft,
    greedy_generate,
    llm_inputs,
    prefill_blocks,
)
from mnnbuild_runtime.errors import BundleError

from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.context import ContextManifest
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.partition import PartitionManifest, read_merge
from mnnbuild.partition.records import SubgraphRecord
from mnnbuild.pipeline.layout import BUNDLE_MODEL_DIR, CONFIG_FILE, LLM_GRAPHS, QNN_DIR, graph_name
from mnnbuild.qnn import QnnLibrary, read_binary_info, same_element_order
from mnnbuild.stages.verify import REPORT_JSON, VerifyManifest
from mnnbuild.verify.checks import read_contexts, read_twins
from mnnbuild.verify.verdict import VerifyReport
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR, doit

ARCH = "v79"
LENGTHS = [128, 32]
"""Graph order after decode: longest first, whatever order the spec lists them in."""
MODELS = {"tiny2": TINY_MODEL_DIR, "untied2": FIXTURE_MODELS / "qwen3-untied-int8-b32"}


# ---- the block plan ----------------------------------------------------------------------------------


def mnn_engine_blocks(tokens: int, chunk_limits: list[int]) -> list[tuple[int, int]]:
    """``Llm::set_config`` + ``Llm::forward`` of MNN 4d40bdbd7efb, transcribed: (real tokens, forward size)."""
    valid = sorted(chunk_limits)
    block = valid[-1]
    number, remain = tokens // block, tokens % block
    out = [(block, block)] * number
    if remain:
        forward = valid[-1]
        for j in range(len(valid) - 2, -1, -1):
            if valid[j] < remain:
                break
            forward = valid[j]
        out.append((remain, forward))
    return out


@pytest.mark.parametrize("limits", [[128, 1], [128, 32, 1], [1, 32, 128], [64, 16, 4, 1], [256, 100, 7, 1]])
def test_prefill_blocks_are_mnn_engine_blocks(limits: list[int]) -> None:
    for n in range(1, 3 * max(limits) + 2):
        assert [(b.tokens, b.size) for b in prefill_blocks(n, limits)] == mnn_engine_blocks(n, limits), n


def test_prefill_blocks_examples() -> None:
    def plan(n: int, limits: list[int]) -> list[tuple[int, int]]:
        return [(b.tokens, b.size) for b in prefill_blocks(n, limits)]

    assert plan(20, [128, 1]) == [(20, 128)]  # one length: a short prompt pays for 128
    assert plan(20, [128, 32, 1]) == [(20, 32)]
    assert plan(1, [128, 32, 1]) == [(1, 1)]  # one token runs the decode graph
    assert plan(33, [128, 32, 1]) == [(33, 128)]
    assert plan(161, [128, 32, 1]) == [(128, 128), (33, 128)]
    assert plan(150, [128, 32, 1]) == [(128, 128), (22, 32)]
    assert plan(129, [128, 32, 1]) == [(128, 128), (1, 1)]
    assert prefill_blocks(150, [128, 32, 1])[-1].padding == 10
    assert fit_block(32, [1, 128, 32]) == 32 and fit_block(2, [128, 1]) == 128


def test_invalid_limits_and_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="at least two positive lengths"):
        prefill_blocks(4, [128])  # MNN ignores such a list: the bundle's graphs would not be used as built
    with pytest.raises(ValueError, match="does not fit chunk_limits"):
        fit_block(129, [128, 1])
    with pytest.raises(ValueError, match="at least one"):
        prefill_blocks(0, [128, 1])


# ---- a two-length build ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and the untied int8 fixture with ``chunk_sizes`` (written shortest first), verified."""
    cwd = tmp_path_factory.mktemp("chunks")
    specs = cwd / "specs"
    specs.mkdir()
    for name, src in MODELS.items():
        (specs / f"{name}.toml").write_text(
            f'name = "{name}"\nsource = {{ local = "{src}" }}\nchunk_sizes = [32, 128]\ntargets = ["{ARCH}"]\n'
        )
    tasks = [f"verify:{name}-{ARCH}" for name in MODELS]
    proc = doit(cwd, "-n", "2", *tasks, env={"MNNBUILD_MODELS_PATH": str(specs)})
    assert proc.returncode == 0, f"doit {' '.join(tasks)} failed:\n{proc.stdout}\n{proc.stderr}"
    return cwd / "artifacts"


def bundle_dir(root: Path, name: str) -> Path:
    stage = root / name / ARCH / "bundle"
    return stage / BUNDLE_MODEL_DIR / BundleManifest.read(stage).model_name


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_two_length_spec_builds_and_verifies(built: Path, name: str) -> None:
    root = built / name
    assert [s.seq_len for s in IoManifest.read(root / "io").samples] == [1, *LENGTHS]
    partition = PartitionManifest.read(root / "partition")
    assert partition.seq_lens == [1, *LENGTHS] and partition.plugins
    for p in partition.plugins:
        assert p.graphs == [graph_name(s, p.plugin) for s in range(1 + len(LENGTHS))]
    contexts = [ContextManifest.read(root / "v79" / "context" / f"graphllm{p.plugin}") for p in partition.plugins]
    lowered = {g.name for c in contexts for g in c.graphs}
    assert lowered == {g for p in partition.plugins for g in p.graphs}
    config = json.loads((bundle_dir(built, name) / CONFIG_FILE).read_text(encoding="utf-8"))
    assert config["chunk_limits"] == [*LENGTHS, 1]

    assert VerifyManifest.read(root / ARCH / "verify").passed
    report = VerifyReport.model_validate_json((root / ARCH / "verify" / REPORT_JSON).read_text(encoding="utf-8"))
    assert report.passed and not report.failures
    # (a) every graph of every length ran in the simulator against its reference
    assert sorted(g.graph for g in report.graphs) == sorted(lowered)
    assert all(g.passed and g.simulator_seconds for g in report.graphs)
    # (b) the whole model at every length, through each plugin's shape selection; then each length run whole, as the
    # engine runs a chunk the prompt fills (logits_index -1: the graphs built serve it)
    assert [(s.seq_len, s.logits_index) for s in report.whole_model] == [
        (1, None),
        *((n, None) for n in LENGTHS),
        *((n, -1) for n in LENGTHS),
    ]
    assert all(s.passed and s.top1 is not None and s.top1.passed for s in report.whole_model)
    assert report.generation is not None and report.generation.passed
    assert report.generation.hybrid_tokens == report.generation.cpu_tokens


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_every_binary_holds_its_plugin_graphs_in_order(built: Path, name: str) -> None:
    """What MNN's QNN plugin relies on: the binary holds exactly the ``allGraphName`` graphs (it retrieves graph i
    by name ``allGraphName[i]``), graph ``s`` takes the ``s``-th block of ``allInputShape`` (the block the live
    input shapes select) and is the partition's graph of that name, at the io sample's length."""
    bundle = Bundle.open(bundle_dir(built, name))
    lib = QnnLibrary()
    seq_lens = PartitionManifest.read(built / name / "partition").seq_lens
    assert bundle.plugins
    for spec in bundle.plugins:
        info = read_binary_info(lib, spec.read_binary())
        plugin = int(Path(spec.path).stem.removeprefix(LLM_GRAPHS))
        assert info.graph_names == list(spec.graph_names) == [graph_name(s, plugin) for s in range(3)]
        ranks = [len(info.graph(spec.graph_names[0]).input(t).dims) for t in spec.qnn_inputs]
        blocks = spec.input_shapes(ranks)
        assert len(blocks) == len(set(map(tuple, blocks))) == 3, "each length must select its own graph"
        for s, gname in enumerate(spec.graph_names):
            graph = info.graph(gname)
            got = [graph.input(t).dims for t in spec.qnn_inputs]
            assert all(same_element_order(a, b) for a, b in zip(got, blocks[s], strict=True)), (got, blocks[s])
            record = SubgraphRecord.read(built / name / "partition" / QNN_DIR / gname)
            assert record.shape_index == s
            assert [t.qnn_name for t in record.inputs] == list(spec.qnn_inputs)
            assert [tuple(t.shape) for t in record.inputs] == [tuple(d) for d in blocks[s]]
            # the token dimension: the graph of length L takes L rows where the decode graph takes 1
            flat0 = [d for dims in blocks[0] for d in dims]
            flat = [d for dims in blocks[s] for d in dims]
            assert {b for a, b in zip(flat0, flat, strict=True) if a != b} <= {seq_lens[s]}


@pytest.mark.slow
def test_runtime_picks_the_smallest_graph_that_fits(built: Path) -> None:
    """The bundle's forwards run at ``prefill_blocks``' sizes and each plugin executes the graph of that length."""
    root = built / "tiny2"
    lib = QnnLibrary()
    merge = read_merge(root / "partition")
    contexts, _ = read_contexts(root / ARCH / "context", merge)
    twins, _ = read_twins(root / ARCH / "twin", contexts, merge)
    overrides = {p: t.override() for p, t in twins.items()}
    with HybridModel(bundle_dir(built, "tiny2"), binary_overrides=overrides, qnn_lib=lib) as model:
        assert model.bundle.block_sizes == [1, 32, 128]

        def calls() -> dict[str, int]:
            return {g: n for r in model.plugins.values() for g, n in r.report()["calls"].items()}

        def shape_of(graph: str) -> int:
            return 0 if "_" not in graph else int(graph[len(LLM_GRAPHS) :].split("_")[0])

        emb = Embeddings(model.bundle.model_dir)
        for tokens, shape in ((20, 2), (33, 1), (1, 0)):
            (block,) = model.bundle.prefill_blocks(tokens)
            before = calls()
            out = model.forward(llm_inputs(emb(list(range(5, 5 + tokens))), block.size))
            assert out["logits"].shape[1] == block.size
            ran = {g for g, n in calls().items() if n > before.get(g, 0)}
            assert len(ran) == len(model.plugins) and {shape_of(g) for g in ran} == {shape}, (tokens, ran)

        before = calls()
        result = greedy_generate(model, [281, 78, 286], max_new_tokens=4)  # 3..6 tokens: all at length 32
        ran = {g: n - before.get(g, 0) for g, n in calls().items() if n > before.get(g, 0)}
        assert len(result.tokens) == 4 and result.chunk == 128
        assert {shape_of(g) for g in ran} == {2} and set(ran.values()) == {4}


def test_generation_check_runs_each_step_at_the_loops_length() -> None:
    """verify reads every greedy step's logits row from one forward per length the loop used (causal mask): a
    sequence crossing 32 takes the rows of steps up to 32 tokens from the 32-long forward, the rest from 128
    (``follow_draft``, confirming a draft; ``draft_feeds`` are the same forwards, for a caller's batch)."""
    seen: list[tuple[int, int]] = []

    def forward(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        size = inputs["input_ids"].shape[0]
        real = int(np.abs(inputs["input_ids"]).sum(axis=(1, 2)).astype(bool).sum())
        seen.append((real, size))
        rows = np.zeros((1, size, 4), dtype=np.float32)
        rows[0, :, 0] = size  # which forward a row came from
        rows[0, :, 1] = np.arange(size)  # and which row
        return {"logits": rows}

    def embed(ids: list[int]) -> np.ndarray:
        return np.ones((len(ids), 2), dtype=np.float32)

    prompt, draft = list(range(30)), [0] * 10  # 10 generated: steps at 30..39 tokens; each row's argmax is 0
    got = follow_draft(forward, embed, prompt, draft, 10, [1, 32, 128])
    assert got.result.tokens == draft and got.rejected is None
    assert got.forwards == 2 and seen == [(32, 32), (39, 128)]
    rows = got.step_rows
    assert [(int(r[0]), int(r[1])) for r in rows] == [(32, 29), (32, 30), (32, 31)] + [(128, n) for n in range(32, 39)]
    feeds = draft_feeds(embed, prompt, draft, 10, [1, 32, 128])
    assert {size: f["input_ids"].shape[0] for size, f in feeds.items()} == {32: 32, 128: 128}
    batch = {size: forward(f)["logits"] for size, f in feeds.items()}
    again = follow_draft(forward, embed, prompt, draft, 10, [1, 32, 128], logits=batch)
    assert again.forwards == 0 and all(np.array_equal(a, b) for a, b in zip(again.step_rows, rows, strict=True))
    # the same rows taken from the batch directly, whatever the draft's tokens are (no confirming: a comparison)
    other = [3] * 10
    other_feeds = draft_feeds(embed, prompt, other, 10, [1, 32, 128])
    direct = draft_rows({size: forward(f)["logits"] for size, f in other_feeds.items()}, prompt, other, [1, 32, 128])
    assert [(int(r[0]), int(r[1])) for r in direct] == [(int(r[0]), int(r[1])) for r in rows]
    with pytest.raises(BundleError, match=r"no logits for prefill lengths \[128\]"):
        draft_rows({32: batch[32]}, prompt, draft, [1, 32, 128])
