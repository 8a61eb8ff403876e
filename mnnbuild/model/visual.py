"""A visual encoder's inputs for one image size, with the content MNN's runtime gives them (docs/families.md 3.2).

The shapes come from ``VisualEncoder.input_shapes`` alone; this module fills them: the patch rows in merge-block
order (each ``merge x merge`` block of patches contiguous), each patch's (row, column), Qwen2.5-VL's window
regrouping and windowed mask, Qwen3-VL's bilinear corners into the learned position table. Only the pixels are
random (seeded): the io stage's reference samples and ``models/export/check_models.py`` both build them here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mnnbuild.model.spec import VISUAL_ENCODERS, ImageSize

if TYPE_CHECKING:
    import numpy as np

WINDOW = 4
"""Qwen2.5-VL's window side in merged tokens (112 px at patch 14, merge 2)."""


def merge_order(grid_h: int, grid_w: int, merge: int) -> np.ndarray:
    """Row-major patch (i, j) -> its row in the encoder input, where each merge x merge block is contiguous."""
    import numpy as np

    i, j = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    return ((i // merge) * (merge * grid_w) + (j // merge) * merge * merge + (i % merge) * merge + (j % merge)).ravel()


def patch_positions(grid_h: int, grid_w: int, merge: int) -> np.ndarray:
    """``position_ids`` [2, seq]: each patch's (row, column), in merge-block order."""
    import numpy as np

    positions = np.zeros((2, grid_h * grid_w), np.int32)
    order = merge_order(grid_h, grid_w, merge)
    i, j = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    positions[0, order] = i.ravel()
    positions[1, order] = j.ravel()
    return positions


def windows(grid_h: int, grid_w: int, merge: int, window: int) -> tuple[np.ndarray, list[int]]:
    """Qwen2.5-VL window attention: merged tokens regrouped window by window, and each window's token count."""
    import numpy as np

    rows, cols = grid_h // merge, grid_w // merge
    index: list[int] = []
    counts: list[int] = []
    for top in range(0, rows, window):
        for left in range(0, cols, window):
            members = [
                r * cols + c for r in range(top, min(top + window, rows)) for c in range(left, min(left + window, cols))
            ]
            index += members
            counts.append(len(members))
    return np.asarray(index, np.int32), counts


def bilinear_corners(grid_h: int, grid_w: int, merge: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-VL: the 4 learned position embeddings (of a side x side table) around each patch, and their weights."""
    import numpy as np

    ys = np.linspace(0, side - 1, grid_h, dtype=np.float32)
    xs = np.linspace(0, side - 1, grid_w, dtype=np.float32)
    y0, x0 = ys.astype(np.int32), xs.astype(np.int32)
    y1, x1 = np.minimum(y0 + 1, side - 1), np.minimum(x0 + 1, side - 1)
    dy, dx = (ys - y0)[:, None], (xs - x0)[None, :]
    idx = np.stack([y0[:, None] * side + x0, y0[:, None] * side + x1, y1[:, None] * side + x0, y1[:, None] * side + x1])
    weight = np.stack([(1 - dy) * (1 - dx), (1 - dy) * dx, dy * (1 - dx), dy * dx])
    order = merge_order(grid_h, grid_w, merge)
    idx_out = np.zeros((4, grid_h * grid_w), np.int32)
    weight_out = np.zeros((4, grid_h * grid_w), np.float32)
    idx_out[:, order] = np.broadcast_to(idx, (4, grid_h, grid_w)).reshape(4, -1)
    weight_out[:, order] = weight.reshape(4, -1)
    return idx_out, weight_out


def position_table_side(llm_config: Mapping[str, Any]) -> int:
    """Qwen3-VL's learned position table side (``num_grid_per_side``, else the root of ``num_position_embeddings``)."""
    import numpy as np

    side = int(llm_config.get("num_grid_per_side", 0) or 0)
    return side or int(round(np.sqrt(llm_config["num_position_embeddings"])))


def visual_inputs(kind: str, size: ImageSize, llm_config: Mapping[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Encoder inputs for one image size, shaped by ``VisualEncoder.input_shapes``, in ``visual.mnn``'s order; the
    pixels are seeded by (seed, patch count), so each size is reproducible."""
    import numpy as np

    encoder = VISUAL_ENCODERS[kind]
    shapes = encoder.input_shapes(size)
    grid_h, grid_w = size.grid(encoder)
    rng = np.random.default_rng([seed, grid_h * grid_w])
    feeds = {
        "patches": rng.standard_normal(shapes["patches"]).astype(np.float32),
        "position_ids": patch_positions(grid_h, grid_w, encoder.merge_size),
    }
    if kind == "qwen2.5-vl":
        index, counts = windows(grid_h, grid_w, encoder.merge_size, window=WINDOW)
        mask = np.zeros(shapes["attention_mask"], np.float32)
        mask[1] = np.finfo(np.float32).min
        start = 0
        for count in counts:  # patches attend within their window only (in window order)
            end = start + count * encoder.merge_size**2
            mask[1, 0, start:end, start:end] = 0
            start = end
        feeds["attention_mask"] = mask
        feeds["window_index"] = index
    else:
        feeds["attention_mask"] = np.zeros(shapes["attention_mask"], np.float32)
        side = position_table_side(llm_config)
        feeds["idx_tensor"], feeds["weight_tensor"] = bilinear_corners(grid_h, grid_w, encoder.merge_size, side)
    wrong = [n for n, shape in shapes.items() if list(feeds[n].shape) != shape]
    if wrong:  # the builders and the spec's shape table disagree: a bug here, not bad input
        raise AssertionError(f"{kind} {size}: {wrong[0]} built as {list(feeds[wrong[0]].shape)}, spec says {shapes}")
    return {n: feeds[n] for n in shapes}
