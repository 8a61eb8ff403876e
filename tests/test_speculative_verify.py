"""Verify of bundles built for speculation: lookahead (no draft model: it passes as a plain bundle does, with its
verify-length graph among the checks, and says that no draft ran) and Eagle3 (the random pair: the tree-shaped
sample and the speculative tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mnnbuild_runtime import Embeddings, HybridModel, cpu_forward_fn, load_twins, recompute_generate
from mnnbuild_runtime.speculative import EagleDrafter, speculative_generate

from mnnbuild.stages.verify import REPORT_JSON, REPORT_TEXT
from mnnbuild.verify.verdict import VerifyReport
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR, doit

pytestmark = pytest.mark.slow  # every test here runs doit, a bundle or a whole model

RANDOM_PAIR = FIXTURE_MODELS / "qwen3-eagle-random"


def test_a_lookahead_bundle_verifies_its_verify_length_and_says_no_draft_ran(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "tiny-look.toml").write_text(
        f'name = "tiny-look"\nsource = {{ local = "{TINY_MODEL_DIR}" }}\nchunk_size = 128\ntargets = ["v79"]\n'
        'speculative = "lookahead"\n'
    )
    doit(tmp_path, "verify:tiny-look-v79", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=True)
    out = tmp_path / "artifacts" / "tiny-look" / "v79" / "verify"
    report = VerifyReport.model_validate_json((out / REPORT_JSON).read_text(encoding="utf-8"))
    assert report.passed
    # the engine's verify forward (draft_predict_length 3 + 1 rows) is io's sample of that length, and every graph
    # at that length ran in the simulator; 4 is in chunk_limits, so a prompt's last 4 tokens run there whole
    # (logits_index -1) as a full 128-token chunk does
    got = sorted((s.seq_len, s.logits_index or 0) for s in report.whole_model)
    assert got == [(1, 0), (4, -1), (4, 0), (128, -1), (128, 0)] and all(s.passed for s in report.whole_model)
    rows = {g.outputs[0].shape[1] for g in report.graphs}  # a graph's first output: [1, rows, width]
    at_four = [g for g in report.graphs if g.outputs[0].shape[1] == 4]
    assert rows == {1, 4, 128} and len(at_four) == len(report.plugins)
    assert all(g.passed and g.fed == "bundle_pass" for g in at_four)
    spec = report.speculation
    assert spec is not None and spec.passed and spec.kind == "lookahead" and spec.verify_length == 4
    assert spec.note is not None and "no draft model" in spec.note and not spec.bundle_tokens
    assert "speculative decoding (lookahead)" in (out / REPORT_TEXT).read_text(encoding="utf-8")


def test_an_eagle_bundle_verifies_its_tree_sample_and_speculative_tokens(tmp_path: Path) -> None:
    """The random Eagle3 pair's bundle: the tree-shaped sample (a real draft tree at the verify length) and the
    bundle's speculative tokens pass against the CPU; its loop read the generation check's pass, and running it on
    the bundle's own forwards gives the same tokens and rounds; a random draft buys nothing (1 token per forward);
    verify.txt and the page report say so."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "rnd-eagle.toml").write_text(
        f'name = "rnd-eagle"\nsource = {{ local = "{RANDOM_PAIR}" }}\nchunk_size = 32\ntargets = ["v79"]\n'
    )
    doit(tmp_path, "report:rnd-eagle-v79", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=True)  # after verify
    target = tmp_path / "artifacts" / "rnd-eagle" / "v79"
    report = VerifyReport.model_validate_json((target / "verify" / REPORT_JSON).read_text(encoding="utf-8"))
    spec = report.speculation
    assert report.passed and spec is not None and spec.passed and spec.kind == "eagle" and spec.problem is None
    assert spec.tree is not None and spec.tree.topk == 2 and not spec.tree.chain and len(spec.tree.tokens) == 4
    assert spec.tree.positions[0] == len(spec.prompt_ids) and spec.tree.sees[0] == [1, 0, 0, 0]
    assert spec.tree_check is not None and spec.tree_check.passed and spec.tree_check.seq_len == 4
    assert {t.name for t in spec.tree_check.outputs} == {"logits", "hidden_states"}
    assert spec.bundle_tokens == spec.cpu_tokens and len(spec.cpu_tokens) == 16 and spec.first_difference is None
    # the CPU's plain greedy tokens (taken from the generation check's reference: the same loop, the same rows)
    plain = recompute_generate(cpu_forward_fn(RANDOM_PAIR), Embeddings(RANDOM_PAIR), spec.prompt_ids, 16, 32)
    assert spec.cpu_tokens == plain.tokens
    assert spec.mean_accepted == 1.0 and spec.forwards == 16
    assert spec.replayed_forwards == 16 and spec.simulator_forwards == 0
    assert spec.npu_weight_bytes_per_forward and spec.npu_weight_bytes_per_token == spec.npu_weight_bytes_per_forward
    bundle = target / "bundle" / "model" / RANDOM_PAIR.name
    with HybridModel(bundle, binary_overrides=load_twins(target)) as model:
        embed = Embeddings(bundle)
        drafter = EagleDrafter(bundle, config_name="config_qnn.json", embed=embed)
        own = speculative_generate(model.forward, embed, drafter, spec.prompt_ids, 16, model.bundle.block_sizes)
    assert own.result.tokens == spec.bundle_tokens
    assert [vars(r) for r in own.rounds] == [r.model_dump() for r in spec.rounds]
    text = (target / "verify" / REPORT_TEXT).read_text(encoding="utf-8")
    assert "(b) tree-shaped sample (topk 2, a tree" in text and "tokens identical: pass" in text
    assert "NPU weight bytes per generated token" in text and "a size, not a speed" in text
    page = (target / "report" / "index.html").read_text(encoding="utf-8")
    assert "Speculative decoding (eagle)" in page and "1.00 tokens per target forward" in page
    assert "speculative tokens = plain greedy (16 tokens)" in page
