"""Reading a finished bundle (``config_qnn.json`` + ``qnn/llm.mnn``) and validating its QNN plugin ops.

Only files a phone receives are read; nothing from the build's intermediate directories.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import numpy as np

from mnnbuild.base.errors import MNNFormatError, UnsafePathError
from mnnbuild.base.fsutil import confined, parse_json
from mnnbuild.mnn import (
    DATA_TYPES,
    MnnModel,
    WeightRange,
    embedding_info,
    enum_name,
    external_ranges,
    load_model,
    plugin_attributes,
    schema,
)
from mnnbuild.mnn.llm import (
    DEFAULT_MODEL,
    DEFAULT_TOKENIZER,
    DEFAULT_WEIGHT,
    DRAFT_LENGTH_FIELD,
    EAGLE,
    EAGLE_FILE_FIELDS,
    EAGLE_GRAPH_IO,
    ENGINE_RUN_FIELDS,
    SPECULATIVE_TYPE,
    attention_window,
    draft_length,
    read_draft_map,
)
from mnnbuild_runtime.chunks import Block, block_sizes, prefill_blocks
from mnnbuild_runtime.errors import BundleError
from mnnbuild_runtime.hashes import read_stamped

log = logging.getLogger(__name__)

CONFIG_FILE = "config_qnn.json"
PLUGIN_TYPE = "QNN"

#: MNN DataType -> numpy dtype, for the types a plugin output may carry.
MNN_NUMPY_DTYPES: dict[int, np.dtype] = {
    DATA_TYPES["DT_FLOAT"]: np.dtype(np.float32),
    DATA_TYPES["DT_INT32"]: np.dtype(np.int32),
    DATA_TYPES["DT_INT64"]: np.dtype(np.int64),
    DATA_TYPES["DT_HALF"]: np.dtype(np.float16),
    DATA_TYPES["DT_UINT8"]: np.dtype(np.uint8),
    DATA_TYPES["DT_INT8"]: np.dtype(np.int8),
    DATA_TYPES["DT_INT16"]: np.dtype(np.int16),
}


@dataclass(frozen=True)
class OutputDesc:
    """One ``o_<shape>_<output>`` attribute: what the plugin's output looks like for one shape."""

    dims: tuple[int, ...]
    data_type: int  # MNN DataType
    data_format: int  # MNN_DATA_FORMAT

    @property
    def dtype(self) -> np.dtype:
        return MNN_NUMPY_DTYPES[self.data_type]

    @property
    def format_name(self) -> str:
        return enum_name(schema.MNN_DATA_FORMAT, self.data_format)


@dataclass(frozen=True)
class PluginSpec:
    """A ``Plugin(type="QNN")`` op of ``qnn/llm.mnn`` with its attributes decoded and checked.

    ``input_tensors``/``output_tensors`` are the MNN tensor names the op reads and writes;
    ``qnn_inputs``/``qnn_outputs`` the QNN tensor names (``t<index>``) bound to them, in the same order.
    Shape index ``s`` runs graph ``graph_names[s]`` and produces ``outputs[s]``.
    """

    name: str
    op_index: int
    path: str
    file: Path
    input_tensors: tuple[str, ...]
    output_tensors: tuple[str, ...]
    qnn_inputs: tuple[str, ...]
    qnn_outputs: tuple[str, ...]
    graph_names: tuple[str, ...]
    all_input_shape: tuple[int, ...]
    outputs: tuple[tuple[OutputDesc, ...], ...]
    offset: int = 0
    size: int = 0  # 0: the whole file
    model_dir: Path | None = None
    """The bundle's model dir ``path`` belongs to: the file is checked again at every read (`bundle_path`)."""

    @property
    def num_shapes(self) -> int:
        return len(self.graph_names)

    def where(self) -> str:
        return f"plugin {self.name!r} ({self.path})"

    def input_shapes(self, ranks: tuple[int, ...] | list[int]) -> list[list[tuple[int, ...]]]:
        """``allInputShape`` split per shape index and input, given each input's rank."""
        per_shape = sum(ranks)
        if per_shape == 0:
            return [[() for _ in ranks] for _ in range(self.num_shapes)]
        flat = self.all_input_shape
        result = []
        for s in range(len(flat) // per_shape):
            at, dims = s * per_shape, []
            for r in ranks:
                dims.append(tuple(flat[at : at + r]))
                at += r
            result.append(dims)
        return result

    def read_binary(self) -> bytes:
        """The bytes of this plugin's context binary (honouring the ``offset``/``size`` attributes)."""
        return self.read_binary_stamped()[0]

    def read_binary_stamped(self) -> tuple[bytes, tuple[int, ...] | None]:
        """:meth:`read_binary`, with the file's stamp while it was read (`mnnbuild_runtime.hashes.read_stamped`)."""
        if self.model_dir is not None:
            bundle_path(self.model_dir, self.path, f"{self.where()}: attribute 'path'")
        try:
            with open_bundle_file(self.file) as fh:
                data, stamp = read_stamped(fh, self.offset, self.size)
        except OSError as exc:
            raise BundleError(f"{self.where()}: cannot read context binary {self.file}: {exc}") from exc
        if self.size and len(data) != self.size:
            raise BundleError(
                f"{self.where()}: {self.file} is too short: expected {self.size} bytes at offset {self.offset}, "
                f"got {len(data)}"
            )
        return data, stamp


def open_bundle_file(path: Path, links: bool = False) -> BinaryIO:
    """Open a bundle file for reading without following a link (``links``: a fetched model dir's files are links):
    a file swapped for a link after it was checked (`bundle_path`) is refused by the open itself."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | (0 if links else getattr(os, "O_NOFOLLOW", 0))
    try:
        return os.fdopen(os.open(path, flags), "rb")
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BundleError(f"{path}: a symlink; a bundle's files are copies, and links are not followed") from None
        raise


def read_json_object(path: Path, missing: str, *, links: bool = False) -> dict[str, Any]:
    """The JSON object in ``path``, opened as `open_bundle_file` does; a problem is one BundleError naming the file,
    ``missing`` saying what a missing one means (``<path>: <missing>``)."""
    try:
        with open_bundle_file(path, links) as fh:
            data = parse_json(fh.read().decode("utf-8"))
    except FileNotFoundError:
        raise BundleError(f"{path}: {missing}") from None
    except (OSError, ValueError) as exc:  # not UTF-8, not JSON
        raise BundleError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _read_bundle_json(path: Path, links: bool) -> dict[str, Any]:
    return read_json_object(path, f"file missing; a bundle model dir must have {path.name}", links=links)


FILE_FIELDS = (
    "llm_config", "llm_model", "llm_weight", "tokenizer_file", "embedding_file", "embedding_model", "visual_model",
    "lm_model", "block_model", "npu_model_dir", "context_file", "lookup_file", "ple_embed_file",
    "mtp_model", "draft_model", "eagle_model", "eagle_fc", "eagle_d2t", "dflash_model", "dflash_fc", "dflash_kvmat",
    "audio_model", "talker_model", "talker_weight", "talker_embedding_file", "talker_text_embedding_file",
    "code_predictor_model", "code_predictor_weight", "code_predictor_embedding_file", "speech_decoder_model",
    "speech_decoder_weight", "speaker_encoder_model", "speaker_encoder_weight", "prompt_embedder_model",
    "prompt_embedder_weight", "codec_embedder_model", "codec_embedder_weight", "predit_model", "dit_model",
    "bigvgan_model", "spk_dict",
)  # fmt: skip
"""Fields of an LLM config (and of the ``llm_config.json`` MNN's engine merges into it) naming a file of the
model dir: the engine joins each to the config's directory, and so does this runtime. Every such field of MNN's
``llmconfig.hpp`` (4d40bdbd): a model's ``config.json`` reaches ``config_qnn.json`` whole, so any of them may."""
REFUSED_FIELDS = {
    "base_dir": "it would move every file the config names elsewhere; expected the model's files next to the config",
    "tmp_path": "MNN's engine writes its memory-mapped files there, outside the model dir",
    "prefix_cache_path": "MNN's engine writes its prompt cache there, outside the model dir",
}
"""Fields naming a directory MNN's engine reads from or writes to, not relative to the model dir."""


def bundle_path(model_dir: Path, name: object, what: str, *, links: bool = False) -> Path:
    """``model_dir / name`` for a file name read from a bundle (``what``: the file and field it came from), checked
    right before the file is read. It must name a file of the model dir: relative, without ``..``, no symlinked
    directory on the way out of it. A bundle's files are copies, so a symlink anywhere on the way, the file itself
    included, is refused even when it points inside; ``links=True`` is for a fetched model dir, whose files are
    links to the source model's (its directories may still not lead out)."""
    if not isinstance(name, str) or not name:
        raise BundleError(f"{what} must be a file name inside {model_dir}, got {name!r}")
    try:
        path = confined(model_dir, name, what, follow_last=False)
    except UnsafePathError as exc:
        raise BundleError(str(exc)) from None
    if not links:
        at = Path(model_dir)
        for part in PurePosixPath(name).parts:
            at = at / part
            if at.is_symlink():
                raise BundleError(
                    f"{what}: {at} is a symlink (to {os.readlink(at)}); a bundle's files are copies, and links are "
                    "not followed"
                )
    return path


ENGINE_DEFAULTS = {"llm_model": DEFAULT_MODEL, "llm_weight": DEFAULT_WEIGHT, "tokenizer_file": DEFAULT_TOKENIZER}
"""Files MNN's engine reads when a config does not name them (``llmconfig.hpp``'s defaults)."""


def check_config_files(config_path: Path, config: dict[str, Any], *, links: bool = False) -> None:
    """Every file an LLM config names (`FILE_FIELDS`, in it or in the ``llm_config.json`` it names) must be a file
    of its directory, and `REFUSED_FIELDS` are refused: what MNN's engine reads or writes when it is given this
    config stays inside the model dir. (An empty name is the model dir itself, MNN's default for some fields.)
    ``links``: see `bundle_path`."""
    model_dir = config_path.parent
    sources = [(config_path, config)]
    llm_config = bundle_path(
        model_dir, config.get("llm_config", "llm_config.json"), f"{config_path}: field 'llm_config'", links=links
    )
    if llm_config.is_file():
        sources.append((llm_config, _read_bundle_json(llm_config, links)))
    for source, values in sources:
        refused = [field for field in REFUSED_FIELDS if field in values]
        if refused:
            raise BundleError(f"{source}: field {refused[0]!r} is not supported: {REFUSED_FIELDS[refused[0]]}")
        for field in FILE_FIELDS:
            if field in values and values[field] != "":
                bundle_path(model_dir, values[field], f"{source}: field {field!r}", links=links)


def check_engine_files(config_path: Path, config: dict[str, Any], *, links: bool = False) -> None:
    """Right before MNN's engine is handed ``config_path`` (it opens the files itself, by name): the files it names
    (`check_config_files`) and those it reads by default (`ENGINE_DEFAULTS`) are checked again."""
    check_config_files(config_path, config, links=links)
    check_draft_files(config_path, config, links=links)
    for field, default in ENGINE_DEFAULTS.items():
        if field not in config and (config_path.parent / default).exists():
            bundle_path(config_path.parent, default, f"{config_path}: default of field {field!r}", links=links)


def read_config(config_path: Path, *, links: bool = False) -> dict[str, Any]:
    """An LLM config (``config.json``, ``config_qnn.json``), read, and checked by `check_config_files`: what it
    gives MNN's engine to read stays inside its model dir. ``links``: see `bundle_path`."""
    config_path = Path(config_path)
    bundle_path(config_path.parent, config_path.name, f"{config_path}", links=links)
    config = _read_bundle_json(config_path, links)
    check_config_files(config_path, config, links=links)
    return config


def mask_window(config_path: Path, config: dict[str, Any], *, links: bool = False) -> int | None:
    """The sliding window of the two-part mask MNN's engine feeds the model ``config`` describes (None: one causal
    mask; :func:`mnnbuild.mnn.llm.attention_window`), from the config merged with the ``llm_config.json`` it names
    (whose fields win, as the engine merges it in)."""
    name = config.get("llm_config", "llm_config.json")
    path = bundle_path(config_path.parent, name, f"{config_path}: field 'llm_config'", links=links)
    merged = {**config, **(_read_bundle_json(path, links) if path.is_file() else {})}
    try:
        return attention_window(merged)
    except ValueError as exc:
        raise BundleError(f"{path if path.is_file() else config_path}: {exc}") from None


def check_llm_config(config_path: Path, config: dict[str, Any], *, links: bool = False) -> None:
    """MNN's engine merges the ``llm_config.json`` a config names over the config itself (``LlmConfig``: its fields
    win), so a field set there would run the phone on other settings than the config says, and verify checks:
    refused, one line, unless it equals the config's. A field that decides which forwards run (``chunk_limits``,
    the speculative fields: :data:`ENGINE_RUN_FIELDS`) is refused there even when the config leaves it out."""
    name = config.get("llm_config", "llm_config.json")
    path = bundle_path(config_path.parent, name, f"{config_path}: field 'llm_config'", links=links)
    if not path.is_file():
        return
    for key, value in _read_bundle_json(path, links).items():
        if key in config and config[key] == value:
            continue
        if key in config or key in ENGINE_RUN_FIELDS:
            ours = f"{config[key]!r} there" if key in config else "its leaving it out"
            raise BundleError(
                f"{path}: field {key!r} is {value!r}; MNN's engine merges this file over {config_path.name}, so it "
                f"would override {ours}; expected it only in the config"
            )


def _pair_to_size(value: Any, where: str, key: str) -> int:
    """``offset``/``size`` attributes are a 64-bit number stored as two int32 (low, high)."""
    if not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise BundleError(f"{where}: attribute {key!r} must be a list of two ints (low, high 32 bits), got {value!r}")
    low, high = (int(v) & 0xFFFFFFFF for v in value)
    return (high << 32) | low


def _binary_slice(attrs: dict[str, Any], where: str, file: Path | None) -> tuple[int, int]:
    """The ``offset``/``size`` attributes, as MNN's QNN plugin reads them: ``size`` bytes at ``offset`` of the file,
    or (no size, or 0) the whole file with ``offset`` ignored. So an offset without a size, or a slice past the end
    of ``file`` (None: not built yet), is refused rather than the whole file run in its place."""
    offset = _pair_to_size(attrs["offset"], where, "offset") if "offset" in attrs else 0
    size = _pair_to_size(attrs["size"], where, "size") if "size" in attrs else 0
    if offset and not size:
        raise BundleError(
            f"{where}: attribute 'offset' is {offset} without a 'size'; MNN's engine would ignore it and load the "
            "whole file: expected both (a slice of the file) or neither"
        )
    if file is not None and size:
        length = file.stat().st_size
        if offset + size > length:
            raise BundleError(
                f"{where}: attributes 'offset' {offset} and 'size' {size} reach byte {offset + size}, but {file} has "
                f"{length} bytes; expected a slice inside the file"
            )
    return offset, size


def _str_list(attrs: dict[str, Any], key: str, where: str, count: int | None = None) -> tuple[str, ...]:
    value = attrs.get(key)
    if value is None:
        raise BundleError(f"{where}: attribute {key!r} missing; expected a list of strings")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BundleError(f"{where}: attribute {key!r} must be a list of strings, got {value!r}")
    if count is not None and len(value) != count:
        raise BundleError(f"{where}: attribute {key!r} has {len(value)} names, expected {count} (one per op tensor)")
    return tuple(value)


def parse_plugin(
    model: MnnModel, op_index: int, model_dir: Path, model_file: Path, *, binaries: bool = True
) -> PluginSpec:
    """Decode and check one Plugin op's attributes (see :class:`PluginSpec`). ``binaries=False`` accepts a
    ``path`` whose file does not exist yet (a partitioned model before its context binaries are built)."""
    op = model.ops[op_index]
    where = f"{model_file}: plugin {op.name!r} (op #{op_index})"
    plugin_type = getattr(op.main, "type", None)
    if plugin_type != PLUGIN_TYPE:
        raise BundleError(f"{where}: Plugin type is {plugin_type!r}, expected {PLUGIN_TYPE!r}")
    try:
        attrs = plugin_attributes(op)
    except MNNFormatError as exc:
        raise BundleError(f"{where}: {exc}") from exc
    if "state" in attrs:
        raise BundleError(
            f"{where}: attribute 'state' (KV cache kept on the NPU) is not supported by this runtime; "
            "expected plugins without state (attention on the CPU)"
        )
    if attrs.get("dump_intermediate_outputs"):
        raise BundleError(
            f"{where}: attribute 'dump_intermediate_outputs' is set: MNN's engine would write every intermediate "
            "tensor into the model dir; expected it unset (a debugging switch, never shipped)"
        )
    path = attrs.get("path")
    if not isinstance(path, str) or not path:
        raise BundleError(f"{where}: attribute 'path' missing or not a string; expected e.g. 'qnn/graphllm0.bin'")
    file = bundle_path(model_dir, path, f"{where}: attribute 'path'")
    if binaries and not file.is_file():
        raise BundleError(f"{where}: attribute 'path' = {path!r} but {file} does not exist")
    qnn_inputs = _str_list(attrs, "inputs", where, len(op.inputs))
    qnn_outputs = _str_list(attrs, "outputs", where, len(op.outputs))
    graph_names = _str_list(attrs, "allGraphName", where)
    if not graph_names:
        raise BundleError(f"{where}: attribute 'allGraphName' is empty; expected one graph name per shape")
    if len(set(graph_names)) != len(graph_names):
        raise BundleError(f"{where}: attribute 'allGraphName' {list(graph_names)} repeats a name")
    shape_attr = attrs.get("allInputShape")
    if shape_attr is None or not isinstance(shape_attr, list) or not all(isinstance(v, int) for v in shape_attr):
        raise BundleError(f"{where}: attribute 'allInputShape' missing or not a list of ints: {shape_attr!r}")
    if len(shape_attr) % len(graph_names):
        raise BundleError(
            f"{where}: attribute 'allInputShape' has {len(shape_attr)} dims, not a multiple of the "
            f"{len(graph_names)} shapes named by 'allGraphName'"
        )
    if any(d <= 0 for d in shape_attr):
        raise BundleError(f"{where}: attribute 'allInputShape' {shape_attr} has a non-positive dimension")
    outputs = []
    for s in range(len(graph_names)):
        descs = []
        for i in range(len(op.outputs)):
            key = f"o_{s}_{i}"
            blob = attrs.get(key)
            if not isinstance(blob, schema.BlobT):
                raise BundleError(
                    f"{where}: attribute {key!r} missing or not a Blob; expected the dims, data type and "
                    f"format of output {i} for shape {s}"
                )
            dims = tuple(int(d) for d in (blob.dims if blob.dims is not None else []))
            if int(blob.dataType) not in MNN_NUMPY_DTYPES:
                raise BundleError(
                    f"{where}: attribute {key!r} has data type {enum_name(schema.DataType, blob.dataType)}; "
                    f"expected one of {[enum_name(schema.DataType, t) for t in MNN_NUMPY_DTYPES]}"
                )
            descs.append(OutputDesc(dims, int(blob.dataType), int(blob.dataFormat)))
        outputs.append(tuple(descs))
    offset, size = _binary_slice(attrs, where, file if binaries else None)
    return PluginSpec(
        model_dir=Path(model_dir),
        name=op.name or path,  # unnamed ops are known by their binary
        op_index=op_index,
        path=path,
        file=file,
        input_tensors=tuple(model.tensor_names[t] for t in op.inputs),
        output_tensors=tuple(model.tensor_names[t] for t in op.outputs),
        qnn_inputs=qnn_inputs,
        qnn_outputs=qnn_outputs,
        graph_names=graph_names,
        all_input_shape=tuple(shape_attr),
        outputs=tuple(outputs),
        offset=offset,
        size=size,
    )


def parse_plugins(
    model: MnnModel, model_dir: Path, model_file: Path, *, binaries: bool = True
) -> tuple[PluginSpec, ...]:
    """Every Plugin op of ``model`` (see :func:`parse_plugin`), checked for unique names and binaries."""
    plugins = tuple(
        parse_plugin(model, i, model_dir, model_file, binaries=binaries)
        for i, op in enumerate(model.ops)
        if op.type == "Plugin"
    )
    names = [p.name for p in plugins]
    dup_names = sorted({n for n in names if names.count(n) > 1})
    if dup_names:
        raise BundleError(f"{model_file}: several Plugin ops are named {dup_names}; expected unique op names")
    paths = [p.path for p in plugins if not p.size]
    dup = sorted({p for p in paths if paths.count(p) > 1})
    if dup:
        raise BundleError(f"{model_file}: several plugins use the same context binary {dup}; expected one each")
    return plugins


def compiled_lengths(spec: PluginSpec) -> set[int] | None:
    """The token counts a plugin's graphs were compiled for, read from ``allInputShape``: the dims that are 1 in
    the smallest shape and vary between shapes are its sequence dims (a bundle built without the decode graph has no
    1: then every dim that varies), and each shape's value there is its length. None when that cannot be told (no
    such dim, or a shape whose sequence dims disagree): the plugin takes every length alike (an lm_head after the
    ``logits_index`` slice) or is laid out otherwise."""
    per_shape = len(spec.all_input_shape) // spec.num_shapes
    blocks = [spec.all_input_shape[s * per_shape : (s + 1) * per_shape] for s in range(spec.num_shapes)]
    base = [min(b[i] for b in blocks) for i in range(per_shape)]
    varying = [i for i in range(per_shape) if any(b[i] != base[i] for b in blocks)]
    seq_dims = [i for i in varying if base[i] == 1] or varying
    if not seq_dims:
        return None
    lengths = set()
    for block in blocks:
        values = {block[i] for i in seq_dims}
        if len(values) != 1:
            return None
        lengths |= values
    return lengths


def check_chunk_limits(config_path: Path, chunk_limits: list[int], plugins: tuple[PluginSpec, ...]) -> None:
    """Every length of ``chunk_limits`` (a forward MNN's engine may run) must be one the plugins were compiled for:
    the plugin picks its graph by input shape, so any other length has no graph (and a caller sizing its inputs
    by ``chunk_limits [1000000000, 1]`` would ask for hundreds of GiB before finding out)."""
    for spec in plugins:
        lengths = compiled_lengths(spec)
        missing = sorted(set(chunk_limits) - lengths) if lengths is not None else []
        if missing:
            raise BundleError(
                f"{config_path}: field 'chunk_limits' {chunk_limits} holds {missing[-1]}, but {spec.where()} was "
                f"compiled for {sorted(lengths or ())} tokens (attribute 'allInputShape'); expected lengths among them"
            )


def check_speculation(config_path: Path, config: dict[str, Any], plugins: tuple[PluginSpec, ...]) -> None:
    """A config that speculates (``speculative_type``) has MNN's engine verify drafts in forwards of
    ``draft_predict_length + 1`` tokens: every plugin must hold a graph at that length (it picks its graph by input
    shape), and an Eagle bundle must hold the draft's files, which the engine loads with the model."""
    kind = config.get(SPECULATIVE_TYPE)
    if not kind:
        return
    try:
        verify = draft_length(config, config_path) + 1
    except ValueError as exc:
        raise BundleError(str(exc)) from None
    for spec in plugins:
        lengths = compiled_lengths(spec)
        if lengths is not None and verify not in lengths:
            raise BundleError(
                f"{config_path}: field {SPECULATIVE_TYPE!r} is {kind!r}: MNN's engine verifies {verify} tokens per "
                f"forward ({DRAFT_LENGTH_FIELD} {verify - 1} + 1), but {spec.where()} was compiled for "
                f"{sorted(lengths)} tokens (attribute 'allInputShape'); expected a bundle built for that "
                "speculation (spec field speculative)"
            )
    check_draft_files(config_path, config)


def check_draft_files(config_path: Path, config: dict[str, Any], *, links: bool = False) -> None:
    """An Eagle config makes MNN's engine load the draft's files with the model: each must exist, and ``eagle_d2t``
    hold its one int32 tensor (PyPI MNN 3.6.1 dereferences the empty load of a missing, empty or truncated
    ``eagle_d2t`` and crashes with SIGSEGV instead of failing)."""
    if config.get(SPECULATIVE_TYPE) != EAGLE:
        return
    for field, default in EAGLE_FILE_FIELDS.items():
        name = config.get(field, default)
        path = bundle_path(config_path.parent, name, f"{config_path}: field {field!r}", links=links)
        if not path.is_file():
            raise BundleError(
                f"{config_path}: field {SPECULATIVE_TYPE!r} is 'eagle', so MNN's engine loads the draft's "
                f"{field} {name!r} with the model, but {config_path.parent / name} does not exist; expected the "
                "Eagle draft's files beside the model"
            )
        if field not in EAGLE_GRAPH_IO:
            try:
                read_draft_map(path)
            except MNNFormatError as exc:
                raise BundleError(f"{exc} ({config_path}: field {field!r})") from None


@dataclass
class Bundle:
    """A bundle's model directory, opened and validated: config, the plugin graph and its plugins."""

    model_dir: Path
    config: dict[str, Any]
    model_file: Path
    model: MnnModel
    weight_file: Path | None
    plugins: tuple[PluginSpec, ...]
    mask_window: int | None = None
    """The sliding window of the two-part mask MNN's engine feeds the language model (`mask_window`); None: one
    causal mask, or a VL encoder (whose masks are its own)."""

    @classmethod
    def open(cls, model_dir: str | os.PathLike[str], config_name: str = CONFIG_FILE, *, visual: bool = False) -> Bundle:
        """Read ``<model_dir>/config_qnn.json`` and the model it names; check every Plugin op.

        ``visual``: open a VL model's encoder instead (``visual_model``, its weights beside it as
        ``<visual_model>.weight``, which is where MNN's engine looks for them)."""
        model_dir = Path(model_dir).resolve()
        config_path = model_dir / config_name
        config = read_config(config_path)
        if visual:
            if "visual_model" not in config:
                raise BundleError(f"{config_path}: field 'visual_model' is missing; not a vision-language bundle")
            config = {k: v for k, v in config.items() if k not in ("llm_model", "llm_weight")}
            config.update(llm_model=config["visual_model"], llm_weight=f"{config['visual_model']}.weight")
        llm_model = config.get("llm_model", DEFAULT_MODEL)
        chunks = config.get("chunk_limits")
        if chunks is not None and (
            not isinstance(chunks, list)
            or not chunks
            or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in chunks)
        ):
            raise BundleError(f"{config_path}: field 'chunk_limits' must be a list of positive ints, got {chunks!r}")
        model_file = bundle_path(model_dir, llm_model, f"{config_path}: field 'llm_model'")
        if not model_file.is_file():
            raise BundleError(f"{config_path}: field 'llm_model' = {llm_model!r} but {model_file} does not exist")
        try:
            model = load_model(model_file)
        except MNNFormatError as exc:
            raise BundleError(str(exc)) from exc
        weight_name = config.get("llm_weight", DEFAULT_WEIGHT)
        weight_file = bundle_path(model_dir, weight_name, f"{config_path}: field 'llm_weight'")
        try:
            ranges = external_ranges(model)
        except MNNFormatError as exc:
            raise BundleError(f"{model_file}: {exc}") from None
        if weight_file is not None and not weight_file.is_file():
            if ranges:
                raise BundleError(
                    f"{config_path}: {model_file.name} keeps weights in an external file but "
                    f"{weight_file} does not exist (field 'llm_weight', default {DEFAULT_WEIGHT!r})"
                )
            weight_file = None
        if weight_file is not None:
            _check_weight_extent(ranges, model_dir, weight_file, embeddings=not visual)
        plugins = parse_plugins(model, model_dir, model_file)
        if not visual:  # first: a speculating config's verify length is in its chunk_limits too (lookahead)
            check_speculation(config_path, config, plugins)
        if chunks is not None and not visual:  # an encoder's graphs are per image size, not per chunk
            check_chunk_limits(config_path, chunks, plugins)
        log.info("opened bundle %s: %d ops, %d plugins", model_dir, len(model.ops), len(plugins))
        check_llm_config(config_path, config)
        window = None if visual else mask_window(config_path, config)
        return cls(model_dir, config, model_file, model, weight_file, plugins, window)

    def check_files(self) -> None:
        """The model file and weight file, checked again (`bundle_path`): called right before MNN opens them by name,
        at every load of a segment, not only when the bundle was opened."""
        for path in (self.model_file, self.weight_file):
            if path is not None:
                bundle_path(self.model_dir, path.relative_to(self.model_dir).as_posix(), f"{self.model_dir}")

    @property
    def chunk_limits(self) -> list[int]:
        return list(self.config.get("chunk_limits") or [])

    @property
    def chunk_size(self) -> int:
        """The prefill length (the largest of ``chunk_limits``), as MNN's LLM engine picks it."""
        return self.block_sizes[-1]

    @property
    def block_sizes(self) -> list[int]:
        """Every length a forward may run at, ascending (``chunk_limits`` as MNN's engine sorts it)."""
        try:
            return block_sizes(self.chunk_limits)
        except ValueError as exc:
            raise BundleError(f"{self.model_dir / CONFIG_FILE}: field 'chunk_limits': {exc}") from None

    def prefill_blocks(self, tokens: int) -> list[Block]:
        """How MNN's engine runs a prompt of ``tokens``: full blocks of ``chunk_size``, the rest padded up to
        the smallest length that holds it (:func:`mnnbuild_runtime.chunks.prefill_blocks`)."""
        return prefill_blocks(tokens, self.block_sizes)

    def plugin(self, name_or_path: str) -> PluginSpec:
        for p in self.plugins:
            if name_or_path in (p.name, p.path):
                return p
        raise KeyError(f"no plugin named {name_or_path!r}; plugins: {[p.name for p in self.plugins]}")

    @property
    def input_names(self) -> list[str]:
        return self.model.input_names

    @property
    def output_names(self) -> list[str]:
        return list(self.model.output_names)


def _check_weight_extent(
    ranges: list[WeightRange], model_dir: Path, weight_file: Path, embeddings: bool = True
) -> None:
    """The weight file must cover every external range of ``qnn/llm.mnn`` (``ranges``) and (``embeddings``) the
    bytes ``tie_embeddings`` points at: a weight file of another model usually fails here instead of producing
    garbage."""
    size = weight_file.stat().st_size
    for r in ranges:
        if r.end > size:
            raise BundleError(
                f"{weight_file}: {r.reader} reads bytes up to {r.end} but the file has {size}: "
                "not the weight file of this model"
            )
    if embeddings and (model_dir / "llm_config.json").is_file():
        try:
            info = embedding_info(model_dir)
        except MNNFormatError as exc:
            raise BundleError(str(exc)) from exc  # its message names llm_config.json or the file it points at
        if info.path == weight_file and info.alpha_offset + info.alpha_size > size:
            raise BundleError(
                f"{weight_file}: llm_config.json 'tie_embeddings' reads bytes up to "
                f"{info.alpha_offset + info.alpha_size} but the file has {size}: not the weight file of this model"
            )
