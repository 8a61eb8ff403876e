"""The words for how a graph stores its convolution weights: spec field ``npu_weights`` and a per-weight note.

Kept apart from the lowering (no numpy, MNN or QNN here) so the spec and the manifests can name them."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

NpuWeights = Literal["float16", "int8", "int4"]
"""``float16``: every conv weight decoded to fp16 (upstream's form); ``int4``: the model's own codes where a QNN
encoding keeps them (4-bit codes as 4-bit, 8-bit ones as int8); ``int8``: int8 per channel everywhere
(`mnnbuild.lowering.quantized` has the mapping)."""
NPU_WEIGHTS: tuple[str, ...] = get_args(NpuWeights)
DEFAULT_NPU_WEIGHTS: NpuWeights = "float16"


class WeightNote(BaseModel):
    """How one convolution's weight is stored in a graph: ``float16`` or a quantized encoding (QNN's name, lower
    case), whether that is the model's own codes and scales (``exact``), its error against the model's weights when
    not (max |dw| / max |w|), why it is float16 when another ``npu_weights`` was asked for, and whether the op reads
    its input centered per block (asymmetric codes)."""

    model_config = ConfigDict(frozen=True)

    op: str
    tensor: str
    encoding: str
    bitwidth: int
    weights: int
    exact: bool = True
    error: float = 0.0
    reason: str = ""
    centered: bool = False
    """The conv reads its input minus the input's mean per block and adds back the means times the weights' block
    sums: how asymmetric codes stay exact without fp16 losing what their zeros cancel."""
    folded: int = 0
    """Codes stored beside the model's ``weights``: the block sums' digits folded into the conv (centered blocks)."""

    @property
    def stored_bytes(self) -> int:
        """What the HTP keeps of the weight: ``bitwidth`` bits each, folded digits included."""
        return (self.weights + self.folded) * self.bitwidth // 8
