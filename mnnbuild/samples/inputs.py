"""The inputs of one reference sample: seeded embeddings, the causal mask (in two parts, full and sliding, for a model
mixing both attention kinds), positions (M-RoPE with a stand-in image for a VL language model) and the logits index,
as MNN's engine feeds them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

from mnnbuild.manifests.io import DECODE_SEQ
from mnnbuild.mnn.llm import DEEPSTACK_INPUT, engine_mask

if TYPE_CHECKING:
    import numpy as np

Feed: TypeAlias = "dict[str, np.ndarray]"  # a string: numpy is imported where arrays are made

IMAGE_GRID = (2, 3)
"""The merged-token grid (rows, columns) of the stand-in image in a VL prefill sample."""


def mrope_positions(seq_len: int, rows: int) -> tuple[np.ndarray, slice]:
    """``position_ids [rows, seq]`` of a prompt with a stand-in image, and the image tokens' span.

    One row (a text LLM): ``0..seq-1``. Several (M-RoPE: time, height, width): text tokens carry their position
    in every row; when the sample has room, tokens ``1 ..`` are an image of :data:`IMAGE_GRID` merged tokens,
    which all share the time position and take their grid row and column in the other rows, and the text after it
    goes on from the largest position used (the scheme Qwen2-VL's rope index follows)."""
    import numpy as np

    grid_h, grid_w = IMAGE_GRID
    start, count = 1, grid_h * grid_w
    if rows == 1 or seq_len <= start + count:
        return np.tile(np.arange(seq_len, dtype=np.int32), (rows, 1)), slice(0, 0)
    pos = np.zeros((rows, seq_len), dtype=np.int32)
    pos[:, :start] = np.arange(start)
    cell = np.arange(count)
    pos[0, start : start + count] = start
    pos[1:, start : start + count] = start + cell // grid_w
    pos[2:, start : start + count] = start + cell % grid_w
    after = start + max(grid_h, grid_w)
    pos[:, start + count :] = np.arange(after, after + seq_len - start - count)
    return pos, slice(start, start + count)


LAST_ROW = -1
"""``logits_index`` asking for the last row's logits only; 0 asks for every row."""


def whole_blocks(block_sizes: Sequence[int], inputs: Sequence[str]) -> tuple[int, ...]:
    """The prefill blocks MNN's engine may run unpadded with ``logits_index`` :data:`LAST_ROW`: ``Llm::forwardRaw``
    asks for every row only in a speculative decode step or when the block is padded, so every full chunk of a
    prompt, and a last chunk of exactly one of ``block_sizes`` (the ``chunk_limits`` above decode), takes the last
    row only. The graphs are compiled for every row at those lengths (the padded case); these shapes must find
    graphs too. Nothing for a model without a ``logits_index`` input (it always computes every row)."""
    if "logits_index" not in inputs:
        return ()
    return tuple(dict.fromkeys(n for n in block_sizes if n != DECODE_SEQ))


def make_inputs(
    seq_len: int,
    hidden_size: int,
    seed: int,
    declared: dict[str, list[int]] | None = None,
    window: int | None = None,
    logits_index: int | None = None,
) -> dict[str, np.ndarray]:
    """The inputs of one sample; the generator is seeded by (seed, seq_len), so each shape is reproducible.
    ``logits_index``: by default -1 for decode and 0 (every row, as a padded prefill block) for a longer sample.

    ``declared`` (the model's input dims) sizes what varies by model: M-RoPE's ``position_ids`` rows (``[3, -1]``)
    and Qwen3-VL's ``deepstack_embeds`` (``[3, seq, hidden]``: what MNN's runtime feeds, the stand-in image's
    rows random, the text's zero). ``window``: the sliding window of a model mixing full and sliding attention
    (:func:`mnnbuild.mnn.llm.attention_window`), whose mask the engine builds in two parts."""
    import numpy as np

    declared = declared or {}
    rng = np.random.default_rng([seed, seq_len])
    rows = declared.get("position_ids", [1])[0]
    positions, image = mrope_positions(seq_len, rows if rows > 0 else 1)
    feed = {
        "input_ids": rng.random((seq_len, 1, hidden_size), dtype=np.float32),
        "attention_mask": engine_mask(seq_len, window),
        "position_ids": positions,
        "logits_index": np.array([_logits_index(seq_len, logits_index)], dtype=np.int32),
    }
    if DEEPSTACK_INPUT in declared:
        deepstack = np.zeros((declared[DEEPSTACK_INPUT][0], seq_len, hidden_size), dtype=np.float32)
        deepstack[:, image] = rng.standard_normal(deepstack[:, image].shape, dtype=np.float32)
        feed[DEEPSTACK_INPUT] = deepstack
    return feed


def _logits_index(seq_len: int, given: int | None) -> int:
    if given is not None:
        return given
    return LAST_ROW if seq_len == DECODE_SEQ else 0
