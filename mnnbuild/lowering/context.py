"""State of one subgraph being lowered: MNN tensors -> QNN tensor names, statics, emitted nodes.

Op lowerings (``ops.py``) only talk to :class:`LoweringContext`; it decides whether an MNN tensor is a
graph input (``APP_WRITE``), a graph output (``APP_READ``), an intermediate (``NATIVE``) or a constant
(``STATIC``, materialized on first use), and it names everything deterministically.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from mnnbuild.base.fsutil import sha256_bytes
from mnnbuild.lowering.graph import (
    LoweringError,
    Param,
    QnnNodeDesc,
    QnnTensorDesc,
    QuantDesc,
    ScalarParam,
    TensorKind,
    TensorParam,
    quant_key,
    raw_file_name,
)
from mnnbuild.lowering.quantized import DEFAULT_NPU_WEIGHTS, QuantizedWeight, folded_layout, sum_levels
from mnnbuild.mnn import MnnModel, Op
from mnnbuild.mnn.semantics import CONST_OP_TYPES
from mnnbuild.mnn.weights import ConvWeights, WeightFile
from mnnbuild.model.npu_weights import NpuWeights, WeightNote


@dataclass(frozen=True)
class TensorMeta:
    """Shape and element type of one MNN tensor at one shape index, and its value when known.

    ``shape`` is MNN's logical shape (NC4HW4 tensors count as NCHW); ``dtype`` a numpy name
    (``float32``, ``int32``). ``value`` may be given for any tensor; the lowering only reads it for
    tensors that are constant for this shape (Const outputs and what folds from shapes).
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    value: np.ndarray | None = field(default=None, compare=False, repr=False)
    format: str = "NCHW"
    """The layout MNN keeps the tensor in (``NC4HW4`` changes what a LayerNorm normalizes: the channels)."""


def qnn_dtype_name(dtype: str | np.dtype) -> str:
    """The QNN data type name a graph uses for an MNN element type (int64 and bool travel as int32)."""
    d = np.dtype(dtype)
    if d.kind == "f":
        return "float32"
    if d.kind in "iub":
        return "int32" if d != np.dtype(np.uint32) else "uint32"
    raise LoweringError(f"element type {d} has no QNN lowering")


def u32(v: int) -> ScalarParam:
    return ScalarParam(name="", dtype="uint32", value=int(v))


def i32(v: int) -> ScalarParam:
    return ScalarParam(name="", dtype="int32", value=int(v))


def f32(v: float) -> ScalarParam:
    return ScalarParam(name="", dtype="float32", value=float(v))


def b8(v: bool) -> ScalarParam:
    return ScalarParam(name="", dtype="bool", value=bool(v))


def tensor_param(values: np.ndarray | Sequence[int], dtype: str = "uint32") -> TensorParam:
    arr = np.asarray(values)
    return TensorParam(name="", dtype=dtype, dims=list(arr.shape), values=arr.ravel().tolist())


def digest(*parts: bytes) -> str:
    return sha256_bytes(*parts)[:8]


class LoweringContext:
    """Builds the tensors and nodes of one QNN graph from MNN ops."""

    def __init__(
        self,
        model: MnnModel,
        weights: WeightFile | None,
        tensor_info: Mapping[int, TensorMeta],
        constants: Mapping[int, np.ndarray],
        inputs: Sequence[int],
        outputs: Sequence[int],
        conv_weights: MutableMapping[str, ConvWeights | QuantizedWeight] | None = None,
        npu_weights: NpuWeights = DEFAULT_NPU_WEIGHTS,
    ) -> None:
        self.model = model
        self.weights = weights
        self.conv_weights = conv_weights
        """Decoded conv weights by op name, shared with other graphs of the plugin (None: decode each time)."""
        self.npu_weights = npu_weights
        """How conv weights are stored: ``float16``, or the model's codes where a QNN encoding keeps them."""
        self.weight_notes: list[WeightNote] = []
        self.fp16_copies: dict[tuple[str, tuple[int, ...]], str] = {}
        """fp16 casts of float32 tensors, by the tensor they view and their dims (one Cast feeds every reader)."""
        self.centered_copies: dict[tuple[str, tuple[int, ...], int], tuple[str, str]] = {}
        """fp16 tensors centered per block of channels and their means, by the tensor they view, dims and block."""
        self.folded_inputs: dict[tuple[str, tuple[int, ...], int, int], str] = {}
        """Centered tensors with their block means' levels appended (`block_folded`), by view, dims, block, width."""
        self.info = tensor_info
        self.constants = constants
        self.graph_inputs = list(inputs)
        self.graph_outputs = list(outputs)
        self.tensors: dict[str, QnnTensorDesc] = {}
        self.statics: dict[str, np.ndarray] = {}
        self.nodes: list[QnnNodeDesc] = []
        self.names: dict[int, str] = {}
        self.producers = model.producers()
        self.op: Op | None = None
        for t in self.graph_inputs:
            self._declare(t, TensorKind.APP_WRITE)

    # -- facts about MNN tensors ------------------------------------------------------------------
    def meta(self, t: int) -> TensorMeta:
        try:
            return self.info[t]
        except KeyError:
            raise self.error(f"no shape known for tensor {self.tname(t)!r} (#{t})") from None

    def shape(self, t: int) -> tuple[int, ...]:
        return tuple(int(d) for d in self.meta(t).shape)

    def dtype(self, t: int) -> str:
        return qnn_dtype_name(self.meta(t).dtype)

    def tname(self, t: int) -> str:
        return self.model.tensor_names[t] if 0 <= t < len(self.model.tensor_names) else f"#{t}"

    def is_const(self, t: int) -> bool:
        return t in self.constants

    def value(self, t: int) -> np.ndarray:
        """The constant value of tensor ``t`` (static inputs of ops: shapes, axes, indices, weights)."""
        if t not in self.constants:
            raise self.error(f"input {self.tname(t)!r} (#{t}) must be constant for this lowering but is not")
        return self.constants[t]

    def error(self, message: str) -> LoweringError:
        where = f"op {self.op.name!r} ({self.op.type}): " if self.op is not None else ""
        return LoweringError(where + message)

    # -- QNN tensors ------------------------------------------------------------------------------
    def _add(self, desc: QnnTensorDesc) -> str:
        if desc.name in self.tensors:
            raise self.error(f"QNN tensor {desc.name!r} defined twice")
        self.tensors[desc.name] = desc
        return desc.name

    def _declare(self, t: int, kind: TensorKind) -> str:
        name = f"t{t}"
        m = self.meta(t)
        # QNN has no rank-0 tensors (the HTP rejects them): a scalar travels as [1], same bytes
        dims = list(self.shape(t)) or [1]
        self._add(QnnTensorDesc(name=name, kind=kind, dims=dims, dtype=qnn_dtype_name(m.dtype)))
        self.names[t] = name
        return name

    def static(self, name: str, data: np.ndarray, dtype: str | None = None) -> str:
        """A STATIC tensor; one name always holds the same data (weight sharing relies on it). float16 data of a
        float32 tensor is kept as it is and stored so (the raw's ``storage`` type)."""
        dtype = dtype or qnn_dtype_name(data.dtype)
        data = np.asarray(data)
        if data.ndim == 0:
            data = data.reshape(1)
        storage = "float16" if data.dtype == np.float16 and dtype == "float32" else None
        desc = QnnTensorDesc(
            name=name, kind=TensorKind.STATIC, dims=list(data.shape), dtype=dtype, raw="", storage=storage
        )
        arr = np.ascontiguousarray(data, dtype=desc.raw_dtype.newbyteorder("="))
        if name in self.statics:
            old = self.statics[name]
            if old.shape != arr.shape or not np.array_equal(old, arr):
                raise self.error(f"static tensor {name!r} defined twice with different data")
            return name
        self.statics[name] = arr
        return self._add(desc.model_copy(update={"raw": raw_file_name(name)}))

    def quantized_static(self, name: str, qw: QuantizedWeight) -> str:
        """A quantized STATIC tensor (``sfixed8`` codes, their (scale, offset) rows beside them)."""
        quant = QuantDesc(
            encoding=qw.encoding,  # type: ignore[arg-type]
            bitwidth=qw.bitwidth,
            axis=qw.axis,
            block_size=qw.block_size,
            raw=raw_file_name(quant_key(name)),
        )
        desc = QnnTensorDesc(
            name=name, kind=TensorKind.STATIC, dims=list(qw.codes.shape), dtype="sfixed8", raw="", quant=quant
        )
        if name in self.statics:
            old_codes, old_params = self.statics[name], self.statics[quant_key(name)]
            if not (np.array_equal(old_codes, qw.codes) and np.array_equal(old_params, qw.params)):
                raise self.error(f"static tensor {name!r} defined twice with different data")
            return name
        self.statics[name] = qw.codes
        self.statics[quant_key(name)] = qw.params
        return self._add(desc.model_copy(update={"raw": raw_file_name(name)}))

    def fp16(self, src: str, dims: Sequence[int], viewed: str) -> str:
        """float32 tensor ``src`` (a view of ``viewed`` as ``dims``) cast to float16: one Cast for every reader of
        that view (q, k and v read one)."""
        key = (viewed, tuple(dims))
        if key not in self.fp16_copies:
            dst = self.temp("fp16", dims, "float16")
            self.node("Cast", [src], [dst], suffix="fp16")
            self.fp16_copies[key] = dst
        return self.fp16_copies[key]

    def block_centered(self, src16: str, dims: Sequence[int], viewed: str, block: int) -> tuple[str, str]:
        """fp16 tensor ``src16`` (``dims``, channel last; a view of ``viewed``) minus its mean over each ``block``
        channels, and those means (``dims[:-1] + [channels / block]``): computed once for every reader (q, k and v
        share them). One row: `ReduceMean` on a ``[.., blocks, block]`` view and a broadcast subtraction, no weights
        (decode reads every weight once per token). Several rows (prefill): two grouped fp16 convs, one block per
        group (`_centered_by_convs`)."""
        key = (viewed, tuple(dims), block)
        if key not in self.centered_copies:
            *rows, channels = dims
            if channels % block:
                raise self.error(f"{channels} channels do not split into blocks of {block}")
            count, blocks = int(np.prod(rows)), channels // block
            if count > 1 and blocks > 1:
                self.centered_copies[key] = self._centered_by_convs(src16, dims, block)
            else:
                grouped = self.reshape(src16, (1, count, blocks, block), "float16", f"blocks{block}")
                mean = self.temp(f"mean{block}", (1, count, blocks, 1), "float16")
                axes = {"axes": tensor_param([3]), "keep_dims": b8(True)}
                self.node("ReduceMean", [grouped], [mean], axes, suffix=f"mean{block}")
                centered = self.temp(f"centered{block}", (1, count, blocks, block), "float16")
                self.node("ElementWiseSubtract", [grouped, mean], [centered], suffix=f"center{block}")
                self.centered_copies[key] = (
                    self.reshape(centered, dims, "float16", f"centered{block}_nhwc"),
                    self.reshape(mean, (*rows, blocks), "float16", f"mean{block}_nhwc"),
                )
        return self.centered_copies[key]

    def _centered_by_convs(self, src16: str, dims: Sequence[int], block: int) -> tuple[str, str]:
        """`block_centered` by two convs with one group per block: one subtracting the block's mean from each of
        its channels (weights 1 - 1/block on the diagonal, -1/block elsewhere), one taking the mean (weights
        1/block); both read ``src16``, nothing is broadcast. QNN finalizes a Qwen3-1.7B layer's 128-row graph in
        half the time of `ReduceMean` and a broadcast subtraction, and the centered values come out of the conv's
        accumulator rounded once, which keeps more of what they cancel (lowering README: the error)."""
        *rows, channels = dims
        blocks = channels // block
        conv = {
            "stride": tensor_param([1, 1]),
            "pad_amount": tensor_param(np.zeros((2, 2), np.uint32)),
            "group": u32(blocks),
        }
        center = np.eye(block) - 1.0 / block  # [in, out] of one group; the groups are laid side by side
        weights = {
            "center": np.tile(center, (1, blocks)).astype(np.float16).reshape(1, 1, block, channels),
            "mean": np.full((1, 1, block, blocks), 1.0 / block, np.float16),
        }
        outs: dict[str, str] = {}
        for what, w in weights.items():
            name = f"block_{what}.{block}x{w.shape[3]}"
            bias = self.static(f"{name}.bias", np.zeros(w.shape[3], np.float16), "float16")
            outs[what] = self.temp(f"{what}{block}", (*rows, w.shape[3]), "float16")
            inputs = [src16, self.static(name, w, "float16"), bias]
            self.node("Conv2d", inputs, [outs[what]], conv, suffix=f"{what}{block}")
        return outs["center"], outs["mean"]

    def block_folded(self, src16: str, dims: Sequence[int], viewed: str, block: int, folded: int) -> str:
        """`block_centered` ``src16`` with its block means times `sum_levels` appended on the channel axis, then
        zeros up to ``folded`` extra channels: the input of a conv whose block sums are folded into its codes
        (`fold_block_sums`); built once for every reader."""
        key = (viewed, tuple(dims), block, folded)
        if key not in self.folded_inputs:
            centered, mean = self.block_centered(src16, dims, viewed, block)
            *rows, channels = dims
            count, blocks = int(np.prod(rows)), channels // block
            per_mean, zeros = folded_layout(blocks, block)
            if blocks * per_mean + zeros != folded:
                raise self.error(f"{folded} folded inputs do not match {blocks} block means of {block} inputs")
            grouped = self.reshape(mean, (1, count, blocks, 1), "float16", "means")
            scaled = self.temp("levels", (1, count, blocks, per_mean), "float16")
            factors = self.static(f"sum_levels.{per_mean}", sum_levels(per_mean).reshape(1, 1, 1, -1), "float16")
            self.node("ElementWiseMultiply", [grouped, factors], [scaled], suffix="levels")
            parts = [centered, self.reshape(scaled, (*rows, blocks * per_mean), "float16", "levels_nhwc")]
            if zeros:  # blocks that do not divide a whole number of blocks of inputs
                pad = np.zeros((*rows, zeros), np.float16)
                parts.append(self.static("folded_pad." + "x".join(map(str, pad.shape)), pad, "float16"))
            joined = self.temp("folded", (*rows, channels + folded), "float16")
            self.node("Concat", parts, [joined], {"axis": u32(len(dims) - 1)}, suffix="folded")
            self.folded_inputs[key] = joined
        return self.folded_inputs[key]

    def const_static(self, t: int, shape: Sequence[int] | None = None, dtype: str | None = None) -> str:
        """Constant tensor ``t`` as a STATIC tensor (optionally reshaped), named from its producer op."""
        value = np.asarray(self.value(t))
        dtype = dtype or self.dtype(t)
        if shape is not None:
            value = value.reshape(tuple(shape))
        producer = self.producers.get(t)
        base = self.model.ops[producer].name if producer is not None else f"const{t}"
        if producer is None or self.model.ops[producer].type not in CONST_OP_TYPES:
            # folded per shape: the value may differ between the decode and prefill graph
            base += "." + digest(str(value.shape).encode(), np.ascontiguousarray(value).tobytes())
        if shape is not None and tuple(value.shape) != self.shape(t):
            base += ".r" + "x".join(str(d) for d in value.shape)
        if dtype != qnn_dtype_name(value.dtype):
            base += "." + dtype
        return self.static(base, value.astype(np.dtype(self._np(dtype))), dtype)

    @staticmethod
    def _np(dtype: str) -> str:
        return {"float32": "float32", "int32": "int32", "uint32": "uint32", "bool": "bool"}[dtype]

    def input(self, t: int) -> str:
        """The QNN tensor feeding MNN tensor ``t`` into a node."""
        if t in self.names:
            return self.names[t]
        if self.is_const(t):
            return self.const_static(t)
        raise self.error(
            f"input {self.tname(t)!r} (#{t}) is neither a graph input, produced earlier in the subgraph, nor constant"
        )

    def output(self, t: int) -> str:
        """The QNN tensor a node writes MNN tensor ``t`` into (graph output or NATIVE)."""
        if t in self.names:
            raise self.error(f"tensor {self.tname(t)!r} (#{t}) is produced twice")
        kind = TensorKind.APP_READ if t in self.graph_outputs else TensorKind.NATIVE
        return self._declare(t, kind)

    def temp(self, suffix: str, dims: Sequence[int], dtype: str = "float32") -> str:
        """An intermediate NATIVE tensor belonging to the current op."""
        assert self.op is not None
        base = f"t{self.op.outputs[0]}" if self.op.outputs else self.op.name
        desc = QnnTensorDesc(name=f"{base}.{suffix}", kind=TensorKind.NATIVE, dims=list(dims) or [1], dtype=dtype)
        return self._add(desc)

    # -- nodes ------------------------------------------------------------------------------------
    def node(
        self,
        qnn_type: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        params: Mapping[str, ScalarParam | TensorParam] | None = None,
        suffix: str = "",
    ) -> None:
        """Emit one QNN node for the current op. Node names are ``<MNN op name>[#suffix]``; a node with
        tensor params gets a hash of them appended, because QNN turns tensor params into static tensors
        named after the node and a shared weight name must never hold two different values."""
        assert self.op is not None
        plist: list[Param] = [p.model_copy(update={"name": k}) for k, p in (params or {}).items()]
        name = self.op.name + (f"#{suffix}" if suffix else "")
        tensor_params = [p for p in plist if isinstance(p, TensorParam)]
        if tensor_params:
            name += "@" + digest(*(p.model_dump_json().encode() for p in tensor_params))
        self.nodes.append(
            QnnNodeDesc(
                name=name,
                type=qnn_type,
                inputs=list(inputs),
                outputs=list(outputs),
                params=plist,
                mnn_op=self.op.name,
            )
        )

    def reshape(self, src: str, dims: Sequence[int], dtype: str, suffix: str) -> str:
        """``src`` reshaped to ``dims`` through a new NATIVE tensor (returns its name)."""
        dst = self.temp(suffix, dims, dtype)
        self.node("Reshape", [src], [dst], suffix=suffix)
        return dst

    def unused_inputs(self) -> list[str]:
        used = {n for node in self.nodes for n in node.inputs}
        return [self.names[t] for t in self.graph_inputs if self.names[t] not in used]
