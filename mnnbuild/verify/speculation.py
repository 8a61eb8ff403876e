"""Verify of a bundle that speculates (``speculative_type`` in its ``config_qnn.json``): the engine's verifying
forward on a real draft tree, and speculative generation against plain greedy decoding.

- (b) tree-shaped sample: the original model on the CPU reads the prompt; its hidden rows feed the bundle's Eagle
  draft, which grows a token tree (``eagle_topk`` at least 2); the engine's verifying forward for it (the sampled
  token and the ``draft_predict_length`` best nodes, at the verify length, with the tree mask and the tree positions
  after the prompt; should the best nodes form a chain, the deepest gives way to the best node that branches:
  :meth:`~mnnbuild_runtime.speculative.DraftTree.branching`) runs through the bundle and through the original model
  on the CPU, judged as an io sample is (:func:`mnnbuild.verify.checks.check_whole_model`). Without a KV cache the
  rows see the tree only, not the prompt: the sample exercises the verify-length graphs with the tree's mask and
  positions.
  A lookahead bundle has no tree: its verifying forward is a chain padded to the verify length, io's sample of
  that length.
- (c) speculative generation: the bundle's speculative greedy loop (its Eagle draft on the CPU, or lookahead's
  n-gram drafts, :class:`mnnbuild_runtime.lookahead.LookaheadDrafter`, with the settings of the bundle's config;
  its forwards in the simulator, :func:`mnnbuild_runtime.speculative.speculative_generate`) must give the original
  model's plain greedy tokens on the CPU (:func:`mnnbuild_runtime.generate.cpu_greedy_generate`). Up to the first
  token where they part both loops ran the same prefixes, so each step's rows are compared too (the model
  tolerance); where they part, the bundle's token is a flip of the CPU's, allowed only at a near-tie (as the plain
  generation check judges one) and named as such, and the check ends there. Anything else fails, naming the step.

The report gives the bundle loop's mean accepted tokens per target forward and the NPU weight bytes per generated
token (the NPU weight bytes a forward reads, over that mean: a size, not a speed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from mnnbuild_runtime import Embeddings, ForwardResult, HybridModel, cpu_forward_fn, cpu_greedy_generate, llm_inputs
from mnnbuild_runtime.bundle import CONFIG_FILE
from mnnbuild_runtime.generate import ForwardFn, GenerationResult, draft_feeds
from mnnbuild_runtime.lookahead import LookaheadDrafter
from mnnbuild_runtime.speculative import (
    HIDDEN,
    Drafter,
    EagleDrafter,
    SpeculationConfig,
    SpeculativeResult,
    speculation_config,
    speculative_generate,
)

from mnnbuild.base.compare import Tolerance
from mnnbuild.cpu import CpuRuntime
from mnnbuild.manifests.context import ContextManifest
from mnnbuild.mnn.llm import DRAFT_LENGTH_FIELD, EAGLE, LOOKAHEAD, LOOKUP_FILE_FIELD
from mnnbuild.verify.checks import Sample, check_whole_model, generation_step, step_passed
from mnnbuild.verify.reference import describe_error
from mnnbuild.verify.verdict import GenerationStep, SpeculationCheck, SpeculationRound, TreeSample

log = logging.getLogger(__name__)

TREE_TOPK = 2
"""Candidates per node for the tree-shaped sample when the model's ``eagle_topk`` is 1 (a chain)."""


def npu_weight_bytes(contexts: Mapping[str, ContextManifest]) -> int:
    """The NPU weight bytes a forward reads: every conv weight of the plugins once, as the binaries store it."""
    return sum(note.stored_bytes for ctx in contexts.values() for note in ctx.weights)


def tree_feed(
    cpu_forward: ForwardFn, embed: Embeddings, drafter: EagleDrafter, prompt_ids: list[int], chunk: int, topk: int
) -> tuple[TreeSample, dict[str, np.ndarray]]:
    """The engine's verifying forward for the draft's tree after ``prompt_ids`` (the original model's forward at
    ``chunk`` rows gives the sampled token and the hidden rows the draft reads)."""
    n = len(prompt_ids)
    out = cpu_forward(llm_inputs(embed(prompt_ids), chunk, logits_index=0))
    logits = np.asarray(out["logits"]).reshape(chunk, -1)
    if HIDDEN not in out:
        raise ValueError(f"the original model gives no {HIDDEN!r} output; an Eagle draft reads it")
    hidden = np.asarray(out[HIDDEN]).reshape(chunk, -1)[:n]
    sample = int(logits[n - 1].argmax())
    tree = drafter.tree([*prompt_ids, sample], hidden, topk=topk)
    size = drafter.config.verify_length
    best, nodes = tree.best(size - 1), tree.branching(size - 1)
    tokens, mask, positions = tree.inputs(sample, size - 1, nodes)
    if len(tokens) < size:
        raise ValueError(f"the draft's tree has {len(tokens) - 1} nodes for a verifying forward of {size} rows")
    feed = llm_inputs(embed(tokens), size, logits_index=0)
    feed["attention_mask"] = mask
    feed["position_ids"] = (positions + n).reshape(1, size).astype(np.int32)
    sees = (mask[0, 0] == 0).astype(int).tolist()
    chain = bool(np.array_equal(mask[0, 0] == 0, np.tril(np.ones((size, size), dtype=bool))))
    fed = feed["position_ids"][0].tolist()
    return TreeSample(tokens=tokens, positions=fed, sees=sees, topk=topk, chain=chain, forked=nodes != best), feed


class ReplayForward:
    """The bundle's forward for the speculative loop, served from the generation check's pass where that pass already
    holds the rows: with the causal mask a row depends only on the tokens up to it (the generation check and the
    shared io samples rest on the same fact), so a forward whose rows up to ``p`` carry the pass's inputs has the
    pass's outputs there. Rows after the first that differs are NaN (the loop reads them only when the bundle's token
    leaves the pass's sequence; its rows then show it, and the loop runs again on ``forward``); a length the pass
    did not run, or other inputs, run on ``forward``."""

    def __init__(
        self, forward: ForwardFn, runs: Mapping[int, tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]]
    ) -> None:
        self.forward, self.runs = forward, runs
        self.served = self.ran = 0

    def __call__(self, feed: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        ids = np.asarray(feed["input_ids"])
        size = ids.shape[0]
        cached = self.runs.get(size)
        if (
            cached is None
            or set(cached[0]) != set(feed)
            or any(not np.array_equal(cached[0][k], v) for k, v in feed.items() if k != "input_ids")
        ):
            self.ran += 1
            return self.forward(feed)
        rows, ref = ids.reshape(size, -1), np.asarray(cached[0]["input_ids"]).reshape(size, -1)
        real = np.any(rows != 0, axis=1)
        fed = size if real.all() else int(np.argmin(real))  # the sequence's rows; zeros pad the rest
        same = np.all(rows[:fed] == ref[:fed], axis=1)
        valid = fed if same.all() else int(np.argmin(same))
        outputs = {}
        for name, value in cached[1].items():
            value = np.array(value, copy=True)
            if value.ndim >= 2 and value.shape[-2] == size and np.issubdtype(value.dtype, np.floating):
                value[..., valid:, :] = np.nan
            outputs[name] = value
        self.served += 1
        return outputs


def left_the_pass(spec: SpeculativeResult) -> int | None:
    """The first new token whose row is not finite: where the loop left the replayed pass's sequence
    (`ReplayForward` gives NaN rows past it); None when every row was served or run."""
    return next((i for i, row in enumerate(spec.result.rows) if not np.isfinite(row).all()), None)


def parted_before(spec: SpeculativeResult, left: int, cpu: GenerationResult) -> SpeculativeResult | None:
    """``spec`` cut at ``left`` when, before it, the bundle's token parts from the CPU's: the check ends at that
    token (`judge`), so the rounds after it, which would each run in the simulator, decide nothing. None when it
    does not part before ``left`` (the loop must then run all of it)."""
    cut = spec.cut(left)
    parted = any(got != want for got, want in zip(cut.result.tokens, cpu.tokens, strict=False))
    return cut if parted else None


def cut_where_parted(
    spec: SpeculativeResult,
    plain: GenerationResult | None,
    cpu_plain: Callable[[], GenerationResult],
    follow: bool = False,
) -> tuple[SpeculativeResult | None, GenerationResult | None, int | None]:
    """Where the loop served from the pass left it (:func:`left_the_pass`): the loop cut there when the bundle parted
    from the CPU's plain greedy tokens before (:func:`parted_before`), else None (it must run on in the simulator,
    as it must with ``follow``). ``plain`` is that CPU loop when the pass's sequence was its tokens; when it was not
    (MNN's engine parted from the recompute loop) ``cpu_plain`` computes it, minutes of CPU against a simulator
    forward per token left. Returns the cut loop, the CPU loop if there is one now, and where the loop left."""
    left = left_the_pass(spec)
    if left is None or follow:
        return None, plain, left
    cpu = plain if plain is not None else cpu_plain()
    return parted_before(spec, left, cpu), cpu, left


def cpu_sequence_pass(
    forward: ForwardFn,
    embed: Embeddings,
    prompt_ids: list[int],
    cpu: GenerationResult,
    limits: int | list[int],
) -> dict[int, tuple[dict[str, np.ndarray], Mapping[str, np.ndarray]]]:
    """``forward`` run once per length over the CPU's plain greedy sequence (the forwards its loop makes, by
    length), as :class:`ReplayForward` takes a pass: a loop that follows those tokens reads only their rows."""
    feeds = draft_feeds(embed, prompt_ids, cpu.tokens, len(cpu.tokens), limits)
    return {size: (feed, forward(feed)) for size, feed in feeds.items()}


def judge(
    spec: SpeculativeResult, cpu: GenerationResult, tol: Tolerance
) -> tuple[list[GenerationStep], int | None, str | None, bool]:
    """The bundle's speculative tokens against the CPU's plain greedy ones: each step up to the first where they part
    (same prefix for both), its rows within the model tolerance; where they part, a flip allowed only at a near-tie
    of the CPU's row. Returns the steps, that step (None: the same tokens), a note on it and the verdict."""
    steps, first, note, ok = [], None, None, True
    for i, (got, want) in enumerate(zip(spec.result.tokens, cpu.tokens, strict=False)):
        step = generation_step(i, spec.result.rows[i], cpu.rows[i], want, got, tol)
        steps.append(step)
        ok = ok and step_passed(step)
        flip = got != want
        if flip:
            first = i
            tie = "a near-tie, tolerated" if step.tolerated_flip else "NOT a near-tie"
            note = (
                f"at new token {i} the bundle's speculative loop gives {got} where the CPU's plain greedy "
                f"decoding gives {want}, which the CPU prefers by {step.cpu_lead:.4g} (top-2 margin "
                f"{step.cpu_margin:.4g}, {tie})"
            )
            break
    if first is None and len(spec.result.tokens) != len(cpu.tokens):
        first, ok = min(len(spec.result.tokens), len(cpu.tokens)), False
        note = (
            f"the bundle's speculative loop gives {len(spec.result.tokens)} tokens ({spec.result.stop_reason}), "
            f"the CPU's plain greedy decoding {len(cpu.tokens)} ({cpu.stop_reason})"
        )
    return steps, first, note, ok


def check_speculation(
    model: HybridModel,
    model_dir: Path,
    prompt_ids: list[int],
    max_new_tokens: int,
    runtime: CpuRuntime,
    tol: Tolerance,
    weight_bytes: int | None,
    *,
    cpu_forward: ForwardFn | None = None,
    replay: Mapping[int, tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]] | None = None,
    plain: GenerationResult | None = None,
    follow: bool = False,
) -> SpeculationCheck | None:
    """(b) on the tree-shaped sample and (c) speculative generation for a bundle whose config asks for speculation
    (None for one that does not); a problem is recorded, never raised. ``model_dir``: the original (fetched) model;
    ``weight_bytes``: the NPU weight bytes a forward reads (:func:`npu_weight_bytes`); ``replay``: the generation
    check's bundle pass by length, whose rows serve the loop where they can (:class:`ReplayForward`); ``plain``: the
    original model's plain greedy tokens and rows for the prompt when already at hand (else computed here);
    ``follow``: after the bundle's first token that parts from them, run its own loop on to ``max_new_tokens``
    (``VerifyParams.follow_divergence``), else the loop stops where it left the replayed pass (`parted_before`)."""
    bundle = model.bundle
    config_path = bundle.model_dir / CONFIG_FILE
    t0 = time.perf_counter()
    try:
        config: SpeculationConfig | None = speculation_config(config_path)
    except Exception as exc:
        return SpeculationCheck(kind="?", passed=False, problem=describe_error(exc))
    if config is None:
        return None
    check = SpeculationCheck(
        kind=config.kind,
        draft_length=config.draft_length,
        topk=config.topk,
        depth=config.depth,
        verify_length=config.verify_length,
        prompt_ids=list(prompt_ids),
        npu_weight_bytes_per_forward=weight_bytes,
        passed=False,
    )
    if config.kind not in (EAGLE, LOOKAHEAD):
        # no drafter for it here: its verify-length graphs are proved by (a) and io's sample of that length
        check.note = (
            f"{config.kind}: no drafter in the runtime; its verify-length graphs are checked per graph and on io's "
            "sample"
        )
        check.passed, check.seconds = True, time.perf_counter() - t0
        return check
    try:
        embed = Embeddings(bundle.model_dir)
        limits = bundle.block_sizes
        drafter: Drafter
        if config.kind == EAGLE:
            drafter = EagleDrafter(bundle.model_dir, runtime, config_name=CONFIG_FILE, embed=embed)
            cpu_forward = cpu_forward or cpu_forward_fn(model_dir, runtime)
            # (b) the engine's verifying forward on a real tree
            topk = max(config.topk, TREE_TOPK)
            check.tree, feed = tree_feed(cpu_forward, embed, drafter, prompt_ids, limits[-1], topk)
            refs = {k: np.asarray(v) for k, v in cpu_forward(feed).items()}
            run: ForwardResult = model.run(feed)
            check.tree_check = check_whole_model(Sample(config.verify_length, feed, refs), run, tol)
        else:
            # n-gram drafts padded to the verify length: its forward is io's sample of that length, checked as any
            drafter = LookaheadDrafter(bundle.model_dir, config_name=CONFIG_FILE)
            check.settings = {k: v for k, v in drafter.settings.engine_config().items() if k != DRAFT_LENGTH_FIELD}
            if drafter.settings.lookup_file is not None:
                check.settings[LOOKUP_FILE_FIELD] = drafter.settings.lookup_file.name
        # (c) the bundle's speculative loop against the CPU's plain greedy decoding
        served = ReplayForward(model.forward, replay or {})
        spec = speculative_generate(served, embed, drafter, prompt_ids, max_new_tokens, limits)

        def cpu_plain() -> GenerationResult:
            model.unload()  # the CPU reference's decoded weights take the memory now
            return cpu_greedy_generate(model_dir, prompt_ids, max_new_tokens, chunk=limits, runtime=runtime)

        cut, cpu, left = cut_where_parted(spec, plain, cpu_plain, follow)
        if cut is None and left is not None and not follow and plain is None and cpu is not None:
            # the pass ran MNN's engine's sequence and the loop left it following the CPU's tokens: one forward
            # per length over the CPU's sequence serves the loop (a row depends only on the tokens up to it), where
            # running the loop again would take a simulator forward per token
            own = cpu_sequence_pass(model.forward, embed, prompt_ids, cpu, limits)
            served = ReplayForward(model.forward, {**(replay or {}), **own})
            spec = speculative_generate(served, embed, drafter, prompt_ids, max_new_tokens, limits)
            served.ran += len(own)
            cut, cpu, left = cut_where_parted(spec, cpu, cpu_plain, follow)
        if cut is not None:
            spec = cut
            check.note = (
                f"the loop stops at new token {left}: it parted from the CPU's tokens before, and past the "
                "bundle's own pick each forward would run in the simulator alone (follow_divergence)"
            )
        elif left is not None:  # run it all in the simulator: every forward, past the bundle's own pick too
            served = ReplayForward(model.forward, {})
            spec = speculative_generate(served, embed, drafter, prompt_ids, max_new_tokens, limits)
        check.replayed_forwards, check.simulator_forwards = served.served, served.ran
        model.unload()  # the CPU reference's decoded weights take the memory now (unloading twice costs nothing)
        cpu = cpu or cpu_plain()
        check.cpu_tokens, check.bundle_tokens = list(cpu.tokens), list(spec.result.tokens)
        check.rounds = [SpeculationRound(**vars(r)) for r in spec.rounds]
        check.forwards, check.mean_accepted = spec.forwards, spec.mean_accepted
        if weight_bytes is not None and spec.mean_accepted:
            check.npu_weight_bytes_per_token = weight_bytes / spec.mean_accepted
        check.steps, check.first_difference, check.difference_note, same = judge(spec, cpu, tol)
        check.passed = same and (check.tree_check is None or check.tree_check.passed)
    except Exception as exc:
        log.debug("speculation check failed", exc_info=True)
        check.problem = describe_error(exc)
        check.passed = False
    check.seconds = time.perf_counter() - t0
    return check
