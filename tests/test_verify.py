"""The verify stage and `doit verify`: a good bundle passes, a broken one fails naming what is wrong.

The tiny chain is built and verified once per module through doit (as a user runs it); the broken-bundle
cases run the stage function on a private copy of the bundle (copies, never the hard-linked originals).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mnnbuild_runtime import BinaryOverride, Bundle, ForwardResult, HybridModel, Tokenizer, greedy_generate
from mnnbuild_runtime.generate import cpu_forward_fn

from mnnbuild.base.compare import Tolerance, compare
from mnnbuild.base.errors import ToleranceError
from mnnbuild.cpu import CpuRuntime, load_vars, save_vars
from mnnbuild.manifests.partition import read_merge
from mnnbuild.manifests.report import ReportManifest
from mnnbuild.manifests.twin import TwinManifest
from mnnbuild.mnn import embedding_info, load_model, make_attribute, plugin_attributes, save_model
from mnnbuild.model.targets import soc_for_arch
from mnnbuild.partition.records import SubgraphRecord
from mnnbuild.partition.reference import SourceSubgraphRunner
from mnnbuild.pipeline.layout import REPORT_PAGE as PAGE
from mnnbuild.qnn import QnnLibrary
from mnnbuild.stages.verify import REPORT_JSON, REPORT_TEXT, VerifyInputs, VerifyManifest, VerifyParams, verify
from mnnbuild.verify import checks
from mnnbuild.verify.verdict import TIME_PHASES, VerifyReport, format_report
from tests.conftest import FIXTURE_MODELS, doit, executed_tasks, skipped_tasks

TINY = "tiny-qwen3"
ARCH = "v79"
HELD_OUT = ("qwen3-untied-int8-b32", "llama-int4-cw")
HELD_OUT_ARCHS = ("v79", "v75")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`doit verify` from scratch: builds the tiny bundle and verifies it."""
    cwd = tmp_path_factory.mktemp("verify")
    proc = doit(cwd, "verify")
    assert proc.returncode == 0, f"doit verify failed:\n{proc.stdout}\n{proc.stderr}"
    return cwd, proc


def model_root(built: tuple[Path, object]) -> Path:
    return built[0] / "artifacts" / TINY


def inputs_for(root: Path, arch: str = ARCH, bundle_dir: Path | None = None) -> VerifyInputs:
    return VerifyInputs(
        model=root.name,
        bundle_dir=bundle_dir or root / arch / "bundle",
        partition_dir=root / "partition",
        io_dir=root / "io",
        model_dir=root / "model",
        context_dir=root / arch / "context",
        twin_dir=root / arch / "twin",
    )


def twins(root: Path, arch: str = ARCH) -> dict[str, Path]:
    """Each plugin's unshared twin, as the twin stage wrote it (plugin path -> file)."""
    found = {}
    for binary in read_merge(root / "partition"):
        where = root / arch / "twin" / Path(binary).stem
        manifest = TwinManifest.read(where)
        assert manifest.binary == binary
        found[binary] = where / manifest.twin
    return found


def read_report(out_dir: Path) -> VerifyReport:
    return VerifyReport.model_validate_json((out_dir / REPORT_JSON).read_text(encoding="utf-8"))


@pytest.fixture
def bundle_copy(built: tuple[Path, object], tmp_path: Path) -> Path:
    """A private copy of the tiny bundle stage dir (real copies: the originals are hard links)."""
    dest = tmp_path / "bundle"
    shutil.copytree(model_root(built) / ARCH / "bundle", dest)
    return dest


def run_failing(built: tuple[Path, object], bundle: Path, out_dir: Path) -> tuple[str, VerifyReport]:
    """Verify a broken bundle: it must raise, leave a readable report and no manifest (not done for doit)."""
    with pytest.raises(ToleranceError) as err:
        verify(inputs_for(model_root(built), bundle_dir=bundle), VerifyParams(soc=soc_for_arch(ARCH)), out_dir)
    assert not (out_dir / VerifyManifest.filename()).exists(), "a failed verify must not write its manifest"
    report = read_report(out_dir)
    assert not report.passed and report.failures
    assert "FAILED" in (out_dir / REPORT_TEXT).read_text(encoding="utf-8")
    assert str(out_dir / REPORT_TEXT) in str(err.value), "the error points at the report"
    return str(err.value), report


# ---- the comparison ----------------------------------------------------------------------------------


def test_compare_judges_cosine_relative_error_and_zero_references() -> None:
    tol = Tolerance()
    ref = np.linspace(-1, 1, 100, dtype=np.float32)
    assert compare("x", ref + 0.01, ref, tol).passed  # 1% of max abs
    far = compare("x", ref + 0.05, ref, tol)
    assert not far.passed and far.rel_err == pytest.approx(0.05, rel=1e-4)
    assert compare("z", np.zeros(4), np.zeros(4), tol).cosine is None  # no direction: abs floor decides
    assert compare("z", np.zeros(4), np.zeros(4), tol).passed
    assert not compare("z", np.ones(4), np.zeros(4), tol).passed
    assert not compare("n", np.full(100, np.nan), ref, tol).passed
    assert compare("s", np.zeros(3), ref, tol).problem == "has shape [3], reference [100]"


def test_a_whole_block_no_graph_serves_fails_in_one_line_naming_feed_and_plugin() -> None:
    """MNN's engine runs a full prefill chunk with ``logits_index`` -1: a plugin holding ops on both sides of the
    slice (an Eagle3 target's lm_head with its hidden_states Concat, before the partition kept them apart) is then fed
    1 row and 128 rows together, which none of its graphs takes. The runtime's refusal (as MNN's plugin finds no
    graph) is verify's failure: one line naming the feed, the plugin and the shapes."""
    from mnnbuild_runtime import PluginShapeError
    from mnnbuild_runtime.bundle import PluginSpec
    from mnnbuild_runtime.plugin import select_shape_index

    from mnnbuild.verify.failures import whole_model_failures

    # graphs at decode (1, 1), the padded chunk (128, 128) and the verify length (4, 4): rows after the slice, then
    # the tapped hidden states' rows
    shapes = [(r, 1, 128, t, 1, 384) for r, t in ((1, 1), (128, 128), (4, 4))]
    graphs = ("graphllm3", "graphllm1_3", "graphllm2_3")
    spec = PluginSpec(name="graphllm3", op_index=40, path="qnn/graphllm3.bin", file=Path("graphllm3.bin"),
                      input_tensors=("/Slice_output_0", "/Concat_output_0"), output_tensors=("logits",),
                      qnn_inputs=("t1", "t2"), qnn_outputs=("t3",), graph_names=graphs,
                      all_input_shape=tuple(d for s in shapes for d in s), outputs=((), (), ()))  # fmt: skip
    with pytest.raises(PluginShapeError) as err:
        select_shape_index(spec, [(1, 1, 128), (128, 1, 384)])
    sample = checks.Sample(128, {}, {"logits": np.zeros((1, 1, 8), np.float32)}, logits_index=-1)
    shape = checks.check_whole_model(sample, ForwardResult({}, [], error=err.value), Tolerance())
    assert not shape.passed and shape.logits_index == -1
    (line,) = whole_model_failures([shape], Tolerance())
    assert "\n" not in line.line
    assert line.line.startswith(
        "whole model seq 128 (whole block, logits_index -1): plugin 'graphllm3' (qnn/graphllm3.bin): input shapes "
        "[[1, 1, 128], [128, 1, 384]]"
    ), line.line
    assert "match none of its allInputShape" in line.line


# ---- the tiny bundle -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_doit_verify_passes_on_the_tiny_bundle(built: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    cwd, proc = built
    assert f"verify:{TINY}-{ARCH}" in executed_tasks(proc.stdout)
    out = model_root(built) / ARCH / "verify"
    manifest = VerifyManifest.read(out)
    assert manifest.passed and manifest.tokens_match
    assert set(manifest.executed.values()) == {"override"}
    report = read_report(out)
    assert report.passed and not report.failures
    assert report.integrity is not None and report.integrity.passed
    # the bundle stage hashed the bundle, the twin stage the twins; unchanged since, nothing is hashed again
    assert report.integrity.hashed == 0 and report.binaries_hashed == 0 and report.binaries_trusted > 0
    assert len(report.graphs) == 2 * len(report.plugins) and all(g.passed for g in report.graphs)
    for g in report.graphs:
        # every graph ran in the whole-model pass: that run is its check (against its ops in MNN, same inputs)
        assert g.fed == "bundle_pass" and g.simulator_seconds is not None and g.simulator_seconds > 0
        for t in g.outputs:
            assert t.cosine is None or t.cosine >= 0.999, (g.graph, t)
            assert t.rel_err is None or t.rel_err <= 0.02, (g.graph, t)
    # the io samples, then the full 128-token chunk as MNN's engine feeds it (logits_index -1, the last row only):
    # no graph of its own, every plugin found one for its shapes
    assert [(s.seq_len, s.logits_index) for s in report.whole_model] == [(1, None), (128, None), (128, -1)]
    for s in report.whole_model:
        assert s.passed and s.top1 is not None and s.top1.passed
        assert {t.name for t in s.outputs} == {"logits", "hidden_states"}
    (logits,) = [t for t in report.whole_model[-1].outputs if t.name == "logits"]
    assert logits.shape[:-1] == [1, 1]
    gen = report.generation
    assert gen is not None and gen.passed and gen.first_divergence is None
    assert gen.prompt == "hello" and len(gen.cpu_tokens) == 16 and gen.hybrid_tokens == gen.cpu_tokens
    # the prefill sample's run was the generation's forward too: no bundle pass of its own
    assert gen.shared_lengths == [128] and gen.hybrid_forwards == 1
    for p in report.plugins:  # which binary ran, and that the shipped one is the context stage's
        assert p.executed == "override" and p.shipped_weight_shared
        assert p.shipped_sha256 == p.context_sha256 == p.bundle_sha256
        assert p.executed_source and "unshared twin" in p.executed_source
        # one load of its context served the per-graph check, both io samples and the generation sequence
        assert p.loads == 1, p
    assert {"graphs", "bundle_pass", "cpu_reference", "total"} <= set(report.timings)
    # a bundle that does not speculate gets no speculation check, time or text
    assert report.speculation is None and "speculation" not in report.timings
    text = (out / REPORT_TEXT).read_text(encoding="utf-8")
    assert "PASSED" in text and "unshared twins" in text and "graphllm1_0" in text
    assert "speculat" not in text

    again = doit(cwd, "verify")
    assert again.returncode == 0, again.stderr
    assert f"verify:{TINY}-{ARCH}" in skipped_tasks(again.stdout), "a second `doit verify` does nothing"


@pytest.mark.slow
def test_bare_doit_builds_and_verifies_the_default_bundle(built: tuple[Path, object]) -> None:
    proc = doit(built[0])  # same artifacts: everything is up to date, verify included
    assert proc.returncode == 0, proc.stderr
    assert f"verify:{TINY}-{ARCH}" in skipped_tasks(proc.stdout)
    assert f"bundle:{TINY}-{ARCH}" in skipped_tasks(proc.stdout)


@pytest.mark.slow
def test_generation_shortcut_equals_the_runtime_greedy_loop(built: tuple[Path, object]) -> None:
    """verify runs the bundle once on the CPU's token sequence instead of once per token; the causal mask
    makes that the same greedy tokens. Checked against the runtime's own loop."""
    root = model_root(built)
    report = read_report(root / ARCH / "verify")
    lib = QnnLibrary()
    bundle = root / ARCH / "bundle" / "model" / TINY
    overrides = {p: BinaryOverride(t) for p, t in twins(root).items()}
    with HybridModel(bundle, binary_overrides=overrides, qnn_lib=lib, max_loaded=1) as model:
        ids = Tokenizer(bundle / "config_qnn.json").encode("hello")
        tokens = greedy_generate(model, ids, max_new_tokens=8).tokens
    assert report.generation is not None and tokens == report.generation.hybrid_tokens[:8]


@pytest.mark.slow
def test_a_tolerated_flip_ends_the_bundles_tokens_unless_followed(built: tuple[Path, object]) -> None:
    """After the bundle's first own pick (a tolerated near-tie) the check needs no simulator forward: every step is
    compared on the CPU's sequence. Only ``follow_divergence`` runs the bundle's loop on, for the report's text.
    The bundle's runs are stood in for by the CPU's forwards with one row's top-2 swapped."""
    root = model_root(built)
    bundle = root / ARCH / "bundle" / "model" / TINY
    limits = Bundle.open(bundle).block_sizes
    cpu = cpu_forward_fn(root / "model")
    # every flip counts as a near-tie and the swapped row as close: this test is about what happens after one
    tol = Tolerance(tie_margin=1.0, max_rel_err=1.0, min_cosine=0.5)
    flip = 2
    for follow in (False, True):
        gen = checks.GenerationRun(root / "model", bundle, limits, "hello", 8, CpuRuntime(), follow)
        gen.reference()
        assert gen.check.problem is None, gen.check.problem
        row = len(gen.check.prompt_ids) - 1 + flip
        runs = {}
        for size, feed in gen.feeds().items():
            logits = np.array(cpu(feed)["logits"], dtype=np.float32)
            rows = logits.reshape(size, -1)
            if row < size:
                top, second = np.argsort(rows[row])[-2:][::-1]
                rows[row, [top, second]] = rows[row, [second, top]]
            runs[size] = ForwardResult({"logits": logits}, [])
        calls: list[int] = []

        def forward(feed: dict[str, np.ndarray], calls: list[int] = calls) -> dict[str, np.ndarray]:
            calls.append(1)
            return cpu(feed)

        check = gen.conclude(forward, runs, tol)
        assert check.problem is None and check.passed and check.first_divergence == flip
        hybrid, reference = check.hybrid_tokens, check.cpu_tokens
        assert hybrid[:flip] == reference[:flip] and hybrid[flip] != reference[flip]
        assert len(check.steps) == len(check.cpu_tokens), "every step compared on the CPU's sequence"
        if follow:
            assert check.followed and calls and len(check.hybrid_tokens) == len(check.cpu_tokens)
        else:
            assert not check.followed and not calls and len(check.hybrid_tokens) == flip + 1
            assert "follow_divergence" in format_report(
                VerifyReport(
                    model=TINY,
                    target=ARCH,
                    soc="x",
                    bundle="b",
                    passed=True,
                    graph_tolerance=tol,
                    model_tolerance=tol,
                    executed_note="",
                    generation=check,
                )  # fmt: skip
            )


@pytest.mark.slow
def test_the_cpu_reference_beside_the_pass_gives_the_same_report(
    built: tuple[Path, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big model's CPU reference runs in a child process beside the simulator pass (forced here for the tiny
    one): the same tokens, the same whole-model numbers and the same shared forward as in this process, the
    timings account for it, and no process is left when verify returns. Nothing verify read was hashed again."""
    import multiprocessing

    from mnnbuild.verify import reference

    monkeypatch.setattr(reference, "CHILD_ABOVE", 0)
    root = model_root(built)
    out = tmp_path / "verify"
    verify(inputs_for(root), VerifyParams(soc=soc_for_arch(ARCH)), out)
    assert not multiprocessing.active_children(), "the CPU reference's process ended with verify"
    report, here = read_report(out), read_report(root / ARCH / "verify")
    assert report.passed and report.generation is not None and here.generation is not None
    assert report.generation.cpu_tokens == here.generation.cpu_tokens == report.generation.hybrid_tokens
    assert report.generation.shared_lengths == [128] and report.generation.hybrid_forwards == 1
    for a, b in zip(report.whole_model, here.whole_model, strict=True):
        assert [t.model_dump() for t in a.outputs] == [t.model_dump() for t in b.outputs], a.seq_len
    t = report.timings
    assert t["cpu_reference_start"] > 0 and t["cpu_reference_confirm"] > 0 and "overlap" in t
    # the engine's whole-block samples ran in the pass: their part of it is counted, and is only a part
    assert 0 < t["whole_blocks"] < t["bundle_pass"] and "whole-block samples" in (out / REPORT_TEXT).read_text()
    assert t["cpu_reference"] == pytest.approx(sum(v for k, v in t.items() if k.startswith("cpu_reference_")), abs=0.01)
    phases = [k for k in t if k in ("integrity", "bundle_pass", "graphs", "reference_wait", "other")]
    assert len(phases) == 5 and sum(t[k] for k in TIME_PHASES if k in t) == pytest.approx(t["total"], abs=0.01)
    assert report.integrity is not None and report.integrity.hashed == 0 and report.timings["hashing"] == 0.0
    assert report.binaries_hashed == 0 and report.binaries_trusted >= 2 * len(report.plugins)
    text = (out / REPORT_TEXT).read_text(encoding="utf-8")
    assert "CPU reference" in text and "of work in" in text and "process start" in text


@pytest.mark.slow
def test_the_generation_is_judged_on_the_engines_tokens_with_the_recompute_rows(
    built: tuple[Path, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sequence is MNN's KV-cache engine's tokens and each step's reference is the recompute forward's row on it,
    so where the engine parts from that forward the steps after it still compare both on the engine's tokens, and
    nothing runs again. The parting (an engine stood in for by its draft with step 3 changed; the rest is the
    recompute loop's from there, so it parts there only) is recorded and named in the report, near-tie or not, and
    never fails the check: the bundle is judged against the forward. The CPU stands in for the bundle."""
    from mnnbuild_runtime import Embeddings, llm_inputs, recompute_generate

    from mnnbuild.verify import failures, reference

    root = model_root(built)
    bundle = root / ARCH / "bundle" / "model" / TINY
    limits = Bundle.open(bundle).block_sizes
    cpu, embed = cpu_forward_fn(root / "model"), Embeddings(root / "model", links=True)
    ids = Tokenizer(bundle / "config_qnn.json").encode("hello")
    truth = recompute_generate(cpu, embed, ids, 8, limits).tokens
    turned = (truth[3] + 1) % embed.vocab
    engine = truth[:3] + [turned] + recompute_generate(cpu, embed, ids + truth[:3] + [turned], 4, limits).tokens
    monkeypatch.setattr(reference, "kv_cache_draft", lambda *args, **kwargs: list(engine))
    # the CPU's rows on the engine's tokens, computed here on their own
    rows = np.asarray(cpu(llm_inputs(embed(ids + engine), 128, logits_index=0))["logits"]).reshape(128, -1)
    rows = rows[len(ids) - 1 : len(ids) - 1 + 8]
    assert [int(r.argmax()) for r in rows] == truth[:4] + engine[4:], "the engine parts at step 3 only"
    for tie_margin, near in ((Tolerance().tie_margin, False), (2.0, True)):  # 2: any lead is a near-tie
        tol = Tolerance(tie_margin=tie_margin)
        gen = checks.GenerationRun(root / "model", bundle, limits, "hello", 8, CpuRuntime())
        gen.reference()
        assert gen.check.problem is None and gen.check.cpu_tokens == engine and gen.check.sequence == "engine"
        runs = {size: ForwardResult({"logits": cpu(feed)["logits"]}, []) for size, feed in gen.feeds().items()}
        calls: list[int] = []

        def forward(feed: dict[str, np.ndarray], calls: list[int] = calls) -> dict[str, np.ndarray]:
            calls.append(1)
            return cpu(feed)

        check = gen.conclude(forward, runs, tol)
        assert check.problem is None and check.passed and not calls, "no forward runs again"
        assert not failures.generation_failures(check, tol)
        assert [(p.step, p.engine_token, p.recompute_token, p.near_tie) for p in check.engine_partings] == [
            (3, turned, truth[3], near)
        ]
        assert check.engine_partings[0].lead == pytest.approx(float(rows[3][truth[3]] - rows[3][turned]))
        # every step: the CPU's pick and margin are the recompute row's on the engine's tokens, the bundle's the same
        for step, row in zip(check.steps, rows, strict=True):
            assert step.cpu_token == step.hybrid_pick == int(row.argmax()) and not step.tolerated_flip
            assert step.cpu_margin == pytest.approx(float(np.sort(row)[-1] - np.sort(row)[-2]), abs=1e-6)
            assert step.logits.passed and step.logits.max_abs_err == 0.0, "the same inputs on both sides"
        # the bundle's own tokens leave the engine's where it picks the recompute forward's token
        assert check.first_divergence == 3 and check.hybrid_tokens == truth[:4]
        assert "picks what the CPU's recompute forward picks" in (check.divergence_note or "")
        text = format_report(VerifyReport(model=TINY, target=ARCH, soc="x", bundle="b", passed=True,
                                          graph_tolerance=tol, model_tolerance=tol, executed_note="",
                                          generation=check))  # fmt: skip
        said = f"MNN's KV-cache engine and its recompute forward part at new token 3: engine {turned}, forward"
        assert said in text and ("(a near-tie)" if near else "(beyond a near-tie)") in text


@pytest.mark.slow
def test_without_the_engine_the_sequence_is_the_recompute_loops(
    built: tuple[Path, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model MNN's engine cannot run gets no draft (``kv_cache_draft`` gives ``[]``): the sequence is then the
    recompute loop's own tokens, which the report says, and every step's CPU pick is its token."""
    from mnnbuild_runtime import Embeddings, recompute_generate

    from mnnbuild.verify import reference

    monkeypatch.setattr(reference, "kv_cache_draft", lambda *args, **kwargs: [])
    root = model_root(built)
    bundle = root / ARCH / "bundle" / "model" / TINY
    limits = Bundle.open(bundle).block_sizes
    gen = checks.GenerationRun(root / "model", bundle, limits, "hello", 8, CpuRuntime())
    gen.reference()
    cpu = cpu_forward_fn(root / "model")
    loop = recompute_generate(cpu, Embeddings(root / "model", links=True), gen.check.prompt_ids, 8, limits)
    assert gen.check.problem is None and gen.check.sequence == "recompute" and gen.check.cpu_tokens == loop.tokens
    runs = {size: ForwardResult({"logits": cpu(feed)["logits"]}, []) for size, feed in gen.feeds().items()}
    check = gen.conclude(cpu, runs, Tolerance())
    assert check.passed and not check.engine_partings and [s.cpu_token for s in check.steps] == loop.tokens
    text = format_report(VerifyReport(model=TINY, target=ARCH, soc="x", bundle="b", passed=True,
                                      graph_tolerance=Tolerance(), model_tolerance=Tolerance(), executed_note="",
                                      generation=check))  # fmt: skip
    assert "cpu    (original model, MNN's recompute loop)" in text


@pytest.mark.slow
def test_a_near_tie_parting_passes_with_one_simulator_pass(
    held_out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MNN's engine with its low-memory arithmetic (what a big model's draft uses) parts from the recompute forward
    on the untied int8 fixture at step 7, on a near-tie. Verify runs the generation on the engine's tokens and passes
    with one simulator pass (the io samples and the generation's forward in one lockstep run, each plugin loaded
    once), the parting named in the report; each step's CPU pick is the recompute forward's on the engine's tokens."""
    from mnnbuild_runtime import Embeddings, HybridExecutor, kv_cache_draft, llm_inputs

    from mnnbuild.verify import reference

    monkeypatch.setattr(reference, "kv_cache_draft", partial(kv_cache_draft, low_memory_above=0))
    passes: list[int] = []
    run_many = HybridExecutor.run_many

    def counted(self: HybridExecutor, feeds: Any, **kwargs: Any) -> Any:
        passes.append(len(feeds))
        return run_many(self, feeds, **kwargs)

    monkeypatch.setattr(HybridExecutor, "run_many", counted)
    root, out = held_out / "qwen3-untied-int8-b32", tmp_path / "verify"
    verify(inputs_for(root), VerifyParams(soc=soc_for_arch(ARCH)), out)
    report = read_report(out)
    gen = report.generation
    assert report.passed and gen is not None and gen.passed and gen.sequence == "engine"
    # one simulator pass: the decode and prefill samples (the prefill one the generation's too) and the prefill
    # length fed as a whole chunk (logits_index -1), which runs again only the plugins after the logits slice
    assert passes == [3], "one simulator pass of the decode, prefill and whole-chunk samples"
    assert gen.shared_lengths == [128] and gen.hybrid_forwards == 1 and all(p.loads == 1 for p in report.plugins)
    assert [(p.step, p.near_tie) for p in gen.engine_partings] == [(7, True)], "the engine parts at step 7"
    parting = gen.engine_partings[0]
    # the engine's own row there against the forward's: other arithmetic, so not the same row
    assert parting.engine_rel_err is not None and 0.0 < parting.engine_rel_err < 1.0 and parting.engine_cosine
    assert gen.cpu_tokens[7] == parting.engine_token != parting.recompute_token == gen.steps[7].cpu_token
    model = root / "model"
    embed = Embeddings(model, links=True)
    seq = gen.prompt_ids + gen.cpu_tokens
    rows = np.asarray(cpu_forward_fn(model)(llm_inputs(embed(seq), 128, logits_index=0))["logits"]).reshape(128, -1)
    assert [s.cpu_token for s in gen.steps] == [int(rows[len(gen.prompt_ids) - 1 + s.step].argmax()) for s in gen.steps]
    text = (out / REPORT_TEXT).read_text(encoding="utf-8")
    assert "part at new token 7" in text and "(a near-tie); the engine's own logits are " in text


@pytest.mark.slow
def test_bounded_plugin_loading_is_bit_identical(built: tuple[Path, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``max_loaded`` N, no more than N plugin contexts are alive at any time (counted where they are
    created and freed), and the outputs are bit for bit those of the all-loaded runtime; one lockstep pass over
    several inputs loads each plugin once."""
    import mnnbuild_runtime.plugin as plugin_module

    live: set[int] = set()
    peak = [0]

    class Counted(plugin_module.ContextRunner):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            live.add(id(self))
            peak[0] = max(peak[0], len(live))

        def close(self) -> None:
            live.discard(id(self))
            super().close()

    monkeypatch.setattr(plugin_module, "ContextRunner", Counted)
    root = model_root(built)
    bundle = root / ARCH / "bundle" / "model" / TINY
    feeds = [load_vars(root / "io" / "testdir" / str(seq) / "input.mnn") for seq in (1, 128, 1)]
    lib = QnnLibrary()

    def run(max_loaded: int | None, lockstep: bool) -> tuple[list[dict[str, np.ndarray]], list[int]]:
        peak[0] = 0
        overrides = {p: BinaryOverride(t) for p, t in twins(root).items()}
        with HybridModel(bundle, binary_overrides=overrides, qnn_lib=lib, max_loaded=max_loaded) as model:
            if lockstep:
                outs = [r.outputs for r in model.run_many(feeds)]
            else:
                outs = [model.forward(f) for f in feeds]
            assert len(model.loaded_plugins) <= (max_loaded or len(model.plugins))
            loads = [r.loads for r in model.plugins.values()]
        assert not live, "close() frees every context"
        return outs, loads

    reference, loads = run(None, lockstep=False)
    assert peak[0] == 4 and loads == [1, 1, 1, 1], "all loaded: each context once, all alive together"
    for max_loaded in (1, 2):
        for lockstep in (False, True):
            outs, loads = run(max_loaded, lockstep)
            assert peak[0] <= max_loaded, (max_loaded, lockstep, peak[0])
            if lockstep:
                assert loads == [1, 1, 1, 1], "one pass over every input loads each plugin once"
            elif max_loaded == 1:
                assert loads == [3, 3, 3, 3], "one load per plugin per forward"
            for got, ref in zip(outs, reference, strict=True):
                assert got.keys() == ref.keys()
                assert all(np.array_equal(got[k], ref[k]) for k in ref), (max_loaded, lockstep)


@pytest.mark.slow
def test_tampered_bundle_file_reruns_verify_and_fails_then_recovers(built: tuple[Path, object], tmp_path: Path) -> None:
    """doit must not trust an old verify when a bundle file changed, nor restore a passing one from the cache
    (whose key only sees the manifests); the failed run leaves the report and no manifest, and a restored
    bundle verifies again."""
    cwd = built[0]
    env = {"MNNBUILD_CACHE": str(tmp_path / "cache")}
    out = model_root(built) / ARCH / "verify"
    shutil.rmtree(out)
    first = doit(cwd, f"verify:{TINY}-{ARCH}", env=env)  # re-run with the cache on: stores the passing verify
    assert first.returncode == 0 and executed_tasks(first.stdout) == [f"verify:{TINY}-{ARCH}"], first.stderr
    target = model_root(built) / ARCH / "bundle" / "model" / TINY / "qnn" / "graphllm2.bin"
    original = target.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0x01
    stat = target.stat()
    target.unlink()
    target.write_bytes(bytes(data))
    # corruption that size and mtime do not show (a rewrite with a new mtime makes the bundle task rebuild the
    # file first; tests/test_faults.py shows that): the DAG's cheap check passes it, verify hashes and must not
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (out / VerifyManifest.filename()).unlink()
    try:
        proc = doit(cwd, f"verify:{TINY}-{ARCH}", env=env)
        assert proc.returncode != 0, proc.stdout
        assert "qnn/graphllm2.bin" in proc.stdout + proc.stderr and "sha256" in proc.stdout + proc.stderr
        assert not (out / VerifyManifest.filename()).exists()
        assert not read_report(out).passed
    finally:
        target.unlink()
        target.write_bytes(original)
    proc = doit(cwd, f"verify:{TINY}-{ARCH}", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"verify:{TINY}-{ARCH}" in executed_tasks(proc.stdout)
    assert VerifyManifest.read(out).passed


# ---- broken bundles -----------------------------------------------------------------------------------


def qnn_file(bundle: Path, name: str) -> Path:
    return bundle / "model" / TINY / "qnn" / name


@pytest.mark.slow
def test_flipped_byte_in_a_context_binary_fails(built: tuple[Path, object], bundle_copy: Path, tmp_path: Path) -> None:
    path = qnn_file(bundle_copy, "graphllm2.bin")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    message, report = run_failing(built, bundle_copy, tmp_path / "verify")
    # QNN does not checksum its blobs (a flipped payload byte still loads): the hashes catch it
    assert "model/tiny-qwen3/qnn/graphllm2.bin" in message and "sha256" in message
    bad = [p for p in report.plugins if not p.passed]
    assert [p.path for p in bad] == ["qnn/graphllm2.bin"]
    assert "not the one the twin stands in for" in (bad[0].problem or "")
    assert all(g.passed for g in report.graphs), "the simulator checks do not depend on the bundle"
    # no whole-model pass ran (a plugin failed its checks): each graph ran alone on the partition's reference IO
    assert report.graphs and all(g.fed == "reference" for g in report.graphs)


@pytest.mark.slow
def test_a_missing_or_foreign_twin_fails(built: tuple[Path, object], tmp_path: Path) -> None:
    """The twins are the twin stage's: plugin 0's dir holding plugin 1's twin, and no twin for plugin 1, fail
    verify naming both (nothing is composed in their place)."""
    root = model_root(built)
    twin_dir = tmp_path / "twin"
    shutil.copytree(root / ARCH / "twin", twin_dir)
    shutil.rmtree(twin_dir / "graphllm0")
    (twin_dir / "graphllm1").rename(twin_dir / "graphllm0")
    out = tmp_path / "verify"
    inputs = inputs_for(root).model_copy(update={"twin_dir": twin_dir})
    with pytest.raises(ToleranceError):
        verify(inputs, VerifyParams(soc=soc_for_arch(ARCH)), out)
    report = read_report(out)
    assert not report.passed and not (out / VerifyManifest.filename()).exists()
    assert any("plugin qnn/graphllm0.bin" in f and "is qnn/graphllm1.bin's twin" in f for f in report.failures)
    assert any("plugin qnn/graphllm1.bin" in f and "run the twin stage first" in f for f in report.failures)
    assert {g.binary for g in report.graphs if not g.passed} == {"qnn/graphllm0.bin", "qnn/graphllm1.bin"}


@pytest.mark.slow
def test_a_twin_built_from_other_weights_fails(built: tuple[Path, object], tmp_path: Path) -> None:
    """A twin stands in for the shipped binary only if both were built from the same partition files and model
    weights: a twin manifest recording another weight file (as after the model changed and only the twin was kept)
    fails verify naming the plugin, while the other plugins pass that check."""
    root = model_root(built)
    twin_dir = tmp_path / "twin"
    shutil.copytree(root / ARCH / "twin", twin_dir)
    manifest = TwinManifest.read(twin_dir / "graphllm1")
    sources = [
        r.model_copy(update={"sha256": "0" * 64}) if r.path == "fetch/llm.mnn.weight" else r for r in manifest.inputs
    ]
    assert sources != manifest.inputs, "the twin records the weight file it was lowered from"
    manifest.model_copy(update={"inputs": sources}).write(twin_dir / "graphllm1")
    out = tmp_path / "verify"
    with pytest.raises(ToleranceError):
        verify(inputs_for(root).model_copy(update={"twin_dir": twin_dir}), VerifyParams(soc=soc_for_arch(ARCH)), out)
    origin = [f for f in read_report(out).failures if "would not stand in" in f]
    assert len(origin) == 1 and "plugin qnn/graphllm1.bin" in origin[0] and "twin stage" in origin[0], origin


@pytest.mark.slow
def test_swapped_binaries_fail_on_structure(built: tuple[Path, object], bundle_copy: Path, tmp_path: Path) -> None:
    a, b = qnn_file(bundle_copy, "graphllm0.bin"), qnn_file(bundle_copy, "graphllm1.bin")
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    message, report = run_failing(built, bundle_copy, tmp_path / "verify")
    assert "qnn/graphllm0.bin" in message
    # caught by binary info too, not only by hash
    structure = [f for f in report.failures if "which the context binary does not contain" in f]
    assert any("'graphllm0'" in f for f in structure) and any("'graphllm1'" in f for f in structure), report.failures


@pytest.mark.slow
def test_all_graph_name_naming_a_missing_graph_fails(
    built: tuple[Path, object], bundle_copy: Path, tmp_path: Path
) -> None:
    path = qnn_file(bundle_copy, "llm.mnn")
    model = load_model(path)
    op = next(o for o in model.ops if o.type == "Plugin" and plugin_attributes(o)["path"] == "qnn/graphllm3.bin")
    op.main.attr = [
        make_attribute("allGraphName", ["graphllm3", "graphllm1_9"]) if a.key == "allGraphName" else a
        for a in op.main.attr
    ]
    save_model(model, path)
    message, report = run_failing(built, bundle_copy, tmp_path / "verify")
    assert "model/tiny-qwen3/qnn/llm.mnn" in message
    structure = [f for f in report.failures if "'allGraphName' names graph 'graphllm1_9'" in f]
    assert structure and "qnn/graphllm3.bin" in structure[0], report.failures


@pytest.mark.slow
def test_weight_file_of_another_model_fails(built: tuple[Path, object], bundle_copy: Path, tmp_path: Path) -> None:
    weight = bundle_copy / "model" / TINY / "llm.mnn.weight"
    foreign = FIXTURE_MODELS / "qwen3-embedding-tiny" / "embedding.mnn.weight"
    assert foreign.stat().st_size < weight.stat().st_size  # the shipped file holds only the tied embeddings
    weight.write_bytes(foreign.read_bytes())
    message, report = run_failing(built, bundle_copy, tmp_path / "verify")
    assert "llm.mnn.weight" in message
    # besides the hash: the file does not even cover the model's external weight ranges
    assert any("not the weight file of this model" in f for f in report.failures), report.failures


@pytest.mark.slow
def test_perturbed_weight_file_fails_on_the_numbers(
    built: tuple[Path, object], bundle_copy: Path, tmp_path: Path
) -> None:
    """Same size and layout, other values (another model of the same shape): the tiny model's embeddings are
    tied into llm.mnn.weight, so the bundle's own token embeddings differ and generation's logits show it."""
    model_dir = bundle_copy / "model" / TINY
    info = embedding_info(model_dir)
    weight = model_dir / "llm.mnn.weight"
    data = bytearray(weight.read_bytes())
    rng = np.random.default_rng(0)
    end = info.alpha_offset if info.alpha_offset > info.weight_offset else len(data)
    data[info.weight_offset : end] = rng.integers(0, 256, end - info.weight_offset, dtype=np.uint8).tobytes()
    weight.write_bytes(bytes(data))
    message, report = run_failing(built, bundle_copy, tmp_path / "verify")
    assert "llm.mnn.weight" in message
    gen = report.generation
    assert gen is not None and not gen.passed
    assert any(f.startswith("generation:") for f in report.failures), report.failures
    assert any(not s.logits.passed for s in gen.steps), "detected by the logits, not only by the hash"


@pytest.mark.slow
def test_graph_off_its_ops_fails_naming_graph_and_tensor(
    built: tuple[Path, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A per-graph numeric failure names the graph, the tensor and the error (here the graph's ops in MNN are made
    to answer 10% off for one graph, which is what a miscompiled graph looks like from the outside)."""
    root = model_root(built)
    desc = SubgraphRecord.read(root / "partition" / "qnn" / "graphllm1_2")
    victim = desc.outputs[0]
    real = SourceSubgraphRunner.run

    def off(self: SourceSubgraphRunner, graph: str, *args: Any) -> list[np.ndarray]:
        outs = real(self, graph, *args)
        return [outs[0] * np.float32(1.1), *outs[1:]] if graph == "graphllm1_2" else outs  # past the 2% tolerance

    monkeypatch.setattr(SourceSubgraphRunner, "run", off)
    out = tmp_path / "verify"
    with pytest.raises(ToleranceError) as err:
        verify(inputs_for(root), VerifyParams(soc=soc_for_arch(ARCH)), out)
    line = f"graph graphllm1_2 (qnn/graphllm2.bin) output {victim.name} ({victim.qnn_name}): max abs err "
    assert line in str(err.value) and "above the allowed" in str(err.value), "the line names the broken limit"
    report = read_report(out)
    assert [g.graph for g in report.graphs if not g.passed] == ["graphllm1_2"]
    assert report.whole_model and all(s.passed for s in report.whole_model), "the bundle itself is fine"


@pytest.mark.slow
def test_a_failed_verify_states_the_broken_limit_in_one_line(built: tuple[Path, object], tmp_path: Path) -> None:
    """The tiny bundle against a model tolerance no fp16 result meets (exact): the error is one line naming the
    worst failure with the limit it broke and how many more failed, and the page's row (c) does not say
    "identical tokens" alone beside its FAIL (every token agrees; the logits do not)."""
    from mnnbuild.report.data import generation_detail

    exact = Tolerance(min_cosine=1.0, max_rel_err=0.0, abs_floor=0.0)
    out = tmp_path / "verify"
    with pytest.raises(ToleranceError) as err:
        verify(inputs_for(model_root(built)), VerifyParams(soc=soc_for_arch(ARCH), model_tolerance=exact), out)
    message = str(err.value)
    report = read_report(out)
    assert "\n" not in message and "(+" not in message, message
    assert message.startswith(f"verify {TINY}-{ARCH} FAILED: whole model seq ")
    assert "above the allowed 0 (0 x ref max abs" in message, message
    assert f"(and {len(report.failures) - 1} more failed checks); read {out / REPORT_TEXT}" in message, message
    gen = report.generation
    assert gen is not None and not gen.passed and gen.first_divergence is None, "same tokens, logits off"
    detail = generation_detail(report)
    assert detail.startswith("identical tokens") and "but the logits of" in detail and "out of tolerance" in detail
    assert any(f.startswith("generation: the logits of") and "above the allowed" in f for f in report.failures)


@pytest.mark.slow
def test_a_graph_alone_is_checked_against_the_partition_reference(built: tuple[Path, object], tmp_path: Path) -> None:
    """A graph no whole-model pass ran (here the decode graphs: the decode io sample is unreadable, and the
    generation runs prefill chunks) is run alone on the partition's reference inputs, and a reference output made
    10% wrong fails it, naming the tensor; the prefill graphs are still checked on the pass's executions."""
    root = model_root(built)
    partition = tmp_path / "partition"
    shutil.copytree(root / "partition", partition)
    graph_dir = partition / "qnn" / "graphllm2"
    desc = SubgraphRecord.read(graph_dir)
    outputs = load_vars(graph_dir / desc.reference_output)
    victim = desc.outputs[0]
    outputs[victim.name] = outputs[victim.name] * np.float32(1.1)
    (graph_dir / desc.reference_output).unlink()
    save_vars(graph_dir / desc.reference_output, outputs)
    io = tmp_path / "io"
    shutil.copytree(root / "io", io)
    (io / "testdir" / "1" / "input.mnn").write_bytes(b"not an MNN file")
    inputs = inputs_for(root).model_copy(update={"partition_dir": partition, "io_dir": io})
    out = tmp_path / "verify"
    with pytest.raises(ToleranceError):
        verify(inputs, VerifyParams(soc=soc_for_arch(ARCH)), out)
    report = read_report(out)
    fed = {g.graph: g for g in report.graphs}
    decode = sorted(n for n in fed if "_" not in n)  # graphllm<k>: the decode graphs, the lm_head's last
    # the whole-chunk sample (logits_index -1) hands the plugin after the logits slice one row: its decode graph
    assert [fed[n].fed for n in decode] == ["reference"] * (len(decode) - 1) + ["bundle_pass"]
    assert {g.fed for n, g in fed.items() if "_" in n} == {"bundle_pass"}
    assert [g.graph for g in report.graphs if not g.passed] == ["graphllm2"]
    assert [o.name for o in fed["graphllm2"].outputs if not o.passed] == [victim.name]


# ---- held-out models ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def held_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The held-out fixture models (untied int8 Qwen3, channel-wise int4 Llama) built, verified and reported for
    v79 and v75 in one doit run."""
    cwd = tmp_path_factory.mktemp("held_out")
    specs = cwd / "specs"
    specs.mkdir()
    for name in HELD_OUT:
        (specs / f"{name}.toml").write_text(
            f'name = "{name}"\nsource = {{ local = "{FIXTURE_MODELS / name}" }}\nchunk_size = 128\n'
            f"targets = {list(HELD_OUT_ARCHS)!r}\n".replace("'", '"')
        )
    tasks = [f"report:{m}-{a}" for m in HELD_OUT for a in HELD_OUT_ARCHS]  # report runs verify first
    proc = doit(cwd, "-n", "2", "--continue", *tasks, env={"MNNBUILD_MODELS_PATH": str(specs)})
    assert proc.returncode == 0, f"doit {' '.join(tasks)} failed:\n{proc.stdout}\n{proc.stderr}"
    return cwd / "artifacts"


@pytest.mark.slow
@pytest.mark.parametrize("arch", HELD_OUT_ARCHS)
@pytest.mark.parametrize("name", HELD_OUT)
def test_held_out_models_verify(held_out: Path, name: str, arch: str) -> None:
    out = held_out / name / arch / "verify"
    manifest = VerifyManifest.read(out)
    assert manifest.passed and manifest.target == arch
    report = read_report(out)
    assert report.passed and report.soc == soc_for_arch(arch).name
    assert all(p.target and p.target["dsp_arch"] == int(arch[1:]) for p in report.plugins)
    assert report.generation is not None and report.generation.hybrid_tokens == report.generation.cpu_tokens
    page = ReportManifest.read(held_out / name / arch / "report")
    assert page.verify_passed and page.target == arch
    text = (held_out / name / arch / "report" / PAGE).read_text(encoding="utf-8")
    assert 'class="verdict pass"' in text and report.soc in text and text.count('<svg role="img"') == 7
