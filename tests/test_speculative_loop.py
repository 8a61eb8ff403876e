"""Speculative greedy decoding in the runtime (`mnnbuild_runtime.speculative`): lossless by construction, and the
acceptance it buys counted right."""

from __future__ import annotations

import numpy as np
import pytest
from mnnbuild_runtime import (
    Embeddings,
    GenerationResult,
    cpu_forward_fn,
    draft_feeds,
    draft_rows,
    llm_inputs,
    recompute_generate,
)
from mnnbuild_runtime.errors import BundleError
from mnnbuild_runtime.speculative import (
    DraftTree,
    EagleDrafter,
    OracleDrafter,
    Round,
    SpeculativeResult,
    engine_generate,
    speculative_generate,
)
from mnnbuild_runtime.tokenizer import Tokenizer

from mnnbuild.base.compare import Tolerance
from mnnbuild.verify.failures import speculation_failures
from mnnbuild.verify.speculation import (
    ReplayForward,
    cpu_sequence_pass,
    cut_where_parted,
    judge,
    left_the_pass,
    parted_before,
)
from mnnbuild.verify.verdict import SpeculationCheck
from tests.conftest import FIXTURE_MODELS, PROJECT_ROOT

pytestmark = pytest.mark.slow  # every test here runs doit, a bundle or a whole model

TRAINED = PROJECT_ROOT / "models" / "tiny-qwen3-trained"


@pytest.fixture(scope="module")
def trained() -> tuple[object, Embeddings, list[int]]:
    ids = Tokenizer(TRAINED / "config.json").encode("the cat")
    return cpu_forward_fn(TRAINED), Embeddings(TRAINED), ids


@pytest.mark.parametrize("chunk", [128, [1, 32, 128]], ids=["one-length", "chunk-limits"])
def test_speculative_tokens_are_plain_greedy_tokens_whatever_the_draft(trained: tuple, chunk: object) -> None:
    """A draft that is always right, one that is always wrong and one right only at some steps: the tokens, margins
    and rows are the plain recompute loop's, bit for bit (the rows that pick them see the same tokens)."""
    forward, embed, ids = trained
    plain = recompute_generate(forward, embed, ids, 12, chunk)
    seq = plain.sequence
    half = [t if i % 2 else t + 1 for i, t in enumerate(seq)]  # right at every other position
    for drafter in (OracleDrafter(seq, 3), OracleDrafter(seq, 3, shift=1, vocab=embed.vocab),
                    OracleDrafter(half, 3)):  # fmt: skip
        got = speculative_generate(forward, embed, drafter, ids, 12, chunk)
        assert got.result.tokens == plain.tokens
        assert got.result.top2_margins == plain.top2_margins
        assert all(np.array_equal(a, b) for a, b in zip(got.result.rows, plain.rows, strict=True))
        assert sum(r.tokens for r in got.rounds) == 12


def test_acceptance_is_counted_per_target_forward(trained: tuple) -> None:
    """With one prefill length: a draft of k that always holds yields k + 1 tokens per forward, one that never holds
    yields 1; the prompt's round (no draft yet, the engine's prefill) is not counted."""
    forward, embed, ids = trained
    k, n = 3, 13  # 1 from the prompt's forward, then 3 rounds of 4
    plain = recompute_generate(forward, embed, ids, n, 128)
    right = speculative_generate(forward, embed, OracleDrafter(plain.sequence, k), ids, n, 128)
    rounds = [(len(r.draft), r.accepted, r.tokens, r.forwards) for r in right.rounds]
    assert rounds == [(0, 0, 1, 1)] + [(3, 3, 4, 1)] * 3
    assert right.mean_accepted == k + 1 and right.forwards == 4
    wrong = speculative_generate(forward, embed, OracleDrafter(plain.sequence, k, 1, embed.vocab), ids, n, 128)
    assert all(r.accepted == 0 and r.tokens == 1 and r.forwards == 1 for r in wrong.rounds)
    assert wrong.mean_accepted == 1.0 and wrong.forwards == n
    assert right.result.tokens == wrong.result.tokens == plain.tokens


def test_the_last_round_drafts_only_what_is_left(trained: tuple) -> None:
    """The draft is cut to the tokens left (less the target's own one), so the loop never runs past
    ``max_new_tokens``: 8 tokens with a right draft of 4 are 1 (prompt) + 5 + 2; the cut round is not in the mean."""
    forward, embed, ids = trained
    plain = recompute_generate(forward, embed, ids, 8, 128)
    got = speculative_generate(forward, embed, OracleDrafter(plain.sequence, 4), ids, 8, 128)
    assert [(len(r.draft), r.tokens, r.cut) for r in got.rounds] == [(0, 1, False), (4, 5, False), (1, 2, True)]
    assert got.mean_accepted == 5.0  # the cut round is not a full round's measure
    assert got.result.tokens == plain.tokens and got.result.stop_reason == "max_new_tokens"


def test_tree_inputs_are_the_engines_tree_mask_and_positions() -> None:
    """The engine's verifying forward for a two-wide tree: root children a, b; a's children c, d (the best 3 nodes:
    a, b, c): rows sample, a, b, c; c sees a and not b; positions 0, 1, 1, 2."""
    tree = DraftTree()
    a, b = tree.add(10, -1, -0.1), tree.add(11, -1, -0.5)
    c = tree.add(12, a, -0.2)
    tree.add(13, a, -0.9)
    assert tree.best(3) == [a, b, c]
    tokens, mask, positions = tree.inputs(7, 3)
    assert tokens == [7, 10, 11, 12] and positions.tolist() == [0, 1, 1, 2]
    sees = mask[0, 0] == 0
    assert sees.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, False, True, False],
        [True, True, False, True],
    ]
    assert set(np.unique(mask).tolist()) == {0.0, float(np.finfo(np.float32).min)}
    assert tree.paths(tree.best(3)) == [[b], [a, c]]
    assert tree.chain(3) == [10, 12]
    assert tree.chain(1) == [10]


def test_verify_names_the_step_where_speculative_tokens_leave_plain_greedy(trained: tuple) -> None:
    """A loop that accepts a draft token the target does not pick (a wrong acceptance rule) gives other tokens than
    plain greedy decoding: verify's judgement fails, naming the first such step; the same flip at a near-tie (a
    tie margin wide enough for it) is allowed and named as one."""

    forward, embed, ids = trained
    plain = recompute_generate(forward, embed, ids, 10, 128)
    honest = speculative_generate(forward, embed, OracleDrafter(plain.sequence, 3), ids, 10, 128)
    tol = Tolerance()
    assert judge(honest, plain, tol)[1:] == (None, None, True)
    # accepted as drafted: the target's least likely token at step 5, then the rows of that sequence
    wrong_at = 5
    bad = int(plain.rows[wrong_at].argmin())
    tokens = [*plain.tokens[:wrong_at], bad, *plain.tokens[wrong_at + 1 :]]
    logits = {size: forward(feed)["logits"] for size, feed in draft_feeds(embed, ids, tokens, 10, 128).items()}
    rows = draft_rows(logits, ids, tokens, 128)
    broken = SpeculativeResult(
        GenerationResult(ids, tokens, "max_new_tokens", 128, rows=rows), [Round(tokens, 10, 10, 1)], 10
    )
    steps, first, note, ok = judge(broken, plain, tol)
    assert (first, ok) == (wrong_at, False) and len(steps) == wrong_at + 1
    assert note is not None and f"at new token {wrong_at}" in note and "NOT a near-tie" in note
    check = SpeculationCheck(
        kind="eagle",
        cpu_tokens=plain.tokens,
        bundle_tokens=tokens,
        steps=steps,
        first_difference=first,
        difference_note=note,
        passed=ok,
    )
    (line,) = [f.line for f in speculation_failures(check, tol)]
    assert line.startswith(f"speculation: at new token {wrong_at} the bundle's speculative loop gives {bad} where")
    wide = Tolerance(tie_margin=1e9)
    _, first, note, ok = judge(broken, plain, wide)
    assert (first, ok) == (wrong_at, True) and note is not None and "a near-tie, tolerated" in note


def test_a_sure_drafts_chain_gives_way_to_a_branch_for_the_tree_sample() -> None:
    """A draft so sure that its best nodes form a chain (a, a's child c, c's child e) would make the tree-shaped
    sample's mask causal: the deepest (e) gives way to the best node branching off the rest (b, under the root);
    a child of c would only make the chain again. Best nodes that already branch are kept as they are."""
    tree = DraftTree()
    a, b = tree.add(10, -1, -0.01), tree.add(11, -1, -3.0)
    c = tree.add(12, a, -0.01)
    tree.add(13, a, -4.0)
    e, f = tree.add(14, c, -0.01), tree.add(15, c, -0.5)
    assert tree.best(3) == [a, c, e] and len(tree.paths(tree.best(3))) == 1
    assert tree.branching(3) == [a, b, c] and f not in tree.branching(3)
    _, mask, positions = tree.inputs(7, 3, tree.branching(3))
    assert positions.tolist() == [0, 1, 1, 2] and not np.array_equal(mask[0, 0] == 0, np.tril(np.ones((4, 4), bool)))
    bushy = DraftTree()
    x, y = bushy.add(1, -1, -0.1), bushy.add(2, -1, -0.2)
    bushy.add(3, x, -0.5)
    assert bushy.branching(3) == bushy.best(3) == [x, y, 2]
    assert tree.branching(1) == [a]


def test_the_loop_reads_the_generation_passs_rows_only_where_they_are_its_own(trained: tuple) -> None:
    """Verify serves the bundle loop's forwards from the generation check's pass (`ReplayForward`): on the pass's
    own sequence every forward is served and the loop is the one it runs on the forward itself, bit for bit; on a
    pass over another sequence (its token 5 not the greedy one) the rows from the first that differs are NaN, so
    the loop shows where it left the pass's rows (and verify runs it on the forward instead)."""
    forward, embed, ids = trained
    plain = recompute_generate(forward, embed, ids, 12, 128)
    drafter = OracleDrafter(plain.sequence, 3)
    own = speculative_generate(forward, embed, drafter, ids, 12, 128)

    def pass_over(tokens: list[int]) -> dict[int, tuple[dict, dict]]:
        feeds = draft_feeds(embed, ids, tokens, len(tokens), 128)
        return {size: (feed, forward(feed)) for size, feed in feeds.items()}

    served = ReplayForward(forward, pass_over(plain.tokens))
    replayed = speculative_generate(served, embed, drafter, ids, 12, 128)
    assert served.served == own.forwards and served.ran == 0
    assert replayed.result.tokens == own.result.tokens and replayed.rounds == own.rounds
    assert all(np.array_equal(a, b) for a, b in zip(replayed.result.rows, own.result.rows, strict=True))
    other = [*plain.tokens[:5], (plain.tokens[5] + 1) % embed.vocab, *plain.tokens[6:]]
    left = speculative_generate(ReplayForward(forward, pass_over(other)), embed, drafter, ids, 12, 128)
    finite = [bool(np.isfinite(row).all()) for row in left.result.rows]
    assert finite[:6] == [True] * 6 and not all(finite[6:]) and left.result.tokens[:6] == plain.tokens[:6]
    # where the pass is the CPU's and the loop parted from it before leaving it (token 5), the check ends there:
    # the loop is cut at the row it left the pass (6), not run again in the simulator
    assert left_the_pass(left) == 6 and left_the_pass(replayed) is None
    cpu = GenerationResult(ids, other, "max_new_tokens", 128, rows=plain.rows, top2_margins=plain.top2_margins)
    cut = parted_before(left, 6, cpu)
    assert cut is not None and cut.result.tokens == plain.tokens[:6] and len(cut.result.rows) == 6
    assert sum(r.tokens for r in cut.rounds) == 6 and cut.rounds[:-1] == left.rounds[: len(cut.rounds) - 1]
    assert judge(cut, cpu, Tolerance())[1] == 5
    # a loop that leaves the pass without parting from the CPU's tokens first must run it all: no cut
    assert parted_before(left, 6, plain) is None
    # the pass need not be the CPU's own loop (at 28 layers MNN's engine parted from the recompute loop, so verify
    # had no plain greedy run and reran 16 tokens in the simulator, hours): the CPU's loop is computed then, once
    computed: list[GenerationResult] = []

    def cpu_plain() -> GenerationResult:
        computed.append(cpu)
        return cpu

    got, run, at = cut_where_parted(left, None, cpu_plain)
    assert got is not None and got.result.tokens == cut.result.tokens and run is cpu and at == 6 and computed == [cpu]
    assert cut_where_parted(left, cpu, cpu_plain)[1:] == (cpu, 6) and len(computed) == 1  # given: not computed
    assert cut_where_parted(left, None, cpu_plain, follow=True) == (None, None, 6) and len(computed) == 1
    assert cut_where_parted(replayed, None, cpu_plain) == (None, None, None) and len(computed) == 1  # never left
    assert cut_where_parted(left, None, lambda: plain)[0] is None  # left without parting: runs on in the simulator
    # ... which, when the pass was another sequence's (the engine's), is one forward over the CPU's sequence: the
    # loop, following the CPU's tokens, reads only that pass's rows (not a forward per token)
    calls: list[int] = []

    def counted(feed: dict) -> dict:
        calls.append(1)
        return forward(feed)

    own_pass = cpu_sequence_pass(counted, embed, ids, plain, 128)
    assert len(calls) == len(own_pass) == 1
    served = ReplayForward(counted, {**pass_over(other), **own_pass})
    again = speculative_generate(served, embed, drafter, ids, 12, 128)
    assert left_the_pass(again) is None and served.ran == 0 and len(calls) == 1
    assert again.result.tokens == own.result.tokens and again.rounds == own.rounds
    assert all(np.array_equal(a, b) for a, b in zip(again.result.rows, own.result.rows, strict=True))


def test_a_cut_loop_keeps_its_first_tokens_and_marks_the_round_it_cut() -> None:
    """`SpeculativeResult.cut`: the rounds that gave the first ``count`` tokens, the last cut where they end (and
    marked, so `mean_accepted` counts whole rounds only)."""
    rows = [np.full(4, i, np.float32) for i in range(9)]
    result = GenerationResult([1, 2], list(range(10, 19)), "max_new_tokens", 128, [0.1] * 9, [1.0] * 9, rows)
    rounds = [Round([], 0, 1, 1), Round([5, 6, 7], 3, 4, 1), Round([8, 9, 9], 1, 2, 1), Round([1, 1, 1], 1, 2, 1)]
    spec = SpeculativeResult(result, rounds, 3)
    cut = spec.cut(6)
    assert cut.result.tokens == list(range(10, 16)) and cut.result.stop_reason == "cut" and len(cut.result.rows) == 6
    assert cut.rounds[:2] == rounds[:2] and cut.rounds[2] == Round([8, 9, 9], 1, 1, 1, cut=True)
    assert cut.mean_accepted == 4.0 and spec.mean_accepted == 8 / 3
    assert spec.cut(9).rounds == rounds and spec.cut(1).rounds == rounds[:1]


def test_mnn_engines_plain_greedy_run_is_the_recompute_loop_and_a_plain_model_cannot_speculate(trained: tuple) -> None:
    """`engine_generate` (PyPI MNN's engine at full precision) on a plain model: its greedy tokens are the recompute
    loop's; asking it to speculate is one line naming the config field."""
    forward, embed, _ = trained
    run = engine_generate(TRAINED / "config.json", "the cat", 8, speculative=False)
    assert run.forwards is None and run.tokens == recompute_generate(forward, embed, run.prompt_ids, 8, 128).tokens
    with pytest.raises(BundleError) as exc:
        engine_generate(TRAINED / "config.json", "the cat", 8, speculative=True)
    expected = f"{TRAINED / 'config.json'}: field 'speculative_type' is not set; the engine cannot speculate"
    assert str(exc.value) == expected


RANDOM_PAIR = FIXTURE_MODELS / "qwen3-eagle-random"


def test_the_eagle_drafter_on_a_random_pair_is_lossless_and_counts_as_the_engine_does() -> None:
    """The runtime's Eagle3 drafter on the random 7-layer pair: a chain of ``draft_predict_length`` at the engine's
    defaults and a two-wide tree on request; the loop's tokens are plain greedy's; MNN's own engine at full precision
    gives its plain tokens with speculation too, and needs as many target forwards as the runtime's loop (a random
    draft: one token per forward)."""
    embed = Embeddings(RANDOM_PAIR)
    forward, drafter = cpu_forward_fn(RANDOM_PAIR), EagleDrafter(RANDOM_PAIR, embed=embed)
    assert (drafter.config.draft_length, drafter.config.topk, drafter.config.depth) == (3, 1, 3)
    plain = engine_generate(RANDOM_PAIR / "config.json", "hello world", 12, speculative=False)
    spec = engine_generate(RANDOM_PAIR / "config.json", "hello world", 12, speculative=True)
    assert spec.tokens[:12] == plain.tokens and spec.forwards is not None
    ids = plain.prompt_ids
    ours = speculative_generate(forward, embed, drafter, ids, len(spec.tokens), 128)
    assert ours.result.tokens == recompute_generate(forward, embed, ids, len(spec.tokens), 128).tokens
    assert ours.result.tokens[:12] == plain.tokens and ours.forwards - 1 == spec.forwards
    assert all(len(r.draft) == 3 for r in ours.rounds[1:] if not r.cut) and ours.mean_accepted == spec.mean_accepted
    out = forward(llm_inputs(embed(ids), 128, logits_index=0))
    hidden = np.asarray(out["hidden_states"]).reshape(128, -1)[: len(ids)]
    sample = int(np.asarray(out["logits"]).reshape(128, -1)[len(ids) - 1].argmax())
    tree = drafter.tree([*ids, sample], hidden, topk=2)
    # two per level: 2 at the first, 2 x 2 candidates at each of the two more; draft ids mapped to target ids
    assert [tree.depths.count(d) for d in range(3)] == [2, 4, 4] and all(t % 2 == 0 for t in tree.tokens)
    # the first level's best node is the chain's first token: both are the draft's argmax after the sampled token
    assert tree.tokens[0] == drafter.tree([*ids, sample], hidden).chain(3)[0] and tree.scores[0] >= tree.scores[1]
