"""The MNN model format: read, edit and write ``.mnn`` files, decode their weights.

No stage logic lives here; the partition stage and the QNN lowering build on this API.

Graph::

    model = load_model("llm.mnn")             # never opens llm.mnn.weight
    for op in model.ops:                       # Op(type, name, inputs, outputs, main, ...)
        if op.type == "LayerNorm":
            eps = op.main.epsilon              # main: generated *T object (LayerNormT)
            rms = get_field(op.main, "useRMSNorm")  # == op.main.useRmsnorm (flatc camelCase)
        elif op.type == "BinaryOp":
            kind = enum_name(schema.BinaryOpOperation, op.main.opType)
    model.tensor_names[op.inputs[0]]; model.input_names; model.output_names
    model.add_op(make_plugin_op("qnn0", ins, outs, {"path": "qnn/graph0.bin",
                                                   "inputs": ["t3"], "allInputShape": [1, 128],
                                                   "o_0_0": make_blob([1, 1, 128])}))
    model.delete_ops(lambda op: ...); model.reindex_tensors(); model.topological_sort()
    save_model(model, "qnn/llm.mnn")            # atomic

Weights::

    for cw in iter_conv_weights(model):        # one op at a time
        cw.weight  # float32 [out, in];  cw.bias float32 [out];  cw.quant: bits, block, symmetric
    read_embeddings(model_dir, token_ids)      # float32 [n, hidden], tied or embeddings_bf16.bin
    external_ranges(model)                     # what each op reads of the weight file (any kind of op)
    plan = plan_weights(weight_file, ranges)   # mnn.strip: only those bytes, back to back
    write_weights(plan, dest); relocate_model(model, plan)  # ... and the model pointing at them
    split_convolution(model, i, [0, 75968, 151936], weight_file)  # mnn.split: conv i as 2 convs + Concat

Parameter classes and enums of the schema (``Convolution2DT``, ``BinaryOpOperation``, ``DataType`` ...)
are attributes of ``schema`` (the generated module). Every read error is ``MNNFormatError``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mnnbuild.base.errors import MNNFormatError

if TYPE_CHECKING:
    from mnnbuild.mnn._generated import mnn_fb as schema
    from mnnbuild.mnn.model import (
        DATA_FORMATS,
        DATA_TYPES,
        OP_TYPE_NAMES,
        OP_TYPES,
        PARAM_TYPES,
        MnnModel,
        Op,
        attribute_value,
        blob_format,
        enum_name,
        get_field,
        load_model,
        make_attribute,
        make_blob,
        make_plugin_op,
        parse_model,
        plugin_attributes,
        save_model,
        serialize_model,
    )
    from mnnbuild.mnn.strip import KeptBlock, WeightPlan, plan_weights, relocate_model, write_weights
    from mnnbuild.mnn.summary import input_dtypes, summarize
    from mnnbuild.mnn.weights import (
        ConvCodes,
        ConvWeights,
        EmbeddingInfo,
        QuantInfo,
        QuantizedLinear,
        TieEmbeddings,
        WeightFile,
        WeightRange,
        check_conv_scales,
        check_weight_ranges,
        conv_codes,
        conv_ops,
        conv_stored_bytes,
        decode_conv,
        embedding_info,
        external_ranges,
        external_tables,
        iter_conv_weights,
        quantize_blocks,
        quantize_linear,
        read_embeddings,
        tie_embeddings,
        unpack_codes,
        weight_path_for,
    )


__all__ = [
    "DATA_FORMATS",
    "DATA_TYPES",
    "OP_TYPES",
    "OP_TYPE_NAMES",
    "PARAM_TYPES",
    "ConvWeights",
    "EmbeddingInfo",
    "KeptBlock",
    "MNNFormatError",
    "MnnModel",
    "Op",
    "QuantInfo",
    "QuantizedLinear",
    "TieEmbeddings",
    "WeightFile",
    "WeightPlan",
    "WeightRange",
    "attribute_value",
    "check_conv_scales",
    "check_weight_ranges",
    "conv_ops",
    "conv_stored_bytes",
    "ConvCodes",
    "conv_codes",
    "decode_conv",
    "embedding_info",
    "external_ranges",
    "external_tables",
    "blob_format",
    "enum_name",
    "get_field",
    "input_dtypes",
    "iter_conv_weights",
    "load_model",
    "make_attribute",
    "make_blob",
    "make_plugin_op",
    "parse_model",
    "plan_weights",
    "plugin_attributes",
    "quantize_blocks",
    "quantize_linear",
    "read_embeddings",
    "relocate_model",
    "save_model",
    "schema",
    "serialize_model",
    "summarize",
    "tie_embeddings",
    "unpack_codes",
    "weight_path_for",
    "write_weights",
]

_SOURCES = ("model", "strip", "summary", "weights")
"""The modules the API's names come from (``schema`` aside): imported when a name of theirs is first used, so that
importing a module of this package for its conventions (`mnnbuild.mnn.llm`: file names, inputs) loads neither
flatbuffers nor numpy (a doit start only declares tasks)."""


def __getattr__(name: str) -> Any:
    """A name of the API, imported on first use and then kept as this module's attribute."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name == "schema":
        value: Any = importlib.import_module(f"{__name__}._generated.mnn_fb")
    else:
        found = (importlib.import_module(f"{__name__}.{source}") for source in _SOURCES)
        value = next(getattr(module, name) for module in found if hasattr(module, name))
    globals()[name] = value
    return value
