"""Which QNN weight encoding keeps a convolution's own quantized weights on the HTP (spec field ``npu_weights``).

Facts it builds on (x86 HTP library, API 2.40 / build 2.51, v79; `README.md` here, "Quantized weights"):

- 4-bit values travel in ``sfixed8``, one per byte; ``sfixed4``/``ufixed4`` tensors are refused.
- Integer offsets are not honoured: a symmetric code (offset 0) maps exactly, an asymmetric one only through
  ``BW_FLOAT_BLOCK``, whose float offsets mean real = (q + offset) * scale.
- ``BLOCK`` always reads 4 bits; 8-bit codes per channel go through ``AXIS_SCALE_OFFSET`` (symmetric only).

So, for llmexport's layouts (``w = q * scale + zero`` per block of inputs of one output channel):

| model's codes | ``int4`` | ``int8`` |
|---|---|---|
| ≤ 4 bits, symmetric, blocks | ``BLOCK`` (exact) | int8 per channel, requantized |
| ≤ 4 bits, symmetric, per channel | ``BW_AXIS_SCALE_OFFSET`` 4 bits (exact) | ``AXIS_SCALE_OFFSET`` (exact) |
| ≤ 4 bits, asymmetric | ``BW_FLOAT_BLOCK`` 4 bits, offset = zero / scale (exact) | int8, requantized |
| 5-8 bits, symmetric, per channel | ``AXIS_SCALE_OFFSET`` (exact) | ``AXIS_SCALE_OFFSET`` (exact) |
| 5-8 bits otherwise | int8 per channel, requantized | int8 per channel, requantized |
| float / fp16 weights | float16 (no codes to keep) | float16 (no codes to keep) |

``int4`` never rounds a weight to fewer bits than the model has: it keeps 4-bit codes as they are and gives 8-bit
ones the int8 form. A requantized weight's error against the model's own (dequantized) weights is measured here
and recorded with the graph (``WeightNote``), so the context manifest and the report show it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnnbuild.lowering.encoding import DEFAULT_NPU_WEIGHTS as DEFAULT_NPU_WEIGHTS
from mnnbuild.lowering.encoding import NPU_WEIGHTS as NPU_WEIGHTS
from mnnbuild.lowering.encoding import NpuWeights as NpuWeights
from mnnbuild.mnn import Op
from mnnbuild.mnn.weights import ConvCodes, WeightFile, conv_codes, quantize_blocks

# QuantDesc.encoding values (QNN's Qnn_QuantizationEncoding_t names, lower case)
AXIS = "axis_scale_offset"
BW_AXIS = "bw_axis_scale_offset"
BLOCK = "block"
BW_FLOAT_BLOCK = "bw_float_block"
ENCODINGS = (AXIS, BW_AXIS, BLOCK, BW_FLOAT_BLOCK)


@dataclass
class QuantizedWeight:
    """A 1x1 conv's weight for QNN: ``codes`` int8 HWIO ``[1, 1, in, out]``, one (scale, offset) row per channel or
    block in ``params`` (float32 ``[n, 2]``, channel-major), the encoding's fields, and how far it is from the
    model's weights (``error``: max |dw| / max |w|, 0 when the model's codes and scales are kept)."""

    codes: np.ndarray
    params: np.ndarray
    encoding: str
    bitwidth: int
    axis: int
    block_size: list[int]
    bias: np.ndarray
    exact: bool
    error: float


def _relative_error(approx: np.ndarray, ref: np.ndarray) -> float:
    top = float(np.abs(ref).max()) if ref.size else 0.0
    return float(np.abs(approx - ref).max()) / top if top else 0.0


def _hwio(codes: np.ndarray) -> np.ndarray:
    out_ch, in_ch = codes.shape
    return np.ascontiguousarray(codes.T).reshape(1, 1, in_ch, out_ch)


def _params(scale: np.ndarray, offset: np.ndarray | None = None) -> np.ndarray:
    s = scale.reshape(-1).astype(np.float32)
    o = np.zeros_like(s) if offset is None else offset.reshape(-1).astype(np.float32)
    return np.stack([s, o], axis=1)


def _int8_per_channel(cc: ConvCodes) -> QuantizedWeight:
    if cc.zero is None and cc.channel_wise:  # the model's own codes and scales, widened to 8-bit storage
        return QuantizedWeight(_hwio(cc.codes), _params(cc.scale), AXIS, 8, 3, [], cc.bias, True, 0.0)
    ref = cc.dequantized()
    codes, scale, _ = quantize_blocks(ref, 8, 0, symmetric=True)
    error = _relative_error(codes.astype(np.float32) * scale, ref)
    return QuantizedWeight(_hwio(codes), _params(scale), AXIS, 8, 3, [], cc.bias, False, error)


def _int4(cc: ConvCodes) -> QuantizedWeight:
    block = [1, 1, cc.block, 1]
    if cc.zero is None:
        if cc.channel_wise:
            return QuantizedWeight(_hwio(cc.codes), _params(cc.scale), BW_AXIS, 4, 3, [], cc.bias, True, 0.0)
        return QuantizedWeight(_hwio(cc.codes), _params(cc.scale), BLOCK, 4, 3, block, cc.bias, True, 0.0)
    # w = q * scale + zero = (q + zero / scale) * scale; a block with scale 0 holds only its zero: codes 0,
    # scale 1 (or |zero|), offset zero / scale
    scale, zero, codes = cc.scale.copy(), cc.zero, cc.codes
    flat = scale == 0
    if flat.any():
        scale[flat] = np.where(zero[flat] != 0, np.abs(zero[flat]), 1.0)
        codes = codes.copy()
        mask = np.repeat(flat, cc.block, axis=1)
        codes[mask] = 0
    offset = zero / scale
    return QuantizedWeight(_hwio(codes), _params(scale, offset), BW_FLOAT_BLOCK, 4, 3, block, cc.bias, True, 0.0)


def npu_weight(op: Op, weights: WeightFile | None, mode: str) -> tuple[QuantizedWeight | None, str]:
    """The quantized weight of conv ``op`` for ``mode`` (a `NpuWeights`), or None and why it stays float16."""
    if mode == "float16":
        return None, "npu_weights is float16"
    cc = conv_codes(op, weights)
    if cc is None:
        return None, "float weights: no codes to keep"
    if mode == "int4" and cc.bits <= 4:
        return _int4(cc), ""
    return _int8_per_channel(cc), ""
