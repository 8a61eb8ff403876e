"""Speculative decoding on the shipped trained Eagle3 pair (``models/tiny-qwen3-eagle``): lossless on the CPU in the
runtime's loop and in MNN's own engine, the runtime's drafter as good as the engine's, and a bundle verified end to
end (its speculative tokens against plain greedy decoding, its tree-shaped sample)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mnnbuild_runtime import Embeddings, HybridModel, cpu_forward_fn, load_twins, recompute_generate
from mnnbuild_runtime.speculative import EagleDrafter, engine_generate, speculative_generate
from mnnbuild_runtime.tokenizer import Tokenizer

from mnnbuild.stages.verify import REPORT_JSON
from mnnbuild.verify.report import VerifyReport
from tests.conftest import PROJECT_ROOT, doit

pytestmark = pytest.mark.slow  # every test here runs doit, a bundle or a whole model

EAGLE = PROJECT_ROOT / "models" / "tiny-qwen3-eagle"
NEW_TOKENS = 32


def held_prompts() -> list[str]:
    """Words of documents the pair was not trained on (its ``training.json``)."""
    return list(json.loads((EAGLE / "training.json").read_text(encoding="utf-8"))["results"]["eval_prompts"])


@pytest.fixture(scope="module")
def pair() -> tuple[object, Embeddings, EagleDrafter, Tokenizer]:
    embed = Embeddings(EAGLE)
    return cpu_forward_fn(EAGLE), embed, EagleDrafter(EAGLE, embed=embed), Tokenizer(EAGLE / "config.json")


def test_the_trained_draft_is_lossless_and_buys_tokens_per_forward(pair: tuple) -> None:
    """On held prompts the speculative loop's tokens, margins and rows are the plain loop's bit for bit, and the
    trained draft makes a target forward yield more than one token (a random draft yields exactly one)."""
    forward, embed, drafter, tokenizer = pair
    tokens = forwards = 0
    for prompt in held_prompts():
        ids = tokenizer.encode(prompt)
        plain = recompute_generate(forward, embed, ids, NEW_TOKENS, 128)
        spec = speculative_generate(forward, embed, drafter, ids, NEW_TOKENS, 128)
        assert spec.result.tokens == plain.tokens and spec.result.top2_margins == plain.top2_margins
        assert all(np.array_equal(a, b) for a, b in zip(spec.result.rows, plain.rows, strict=True))
        drafted = [r for r in spec.rounds if r.draft]
        tokens += sum(r.tokens for r in drafted)
        forwards += sum(r.forwards for r in drafted)
    assert tokens / forwards >= 2.0


def test_the_runtimes_drafter_needs_the_forwards_mnns_engine_needs(pair: tuple) -> None:
    """The runtime's Eagle drafter (recomputing the draft each round, no KV cache) proposes what MNN's engine does:
    for the same tokens it needs exactly the engine's target forwards, on every held prompt; the engine's Eagle
    tokens are its plain greedy ones (full precision), which are the runtime's recompute loop's (the engine may give
    a round's tokens past ``max_new_tokens``: the runtime's loop then runs to the same count)."""
    forward, embed, drafter, _ = pair
    for prompt in held_prompts():
        plain = engine_generate(EAGLE / "config.json", prompt, NEW_TOKENS, speculative=False)
        spec = engine_generate(EAGLE / "config.json", prompt, NEW_TOKENS, speculative=True)
        assert len(plain.tokens) == NEW_TOKENS and spec.forwards is not None
        assert spec.tokens[:NEW_TOKENS] == plain.tokens and spec.prompt_ids == plain.prompt_ids
        ours = speculative_generate(forward, embed, drafter, plain.prompt_ids, len(spec.tokens), 128)
        assert ours.result.tokens[:NEW_TOKENS] == plain.tokens
        assert ours.forwards - 1 == spec.forwards, (prompt, [(r.draft, r.accepted) for r in ours.rounds])


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped pair's bundle, built and verified (its own spec)."""
    root = tmp_path_factory.mktemp("eagle")
    doit(root, "verify:tiny-qwen3-eagle-v79", check=True, timeout=1800)
    return root / "artifacts" / "tiny-qwen3-eagle" / "v79" / "verify"


def test_verify_proves_the_pairs_bundle_speculates_losslessly(verified: Path) -> None:
    report = VerifyReport.model_validate_json((verified / REPORT_JSON).read_text(encoding="utf-8"))
    spec = report.speculation
    assert report.passed and spec is not None and spec.passed and spec.problem is None
    # (b) a real tree: the draft's best nodes branch, and the bundle's verifying forward is the CPU's
    assert spec.tree is not None and not spec.tree.chain and len(spec.tree.tokens) == spec.verify_length == 4
    assert spec.tree_check is not None and spec.tree_check.passed and spec.tree_check.top1 is not None
    # (c) the bundle's speculative tokens are the CPU's plain greedy ones up to a near-tie, where the plain generation
    # check sees the bundle flip too (new token 15 for "Computes the": the CPU leads by 0.002, 0.02% of the row's
    # max |logit|), named as one; and a forward yields more than one token (a random draft: exactly one)
    gen = report.generation
    assert gen is not None and len(spec.cpu_tokens) == gen.max_new_tokens and spec.cpu_tokens == gen.cpu_tokens
    first = spec.first_difference
    assert first == gen.first_divergence and spec.bundle_tokens == gen.hybrid_tokens
    if first is not None:
        assert spec.bundle_tokens[:first] == spec.cpu_tokens[:first] and spec.steps[-1].tolerated_flip
        assert spec.difference_note is not None and "a near-tie, tolerated" in spec.difference_note
    assert spec.mean_accepted is not None and spec.mean_accepted > 1.0
    assert spec.npu_weight_bytes_per_forward and spec.npu_weight_bytes_per_token == pytest.approx(
        spec.npu_weight_bytes_per_forward / spec.mean_accepted
    )
    text = (verified / "verify.txt").read_text(encoding="utf-8")
    assert "mean accepted tokens per target forward" in text and "a size, not a speed" in text
    # the loop read the generation check's pass: no simulator forward of its own
    assert spec.replayed_forwards == spec.forwards and spec.simulator_forwards == 0


def test_the_bundles_own_speculative_loop_is_the_one_verify_read(verified: Path) -> None:
    """The loop verify judged (its forwards read from the generation check's pass) is the loop the bundle runs when
    every forward runs in the simulator: the same tokens and the same rounds."""
    report = VerifyReport.model_validate_json((verified / REPORT_JSON).read_text(encoding="utf-8"))
    assert report.speculation is not None and report.generation is not None
    target = verified.parent
    bundle = target / "bundle" / "model" / "tiny-qwen3-eagle"
    with HybridModel(bundle, binary_overrides=load_twins(target)) as model:
        embed = Embeddings(bundle)
        drafter = EagleDrafter(bundle, config_name="config_qnn.json", embed=embed)
        own = speculative_generate(model.forward, embed, drafter, report.speculation.prompt_ids,
                                   report.generation.max_new_tokens, model.bundle.block_sizes)  # fmt: skip
    assert own.result.tokens == report.speculation.bundle_tokens
    assert [vars(r) for r in own.rounds] == [r.model_dump() for r in report.speculation.rounds]
