"""Qualcomm's floor for a plugin: the prepare cost of its linear ops alone, which no lowering can avoid.

One definition for every benchmark that reports a ratio to the floor (bench_prepare, bench_scale).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mnnbuild.lowering.graph import GraphDescription, QnnNodeDesc, QnnTensorDesc, TensorKind

# the node types whose preparation is Qualcomm's own work for a linear layer
LINEAR_OPS = frozenset({"Conv2d", "FullyConnected"})


def is_linear(node: QnnNodeDesc, by_name: dict[str, QnnTensorDesc]) -> bool:
    """A weight layer: Conv2d / FullyConnected, or a MatMul with a static operand."""
    if node.type in LINEAR_OPS:
        return True
    return node.type == "MatMul" and any(by_name[n].kind == TensorKind.STATIC for n in node.inputs)


def linear_ops_alone(desc: GraphDescription) -> GraphDescription:
    """The graph's linear ops with their static weights, each fed by its own graph input of the same dims and
    writing its own graph output (so none waits on the others' inputs)."""
    by_name = {t.name: t for t in desc.tensors}
    tensors: dict[str, QnnTensorDesc] = {}
    nodes: list[QnnNodeDesc] = []
    inputs: list[str] = []
    outputs: list[str] = []
    for node in desc.nodes:
        if not is_linear(node, by_name):
            continue
        new_inputs = []
        for pos, name in enumerate(node.inputs):
            if by_name[name].kind == TensorKind.STATIC:
                tensors[name] = by_name[name]
                new_inputs.append(name)
            else:
                x = f"{node.name}.in{pos}"
                tensors[x] = by_name[name].model_copy(update={"name": x, "kind": TensorKind.APP_WRITE})
                inputs.append(x)
                new_inputs.append(x)
        y = f"{node.name}.out"
        tensors[y] = by_name[node.outputs[0]].model_copy(update={"name": y, "kind": TensorKind.APP_READ})
        outputs.append(y)
        nodes.append(node.model_copy(update={"inputs": new_inputs, "outputs": [y]}))
    return GraphDescription(inputs=inputs, outputs=outputs, tensors=list(tensors.values()), nodes=nodes)


def linear_ops_chained(desc: GraphDescription) -> GraphDescription:
    """The graph's linear ops wired as the graph wires them, with everything between them removed: each reads
    the output of the nearest linear op upstream of its data input (through the first non-static input of the
    nodes in between) when the dims agree, else its own graph input. Linear outputs no other linear op reads
    are the graph outputs. Qualcomm's prepare cost of the layer's dataflow, without any of our other nodes."""
    by_name = {t.name: t for t in desc.tensors}
    producer = {o: n for n in desc.nodes for o in n.outputs}

    def linear_source(tensor: str) -> QnnNodeDesc | None:
        seen: set[str] = set()
        while tensor in producer and tensor not in seen:
            seen.add(tensor)
            node = producer[tensor]
            if is_linear(node, by_name):
                return node
            data = [i for i in node.inputs if by_name[i].kind != TensorKind.STATIC]
            if not data:
                return None
            tensor = data[0]
        return None

    tensors: dict[str, QnnTensorDesc] = {}
    nodes: list[QnnNodeDesc] = []
    inputs: list[str] = []
    for node in desc.nodes:
        if not is_linear(node, by_name):
            continue
        new_inputs = []
        for pos, name in enumerate(node.inputs):
            t = by_name[name]
            if t.kind == TensorKind.STATIC:
                tensors[name] = t
                new_inputs.append(name)
                continue
            source = linear_source(name)
            if source is not None and by_name[source.outputs[0]].dims == t.dims:
                new_inputs.append(source.outputs[0])
                continue
            x = f"{node.name}.in{pos}"
            tensors[x] = t.model_copy(update={"name": x, "kind": TensorKind.APP_WRITE})
            inputs.append(x)
            new_inputs.append(x)
        y = node.outputs[0]
        tensors[y] = by_name[y].model_copy(update={"kind": TensorKind.NATIVE})
        nodes.append(node.model_copy(update={"inputs": new_inputs}))
    read = {i for n in nodes for i in n.inputs}
    outputs = [n.outputs[0] for n in nodes if n.outputs[0] not in read]
    for y in outputs:
        tensors[y] = tensors[y].model_copy(update={"kind": TensorKind.APP_READ})
    return GraphDescription(inputs=inputs, outputs=outputs, tensors=list(tensors.values()), nodes=nodes)


def compose_plugins(
    model_dir: Path,
    partition_dir: Path,
    arch: str,
    npu_weights: str,
    keep: Callable[[GraphDescription], GraphDescription] | None = linear_ops_alone,
) -> dict[str, Any]:
    """Per plugin of a built partition: seconds to compose, finalize and serialize one weight-shared context of its
    graphs (``keep``: what of each graph; the linear ops alone by default, None: the whole lowered graph), lowered in
    memory first and not timed, so only Qualcomm's part counts."""
    from mnnbuild.lowering.graph import compose_context
    from mnnbuild.manifests.fetch import FetchManifest
    from mnnbuild.manifests.partition import PartitionManifest, read_merge
    from mnnbuild.manifests.plugin import plugin_part
    from mnnbuild.model.targets import soc_for_arch
    from mnnbuild.plugin.lowered import PluginGraphs
    from mnnbuild.qnn import HtpTarget, QnnLibrary

    soc = soc_for_arch(arch)
    lib = QnnLibrary()
    target = HtpTarget(soc.soc_id, soc.arch_number, soc.vtcm_mb)
    part = plugin_part(FetchManifest.read(model_dir), PartitionManifest.read(partition_dir))
    results: dict[str, Any] = {}
    for binary, graphs in read_merge(partition_dir).items():
        lowered = PluginGraphs.of(model_dir, part, partition_dir, graphs, npu_weights)()
        floor = {name: (keep(desc) if keep else desc, statics) for name, (desc, statics) in lowered.items()}
        nodes = sum(len(desc.nodes) for desc, _ in floor.values())
        del lowered
        started = time.perf_counter()
        data = compose_context(lib, target, floor, weight_sharing=True)
        results[binary] = {"seconds": round(time.perf_counter() - started, 3), "nodes": nodes, "bytes": len(data)}
        sys.stderr.write(f"floor {binary}: {results[binary]}\n")
    return results
