"""Qualcomm's floor for a plugin: the prepare cost of its linear ops alone, which no lowering can avoid.

One definition for every benchmark that reports a ratio to the floor (bench_prepare, bench_scale).
"""

from __future__ import annotations

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
