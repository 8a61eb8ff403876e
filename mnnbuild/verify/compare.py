"""Verify's judgement of logits rows: top-1 leads and near-ties (the tensor comparison is ``mnnbuild.compare``)."""

from __future__ import annotations

import numpy as np

from mnnbuild.compare import Tolerance


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
