"""Verify's judgement of logits rows: top-1 leads and near-ties (the tensor comparison is ``mnnbuild.base.compare``)."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from mnnbuild.base.compare import Tolerance


class RowErrors(BaseModel):
    """Per row (sequence position) of a ``[..., rows, width]`` output: where along the chunk the error sits."""

    max_abs_err: list[float]
    ref_max_abs: list[float]
    cosine: list[float | None]
    """None for an all-zero reference row."""


def row_errors(got: np.ndarray, ref: np.ndarray) -> RowErrors | None:
    """Errors of each row of ``got`` vs ``ref`` (last axis = width); None when they cannot be compared."""
    ref = np.asarray(ref)
    got = np.asarray(got)
    if ref.ndim == 0 or got.size != ref.size or not np.isfinite(got).all():
        return None
    width = ref.shape[-1]
    r = ref.astype(np.float64).reshape(-1, width)
    g = got.astype(np.float64).reshape(-1, width)
    rn, gn = np.linalg.norm(r, axis=1), np.linalg.norm(g, axis=1)
    dots = (g * r).sum(axis=1)
    cosine = [
        None if a == 0.0 else (0.0 if b == 0.0 else float(d / (a * b))) for a, b, d in zip(rn, gn, dots, strict=True)
    ]
    return RowErrors(
        max_abs_err=[float(v) for v in np.abs(g - r).max(axis=1)],
        ref_max_abs=[float(v) for v in np.abs(r).max(axis=1)],
        cosine=cosine,
    )


def lead(row: np.ndarray, top: int, other: int) -> float:
    """How far ``row[top]`` is ahead of ``row[other]`` (>= 0 when ``top`` is the row's argmax)."""
    return float(row[top]) - float(row[other])


def is_near_tie(ref_row: np.ndarray, ref_top: int, other: int, tol: Tolerance) -> bool:
    """A top-1 flip from ``ref_top`` to ``other`` is a near-tie when the reference barely prefers ``ref_top``."""
    scale = float(np.abs(ref_row).max())
    return lead(ref_row, ref_top, other) <= tol.tie_margin * scale


def top2_margin(row: np.ndarray) -> float:
    if row.size < 2:
        return float("inf")
    a, b = np.partition(row, -2)[-2:]
    return float(b - a)
