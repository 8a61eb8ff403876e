"""Numeric comparison of a computed tensor against its reference, and the tolerance that judges it.

The one comparison of mnnbuild: the lowering checks and verify both judge with it.

Defaults are issue 5's numbers for fp16 on the HTP: cosine >= 0.999 and max abs error <= 2% of the
reference's max abs. An all-zero reference has no direction, so its cosine is not judged (``None``) and
the error is held to the absolute floor alone; a relative error is meaningless there too (``None``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import numpy as np


class Tolerance(BaseModel):
    model_config = ConfigDict(frozen=True)

    min_cosine: float = Field(default=0.999, ge=-1, le=1)
    max_rel_err: float = Field(default=0.02, ge=0)
    """Max abs error allowed, as a fraction of the reference's max abs."""
    abs_floor: float = Field(default=1e-5, ge=0)
    """Absolute slack added to the allowed error (matters only for (near) all-zero references)."""
    tie_margin: float = Field(default=0.005, ge=0)
    """Top-1 / greedy token: a disagreement is tolerated only where the reference's lead of its top-1 over
    the other pick is at most this fraction of the row's max |logit| (a near-tie fp16 may flip)."""


class TensorCheck(BaseModel):
    name: str
    qnn_name: str | None = None
    shape: list[int]
    max_abs_err: float
    ref_max_abs: float
    rel_err: float | None
    """max_abs_err / ref_max_abs (None for an all-zero reference)."""
    cosine: float | None
    """None when the reference is all zeros (no direction to compare)."""
    passed: bool
    problem: str | None = None

    def severity(self, tol: Tolerance) -> float:
        """How far past the tolerance this tensor is (> 1 fails); used to name the worst tensor."""
        if self.problem and self.rel_err is None and self.cosine is None:
            return float("inf")
        allowed = tol.max_rel_err * self.ref_max_abs + tol.abs_floor
        sev = self.max_abs_err / allowed if allowed > 0 else (float("inf") if self.max_abs_err > 0 else 0.0)
        if self.cosine is not None and tol.min_cosine < 1:
            sev = max(sev, (1 - self.cosine) / (1 - tol.min_cosine))
        elif self.cosine is not None and self.cosine < 1:
            sev = float("inf")  # an exact tolerance: any direction error is past it
        return sev

    def broken_limits(self, tol: Tolerance) -> list[str]:
        """Each limit of ``tol`` this check breaks, with the value and the limit."""
        allowed = tol.max_rel_err * self.ref_max_abs + tol.abs_floor
        broken = []
        if self.cosine is not None and self.cosine < tol.min_cosine:
            broken.append(f"cosine {self.cosine:.7f} below the minimum {tol.min_cosine}")
        if self.max_abs_err > allowed:
            broken.append(
                f"max abs err {self.max_abs_err:.4g} above the allowed {allowed:.4g} "
                f"({tol.max_rel_err:g} x ref max abs {self.ref_max_abs:.4g} + {tol.abs_floor:g})"
            )
        return broken

    def describe(self, tol: Tolerance | None = None) -> str:
        """The numbers in one line; given ``tol``, a failed check says which limit it broke instead."""
        what = f"{self.name}" + (f" ({self.qnn_name})" if self.qnn_name and self.qnn_name != self.name else "")
        if self.problem:
            return f"{what}: {self.problem}"
        if tol is not None and not self.passed and (broken := self.broken_limits(tol)):
            return f"{what}: {'; '.join(broken)}"
        cos = "n/a" if self.cosine is None else f"{self.cosine:.6f}"
        rel = "n/a" if self.rel_err is None else f"{self.rel_err:.3%}"
        return f"{what}: cosine {cos}, max abs err {self.max_abs_err:.4g} ({rel} of ref max abs {self.ref_max_abs:.4g})"


NON_FINITE_REFERENCE = "the reference (MNN CPU) itself has"
"""How a check whose reference is not finite begins its problem (the reference's failure, not the bundle's)."""


def compare(name: str, got: np.ndarray, ref: np.ndarray, tol: Tolerance, qnn_name: str | None = None) -> TensorCheck:
    """Compare ``got`` with ``ref`` (same element count; reshaped to ``ref``'s shape) in float64."""
    import numpy as np

    ref = np.asarray(ref)
    got = np.asarray(got)
    shape = [int(d) for d in ref.shape]
    if got.size != ref.size:
        return TensorCheck(
            name=name,
            qnn_name=qnn_name,
            shape=shape,
            max_abs_err=float("inf"),
            ref_max_abs=0.0,
            rel_err=None,
            cosine=None,
            passed=False,
            problem=f"has shape {list(got.shape)}, reference {shape}",
        )
    g = got.astype(np.float64).ravel()
    r = ref.astype(np.float64).ravel()
    if not np.isfinite(r).all():
        # the reference's own arithmetic failed on this input (e.g. a norm with epsilon 0 on a zero row): nothing
        # of the bundle can be judged, and it must not read as the bundle's error
        bad = int((~np.isfinite(r)).sum())
        first = np.unravel_index(int(np.flatnonzero(~np.isfinite(r))[0]), ref.shape) if ref.ndim else ()
        return TensorCheck(
            name=name,
            qnn_name=qnn_name,
            shape=shape,
            max_abs_err=float("inf"),
            ref_max_abs=float("nan"),
            rel_err=None,
            cosine=None,
            passed=False,
            problem=f"{NON_FINITE_REFERENCE} {bad} non-finite values (first at index "
            f"{[int(i) for i in first]}) on this input: not comparable, not a bundle mismatch",
        )
    if not np.isfinite(g).all():
        bad = int((~np.isfinite(g)).sum())
        return TensorCheck(
            name=name,
            qnn_name=qnn_name,
            shape=shape,
            max_abs_err=float("inf"),
            ref_max_abs=float(np.abs(r).max()),
            rel_err=None,
            cosine=None,
            passed=False,
            problem=f"{bad} non-finite values",
        )
    diff = float(np.abs(g - r).max()) if g.size else 0.0
    scale = float(np.abs(r).max()) if r.size else 0.0
    rn, gn = float(np.linalg.norm(r)), float(np.linalg.norm(g))
    cosine = None if rn == 0.0 else (0.0 if gn == 0.0 else float(g @ r / (gn * rn)))
    rel = diff / scale if scale > 0 else None
    ok = diff <= tol.max_rel_err * scale + tol.abs_floor and (cosine is None or cosine >= tol.min_cosine)
    return TensorCheck(
        name=name,
        qnn_name=qnn_name,
        shape=shape,
        max_abs_err=diff,
        ref_max_abs=scale,
        rel_err=rel,
        cosine=cosine,
        passed=ok,
    )
