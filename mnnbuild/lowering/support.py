"""Which MNN ops the QNN lowering can put on the NPU: the question the partition stage asks.

The answer comes from the lowering's own registry (`mnnbuild.lowering.lower.unsupported_reason`),
so an op kind is placed on the NPU exactly when the lowering can turn it into QNN ops; anything
else becomes a break op, stays on the CPU and is listed with the reason in the partition report.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from mnnbuild.lowering.lower import LOWERED_OP_TYPES, unsupported_reason
from mnnbuild.mnn import MnnModel, Op

SupportCheck = Callable[[Op, MnnModel, Collection[int]], "str | None"]
"""The signature of ``unsupported_reason`` (and of test doubles of it)."""

__all__ = ["LOWERED_OP_TYPES", "SupportCheck", "unsupported_reason"]
