"""Which QNN weight encoding keeps a convolution's own quantized weights on the HTP (spec field ``npu_weights``).

Facts it builds on (x86 HTP library, API 2.40 / build 2.51, v79; `README.md` here, "Quantized weights"):

- quantized weights need fp16 tensors at the op (the lowering casts before and after it);
- values travel in ``sfixed8``, one per byte, also 4-bit ones (``sfixed4``/``ufixed4`` tensors are refused);
- integer offsets are not honoured: a symmetric code (offset 0) maps exactly through ``BLOCK`` (always 4 bits),
  ``BW_AXIS_SCALE_OFFSET`` or ``AXIS_SCALE_OFFSET``, an asymmetric one only through ``BW_FLOAT_BLOCK``, whose
  float offsets mean real = (q + offset) * scale (so offset = zero / scale); it takes 4- and 8-bit values;
- an asymmetric code's zero is large against what the codes add where the input has a common part (its mean over a
  block): the fp16 arithmetic then loses what the two cancel (``BW_FLOAT_BLOCK``: 3.8-4x fp16 weights' error on a
  2048 -> 6144 op fed inputs of mean 1, ``benchmarks/bench_int4_split.py``). So 4-bit asymmetric codes run on the
  input centered per block: with ``m`` the mean of each block of ``x`` and ``T`` each block's sum of the weights,
  ``x @ w = (x - m) @ (q * scale) + m @ T`` exactly (a centered block sums to 0, so the zeros drop out): the codes
  and scales through ``BLOCK`` (offset 0, exact);
- ``m @ T`` rides in the same conv (`fold_block_sums`): ``T`` as ``SUM_DIGITS`` signed 4-bit digits in base
  ``SUM_BASE`` of one scale per output channel, read against the means times ``SUM_BASE ** -k``, appended to the
  centered input. A separate fp16 conv of ``T`` and an ``ElementWiseAdd`` of the two results, as wide as the op's
  output, took QNN twice as long to prepare as the op itself (an lm_head half, 2048 -> 75968: 10.9-14.3 s vs 4.6-5.3
  s folded; ``benchmarks/bench_int4_split.py``); the digits keep ``T`` to 1/(2 * 7 * 14**3) of its largest value per
  output channel, finer than fp16's 2**-11 for all but the smallest sums.

So, for llmexport's layouts (``w = q * scale + zero`` per block of inputs of one output channel):

| model's codes | ``int4`` (the model's own codes, exact) | ``int8`` (int8 per channel) |
|---|---|---|
| <= 4 bits, symmetric, blocks | ``BLOCK`` | requantized |
| <= 4 bits, symmetric, per channel | ``BW_AXIS_SCALE_OFFSET`` 4 bits | ``AXIS_SCALE_OFFSET`` (exact) |
| <= 4 bits, asymmetric, blocks | ``BLOCK`` on the centered input, the block sums' digits folded in | requantized |
| <= 4 bits, asymmetric, per channel | ``BW_AXIS`` on the centered input + an fp16 conv of the sums | requantized |
| 5-8 bits, symmetric, per channel | ``AXIS_SCALE_OFFSET`` | ``AXIS_SCALE_OFFSET`` (exact) |
| 5-8 bits otherwise | ``BW_FLOAT_BLOCK`` 8 bits | requantized |
| float / fp16 weights | float16 (no codes to keep) | float16 (no codes to keep) |

``int4`` never rounds a weight: it keeps every code and scale the model has, at 4 bits where the model's are, else
at 8. ``int8`` requantizes to one symmetric scale per output channel (QNN's common w8a16 form) where the model's
codes are not that already; its error against the model's (dequantized) weights is measured here and recorded
with the graph (``WeightNote``), so the context manifest and the report show it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnnbuild.mnn import Op
from mnnbuild.mnn.weights import ConvCodes, WeightFile, conv_codes, quantize_blocks
from mnnbuild.model.npu_weights import DEFAULT_NPU_WEIGHTS as DEFAULT_NPU_WEIGHTS
from mnnbuild.model.npu_weights import NPU_WEIGHTS as NPU_WEIGHTS
from mnnbuild.model.npu_weights import NpuWeights as NpuWeights

# QuantDesc.encoding values (QNN's Qnn_QuantizationEncoding_t names, lower case)
AXIS = "axis_scale_offset"
BW_AXIS = "bw_axis_scale_offset"
BLOCK = "block"
BW_FLOAT_BLOCK = "bw_float_block"
ENCODINGS = (AXIS, BW_AXIS, BLOCK, BW_FLOAT_BLOCK)

SUM_BASE = 14
"""Base of the block sums' digits: a residue of at most half a step is at most 7 steps of the next digit."""
SUM_DIGITS = 4


@dataclass
class QuantizedWeight:
    """A 1x1 conv's weight for QNN: ``codes`` int8 HWIO ``[1, 1, in, out]``, one (scale, offset) row per channel or
    block in ``params`` (float32 ``[n, 2]``, channel-major), the encoding's fields, and how far it is from the
    model's weights (``error``: max |dw| / max |w| of the weights the op computes with; 0 when exactly the
    model's; folded block sums are short of exact by at most half their last digit's step)."""

    codes: np.ndarray
    params: np.ndarray
    encoding: str
    bitwidth: int
    axis: int
    block_size: list[int]
    bias: np.ndarray
    exact: bool
    error: float
    block_sums: np.ndarray | None = None
    """For asymmetric codes: each block's sum of the model's weights, float32 ``[blocks, out]``. The conv then reads
    its input minus the input's mean over each block (``block`` inputs), and ``mean @ block_sums`` is added back:
    folded into the codes (``folded``) or, per channel, by a separate fp16 conv."""
    folded: int = 0
    """Inputs after the model's (``codes`` has them): the block means times `sum_levels` (block-major), then zeros
    up to a whole block (`folded_layout`); their codes are ``block_sums`` in `SUM_DIGITS` digits (`fold_block_sums`)."""

    @property
    def in_channels(self) -> int:
        """The model's inputs (without the folded ones)."""
        return self.codes.shape[2] - self.folded

    @property
    def block(self) -> int:
        """Inputs per scale (all of them per channel)."""
        return self.block_size[2] if self.block_size else self.codes.shape[2]


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


def _own_codes(cc: ConvCodes) -> QuantizedWeight:
    """The model's codes and scales as they are: 4-bit ones in 4 bits, wider ones in 8."""
    block = [1, 1, cc.block, 1]
    bits = 4 if cc.bits <= 4 else 8
    if cc.zero is None and cc.channel_wise:
        encoding = BW_AXIS if bits == 4 else AXIS
        return QuantizedWeight(_hwio(cc.codes), _params(cc.scale), encoding, bits, 3, [], cc.bias, True, 0.0)
    if cc.zero is None and bits == 4:
        return QuantizedWeight(_hwio(cc.codes), _params(cc.scale), BLOCK, 4, 3, block, cc.bias, True, 0.0)
    if bits == 4:
        # w = q * scale + zero on an input centered per block: the codes and scales exact, the zeros drop out
        scale, codes = _flat_blocks(cc, cc.zero)
        sums = np.ascontiguousarray(cc.block_sums().T).astype(np.float32)
        if cc.channel_wise:
            return QuantizedWeight(_hwio(codes), _params(scale), BW_AXIS, 4, 3, [], cc.bias, True, 0.0, sums)
        digits, unit, missed = fold_block_sums(sums, cc.block)
        # what the digits miss of each block sum is spread over the block's weights
        top = cc.max_abs()
        error = missed / cc.block / top if top else 0.0
        codes = np.concatenate([codes, digits], 1)
        scale = np.concatenate([scale, np.repeat(unit[:, None], digits.shape[1] // cc.block, 1)], 1)
        return QuantizedWeight(
            _hwio(codes), _params(scale), BLOCK, 4, 3, block, cc.bias, True, error, sums, digits.shape[1]
        )
    # 8-bit codes (BLOCK reads 4 bits): w = q * scale + zero = (q + zero / scale) * scale (symmetric blocks: zero 0);
    # a block with scale 0 holds only its zero: codes 0, scale |zero| (or 1), offset zero / scale
    zero = cc.zero if cc.zero is not None else np.zeros_like(cc.scale)
    scale, codes = _flat_blocks(cc, zero)
    offset = zero / scale
    return QuantizedWeight(_hwio(codes), _params(scale, offset), BW_FLOAT_BLOCK, bits, 3, block, cc.bias, True, 0.0)


def folded_layout(blocks: int, block: int) -> tuple[int, int]:
    """How the folded inputs fill whole blocks: inputs per block mean (its `SUM_DIGITS` levels, then inputs whose
    factor is 0) and zero inputs after all of them. The zeros come from the factors wherever the blocks divide evenly
    (no static tensor as wide as the rows)."""
    padded = -(-blocks * SUM_DIGITS // block) * block
    if padded % blocks == 0:
        return padded // blocks, 0
    return SUM_DIGITS, padded - blocks * SUM_DIGITS


def sum_levels(per_mean: int = SUM_DIGITS) -> np.ndarray:
    """What a block mean is multiplied by for each of its ``per_mean`` inputs: ``SUM_BASE ** -k`` for each digit
    (as fp16: what the graph uses), then 0."""
    levels = np.zeros(per_mean, np.float16)
    levels[:SUM_DIGITS] = float(SUM_BASE) ** -np.arange(SUM_DIGITS)
    return levels


def fold_block_sums(sums: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``sums`` (``[blocks, out]``) as int8 codes ``[out, folded]``, one scale per output channel ``[out]`` and the
    largest |sum - what the digits hold|: input ``b * per_mean + k`` (`folded_layout`; the mean of block ``b`` times
    ``sum_levels(per_mean)[k]``) gets digit ``k`` of block ``b``'s sum, so ``sum_k digit_k * level_k * scale`` is the
    sum to within half the last digit's step; the other inputs get code 0."""
    sums = sums.T.astype(np.float64)  # [out, blocks]
    out_ch, blocks = sums.shape
    top = np.abs(sums).max(1)
    unit = np.where(top > 0, top / 7, 1.0).astype(np.float32).astype(np.float64)  # the scale as QNN gets it
    per_mean, pad = folded_layout(blocks, block)
    codes = np.zeros((out_ch, blocks, per_mean), np.int8)
    left = sums.copy()
    for k, level in enumerate(sum_levels()[:SUM_DIGITS].astype(np.float64)):
        step = unit[:, None] * level
        codes[:, :, k] = np.clip(np.round(left / step), -8, 7)
        left -= codes[:, :, k] * step
    codes = np.concatenate([codes.reshape(out_ch, -1), np.zeros((out_ch, pad), np.int8)], 1)
    return codes, unit.astype(np.float32), float(np.abs(left).max(initial=0.0))


def _flat_blocks(cc: ConvCodes, zero: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Scales and codes with every block of scale 0 (its weights all equal its zero) given codes 0 and a nonzero
    scale (|zero|, or 1), so no encoding divides by 0."""
    scale, codes = cc.scale.copy(), cc.codes
    flat = scale == 0
    if flat.any():
        scale[flat] = 1.0 if zero is None else np.where(zero[flat] != 0, np.abs(zero[flat]), 1.0)
        codes = codes.copy()
        codes[np.repeat(flat, cc.block, axis=1)] = 0
    return scale, codes


def npu_weight(op: Op, weights: WeightFile | None, mode: str) -> tuple[QuantizedWeight | None, str]:
    """The quantized weight of conv ``op`` for ``mode`` (a `NpuWeights`), or None and why it stays float16 (empty
    when float16 was asked for)."""
    if mode == "float16":
        return None, ""
    cc = conv_codes(op, weights)
    if cc is None:
        return None, "float weights: no codes to keep"
    if mode == "int4":
        return _own_codes(cc), ""
    return _int8_per_channel(cc), ""
