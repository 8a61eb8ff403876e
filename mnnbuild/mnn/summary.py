"""A summary of an ``.mnn`` model (what ``python -m mnnbuild inspect`` prints), from the graph alone."""

from __future__ import annotations

from typing import Any

from mnnbuild.mnn._generated import mnn_fb as fb
from mnnbuild.mnn.model import MnnModel, Op, _op_from_t, enum_name
from mnnbuild.mnn.weights import conv_ops, conv_stored_bytes, external_tables, weight_path_for


def _external_bytes(op: Op) -> int:
    if op.main is None:
        return 0
    return sum(int(sum(int(v) for v in table.external[1:])) for table in external_tables(op.main))


def _inline_bytes(op: Op) -> int:
    """Bytes of numeric data an op carries inside the .mnn (Const blobs, inline conv weights, norms)."""
    main = op.main
    if main is None:
        return 0
    if op.param_type == "Convolution2D":
        return 0 if main.external is not None and len(main.external) > 1 else conv_stored_bytes(op)
    total = 0
    for name in ("float32s", "int32s", "int64s", "uint8s", "int8s", "gamma", "beta", "weight", "bias"):
        vec = getattr(main, name, None)
        if vec is not None and hasattr(vec, "nbytes"):
            total += int(vec.nbytes)
    return total


def op_parameter_count(op: Op) -> int:
    """How many parameters an op carries (a conv's weights and bias; the elements of inline data), from the
    graph alone: a conv's count follows from its shape, whatever its storage (int4 blocks, int8, float)."""
    main = op.main
    if main is None:
        return 0
    if op.param_type == "Convolution2D":
        c = main.common
        if c is None:
            return 0
        out_ch, in_ch, group = int(c.outputCount), int(c.inputCount), max(int(c.group), 1)
        return out_ch * (in_ch // group) * int(c.kernelX) * int(c.kernelY) + out_ch
    total = 0
    for name in ("float32s", "int32s", "int64s", "uint8s", "int8s", "gamma", "beta", "weight", "bias"):
        vec = getattr(main, name, None)
        if vec is not None and hasattr(vec, "__len__"):
            total += len(vec)
    return total


def op_weight_bytes(op: Op) -> int:
    """Bytes of parameters an op carries, in the weight file (``external``) or inline."""
    if op.main is None:
        return 0
    if op.param_type == "Convolution2D":
        return conv_stored_bytes(op)
    return _external_bytes(op) or _inline_bytes(op)


def subgraph_weight_bytes(model: MnnModel) -> int:
    """Bytes of parameters the ops of the model's subgraphs carry (llmexport's MoE experts live there)."""
    total = 0
    for sg in model.subgraphs:
        for k, op_t in enumerate(sg.nodes or []):
            total += op_weight_bytes(_op_from_t(op_t, k, f"subgraph {sg.name!r}"))
    return total


def conv_quant_label(op: Op) -> str:
    """Short description of a conv's storage read from its parameters: ``int4 asym block64``,
    ``int8 sym channel``, ``float`` ... (no weight file access)."""
    c = op.main
    q = c.quanParameter
    if q is None:
        return "float"
    if q.type == 3:
        return "fp16"
    if q.type not in (1, 4):
        return f"quant type {q.type}"
    bits = int(q.aMaxOrBits) if q.type == 1 else 8
    out_ch = int(c.common.outputCount) if c.common is not None else 0
    in_ch = int(c.common.inputCount) if c.common is not None else 0
    ext = list(c.external) if c.external is not None else []
    asym = int(q.readType) != 0
    if asym:
        groups = int(q.readType)
    else:
        alpha_bytes = int(ext[2]) if len(ext) > 2 else 0
        elem = 2 if int(q.scaleStorage) == 1 else 4
        groups = alpha_bytes // elem
    per_out = groups // out_ch if out_ch and groups else 0
    if per_out <= 1:
        layout = "channel"
    else:
        layout = f"block{in_ch // per_out}" if in_ch else f"{per_out} blocks"
    return f"int{bits} {'asym' if asym else 'sym'} {layout}"


def graph_inputs(model: MnnModel) -> list[dict[str, Any]]:
    """Each graph input as its ``Input`` op declares it: name, tensor index, and dims, dtype, format when given."""
    inputs = []
    for op in model.ops_of_type("Input"):
        p = op.main
        for t in op.outputs:
            entry: dict[str, Any] = {"name": model.tensor_names[t], "index": t}
            if p is not None:
                entry["dims"] = [int(d) for d in (p.dims if p.dims is not None else [])]
                entry["dtype"] = enum_name(fb.DataType, p.dtype)
                entry["format"] = enum_name(fb.MNN_DATA_FORMAT, p.dformat)
            inputs.append(entry)
    return inputs


def input_dtypes(model: MnnModel) -> dict[str, str]:
    """The declared data type of each graph input that declares one (``DT_FLOAT``, ``DT_INT32`` ...), by name."""
    return {e["name"]: e["dtype"] for e in graph_inputs(model) if "dtype" in e}


def summarize(model: MnnModel) -> dict[str, Any]:
    """JSON-ready summary: op counts by type, inputs, outputs, tensor count, weight bytes."""
    inputs = graph_inputs(model)
    quant: dict[str, int] = {}
    for op in conv_ops(model):
        label = conv_quant_label(op)
        quant[label] = quant.get(label, 0) + 1
    external = sum(_external_bytes(op) for op in model.ops)
    inline = sum(_inline_bytes(op) for op in model.ops)
    summary: dict[str, Any] = {
        "path": str(model.path) if model.path is not None else None,
        "ops": len(model.ops),
        "tensors": len(model.tensor_names),
        "op_types": model.op_type_counts(),
        "inputs": inputs,
        "outputs": [{"name": n, "index": model.tensor_names.index(n)} for n in model.output_names],
        "convolutions": {"count": len(conv_ops(model)), "storage": quant},
        "weight_bytes": {"external": external, "inline": inline, "total": external + inline},
        "subgraphs": len(model.subgraphs),
    }
    if model.path is not None:
        wpath = weight_path_for(model.path)
        summary["weight_file"] = {"path": str(wpath), "bytes": wpath.stat().st_size} if wpath.exists() else None
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """Human-readable text of ``summarize``'s result."""
    lines = [f"model: {summary['path']}", f"ops: {summary['ops']}  tensors: {summary['tensors']}", "inputs:"]
    for i in summary["inputs"]:
        dims = "x".join(str(d) for d in i.get("dims", [])) or "?"
        lines.append(f"  {i['name']:<24} [{dims}] {i.get('dtype', '')} {i.get('format', '')}".rstrip())
    lines.append("outputs: " + ", ".join(o["name"] for o in summary["outputs"]))
    lines.append("op types:")
    for name, count in summary["op_types"].items():
        lines.append(f"  {name:<24} {count}")
    conv = summary["convolutions"]
    storage = ", ".join(f"{k}: {v}" for k, v in conv["storage"].items())
    lines.append(f"convolutions: {conv['count']}" + (f" ({storage})" if storage else ""))
    wb = summary["weight_bytes"]
    lines.append(f"weight bytes: {wb['total']} ({wb['external']} external, {wb['inline']} inline)")
    wf = summary.get("weight_file")
    if wf:
        lines.append(f"weight file: {wf['path']} ({wf['bytes']} bytes)")
    if summary["subgraphs"]:
        lines.append(f"subgraphs: {summary['subgraphs']}")
    return "\n".join(lines) + "\n"
