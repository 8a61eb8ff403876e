"""Which prefill graph a prompt runs on, the way MNN's LLM engine reads ``chunk_limits``.

MNN (``transformers/llm/engine/src/llm.cpp``): ``Llm::set_config`` takes every entry of ``chunk_limits``
(at least two, else it ignores them), sorts them and uses the largest as the block size. ``Llm::forward``
splits a prompt of ``n`` tokens into ``n // largest`` full blocks and, when ``n`` is not a multiple, one last
block of the remaining tokens, zero-padded up to the smallest entry that holds them (a remainder of one token
runs at 1, the decode shape). Each plugin then picks its graph by the block's input shape (``allInputShape``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    """One forward of a prefill: ``tokens`` real tokens run at length ``size`` (zero-padded when larger)."""

    tokens: int
    size: int

    @property
    def padding(self) -> int:
        return self.size - self.tokens


def block_sizes(chunk_limits: Sequence[int]) -> list[int]:
    """The valid block sizes, ascending (MNN sorts ``chunk_limits``; its order in the config does not matter)."""
    sizes = sorted(int(c) for c in chunk_limits)
    if len(sizes) < 2 or sizes[0] < 1:
        # MNN ignores such a list and runs every prompt unchunked: a bundle's graphs would not be used as built
        raise ValueError(f"chunk_limits {list(chunk_limits)}: expected at least two positive lengths, e.g. [128, 1]")
    return sizes


def fit_block(tokens: int, chunk_limits: Sequence[int]) -> int:
    """The length a block of ``tokens`` (1 up to the largest limit) runs at: the smallest limit that holds it."""
    sizes = block_sizes(chunk_limits)
    if not 1 <= tokens <= sizes[-1]:
        raise ValueError(f"a block of {tokens} tokens does not fit chunk_limits {sizes} (1 to {sizes[-1]} tokens)")
    return next(s for s in sizes if s >= tokens)


def prefill_blocks(tokens: int, chunk_limits: Sequence[int]) -> list[Block]:
    """The forwards MNN's engine runs a prompt of ``tokens`` in, in order: full blocks of the largest limit,
    then the rest at :func:`fit_block`'s length."""
    if tokens < 1:
        raise ValueError(f"a prompt of {tokens} tokens: expected at least one")
    longest = block_sizes(chunk_limits)[-1]
    full, rest = divmod(tokens, longest)
    blocks = [Block(longest, longest)] * full
    if rest:
        blocks.append(Block(rest, fit_block(rest, chunk_limits)))
    return blocks
