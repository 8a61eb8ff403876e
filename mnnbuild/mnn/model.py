"""Object model of an MNN ``.mnn`` file: load into Python objects, mutate, save.

The flatbuffer is decoded with the generated object API (``_generated/mnn_fb.py``); the top level
(the ``Net`` table and its ops) is turned into the dataclasses below, while op parameters stay the
generated ``*T`` objects (``Convolution2DT``, ``LayerNormT`` ...): their attributes are MNN's field
names in flatc's lowerCamelCase (``get_field`` accepts MNN's spelling), strings are ``str``, scalar
vectors are numpy arrays. Everything the file holds is kept,
so ``save_model(load_model(p), q)`` writes an equivalent model.
"""

from __future__ import annotations

import heapq
import logging
import os
import stat
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import flatbuffers
import numpy as np

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.mnn._generated import enums
from mnnbuild.mnn._generated import mnn_fb as fb
from mnnbuild.mnn._generated.vector_types import VECTOR_DTYPES

log = logging.getLogger(__name__)


def _enum_members(enum_cls: type) -> dict[str, int]:
    return {k: v for k, v in vars(enum_cls).items() if not k.startswith("_") and isinstance(v, int)}


# From the generated enums, not the generated classes: touching ``fb`` at import would run all of mnn_fb.
OP_TYPES: dict[str, int] = enums.OP_TYPES
"""OpType name -> value, as in MNN's schema."""
OP_TYPE_NAMES: dict[int, str] = {v: k for k, v in OP_TYPES.items()}
PARAM_TYPES: dict[str, int] = enums.PARAM_TYPES
"""OpParameter union member name -> tag (``NONE`` is 0)."""
PARAM_TYPE_NAMES: dict[int, str] = {v: k for k, v in PARAM_TYPES.items()}
DATA_TYPES: dict[str, int] = enums.DATA_TYPES
DATA_FORMATS: dict[str, int] = enums.DATA_FORMATS


def enum_name(enum_cls: type, value: int) -> str:
    """Name of ``value`` in a generated enum class (e.g. ``enum_name(schema.BinaryOpOperation, 2)``)."""
    for k, v in _enum_members(enum_cls).items():
        if v == value:
            return k
    return str(value)


def _field_key(name: str) -> str:
    return name.replace("_", "").lower()


def get_field(obj: Any, mnn_name: str) -> Any:
    """Field of a generated parameter object by its name in MNN's schema / JSON dumps.

    flatc's Python object API renames fields to lowerCamelCase (``useRMSNorm`` -> ``useRmsnorm``,
    ``kv_cache`` -> ``kvCache``, ``T`` -> ``t``); this looks the field up either way."""
    if hasattr(obj, mnn_name):
        return getattr(obj, mnn_name)
    key = _field_key(mnn_name)
    for attr, value in vars(obj).items():
        if _field_key(attr) == key:
            return value
    raise AttributeError(f"{type(obj).__name__} has no field {mnn_name!r}")


def _enum_value(enum_cls: type, value: int | str, what: str) -> int:
    if isinstance(value, int):
        return value
    members = _enum_members(enum_cls)
    if value in members:
        return members[value]
    raise ValueError(f"unknown {what} {value!r}; expected one of {sorted(members)}")


@dataclass(eq=False)
class Op:
    """One op of the graph.

    ``type`` is the OpType name (``"Convolution"``, ``"Plugin"`` ...); ``inputs``/``outputs`` are tensor
    indexes into ``MnnModel.tensor_names``; ``main`` is the parameter object (a generated ``*T``
    instance such as ``Convolution2DT``) or None, and ``param_type`` names its union member.
    """

    type: str
    name: str = ""
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    main: Any = None
    default_dimension_format: int = DATA_FORMATS["NHWC"]
    external_path: str | None = None

    @property
    def param_type(self) -> str | None:
        """OpParameter member of ``main`` (its class name without the trailing ``T``), None without one."""
        if self.main is None:
            return None
        return type(self.main).__name__[:-1]

    def param(self, expected: str) -> Any:
        """``main``, checked to be the OpParameter member ``expected`` (e.g. ``op.param("LayerNorm")``)."""
        if self.param_type != expected:
            raise MNNFormatError(
                f"op {self.name!r} ({self.type}): expected parameter {expected}, found {self.param_type}"
            )
        return self.main


@dataclass(eq=False)
class MnnModel:
    """A whole ``Net``. Only ``ops``, ``tensor_names`` and ``output_names`` matter to most callers; the
    other fields are carried so that a save writes back everything that was loaded."""

    ops: list[Op]
    tensor_names: list[str]
    output_names: list[str] = field(default_factory=list)
    extra_info: Any = None  # ExtraInfoT or None
    extra_tensor_describe: list[Any] = field(default_factory=list)  # TensorDescribeT, by tensor index
    biz_code: str | None = None
    mnn_uuid: str | None = None
    source_type: int = enums.NET_SOURCES["CAFFE"]
    prefer_forward_type: int = enums.FORWARD_TYPES["CPU"]
    usage: int = enums.USAGES["INFERENCE"]
    tensor_number: int = 0
    subgraphs: list[Any] = field(default_factory=list)  # SubGraphProtoT, own tensor index spaces
    path: Path | None = field(default=None, compare=False)
    """Where the model was loaded from (not saved)."""

    # ---- queries -------------------------------------------------------------------------------
    def ops_of_type(self, *types: str) -> list[Op]:
        return [op for op in self.ops if op.type in types]

    def op_by_name(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"no op named {name!r}")

    def tensor_index(self, name: str) -> int:
        try:
            return self.tensor_names.index(name)
        except ValueError:
            raise KeyError(f"no tensor named {name!r}") from None

    @property
    def input_indexes(self) -> list[int]:
        """Tensor indexes produced by ``Input`` ops, in op order."""
        return [t for op in self.ops if op.type == "Input" for t in op.outputs]

    @property
    def input_names(self) -> list[str]:
        return [self.tensor_names[t] for t in self.input_indexes]

    @property
    def input_dims(self) -> dict[str, list[int]]:
        """Each graph input's declared dims (``-1``: any size), by name, in op order."""
        dims = {}
        for op in self.ops_of_type("Input"):
            declared = op.main.dims if op.main is not None and op.main.dims is not None else []
            dims.update((self.tensor_names[t], [int(d) for d in declared]) for t in op.outputs)
        return dims

    @property
    def output_indexes(self) -> list[int]:
        return [self.tensor_index(n) for n in self.output_names]

    def producers(self) -> dict[int, int]:
        """Tensor index -> index of the (last) op that writes it."""
        return {t: i for i, op in enumerate(self.ops) for t in op.outputs}

    def consumers(self) -> dict[int, list[int]]:
        """Tensor index -> indexes of the ops that read it."""
        result: dict[int, list[int]] = {}
        for i, op in enumerate(self.ops):
            for t in op.inputs:
                result.setdefault(t, []).append(i)
        return result

    def op_type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.type] = counts.get(op.type, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    # ---- mutations -----------------------------------------------------------------------------
    def add_tensor(self, name: str) -> int:
        """Append a tensor name and return its index."""
        self.tensor_names.append(name)
        return len(self.tensor_names) - 1

    def add_op(self, op: Op, index: int | None = None) -> Op:
        """Insert ``op`` at ``index`` (default: append). Its tensor indexes must exist."""
        n = len(self.tensor_names)
        bad = [t for t in (*op.inputs, *op.outputs) if not 0 <= t < n]
        if bad:
            raise ValueError(f"op {op.name!r} refers to tensors {bad}, model has {n}")
        if op.type not in OP_TYPES:
            raise ValueError(f"op {op.name!r}: unknown op type {op.type!r}")
        self.ops.insert(len(self.ops) if index is None else index, op)
        return op

    def delete_ops(self, which: Iterable[int] | Callable[[Op], bool]) -> list[Op]:
        """Remove ops given by index or by predicate; returns the removed ops. Tensors stay until
        ``reindex_tensors``."""
        if callable(which):
            doomed = {i for i, op in enumerate(self.ops) if which(op)}
        else:
            doomed = set(which)
        removed = [op for i, op in enumerate(self.ops) if i in doomed]
        self.ops = [op for i, op in enumerate(self.ops) if i not in doomed]
        return removed

    def reindex_tensors(self) -> dict[int, int]:
        """Drop tensors no op reads or writes, renumber the rest keeping their order, and rewrite every
        reference (op inputs/outputs, ``extra_tensor_describe``). Returns old index -> new index."""
        used = sorted({t for op in self.ops for t in (*op.inputs, *op.outputs)})
        mapping = {old: new for new, old in enumerate(used)}
        for op in self.ops:
            op.inputs = [mapping[t] for t in op.inputs]
            op.outputs = [mapping[t] for t in op.outputs]
        self.tensor_names = [self.tensor_names[old] for old in used]
        kept = []
        for desc in self.extra_tensor_describe:
            if desc.index in mapping:
                desc.index = mapping[desc.index]
                kept.append(desc)
        self.extra_tensor_describe = kept
        if self.tensor_number:
            self.tensor_number = len(self.tensor_names)
        dropped = [n for n in self.output_names if n not in set(self.tensor_names)]
        if dropped:
            raise MNNFormatError(f"reindex dropped the model outputs {dropped}: no op produces them")
        return mapping

    def topological_sort(self) -> None:
        """Order ops so every op comes after the producers of its inputs; ties keep the current order.
        Tensors no op produces (graph inputs written by the caller) count as ready."""
        producers: dict[int, list[int]] = {}
        for i, op in enumerate(self.ops):
            for t in op.outputs:
                producers.setdefault(t, []).append(i)
        deps: list[set[int]] = []
        for i, op in enumerate(self.ops):
            deps.append({p for t in op.inputs for p in producers.get(t, ()) if p != i})
        users: dict[int, list[int]] = {}
        for i, ds in enumerate(deps):
            for d in ds:
                users.setdefault(d, []).append(i)
        pending = [len(ds) for ds in deps]
        ready = [i for i, n in enumerate(pending) if n == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for u in users.get(i, ()):
                pending[u] -= 1
                if pending[u] == 0:
                    heapq.heappush(ready, u)
        if len(order) != len(self.ops):
            stuck = [self.ops[i].name for i, n in enumerate(pending) if n > 0][:5]
            raise MNNFormatError(f"graph has a cycle; ops never ready include {stuck}")
        self.ops = [self.ops[i] for i in order]


# ---- Plugin ops ------------------------------------------------------------------------------------

AttrValue: TypeAlias = Any  # str | int | float | bool | Sequence[str] | Sequence[int] | BlobT


def make_blob(dims: Sequence[int], data_type: int | str = "DT_FLOAT", data_format: int | str = "NCHW") -> Any:
    """A ``BlobT`` describing a tensor (shape, data type, layout) without data, e.g. for ``o_*`` attrs."""
    blob = fb.BlobT()
    blob.dims = np.asarray(list(dims), dtype="<i4")
    blob.dataType = _enum_value(fb.DataType, data_type, "data type")
    blob.dataFormat = _enum_value(fb.MNN_DATA_FORMAT, data_format, "data format")
    return blob


def blob_format(blob: Any) -> str:
    """The MNN data format name (``NCHW``, ``NHWC``, ``NC4HW4``) a Blob (a plugin's ``o_*`` attribute) names."""
    return enum_name(fb.MNN_DATA_FORMAT, int(blob.dataFormat))


def make_attribute(key: str, value: AttrValue) -> Any:
    """One ``AttributeT``: str -> ``s``; list of str -> ``list.s``; list of int -> ``list.i``;
    ``BlobT`` -> ``tensor``; bool -> ``b``; int -> ``i``; float -> ``f``."""
    attr = fb.AttributeT()
    attr.key = key
    if isinstance(value, str):
        attr.s = value
    elif isinstance(value, bool):
        attr.b = value
    elif isinstance(value, int):
        attr.i = value
    elif isinstance(value, float):
        attr.f = value
    elif isinstance(value, fb.BlobT):
        attr.tensor = value
    elif isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        lst = fb.ListValueT()
        if items and all(isinstance(v, str) for v in items):
            lst.s = items
        elif all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
            lst.i = np.asarray(items, dtype="<i4")
        else:
            raise ValueError(f"attribute {key!r}: a list must hold only str or only int")
        attr.list = lst
    else:
        raise ValueError(f"attribute {key!r}: unsupported value type {type(value).__name__}")
    return attr


def make_plugin_op(
    name: str,
    inputs: Sequence[int],
    outputs: Sequence[int],
    attrs: Mapping[str, AttrValue],
    plugin_type: str = "QNN",
) -> Op:
    """A ``Plugin`` op (``Plugin.type = plugin_type``) with attributes made by ``make_attribute``.
    Attributes are stored sorted by key, as flatbuffers' keyed-vector lookup expects."""
    plugin = fb.PluginT()
    plugin.type = plugin_type
    plugin.attr = [make_attribute(k, attrs[k]) for k in sorted(attrs)]
    return Op(type="Plugin", name=name, inputs=list(inputs), outputs=list(outputs), main=plugin)


def attribute_value(attr: Any) -> Any:
    """Python value of an ``AttributeT`` (inverse of ``make_attribute``)."""
    if attr.tensor is not None:
        return attr.tensor
    if attr.list is not None:
        lst = attr.list
        for name in ("s", "i", "f", "b", "type"):
            values = getattr(lst, name)
            if values is not None and len(values):
                return [v.item() if isinstance(v, np.generic) else v for v in values]
        return []
    if attr.s is not None:
        return attr.s
    if attr.func is not None:
        return attr.func
    if attr.f:
        return attr.f
    if attr.b:
        return attr.b
    return attr.i


def plugin_attributes(op: Op) -> dict[str, Any]:
    """Attributes of a Plugin (or Extra) op as ``{key: value}``."""
    main = op.main
    if main is None or not hasattr(main, "attr"):
        raise MNNFormatError(f"op {op.name!r} ({op.type}) has no attributes")
    return {a.key: attribute_value(a) for a in (main.attr or [])}


# ---- load ----------------------------------------------------------------------------------------


class _StrictBytes(bytes):
    """bytes whose slices fail past the end: flatbuffers reads strings by slicing, which would
    otherwise silently return a short string from a truncated file. Nor may the strings read add up to more than
    the buffer: MNN writes each string once, so more means many offsets naming one string (a file of a few MB
    decoding to GBs of copies)."""

    left = 0

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            if key.stop is not None and key.stop > len(self):
                raise IndexError(f"read of bytes [{key.start}, {key.stop}) past end of data ({len(self)})")
            self.left -= len(range(*key.indices(len(self))))
            if self.left < 0:
                raise ValueError(f"its strings add up to more than its {len(self)} bytes: offsets share strings")
        return super().__getitem__(key)


def _vector_bytes(net: Any) -> int:
    """The bytes the vectors of a decoded flatbuffer take in it, at least (a numeric vector its elements, a vector
    of tables or strings 4 bytes per offset): no more than the buffer unless vectors are shared between tables."""
    total = 0
    for obj in _walk_t(net):
        for value in vars(obj).values():
            if isinstance(value, np.ndarray):
                total += value.nbytes
            elif isinstance(value, list):
                total += 4 * len(value)
    return total


_READ_ERRORS = (struct.error, IndexError, ValueError, TypeError, OverflowError, UnicodeDecodeError)


FLATBUFFER_MAX_BYTES = (1 << 31) - 1
"""No flatbuffer is larger: its offsets are signed 32-bit (``FLATBUFFERS_MAX_BUFFER_SIZE``)."""


def _check_root(read: Callable[[int, int], bytes], size: int, where: str) -> None:
    """The flatbuffer header of a ``size``-byte model, read through ``read(offset, n)``: a file that cannot be an
    MNN model is refused from a few bytes, before it is read whole."""
    if size < 16:
        raise MNNFormatError(f"{where}: {size} bytes is too small for an MNN model (a flatbuffer Net)")
    if size > FLATBUFFER_MAX_BYTES:
        raise MNNFormatError(
            f"{where}: {size} bytes is more than any flatbuffer holds ({FLATBUFFER_MAX_BYTES}): not an MNN model"
        )
    (root,) = struct.unpack("<I", read(0, 4))
    if not 4 <= root <= size - 4:
        raise MNNFormatError(f"{where}: not an MNN model: root table offset {root} is outside the file ({size} bytes)")
    (soff,) = struct.unpack("<i", read(root, 4))
    vtable = root - soff
    if not 0 <= vtable <= size - 4:
        raise MNNFormatError(f"{where}: not an MNN model: vtable offset {vtable} outside the file ({size})")
    vt_size, table_size = struct.unpack("<HH", read(vtable, 4))
    if vt_size < 4 or vt_size % 2 or vtable + vt_size > size or root + table_size > size:
        raise MNNFormatError(
            f"{where}: not an MNN model or truncated: root vtable (size {vt_size}, table {table_size}) "
            f"does not fit the file ({size} bytes)"
        )
    if size % 4:
        # the flatbuffers builder pads a finished buffer to a multiple of its alignment (>= 4); checked after the
        # header, which tells a cut model (its header intact) from a file that is no model at all
        raise MNNFormatError(f"{where}: truncated MNN model: {size} bytes is not a multiple of 4")


def _decode_strings(obj: Any) -> Any:
    """Turn the bytes the generated code returns for strings into str, recursively through T objects."""
    if isinstance(obj, bytes):
        return obj.decode("utf-8")
    if isinstance(obj, list):
        return [_decode_strings(v) for v in obj]
    if type(obj).__module__ == fb.__name__:
        for key, value in vars(obj).items():
            if isinstance(value, (bytes, list)) or type(value).__module__ == fb.__name__:
                setattr(obj, key, _decode_strings(value))
    return obj


def _op_from_t(op_t: Any, index: int, where: str) -> Op:
    if op_t.type not in OP_TYPE_NAMES:
        raise MNNFormatError(f"{where}: op #{index} has unknown OpType value {op_t.type}")
    if op_t.mainType not in PARAM_TYPE_NAMES:
        raise MNNFormatError(f"{where}: op #{index} has unknown OpParameter tag {op_t.mainType}")
    if op_t.mainType != 0 and op_t.main is None:
        raise MNNFormatError(f"{where}: op #{index} names parameter tag {op_t.mainType} but has none")
    return Op(
        type=OP_TYPE_NAMES[op_t.type],
        name=op_t.name or "",
        inputs=[int(t) for t in (op_t.inputIndexes if op_t.inputIndexes is not None else [])],
        outputs=[int(t) for t in (op_t.outputIndexes if op_t.outputIndexes is not None else [])],
        main=op_t.main,
        default_dimension_format=op_t.defaultDimentionFormat,
        external_path=op_t.externalPath,
    )


def parse_model(data: bytes, where: str = "<bytes>", check_outputs: bool = True) -> MnnModel:
    """Decode a ``.mnn`` flatbuffer held in memory (``where`` names it in errors). ``check_outputs=False``
    accepts output names that name no tensor (MNN's ``compilefornpu`` leaves such names behind)."""
    _check_root(lambda offset, n: data[offset : offset + n], len(data), where)
    buf = _StrictBytes(data)
    buf.left = len(buf)
    try:
        (root,) = struct.unpack_from("<I", buf, 0)
        net = fb.NetT.InitFromBuf(buf, root)
        _decode_strings(net)
    except _READ_ERRORS as exc:
        raise MNNFormatError(
            f"{where}: truncated or not an MNN model: decoding the Net flatbuffer failed ({exc})"
        ) from exc
    if (vectors := _vector_bytes(net)) > len(data):  # checked before any vector is copied
        raise MNNFormatError(
            f"{where}: not an MNN model: its vectors take {vectors} bytes of its {len(data)}: offsets share them"
        )
    op_ts = net.oplists or []
    if not op_ts:
        raise MNNFormatError(f"{where}: not an MNN model: the Net has no ops")
    tensor_names = list(net.tensorName or [])
    if not tensor_names:
        raise MNNFormatError(f"{where}: not an MNN model: the Net has no tensor names")
    ops = [_op_from_t(op_t, i, where) for i, op_t in enumerate(op_ts)]
    n = len(tensor_names)
    for i, op in enumerate(ops):
        bad = [t for t in (*op.inputs, *op.outputs) if not 0 <= t < n]
        if bad:
            raise MNNFormatError(
                f"{where}: op #{i} {op.name!r} ({op.type}) refers to tensors {bad[:4]}, "
                f"expected indexes below the tensor count {n}"
            )
    model = MnnModel(
        ops=ops,
        tensor_names=tensor_names,
        output_names=list(net.outputName or []),
        extra_info=net.extraInfo,
        extra_tensor_describe=list(net.extraTensorDescribe or []),
        biz_code=net.bizCode,
        mnn_uuid=net.mnnUuid,
        source_type=net.sourceType,
        prefer_forward_type=net.preferForwardType,
        usage=net.usage,
        tensor_number=net.tensorNumber,
        subgraphs=list(net.subgraphs or []),
    )
    unknown_outputs = [name for name in model.output_names if name not in set(tensor_names)]
    if unknown_outputs and check_outputs:
        raise MNNFormatError(f"{where}: output names {unknown_outputs[:4]} are not tensor names")
    return model


_FILE_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}  # fmt: skip


def _read_model_file(path: Path) -> bytes:
    """A model file's bytes, once it is known to be a regular file whose flatbuffer header fits its size: a FIFO
    (opened without waiting for a writer), a device such as ``/dev/zero`` or a huge sparse file is refused
    without being read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise MNNFormatError(
            f"{path}: is {_FILE_KINDS.get(stat.S_IFMT(mode), 'not a regular file')}, not an MNN model file"
        )
    with os.fdopen(fd, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size

        def read(offset: int, n: int) -> bytes:
            fh.seek(offset)
            return fh.read(n)

        _check_root(read, size, str(path))
        fh.seek(0)
        return fh.read()


def load_model(path: str | os.PathLike[str], check_outputs: bool = True) -> MnnModel:
    """Read a ``.mnn`` file (only that file: the external weight file is not opened)."""
    path = Path(path)
    try:
        data = _read_model_file(path)
    except OSError as exc:
        raise MNNFormatError(f"{path}: cannot read MNN model: {exc}") from exc
    model = parse_model(data, str(path), check_outputs)
    model.path = path
    log.debug("loaded %s: %d ops, %d tensors", path, len(model.ops), len(model.tensor_names))
    return model


# ---- save ----------------------------------------------------------------------------------------


def _walk_t(obj: Any) -> Iterator[Any]:
    """Every generated T object reachable from ``obj`` (depth first)."""
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, list):
            stack.extend(cur)
        elif type(cur).__module__ == fb.__name__:
            yield cur
            for value in vars(cur).values():
                if isinstance(value, list) or type(value).__module__ == fb.__name__:
                    stack.append(value)


def _coerce_vectors(root: Any) -> None:
    """Give every scalar vector the dtype its field has in the schema: the generated ``Pack`` writes
    a numpy array's bytes as they are, so an int64 array in an ``[int]`` field would corrupt the file."""
    for obj in _walk_t(root):
        for attr, dtype in VECTOR_DTYPES.get(type(obj).__name__, {}).items():
            value = getattr(obj, attr)
            if value is not None and not (isinstance(value, np.ndarray) and value.dtype == np.dtype(dtype)):
                setattr(obj, attr, np.ascontiguousarray(np.asarray(value, dtype=dtype).reshape(-1)))


def _op_to_t(op: Op) -> Any:
    if op.type not in OP_TYPES:
        raise MNNFormatError(f"op {op.name!r}: unknown op type {op.type!r}")
    op_t = fb.OpT()
    op_t.type = OP_TYPES[op.type]
    op_t.name = op.name or None
    # empty vectors are left out, as MNN's own (C++ object API) writer does
    op_t.inputIndexes = np.asarray(op.inputs, dtype="<i4") if op.inputs else None
    op_t.outputIndexes = np.asarray(op.outputs, dtype="<i4") if op.outputs else None
    param = op.param_type
    if param is not None and param not in PARAM_TYPES:
        raise MNNFormatError(f"op {op.name!r}: {type(op.main).__name__} is not an OpParameter member")
    op_t.mainType = PARAM_TYPES[param] if param is not None else 0
    op_t.main = op.main
    op_t.defaultDimentionFormat = op.default_dimension_format
    op_t.externalPath = op.external_path
    return op_t


def serialize_model(model: MnnModel) -> bytes:
    """The ``.mnn`` bytes of ``model``."""
    net = fb.NetT()
    net.oplists = [_op_to_t(op) for op in model.ops]
    net.tensorName = list(model.tensor_names)
    net.outputName = list(model.output_names) if model.output_names else None
    net.extraInfo = model.extra_info
    net.extraTensorDescribe = list(model.extra_tensor_describe) or None
    net.bizCode = model.biz_code
    net.mnnUuid = model.mnn_uuid
    net.sourceType = model.source_type
    net.preferForwardType = model.prefer_forward_type
    net.usage = model.usage
    net.tensorNumber = model.tensor_number
    net.subgraphs = list(model.subgraphs) or None
    _coerce_vectors(net)
    builder = flatbuffers.Builder(1 << 16)
    builder.ForceDefaults(True)  # MNN's converter writes default-valued scalars too; match its files
    builder.Finish(net.Pack(builder))
    return bytes(builder.Output())


def save_model(model: MnnModel, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` to ``path`` atomically (a temp file in the same folder, then ``os.replace``)."""
    path = Path(path)
    data = serialize_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a model file is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.debug("wrote %s (%d bytes, %d ops)", path, len(data), len(model.ops))
    return path
