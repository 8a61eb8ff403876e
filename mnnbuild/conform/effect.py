"""What one conformance patch changes for a bundle: MNN built with and without it, prompt lengths around the chunk.

Made for patch 0004 (MNN's CPU bug with padded chunks): it answers which prompts an unpatched MNN, as on a
phone, gets wrong for our bundles. Per prompt length the bundle runs through both builds, and the original
model without ``chunk_limits`` (no padding, so the bug's code path is not taken) through the patched one as
the reference. The measure is the first generated token's logits, without the patch against with it (verify's
tolerance), and the greedy tokens of all three. The runs themselves are made by
:func:`mnnbuild.conform.run.measure_patch_effect`; this module holds the records and the arithmetic.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from mnnbuild.base.compare import TensorCheck, Tolerance, compare
from mnnbuild.verify.compare import is_near_tie


def padding(prompt_tokens: int, chunk_limits: list[int]) -> int:
    """Tokens MNN's Llm engine pads the prompt's last chunk with: the prompt is cut into chunks of the largest
    limit; a remainder runs as the smallest limit that holds it, padded up to that limit."""
    chunk = max(chunk_limits)
    remain = prompt_tokens % chunk
    if remain == 0:
        return 0
    return min(limit for limit in chunk_limits if limit >= remain) - remain


def default_lengths(chunk: int) -> list[int]:
    """Around the chunk: one token, short prompts, half a chunk, a chunk and its neighbours, 1.5 and 2 chunks."""
    picks = {1, 2, 9, 16, chunk // 2, chunk - 1, chunk, chunk + 1, chunk + 2, chunk + chunk // 2, 2 * chunk - 1}
    picks |= {2 * chunk, 2 * chunk + 1}
    return sorted(n for n in picks if n >= 1)


class RunTokens(BaseModel):
    tokens: list[int]
    text: str


class LengthEffect(BaseModel):
    prompt_tokens: int
    padding: int
    """Tokens the engine pads the last chunk with (0: the patched code path is not taken)."""
    with_patch: RunTokens
    without_patch: RunTokens
    reference: RunTokens
    """The original model without chunk_limits (no padding) on MNN with the patch."""
    first_token_logits: TensorCheck
    """Without the patch against with it, the first generated token's logits."""
    first_divergence: int | None
    """First step whose greedy token differs without the patch, None if all equal."""
    changed: bool
    """The patch changes the bundle's answer: first-token logits out of tolerance, or a token differs."""
    with_patch_matches_reference: bool
    """The patched bundle's tokens equal the reference's, up to a tolerated near-tie flip (fp16 on the HTP)."""


class PatchEffect(BaseModel):
    patch: str
    build_with: str
    build_without: str
    chunk_limits: list[int]
    max_new_tokens: int
    lengths: list[LengthEffect]
    changed_lengths: list[int] = []
    padded_lengths: list[int] = []
    changed_exactly_where_padded: bool = False


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def length_effect(
    prompt_tokens: int,
    pad: int,
    runs: dict[str, tuple[RunTokens, np.ndarray]],
    tol: Tolerance,
) -> LengthEffect:
    """``runs``: ``with_patch``, ``without_patch`` and ``reference``, each (tokens, per-step logits rows)."""
    (with_run, with_rows), (without_run, without_rows) = runs["with_patch"], runs["without_patch"]
    ref_run, ref_rows = runs["reference"]
    check = compare("first token logits", without_rows[0], with_rows[0], tol)
    divergence = _first_divergence(with_run.tokens, without_run.tokens)
    ref_divergence = _first_divergence(ref_run.tokens, with_run.tokens)
    matches = ref_divergence is None or (
        ref_divergence < min(len(ref_run.tokens), len(with_run.tokens))
        and is_near_tie(ref_rows[ref_divergence], ref_run.tokens[ref_divergence], with_run.tokens[ref_divergence], tol)
    )
    return LengthEffect(
        prompt_tokens=prompt_tokens,
        padding=pad,
        with_patch=with_run,
        without_patch=without_run,
        reference=ref_run,
        first_token_logits=check,
        first_divergence=divergence,
        changed=not check.passed or divergence is not None,
        with_patch_matches_reference=matches,
    )


def summarize(effect: PatchEffect) -> PatchEffect:
    effect.changed_lengths = [e.prompt_tokens for e in effect.lengths if e.changed]
    effect.padded_lengths = [e.prompt_tokens for e in effect.lengths if e.padding > 0]
    effect.changed_exactly_where_padded = effect.changed_lengths == effect.padded_lengths
    return effect


def format_effect(effect: PatchEffect) -> list[str]:
    out = [
        f"what {effect.patch} changes for the bundle (MNN {effect.build_without} without it vs {effect.build_with} "
        f"with it; chunk_limits {effect.chunk_limits}, {effect.max_new_tokens} new tokens):",
        "  prompt  pad  first-token logits, without vs with   verdict  first token diff  patched = reference",
    ]
    for e in effect.lengths:
        c = e.first_token_logits
        cos = f"{c.cosine:.4f}" if c.cosine is not None else "n/a"
        rel = f"{c.rel_err:.1%}" if c.rel_err is not None else "n/a"
        div = "-" if e.first_divergence is None else f"step {e.first_divergence}"
        out.append(
            f"  {e.prompt_tokens:6d}  {e.padding:3d}  cosine {cos:>7s}, max err {rel:>7s}      "
            f"{'CHANGED' if e.changed else 'same':7s}  {div:>16s}  {e.with_patch_matches_reference}"
        )
    out.append(
        f"  changed at {effect.changed_lengths}; padded at {effect.padded_lengths}; "
        f"changed exactly where padded: {effect.changed_exactly_where_padded}"
    )
    return out
