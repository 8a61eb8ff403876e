"""Decode Convolution weights and LLM embeddings into float32 numpy arrays.

Layout facts (MNN ``ConvolutionCommon::load`` / ``IDSTDecoder`` and llmexport's writer):

- ``Convolution2D.external`` with a ``quanParameter``: ``[offset, weight_bytes, alpha_bytes, bias_bytes,
  sparse_index_bytes]`` into the weight file (``llm.mnn.weight``), the three blocks back to back. Without
  a ``quanParameter``: ``[offset, float_weight_bytes, float_bias_bytes]``. ``bias_bytes == 0`` means a
  zero bias.
- IDSTQuan type 1 weight block: ``u8 ndim``, ``ndim`` dims (uint16, or int32 when ``shapeInt32``),
  ``u8 n`` (0 means 256) then ``n`` int8 code values, then every weight's index into the (ascending)
  code table packed MSB-first with ``ceil(log2 n)`` bits. llmexport writes the linear table
  ``-2^(b-1) .. 2^(b-1)-1``, so a weight's integer is ``index - 2^(b-1)``.
- alpha: per group (an output channel, or one block of ``block`` inputs of it, in ``[out, block]``
  order) either ``scale`` (symmetric, ``readType == 0``) or ``(zero, scale)`` pairs (asymmetric), fp32 or,
  with ``scaleStorage == FP16``, fp16. ``w = q * scale + zero``.
- Tied embeddings (``llm_config.json`` ``tie_embeddings = [weight_offset, alpha_offset, alpha_size, bits,
  block(, alpha_fp16)]`` or the dict form) point into the lm_head conv's packed bytes: rows of
  ``hidden * bits / 8`` bytes of unsigned codes; untied models ship ``embeddings_bf16.bin``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from mnnbuild.base.errors import MNNFormatError, UnsafePathError
from mnnbuild.base.fsutil import confined, read_json_object
from mnnbuild.mnn.llm import DEFAULT_EMBEDDINGS, DEFAULT_WEIGHT
from mnnbuild.mnn.model import MnnModel, Op, _walk_t

log = logging.getLogger(__name__)

# IDSTQuan.type values
QUANT_IDST = 1  # packed low-bit codes + alpha (what llmexport writes)
QUANT_SPARSE = 2
QUANT_FP16 = 3
QUANT_INT8 = 4  # raw int8 + alpha
QUANT_EXTERNAL_FLOAT = 8  # float weights in the external file (set by MNN's loader, not in files)
_SUPPORTED_QUANT = (QUANT_IDST, QUANT_FP16, QUANT_INT8, QUANT_EXTERNAL_FLOAT)
# Deconvolution stores its weights transposed; LLM graphs have none, so it is not decoded here
_CONV_TYPES = ("Convolution", "ConvolutionDepthwise")


@dataclass(frozen=True)
class QuantInfo:
    """How one Convolution's weights are stored."""

    quant_type: int  # IDSTQuan.type, 0 for plain float
    bits: int  # 32 float, 16 fp16, else code bits
    block_size: int  # inputs per scale group (== inputs for channel-wise)
    groups: int  # scale groups (out * blocks)
    symmetric: bool
    alpha_dtype: str  # "fp32" / "fp16" / "" when there is no alpha


@dataclass
class ConvWeights:
    """Decoded weights of one Convolution op: ``weight`` ``[out, in/group * kh * kw]`` (``[out, in]`` for the
    1x1 convs of LLMs; float32 unless `decode_conv` was asked for another type) and ``bias`` float32 ``[out]``;
    ``y = x @ weight.T + bias``."""

    name: str
    weight: np.ndarray
    bias: np.ndarray
    quant: QuantInfo
    stored_bytes: int  # bytes the weight/alpha/bias occupy where they are stored

    @property
    def channel_wise(self) -> bool:
        """One scale group per output channel (as opposed to block-wise)."""
        return self.quant.groups == self.weight.shape[0]


def weight_path_for(model_path: str | os.PathLike[str]) -> Path:
    """MNN's convention: the external weights of ``x.mnn`` are in ``x.mnn.weight``."""
    return Path(str(model_path) + ".weight")


class WeightFile:
    """Read-only, memory-mapped view of an external weight file with bounds-checked slices.

    Pages are only touched when a slice is decoded, so memory stays bounded by one op."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.size = self.path.stat().st_size
        except OSError as exc:
            raise MNNFormatError(f"{self.path}: cannot open weight file: {exc}") from exc
        self._map: np.memmap | None = np.memmap(self.path, dtype=np.uint8, mode="r") if self.size else None

    def read(self, offset: int, size: int, what: str) -> np.ndarray:
        """``size`` bytes at ``offset`` as a uint8 array view; MNNFormatError if the file is shorter."""
        if offset < 0 or size < 0 or offset + size > self.size:
            raise MNNFormatError(
                f"{self.path}: {what} needs bytes [{offset}, {offset + size}) but the weight file has "
                f"{self.size} bytes (truncated or not this model's weight file)"
            )
        if size == 0 or self._map is None:
            return np.zeros(0, dtype=np.uint8)
        return self._map[offset : offset + size]

    def close(self) -> None:
        if self._map is not None:
            mm = getattr(self._map, "_mmap", None)
            self._map = None
            if mm is not None:
                mm.close()

    def __enter__(self) -> WeightFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True)
class WeightRange:
    """Bytes ``[offset, offset + size)`` of a weight file that ``reader`` reads."""

    offset: int
    size: int
    reader: str

    @property
    def end(self) -> int:
        return self.offset + self.size


def external_tables(obj: Any) -> Iterator[Any]:
    """Every parameter table under ``obj`` (an op's ``main``) keeping its data in the external weight file: any table
    with an ``external`` field of two or more numbers, ``[offset, size, ...]``, its data the sizes' sum of bytes from
    ``offset``, back to back (MNN's ``USE_EXTERNAL_DATA``). In MNN's schema those are Convolution2D, Convolution3D,
    Scale, LayerNorm, GroupNorm and Blob (a Const's), also where another op's parameters hold one (FusedLinearParam's
    convs and norm, RoPEParam's norms)."""
    for table in _walk_t(obj):
        ext = getattr(table, "external", None)
        if ext is not None and len(ext) > 1:
            yield table


def _external_range(table: Any, reader: str) -> WeightRange:
    ext = [int(v) for v in table.external]
    if ext[0] < 0 or any(v < 0 for v in ext[1:]):
        raise MNNFormatError(f"{reader}: external data {ext} holds a negative offset or size")
    return WeightRange(ext[0], sum(ext[1:]), reader)


def external_ranges(model: MnnModel) -> list[WeightRange]:
    """Every byte range of the model's weight file one of its ops reads (`external_tables`), in op order (a
    subgraph's ops after the graph's). An op naming its own file (``externalPath``) reads that file, not this one."""
    found = [
        _external_range(table, f"op {op.name!r}")
        for op in model.ops
        if op.main is not None and not op.external_path
        for table in external_tables(op.main)
    ]
    for sub in model.subgraphs:
        for node in sub.nodes or []:
            if node.main is not None and not node.externalPath:
                reader = f"op {node.name!r} of subgraph {sub.name!r}"
                found += [_external_range(table, reader) for table in external_tables(node.main)]
    return found


def check_weight_ranges(model: MnnModel, weight_path: str | os.PathLike[str]) -> None:
    """Every op's external data lies inside ``weight_path`` (bounds only, nothing decoded); otherwise
    MNNFormatError naming the weight file and the first op that does not fit."""
    with WeightFile(weight_path) as weights:
        for r in external_ranges(model):
            weights.read(r.offset, r.size, r.reader)


def _idst_weight_count(header: np.ndarray, shape_int32: bool, where: str) -> int:
    """The weight count an IDSTQuan type-1 block declares in its header (``u8 ndim`` then the dims)."""
    dim_dtype = np.dtype("<i4" if shape_int32 else "<u2")
    ndim = int(header[0]) if header.size else 0
    if not 1 <= ndim <= 4 or header.size < 1 + ndim * dim_dtype.itemsize:
        raise MNNFormatError(f"{where}: quantized weight header has {ndim} dims in {header.size} bytes, expected 1..4")
    return math.prod(int(d) for d in header[1 : 1 + ndim * dim_dtype.itemsize].view(dim_dtype))


def check_conv_scales(model: MnnModel, weight_path: str | os.PathLike[str]) -> None:
    """Every quantized Convolution's scales fit its shape as MNN's engine reads them, and are finite.

    MNN takes ``external[2]`` bytes of scales and derives the block count from it (scales / output channels, pairs
    when asymmetric); a count that does not split the inputs into equal blocks, or a NaN/inf scale, made io fail
    with only "non-finite values" on a graph output. Only the weight headers and scales are read (at Qwen3-1.7B
    size a quarter of an int4 weight file), not the codes. MNNFormatError names the model file's op and field, or
    the weight file's bytes."""
    model_file = getattr(model, "path", None) or "the model"
    with WeightFile(weight_path) as weights:
        for op in conv_ops(model):
            c, q = op.main, op.main.quanParameter
            ext = [int(v) for v in c.external] if c.external is not None else []
            if q is None or len(ext) < 3 or q.buffer is not None or int(q.type) not in (QUANT_IDST, QUANT_INT8):
                continue
            where = f"op {op.name!r}"
            out_ch = int(c.common.outputCount) if c.common is not None else 0
            head = weights.read(ext[0], min(ext[1], 17), f"{where} quantized weight")
            count = _idst_weight_count(head, bool(q.shapeInt32), where) if int(q.type) == QUANT_IDST else ext[1]
            fp16 = int(q.scaleStorage) == 1
            asymmetric = int(q.readType) != 0 or (
                int(q.type) == QUANT_INT8 and q.aMin == 0 and abs(q.quantScale) < 1e-6
            )
            per_block = out_ch * (2 if asymmetric else 1)
            scales, item = ext[2] // (2 if fp16 else 4), 2 if fp16 else 4
            in_ch = count // out_ch if out_ch > 0 and count % out_ch == 0 else 0
            blocks = scales // per_block if per_block and scales % per_block == 0 else 0
            if ext[2] % item or not in_ch or not blocks or in_ch % blocks:
                per = "(zero, scale) pairs" if asymmetric else "scales"
                raise MNNFormatError(
                    f"{model_file}: {where}: Convolution2D external[2] (scale bytes) is {ext[2]}: "
                    f"{ext[2] / item / per_block:g} blocks of {per} per output channel ({out_ch} channels, {item}-byte "
                    f"values); expected a whole number of blocks splitting its {in_ch or count} inputs evenly"
                )
            alpha = weights.read(ext[0] + ext[1], ext[2], f"{where} scales").view("<f2" if fp16 else "<f4")
            bad = np.flatnonzero(~np.isfinite(alpha))
            if bad.size:
                at = ext[0] + ext[1] + int(bad[0]) * item
                raise MNNFormatError(
                    f"{weights.path}: {where}: {bad.size} of its {alpha.size} scales are not finite (the first at "
                    f"byte {at}: {float(alpha[bad[0]])}); not this model's weight file, or a damaged one"
                )


# ---- low-level decoders -----------------------------------------------------------------------------


def unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """``count`` unsigned ``bits``-wide codes packed MSB-first in ``packed`` (uint8) -> uint8 array."""
    packed = np.asarray(packed, dtype=np.uint8)
    need = (count * bits + 7) // 8
    if packed.size < need:
        raise MNNFormatError(f"{count} codes of {bits} bits need {need} bytes, got {packed.size}")
    if bits == 8:
        return np.array(packed[:count], dtype=np.uint8)
    if bits == 4:
        out = np.empty(2 * need, dtype=np.uint8)
        src = packed[:need]
        np.right_shift(src, 4, out=out[0::2])
        np.bitwise_and(src, 0x0F, out=out[1::2])
        return out[:count]
    if bits == 2:
        out = np.empty(4 * need, dtype=np.uint8)
        src = packed[:need]
        for k in range(4):
            np.bitwise_and(np.right_shift(src, 6 - 2 * k), 3, out=out[k::4])
        return out[:count]
    # generic bit stream (1, 3, 5, 6, 7 bits), in chunks to keep the bit expansion small
    out = np.empty(count, dtype=np.uint8)
    weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.uint8)
    chunk = 8 * 65536  # codes per chunk, a multiple of 8 so chunks start on byte boundaries
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        first = start * bits // 8
        raw = np.unpackbits(packed[first : first + (n * bits + 7) // 8])[: n * bits]
        out[start : start + n] = raw.reshape(n, bits) @ weights
    return out


def _decode_idst_block(buf: np.ndarray, shape_int32: bool, where: str) -> tuple[np.ndarray, int, list[int], int]:
    """Parse an IDSTQuan type-1 weight block -> (values, value offset, dims, code bits); a weight's
    integer is ``value - value_offset``."""
    pos = 0

    def take(n: int, what: str) -> np.ndarray:
        nonlocal pos
        if pos + n > buf.size:
            raise MNNFormatError(f"{where}: weight block ends inside the {what} ({buf.size} bytes)")
        out = buf[pos : pos + n]
        pos += n
        return out

    ndim = int(take(1, "header")[0])
    if not 1 <= ndim <= 4:
        raise MNNFormatError(f"{where}: quantized weight header has {ndim} dims, expected 1..4")
    dim_dtype = "<i4" if shape_int32 else "<u2"
    dims = [int(d) for d in take(ndim * np.dtype(dim_dtype).itemsize, "dims").view(dim_dtype)]
    count = math.prod(dims)
    n_codes = int(take(1, "code table size")[0]) or 256
    table = np.sort(take(n_codes, "code table").view(np.int8).astype(np.int16))
    bits = max(1, math.ceil(math.log2(n_codes))) if n_codes > 1 else 1
    idx = unpack_codes(take((count * bits + 7) // 8, "packed codes"), bits, count)
    offset = 1 << (bits - 1)
    linear = n_codes == (1 << bits) and np.array_equal(table, np.arange(-offset, offset, dtype=np.int16))
    if linear:
        # keep the unsigned codes; the offset is folded into the zero point when dequantizing
        return idx, offset, dims, bits
    if idx.max(initial=0) >= n_codes:
        raise MNNFormatError(f"{where}: code {int(idx.max())} beyond the {n_codes}-entry table")
    return table[idx], 0, dims, bits


def _alpha_from(raw: np.ndarray, fp16: bool) -> np.ndarray:
    return raw.view("<f2").astype(np.float32) if fp16 else raw.view("<f4").astype(np.float32)


RowSource = Callable[[int, int], np.ndarray]
"""Output channels ``[first, last)`` of a conv weight as float32 ``[last - first, in]`` (a view or a new array)."""


def _dequantizer(values: np.ndarray, value_offset: int, alpha: np.ndarray, asymmetric: bool, where: str) -> RowSource:
    """Scale groups ``[first, last)`` of ``(values - value_offset) * scale + zero`` as float32 ``[groups, block]``,
    computed as ``values * scale + zero'`` (offset folded into the zero point) to save a pass over the data."""
    groups = alpha.size // 2 if asymmetric else alpha.size
    if groups == 0 or values.size % groups:
        raise MNNFormatError(f"{where}: {values.size} weights do not split into {groups} scale groups")
    v2 = values.reshape(groups, -1)
    scale = alpha[1::2] if asymmetric else alpha
    zero = alpha[0::2] if asymmetric else np.zeros_like(alpha)
    if value_offset:
        zero = zero - np.float32(value_offset) * scale
    shift = asymmetric or bool(value_offset)

    def rows(first: int, last: int) -> np.ndarray:
        out = np.empty((last - first, v2.shape[1]), dtype=np.float32)
        np.multiply(v2[first:last], scale[first:last, None], out=out, casting="unsafe")
        if shift:
            out += zero[first:last, None]
        return out

    return rows


def _slices(matrix: np.ndarray) -> RowSource:
    return lambda first, last: matrix[first:last]


def _group_rows(dequantize: RowSource, per_row: int, in_ch: int) -> RowSource:
    """Output channels from a dequantizer of scale groups, ``per_row`` groups per channel."""
    return lambda first, last: dequantize(first * per_row, last * per_row).reshape(last - first, in_ch)


# output channels decoded at a time: the float32 temporaries stay small even for an lm_head, and a block written
# transposed (``in_major``) stays in cache, which makes 512 KB blocks much faster than large ones (docs/benchmarks.md)
_BLOCK_BYTES = 512 << 10


def _assemble(rows: RowSource, out_ch: int, in_ch: int, dtype: np.dtype, in_major: bool) -> np.ndarray:
    """The ``[out_ch, in_ch]`` weight of ``dtype`` filled a block of output channels at a time from ``rows``, so
    the only full-size array is the result. ``in_major`` stores it as the transpose of a C-contiguous
    ``[in, out]`` array (QNN's conv weight layout): ``result.T`` is then contiguous, no second copy needed."""
    full = np.empty((in_ch, out_ch) if in_major else (out_ch, in_ch), dtype=dtype)
    view = full.T if in_major else full
    step = max(1, _BLOCK_BYTES // max(1, 4 * in_ch))
    for first in range(0, out_ch, step):
        last = min(out_ch, first + step)
        view[first:last] = rows(first, last)  # cast to dtype per element, as astype would (round to nearest)
    return view


# ---- Convolution ------------------------------------------------------------------------------------


def conv_stored_bytes(op: Op) -> int:
    """Bytes of weight, alpha and bias one conv occupies (in the weight file or inline), without reading
    them."""
    c = op.main
    ext = list(c.external) if c.external is not None else []
    if len(ext) > 1:
        return int(sum(ext[1:]))
    total = 0
    for vec in (c.weight, c.bias):
        total += 0 if vec is None else len(vec) * 4
    q = c.quanParameter
    if q is not None:
        for vec, size in ((q.buffer, 1), (q.alpha, 4), (q.alphaFp16, 2)):
            total += 0 if vec is None else len(vec) * size
    return total


def conv_ops(model: MnnModel) -> list[Op]:
    """The Convolution / ConvolutionDepthwise ops (parameter Convolution2D), in graph order."""
    return [op for op in model.ops if op.type in _CONV_TYPES and op.param_type == "Convolution2D"]


@dataclass
class _StoredConv:
    """One Convolution's weights as stored: float values, or integer values with their scale groups."""

    out_ch: int
    bias: np.ndarray | None
    info: QuantInfo
    count: int
    floats: np.ndarray | None = None
    values: np.ndarray | None = None  # a weight's integer is ``value - value_offset``
    value_offset: int = 0
    alpha: np.ndarray | None = None  # scales, or (zero, scale) pairs when asymmetric, as MNN dequantizes them


def _read_conv(op: Op, weights: WeightFile | None) -> _StoredConv:
    c = op.param("Convolution2D")
    where = f"op {op.name!r}"
    common = c.common
    out_ch = int(common.outputCount) if common is not None else 0
    ext = [int(v) for v in c.external] if c.external is not None else []
    external = len(ext) > 1
    q = c.quanParameter

    def need_file() -> WeightFile:
        if weights is None:
            raise MNNFormatError(f"{where}: weights are in the external weight file but none was given")
        return weights

    bias: np.ndarray | None = None
    if q is None:
        if external:
            f = need_file()
            floats = f.read(ext[0], ext[1], f"{where} float weight").view("<f4")
            if len(ext) > 2 and ext[2]:
                bias = f.read(ext[0] + ext[1], ext[2], f"{where} bias").view("<f4").astype(np.float32)
        else:
            if c.weight is None:
                raise MNNFormatError(f"{where}: Convolution2D has neither weights nor external data")
            floats = np.asarray(c.weight, dtype=np.float32)
        stored = _StoredConv(out_ch, bias, QuantInfo(0, 32, 0, 0, True, ""), floats.size, floats=floats)
    else:
        qtype = int(q.type)
        if qtype not in _SUPPORTED_QUANT:
            kind = (
                "sparse (type 2) quantization is not supported"
                if qtype == QUANT_SPARSE
                else (f"unknown quantization type {qtype}")
            )
            raise MNNFormatError(f"{where}: {kind}; expected IDSTQuan.type in {list(_SUPPORTED_QUANT)}")
        fp16_alpha = int(q.scaleStorage) == 1
        if external and q.buffer is None:
            f = need_file()
            raw = f.read(ext[0], ext[1], f"{where} quantized weight")
            alpha_raw = f.read(ext[0] + ext[1], ext[2], f"{where} scales") if len(ext) > 2 else None
            if len(ext) > 3 and ext[3] > 0:
                bias = f.read(ext[0] + ext[1] + ext[2], ext[3], f"{where} bias").view("<f4").astype(np.float32)
        else:
            raw = np.asarray(q.buffer if q.buffer is not None else [], dtype=np.int8).view(np.uint8)
            if fp16_alpha and q.alphaFp16 is not None:
                alpha_raw = np.asarray(q.alphaFp16, dtype="<u2").view(np.uint8)
            elif q.alpha is not None:
                alpha_raw = np.asarray(q.alpha, dtype="<f4").view(np.uint8)
                fp16_alpha = False
            else:
                alpha_raw = None
        if qtype in (QUANT_FP16, QUANT_EXTERNAL_FLOAT):
            floats = raw.view("<f2") if qtype == QUANT_FP16 else raw.view("<f4")
            info = QuantInfo(qtype, 16 if qtype == QUANT_FP16 else 32, 0, 0, True, "")
            stored = _StoredConv(out_ch, bias, info, floats.size, floats=floats)
        else:
            if qtype == QUANT_IDST:
                ints, value_offset, _dims, bits = _decode_idst_block(np.asarray(raw), bool(q.shapeInt32), where)
            else:
                ints, value_offset, bits = np.asarray(raw).view(np.int8), 0, 8
            if alpha_raw is None or alpha_raw.size == 0:
                raise MNNFormatError(f"{where}: quantized weights without scales (alpha)")
            alpha = _alpha_from(np.asarray(alpha_raw), fp16_alpha)
            old_type4 = qtype == QUANT_INT8 and q.aMin == 0 and abs(q.quantScale) < 1e-6
            asymmetric = int(q.readType) != 0 or old_type4
            if asymmetric:
                clamp_min = -128 if q.aMin == 0 else int(q.aMin)
                if clamp_min < 0:  # older exporters stored the minimum instead of the zero point
                    alpha[0::2] -= clamp_min * alpha[1::2]
            if not q.hasScaleInt and not old_type4 and q.quantScale != 1.0:
                alpha *= np.float32(q.quantScale)
            groups = alpha.size // 2 if asymmetric else alpha.size
            info = QuantInfo(
                qtype,
                bits,
                ints.size // groups if groups else 0,
                groups,
                not asymmetric,
                "fp16" if fp16_alpha else "fp32",
            )
            stored = _StoredConv(out_ch, bias, info, ints.size, values=ints, value_offset=value_offset, alpha=alpha)
    if stored.bias is None and c.bias is not None and len(c.bias):
        stored.bias = np.asarray(c.bias, dtype=np.float32)
    if stored.out_ch <= 0:
        stored.out_ch = stored.bias.size if stored.bias is not None else 1
    if stored.count % stored.out_ch:
        raise MNNFormatError(f"{where}: {stored.count} weights do not split into {stored.out_ch} output channels")
    if stored.bias is None:
        stored.bias = np.zeros(stored.out_ch, dtype=np.float32)
    if stored.bias.size != stored.out_ch:
        raise MNNFormatError(f"{where}: bias has {stored.bias.size} values, expected {stored.out_ch}")
    return stored


def decode_conv(
    op: Op, weights: WeightFile | None, *, dtype: DTypeLike = np.float32, in_major: bool = False
) -> ConvWeights:
    """Decode one Convolution op into an ``[out, in]`` weight of ``dtype`` (float32 unless asked) and a float32
    ``[out]`` bias.

    ``weights`` is the model's external weight file (``None`` is fine when everything is inline). With
    ``in_major`` the weight is the transpose of a C-contiguous ``[in, out]`` array, so ``weight.T`` (what a
    QNN conv reads) needs no copy; either way it is decoded a block of output channels at a time into the
    result, the only full-size array (an lm_head is 1.2 GB in float32)."""
    s = _read_conv(op, weights)
    where = f"op {op.name!r}"
    out_ch, in_ch = s.out_ch, s.count // s.out_ch
    groups = s.info.groups
    if s.floats is not None:
        rows = _slices(s.floats.reshape(out_ch, in_ch))
    else:
        assert s.values is not None and s.alpha is not None
        dequantize = _dequantizer(s.values, s.value_offset, s.alpha, not s.info.symmetric, where)
        if groups % out_ch == 0:  # scale groups are [out, blocks] ordered: whole output channels decode alone
            rows = _group_rows(dequantize, groups // out_ch, in_ch)
        else:  # a scale group spans output channels (no exporter writes this): decode it whole
            rows = _slices(dequantize(0, groups).reshape(out_ch, in_ch))
    weight = _assemble(rows, out_ch, in_ch, np.dtype(dtype), in_major)
    assert s.bias is not None
    return ConvWeights(op.name, weight, s.bias, s.info, conv_stored_bytes(op))


@dataclass
class ConvCodes:
    """A quantized conv's own integers and scale groups: ``w[o, b*block + i] = codes[o, b*block + i] * scale[o, b]
    + zero[o, b]`` (``zero`` None when symmetric), exactly what MNN dequantizes (in float32)."""

    name: str
    codes: np.ndarray  # int8 [out, in], in [-2^(bits-1), 2^(bits-1) - 1]
    scale: np.ndarray  # float32 [out, blocks]
    zero: np.ndarray | None  # float32 [out, blocks], or None
    bias: np.ndarray  # float32 [out]
    bits: int
    block: int  # inputs per scale group (== in for channel-wise)

    @property
    def channel_wise(self) -> bool:
        return self.scale.shape[1] == 1

    def dequantized(self) -> np.ndarray:
        """float32 ``[out, in]``, computed as MNN does (`decode_conv` gives the same numbers)."""
        out_ch, in_ch = self.codes.shape
        blocks = self.codes.reshape(out_ch, -1, self.block).astype(np.float32) * self.scale[:, :, None]
        if self.zero is not None:
            blocks += self.zero[:, :, None]
        return blocks.reshape(out_ch, in_ch)

    def block_sums(self) -> np.ndarray:
        """float64 ``[out, blocks]``: each block's sum of the weights, from the sums of its codes (no dequantized
        copy: at an lm_head's size that is 1.2 GB and seconds)."""
        out_ch, _ = self.codes.shape
        counts = self.codes.reshape(out_ch, -1, self.block).sum(2, dtype=np.int32)
        sums = counts * self.scale.astype(np.float64)
        return sums if self.zero is None else sums + self.block * self.zero.astype(np.float64)

    def max_abs(self) -> float:
        """The largest |weight|, from each block's smallest and largest code."""
        if not self.codes.size:
            return 0.0
        out_ch, _ = self.codes.shape
        blocks = self.codes.reshape(out_ch, -1, self.block)
        scale, zero = self.scale.astype(np.float64), 0.0 if self.zero is None else self.zero.astype(np.float64)
        ends = [blocks.min(2) * scale + zero, blocks.max(2) * scale + zero]
        return float(max(np.abs(e).max() for e in ends))


def conv_codes(op: Op, weights: WeightFile | None) -> ConvCodes | None:
    """The stored integers and per-group scales of a quantized conv (None for float or fp16 weights, or a scale
    group spanning output channels, which no exporter writes). Codes of up to 8 bits come back as int8."""
    s = _read_conv(op, weights)
    if s.values is None or s.alpha is None or s.info.bits > 8:
        return None
    out_ch, in_ch = s.out_ch, s.count // s.out_ch
    groups = s.info.groups
    if groups % out_ch or in_ch % (groups // out_ch):
        return None
    blocks = groups // out_ch
    half = 1 << (s.info.bits - 1)
    # narrow codes (unsigned, below 128) shift in int8: no int16 copy of an lm_head's 311M codes
    wide = s.info.bits >= 8 or abs(int(s.value_offset)) >= 128
    ints = s.values.astype(np.int16 if wide else np.int8)
    if s.value_offset:
        ints -= ints.dtype.type(s.value_offset)
    if ints.size and (ints.min() < -half or ints.max() >= half):
        raise MNNFormatError(f"op {op.name!r}: codes beyond {s.info.bits} bits")
    if s.info.symmetric:
        scale, zero = s.alpha.reshape(out_ch, blocks), None
    else:
        scale, zero = s.alpha[1::2].reshape(out_ch, blocks), s.alpha[0::2].reshape(out_ch, blocks)
    assert s.bias is not None
    codes = ints.astype(np.int8, copy=False).reshape(out_ch, in_ch)
    return ConvCodes(op.name, codes, scale.astype(np.float32), zero, s.bias, s.info.bits, in_ch // blocks)


def iter_conv_weights(model: MnnModel, weight_path: str | os.PathLike[str] | None = None) -> Iterator[ConvWeights]:
    """Decode every Convolution of ``model``, one at a time (the previous one can be freed before the next
    is decoded). ``weight_path`` defaults to ``<model path>.weight``."""
    if weight_path is None and model.path is not None:
        candidate = weight_path_for(model.path)
        weight_path = candidate if candidate.exists() else None
    wf = WeightFile(weight_path) if weight_path is not None else None
    try:
        for op in conv_ops(model):
            cw = decode_conv(op, wf)
            log.debug("decoded %s: %s %s", op.name, cw.weight.shape, cw.quant)
            yield cw
    finally:
        if wf is not None:
            wf.close()


# ---- embeddings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddingInfo:
    """Where a model's token embeddings are and how they are stored."""

    path: Path
    hidden: int
    vocab: int
    kind: str  # "bf16", "fp16" or "quant"
    weight_offset: int = 0
    alpha_offset: int = 0
    alpha_size: int = 0
    bits: int = 16
    block: int = 0
    alpha_fp16: bool = False


def _integer(value: Any, what: str) -> int:
    """A JSON integer (not a string, float or bool: int() would take "7", 7.9 and true)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise MNNFormatError(f"{what} must be an integer, got {value!r}")
    return value


def _model_file(model_dir: Path, cfg: dict[str, Any], field: str, default: str) -> Path:
    """The file ``llm_config.json`` field ``field`` names: one of the model dir's own (see `confined`)."""
    name = cfg.get(field, default)
    what = f"{model_dir / 'llm_config.json'}: field {field!r}"
    if not isinstance(name, str):
        raise MNNFormatError(f"{what} must be a file name, got {name!r}")
    try:
        return confined(model_dir, name, what, follow_last=False)
    except UnsafePathError as exc:
        raise MNNFormatError(str(exc)) from None


TIE_EMBEDDINGS = "tie_embeddings"
_TIE_KEYS = ("weight_offset", "alpha_offset", "alpha_size", "quant_bit", "quant_block")
"""The dict form's names of the list form's five numbers, in order (MNN's ``LlmConfig::tie_embeddings_info``)."""


@dataclass(frozen=True)
class TieEmbeddings:
    """``llm_config.json``'s ``tie_embeddings``: the embedding rows are the lm_head's codes at ``weight_offset``
    (rows of ``hidden * bits / 8`` bytes, the vocabulary up to ``alpha_offset``) with its scales at
    ``alpha_offset``; ``weight_offset == 0`` means a separate ``embedding_file`` holds them."""

    weight_offset: int
    alpha_offset: int
    alpha_size: int
    bits: int
    block: int
    alpha_fp16: bool

    def weight_range(self) -> WeightRange | None:
        """The bytes MNN's engine reads from the model's weight file: the codes and then the scales (None when
        they are in a separate file)."""
        if self.weight_offset == 0:
            return None
        end = self.alpha_offset + (self.alpha_size if self.bits != 16 else 0)
        return WeightRange(self.weight_offset, end - self.weight_offset, f"llm_config.json field {TIE_EMBEDDINGS!r}")

    def moved(self, config: dict[str, Any], weight_offset: int) -> dict[str, Any]:
        """A copy of ``config`` (an ``llm_config.json``) whose ``tie_embeddings`` point at the same bytes moved to
        ``weight_offset`` (the scales follow the codes as they did), in the form the config had."""
        shift = weight_offset - self.weight_offset
        tie = config[TIE_EMBEDDINGS]
        if isinstance(tie, list):
            value: Any = [weight_offset, self.alpha_offset + shift, *tie[2:]]
        else:
            value = {**tie, "weight_offset": weight_offset, "alpha_offset": self.alpha_offset + shift}
        return {**config, TIE_EMBEDDINGS: value}


def tie_embeddings(config: dict[str, Any], where: str | os.PathLike[str]) -> TieEmbeddings | None:
    """``config``'s ``tie_embeddings`` (list or dict form), checked; None when the embeddings are not tied.
    ``where`` names the file in errors."""
    tie = config.get(TIE_EMBEDDINGS)
    if not tie:
        return None
    what = f"{where}: field {TIE_EMBEDDINGS!r}"
    if isinstance(tie, list):
        if len(tie) < 5:
            raise MNNFormatError(f"{what} {tie} needs 5 numbers: {', '.join(_TIE_KEYS)}")
        numbers = [_integer(v, f"{what} entry {i}") for i, v in enumerate(tie[:5])]
        fp16 = len(tie) > 5 and tie[5]
    elif isinstance(tie, dict):
        numbers = [_integer(tie.get(k, 0), f"{where}: field '{TIE_EMBEDDINGS}.{k}'") for k in _TIE_KEYS]
        # MNN's engine reads a missing key as 0, which no tied model can mean for the bits
        if "quant_bit" not in tie:
            raise MNNFormatError(f"{where}: field '{TIE_EMBEDDINGS}.quant_bit' is missing; expected 2, 3, 4, 8 or 16")
        fp16 = tie.get("alpha_dtype", "fp32") == "fp16"
    else:
        raise MNNFormatError(f"{what} must be a list of 5 integers or an object, got {tie!r}")
    if min(numbers) < 0:
        raise MNNFormatError(f"{what} {tie}: {', '.join(_TIE_KEYS)} must be non-negative integers")
    w_off, a_off, a_size, bits, block = numbers
    if bits not in (2, 3, 4, 8, 16):
        raise MNNFormatError(f"{what}: quant_bit {bits}, expected 2, 3, 4, 8 or 16")
    if w_off and a_off <= w_off:
        raise MNNFormatError(f"{what}: alpha_offset {a_off} must follow weight_offset {w_off} (the codes end there)")
    return TieEmbeddings(w_off, a_off, a_size, bits, block, bool(fp16))


def _check_scale_bytes(tie: TieEmbeddings, hidden: int, vocab: int, what: str) -> None:
    """MNN's engine reads one scale per block of a row (quant_block 0: the whole row), or a scale and a bias:
    alpha_size must be one of the two, else the rows decode with another row's scales (its check is an assert,
    gone in a release build)."""
    per_row = hidden // tie.block if tie.block else 1
    one = per_row * vocab * (2 if tie.alpha_fp16 else 4)
    if tie.alpha_size not in (one, 2 * one):
        raise MNNFormatError(
            f"{what}: alpha_size {tie.alpha_size} fits neither {one} (a scale) nor {2 * one} bytes (a scale and a "
            f"bias) for {vocab} rows of {per_row} block(s) of quant_block {tie.block}; expected the sizes the "
            "export wrote"
        )


def embedding_info(model_dir: str | os.PathLike[str]) -> EmbeddingInfo:
    """Locate the embeddings of an exported LLM dir the way MNN's llm engine does."""
    model_dir = Path(model_dir)
    cfg_path = model_dir / "llm_config.json"
    cfg = read_json_object(cfg_path, MNNFormatError, unreadable="cannot read llm_config.json")
    hidden = _integer(cfg.get("hidden_size", 0), f"{cfg_path}: field 'hidden_size'")
    if hidden <= 0:
        raise MNNFormatError(f"{cfg_path}: field 'hidden_size' missing or not positive")
    tie = tie_embeddings(cfg, cfg_path)
    if tie is not None:
        w_off, a_off, a_size, bits, block, a_fp16 = (
            tie.weight_offset, tie.alpha_offset, tie.alpha_size, tie.bits, tie.block, tie.alpha_fp16,
        )  # fmt: skip
        if w_off == 0:  # a separate embedding_int4/8.bin
            path = _model_file(model_dir, cfg, "embedding_file", DEFAULT_EMBEDDINGS)
        else:
            path = _model_file(model_dir, cfg, "llm_weight", DEFAULT_WEIGHT)
        # the codes run from weight_offset to alpha_offset, a row of hidden_size codes per token: a hidden_size
        # that fits them no whole number of times is the config's fault, not the weight file's
        row_bits, code_bits = hidden * bits, (a_off - w_off) * 8
        if w_off and (row_bits % 8 or code_bits % row_bits or code_bits < row_bits):
            raise MNNFormatError(
                f"{cfg_path}: field 'hidden_size' is {hidden}, but field {TIE_EMBEDDINGS!r} gives {a_off - w_off} "
                f"bytes of {bits}-bit codes (alpha_offset - weight_offset), no whole number of rows that wide; "
                "expected the model's hidden size"
            )
        if bits != 16 and block and hidden % block:
            raise MNNFormatError(
                f"{cfg_path}: field {TIE_EMBEDDINGS!r} block {block} does not divide field 'hidden_size' {hidden}"
            )
        if bits == 16:
            vocab = (a_off - w_off) // (2 * hidden) if a_off > w_off else 0
            return EmbeddingInfo(path, hidden, vocab, "fp16", w_off, a_off, a_size, 16, 0, a_fp16)
        vocab = (a_off - w_off) * 8 // bits // hidden
        if w_off:
            _check_scale_bytes(tie, hidden, vocab, f"{cfg_path}: field {TIE_EMBEDDINGS!r}")
        return EmbeddingInfo(path, hidden, vocab, "quant", w_off, a_off, a_size, bits, block, a_fp16)
    path = _model_file(model_dir, cfg, "embedding_file", DEFAULT_EMBEDDINGS)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise MNNFormatError(f"{path}: untied model without its bf16 embedding file: {exc}") from exc
    if size % (2 * hidden) or size < 2 * hidden:
        raise MNNFormatError(
            f"{path}: {size} bytes is not a whole number of bf16 rows of {cfg_path} field 'hidden_size' = {hidden}"
        )
    return EmbeddingInfo(path, hidden, size // (2 * hidden), "bf16")


def read_embeddings(model_dir: str | os.PathLike[str], tokens: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Embedding rows as float32 ``[len(tokens), hidden]`` (all ``[vocab, hidden]`` when ``tokens`` is
    None), read from ``embeddings_bf16.bin`` or, for tied embeddings, from the lm_head's quantized bytes."""
    info = embedding_info(model_dir)
    rows = np.arange(info.vocab) if tokens is None else np.asarray(tokens, dtype=np.int64).reshape(-1)
    if rows.size and (rows.min() < 0 or rows.max() >= info.vocab):
        raise MNNFormatError(f"{info.path}: token ids must be in [0, {info.vocab})")
    with WeightFile(info.path) as wf:
        if info.kind == "bf16":
            table = wf.read(0, info.vocab * info.hidden * 2, "bf16 embeddings").view("<u2")
            picked = table.reshape(info.vocab, info.hidden)[rows]
            return (picked.astype(np.uint32) << 16).view(np.float32)
        if info.kind == "fp16":
            table = wf.read(info.weight_offset, info.vocab * info.hidden * 2, "fp16 embeddings").view("<f2")
            return table.reshape(info.vocab, info.hidden)[rows].astype(np.float32)
        row_bytes = info.hidden * info.bits // 8
        packed = wf.read(info.weight_offset, info.vocab * row_bytes, "tied embedding codes")
        packed = packed.reshape(info.vocab, row_bytes)[rows]
        alpha = _alpha_from(wf.read(info.alpha_offset, info.alpha_size, "tied embedding scales"), info.alpha_fp16)
    block = info.block or info.hidden
    blocks = info.hidden // block
    codes = unpack_codes(packed.reshape(-1), info.bits, rows.size * info.hidden).reshape(rows.size, blocks, block)
    offset = 1 << (info.bits - 1)
    ints = codes.astype(np.float32) - offset
    if alpha.size == info.vocab * blocks:
        scale = alpha.reshape(info.vocab, blocks)[rows]
        out = ints * scale[:, :, None]
    elif alpha.size == 2 * info.vocab * blocks:
        pairs = alpha.reshape(info.vocab, blocks, 2)[rows]
        out = ints * pairs[:, :, 1:2] + pairs[:, :, 0:1]
    else:
        raise MNNFormatError(
            f"{info.path}: {alpha.size} tied-embedding scales fit neither {info.vocab}x{blocks} nor twice that"
        )
    return out.reshape(rows.size, info.hidden).astype(np.float32)


# ---- encoder (llmexport's layout), for synthetic models, tests and benchmarks -------------------------


@dataclass
class QuantizedLinear:
    """A ``[out, in]`` matrix quantized the way llmexport stores it: ``weight_block`` (header, code table,
    packed codes) and ``alpha`` go to the weight file back to back; ``dequantized`` is what a decoder
    must give back."""

    weight_block: bytes
    alpha: bytes
    dequantized: np.ndarray
    bits: int
    block_size: int
    symmetric: bool
    alpha_fp16: bool

    def idst_quan(self) -> Any:
        """The matching ``IDSTQuanT`` (type 1) for a Convolution2D with external data."""
        from mnnbuild.mnn._generated import mnn_fb as fb

        out_ch, in_ch = self.dequantized.shape
        q = fb.IDSTQuanT()
        q.type, q.aMaxOrBits, q.quantScale = QUANT_IDST, self.bits, 1.0
        q.aMin, q.readType = (0, 0) if self.symmetric else (1, out_ch * (in_ch // self.block_size))
        q.shapeInt32 = out_ch > 65535 or in_ch > 65535
        q.scaleStorage = fb.ScaleStorageType.FP16 if self.alpha_fp16 else fb.ScaleStorageType.FP32
        return q


def quantize_blocks(
    w: np.ndarray, bits: int, block_size: int = 0, symmetric: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Round float ``w`` [out, in] to ``bits`` (1..8) per ``block_size`` inputs (0: channel-wise) -> int8 codes
    [out, in], float32 scales [out, blocks] and, when asymmetric, zeros [out, blocks]: ``w ~ q * scale + zero``.
    Symmetric codes use [-(2^(b-1) - 1), 2^(b-1) - 1]; asymmetric ones the full range."""
    w = np.asarray(w, dtype=np.float32)
    out_ch, in_ch = w.shape
    block = block_size or in_ch
    if in_ch % block or not 1 <= bits <= 8:
        raise ValueError(f"cannot quantize [{out_ch}, {in_ch}] to {bits} bits in blocks of {block}")
    groups = w.reshape(out_ch * (in_ch // block), block)
    offset = 1 << (bits - 1)
    if symmetric:
        scale = np.abs(groups).max(axis=1) / max(offset - 1, 1)
        scale[scale == 0] = 1.0
        q = np.clip(np.rint(groups / scale[:, None]), -(offset - 1), offset - 1)
        zero = None
    else:
        lo, hi = groups.min(axis=1), groups.max(axis=1)
        scale = (hi - lo) / (2 * offset - 1)
        scale[scale == 0] = 1.0
        q = np.clip(np.rint((groups - lo[:, None]) / scale[:, None]) - offset, -offset, offset - 1)
        zero = (lo + scale * offset).astype(np.float32).reshape(out_ch, -1)
    codes = q.astype(np.int8).reshape(out_ch, in_ch)
    return codes, scale.astype(np.float32).reshape(out_ch, -1), zero


def quantize_linear(
    w: np.ndarray, bits: int, block_size: int = 0, symmetric: bool = False, alpha_fp16: bool = False
) -> QuantizedLinear:
    """Quantize float ``w`` [out, in] to ``bits`` (1..8) per ``block_size`` inputs (0: channel-wise)."""
    w = np.asarray(w, dtype=np.float32)
    out_ch, in_ch = w.shape
    block = block_size or in_ch
    q8, scale2, zero2 = quantize_blocks(w, bits, block_size, symmetric)
    q = q8.astype(np.float32).reshape(-1, block)
    scale = scale2.reshape(-1)
    offset = 1 << (bits - 1)
    if symmetric:
        alpha = scale
    else:
        assert zero2 is not None
        alpha = np.stack([zero2.reshape(-1), scale], axis=1).reshape(-1)
    stored = alpha.astype("<f2" if alpha_fp16 else "<f4")
    a = stored.astype(np.float32)
    scale_s, zero_s = (a, np.zeros_like(a)) if symmetric else (a[1::2], a[0::2])
    deq = (q * scale_s[:, None] + zero_s[:, None]).astype(np.float32).reshape(out_ch, in_ch)
    codes = (q + offset).astype(np.uint8).reshape(-1)
    if bits == 8:
        packed = codes
    else:
        packed = np.packbits(np.unpackbits(codes[:, None], axis=1)[:, 8 - bits :].reshape(-1))
    dim_dtype = "<i4" if out_ch > 65535 or in_ch > 65535 else "<u2"
    table = np.arange(-offset, offset, dtype=np.int8)
    header = bytes([2]) + np.array([out_ch, in_ch], dim_dtype).tobytes()
    header += bytes([0 if table.size == 256 else table.size]) + table.tobytes()
    return QuantizedLinear(header + packed.tobytes(), stored.tobytes(), deq, bits, block, symmetric, alpha_fp16)
