"""The one numeric comparison (``mnnbuild.base.compare``), as the lowering checks and verify use it."""

from __future__ import annotations

import numpy as np

from mnnbuild.base.compare import Tolerance, compare


def test_all_zero_reference_is_judged_by_the_absolute_floor_alone() -> None:
    zeros = np.zeros(8, np.float32)
    tol = Tolerance()
    exact = compare("z", zeros, zeros, tol)
    assert exact.passed and exact.cosine is None and exact.rel_err is None
    assert compare("z", zeros + 5e-6, zeros, tol).passed  # within the 1e-5 floor
    assert not compare("z", zeros + 1e-3, zeros, tol).passed
    # the lowering checks use no floor: only exact zeros match an all-zero reference
    strict = Tolerance(abs_floor=0.0)
    assert compare("z", zeros, zeros, strict).passed
    assert not compare("z", zeros + 1e-9, zeros, strict).passed


def test_zero_output_against_a_real_reference_fails_on_direction() -> None:
    ref = np.linspace(-1e-6, 1e-6, 16)
    check = compare("x", np.zeros(16), ref, Tolerance())
    assert check.cosine == 0.0 and not check.passed  # within the floor, but no direction at all


def test_relative_error_and_cosine_against_a_nonzero_reference() -> None:
    ref = np.linspace(-1.0, 1.0, 101)
    strict = Tolerance(abs_floor=0.0)
    assert compare("x", ref * 1.015, ref, strict).passed  # 1.5% of max abs
    off = compare("x", ref * 1.03, ref, strict)
    assert not off.passed and abs(off.rel_err - 0.03) < 1e-9 and off.cosine > 0.999
    flipped = compare("x", -ref, ref, strict)
    assert not flipped.passed and flipped.cosine < -0.999
