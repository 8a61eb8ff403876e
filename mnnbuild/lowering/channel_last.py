"""Channel-last layout for lowered graphs: the rewrite that makes the HTP prepare them fast.

QNN reads a rank-4 tensor as NHWC, so MNN's ``[N, C, 1, 1]`` (how MNN feeds and leaves a 1×1 convolution)
is a tensor with ``C = 1`` on the HTP. Every op on such a tensor — and every Reshape into or out of it —
is laid out along the channel axis of width 1, which the HTP prepares (and probably runs) an order of
magnitude slower than the same op on ``[1, 1, N, C]``. The lowering emits one op at a time in MNN's
logical shapes, so a lowered layer is full of them: ``Conv2d → Reshape [N,C,1,1] → Reshape → Reshape
[1,N,C]`` around every linear layer, and SiLU's Sigmoid and multiplies on ``[N, C, 1, 1]``.

:func:`channel_last` rewrites a graph description without changing a byte of any tensor's content (a
Reshape in QNN keeps the elements in C order, and so does every rewrite here):

0. a rank-4 graph input or output ending in 1s is declared with them in front, and a Reshape
   to or from MNN's dims stands in for it inside, which steps 1-3 then dissolve.
1. a Reshape of a Reshape reads the first one's input instead (chains collapse into one Reshape);
2. element-wise islands (element-wise ops and the tensors between them) whose tensors all end in 1s are
   re-laid-out with those trailing 1s moved to the front (``[N, C, 1, 1] → [1, 1, N, C]``), the same
   rotation for every tensor of the island, so broadcasting still pairs the same axes;
3. Reshapes whose input and output now have the same dims disappear (into a graph output: its source's
   producer writes the output), and so do nodes and tensors nothing reads.

Step 0 is the one that matters most at real size: a layer plugin is fed the attention output as MNN's
``[128, 2048, 1, 1]``; reshaped inside the graph, that one input made the HTP prepare the prefill graph of
Qwen3-1.7B's o_proj + MLP many times slower than when the input is declared ``[1, 1, 128, 2048]``
(docs/benchmarks.md has the numbers). Moving 1s does not move an element, so the plugin's buffers are
the same bytes either way: MNN's QNN plugin binds each input and output by name to the MNN tensor's
dense buffer (the Plugin op's ``allInputShape`` keeps MNN's dims, which is what the engine matches),
and the runtime compares the two by ``mnnbuild.qnn.same_element_order``. Names are kept, static tensors keep
their data (a static whose dims change gets a new name, so the decode and prefill graphs of one
weight-shared context never hold two dims under one name).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from mnnbuild.lowering.graph import (
    GraphDescription,
    QnnNodeDesc,
    QnnTensorDesc,
    TensorKind,
    quant_key,
    raw_file_name,
)

# Ops that work element by element (with broadcasting over equal-rank operands) and have no parameter
# that names an axis: their result does not depend on how the elements are grouped into dims.
ELEMENTWISE_OPS = frozenset(
    {
        "ElementWiseAdd",
        "ElementWiseSubtract",
        "ElementWiseMultiply",
        "ElementWiseDivide",
        "ElementWiseMaximum",
        "ElementWiseMinimum",
        "ElementWisePower",
        "ElementWiseSquaredDifference",
        "ElementWiseNeg",
        "ElementWiseSin",
        "ElementWiseCos",
        "ElementWiseExp",
        "ElementWiseLog",
        "ElementWiseSquareRoot",
        "ElementWiseRsqrt",
        "ElementWiseAbs",
        "ElementWiseFloor",
        "ElementWiseCeil",
        "ElementWiseSign",
        "ElementWiseUnary",
        "Sigmoid",
        "Tanh",
        "Gelu",
        "Relu",
        "ReluMinMax",
        "Cast",
    }
)


def _trailing_ones(dims: list[int]) -> int:
    n = 0
    for d in reversed(dims):
        if d != 1:
            break
        n += 1
    return n


def _rotated(dims: list[int], k: int) -> list[int]:
    """``dims`` with its last ``k`` axes (all 1) moved to the front."""
    return dims[len(dims) - k :] + dims[: len(dims) - k]


class _Graph:
    """Mutable working copy of a description: tensors by name, nodes in order, producers/consumers."""

    def __init__(self, desc: GraphDescription) -> None:
        self.inputs = list(desc.inputs)
        self.outputs = list(desc.outputs)
        self.tensors: dict[str, QnnTensorDesc] = {t.name: t for t in desc.tensors}
        self.nodes: list[QnnNodeDesc] = list(desc.nodes)

    def producers(self) -> dict[str, int]:
        return {o: i for i, n in enumerate(self.nodes) for o in n.outputs}

    def consumers(self) -> dict[str, list[int]]:
        uses: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for name in n.inputs:
                uses.setdefault(name, []).append(i)
        return uses

    def replace_input(self, index: int, old: str, new: str) -> None:
        node = self.nodes[index]
        self.nodes[index] = node.model_copy(update={"inputs": [new if n == old else n for n in node.inputs]})

    def description(self) -> GraphDescription:
        used = {n for node in self.nodes for n in (*node.inputs, *node.outputs)} | set(self.inputs) | set(self.outputs)
        return GraphDescription(
            inputs=self.inputs,
            outputs=self.outputs,
            tensors=[t for t in self.tensors.values() if t.name in used],
            nodes=self.nodes,
        )


def _rotate_boundary(g: _Graph) -> None:
    """Declare rank-4 graph inputs/outputs ending in 1s with the 1s in front; a Reshape to (from) MNN's dims
    inside stands in for the tensor, for the later steps to dissolve."""
    head: list[QnnNodeDesc] = []
    tail: list[QnnNodeDesc] = []
    for name in [*g.inputs, *g.outputs]:
        t = g.tensors[name]
        k = _trailing_ones(t.dims) if len(t.dims) == 4 else 0
        if k == 0 or k == 4:
            continue
        inner = f"{name}.mnn"
        g.tensors[inner] = t.model_copy(update={"name": inner, "kind": TensorKind.NATIVE})
        g.tensors[name] = t.model_copy(update={"dims": _rotated(t.dims, k)})
        g.nodes = [
            n.model_copy(
                update={
                    "inputs": [inner if i == name else i for i in n.inputs],
                    "outputs": [inner if o == name else o for o in n.outputs],
                }
            )
            for n in g.nodes
        ]
        if t.kind == TensorKind.APP_WRITE:
            head.append(QnnNodeDesc(name=f"{name}.rotate", type="Reshape", inputs=[name], outputs=[inner]))
        else:
            tail.append(QnnNodeDesc(name=f"{name}.rotate", type="Reshape", inputs=[inner], outputs=[name]))
    g.nodes = [*head, *g.nodes, *tail]


def _collapse_reshape_chains(g: _Graph) -> None:
    producers = g.producers()
    for i, node in enumerate(g.nodes):
        if node.type != "Reshape":
            continue
        src = node.inputs[0]
        while g.tensors[src].kind in (TensorKind.NATIVE, TensorKind.APP_READ) and src in producers:
            before = g.nodes[producers[src]]
            if before.type != "Reshape":
                break
            src = before.inputs[0]
        if src != node.inputs[0]:
            g.replace_input(i, node.inputs[0], src)


def _islands(g: _Graph) -> list[set[str]]:
    """Connected sets of NATIVE tensors joined by element-wise nodes (inputs and outputs of one node)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for node in g.nodes:
        if node.type not in ELEMENTWISE_OPS:
            continue
        names = [n for n in (*node.inputs, *node.outputs) if g.tensors[n].kind != TensorKind.STATIC]
        for a in names[1:]:
            parent[find(a)] = find(names[0])
    groups: dict[str, set[str]] = {}
    for name in parent:
        groups.setdefault(find(name), set()).add(name)
    return list(groups.values())


def _relayout_islands(g: _Graph, statics: dict[str, np.ndarray]) -> None:
    producers, consumers = g.producers(), g.consumers()
    for island in _islands(g):
        dims = [g.tensors[n].dims for n in island]
        if any(g.tensors[n].kind != TensorKind.NATIVE for n in island) or any(len(d) != 4 for d in dims):
            continue
        k = min(_trailing_ones(d) for d in dims)
        if k == 0 or all(d[: 4 - k] == [1] * (4 - k) for d in dims):
            continue  # nothing to gain: no trailing 1s, or every tensor is all 1s
        # every node touching the island must be element-wise (rotated with it) or a Reshape (indifferent)
        touching = {producers[n] for n in island if n in producers} | {i for n in island for i in consumers.get(n, [])}
        if any(g.nodes[i].type not in ELEMENTWISE_OPS | {"Reshape"} for i in touching):
            continue
        for name in island:
            g.tensors[name] = g.tensors[name].model_copy(update={"dims": _rotated(g.tensors[name].dims, k)})
        for i in sorted(touching):
            node = g.nodes[i]
            if node.type == "Reshape":
                continue
            for name in node.inputs:
                t = g.tensors[name]
                if t.kind == TensorKind.STATIC and len(t.dims) == 4 and _trailing_ones(t.dims) >= k:
                    g.replace_input(i, name, _rotated_static(g, statics, t, k))


def _rotated_static(g: _Graph, statics: dict[str, np.ndarray], t: QnnTensorDesc, k: int) -> str:
    dims = _rotated(t.dims, k)
    if dims == t.dims:
        return t.name
    name = f"{t.name}.r{'x'.join(str(d) for d in dims)}"
    if name not in g.tensors:
        g.tensors[name] = t.model_copy(update={"name": name, "dims": dims, "raw": raw_file_name(name)})
        statics[name] = statics[t.name].reshape(dims)
    return name


def _drop_identity_reshapes(g: _Graph) -> None:
    keep: list[QnnNodeDesc] = []
    alias: dict[str, str] = {}
    for node in g.nodes:
        node = node.model_copy(update={"inputs": [alias.get(n, n) for n in node.inputs]})
        src, dst = (node.inputs[0], node.outputs[0]) if node.type == "Reshape" else ("", "")
        if dst and g.tensors[dst].kind == TensorKind.NATIVE and g.tensors[src].dims == g.tensors[dst].dims:
            alias[dst] = src
            continue
        keep.append(node)
    g.nodes = keep


def _write_outputs_directly(g: _Graph) -> None:
    """An identity Reshape into a graph output goes: its source's producer writes the output itself."""
    producers, consumers = g.producers(), g.consumers()
    rename: dict[str, str] = {}
    for node in g.nodes:
        if node.type != "Reshape" or g.tensors[node.outputs[0]].kind != TensorKind.APP_READ:
            continue
        src, dst = node.inputs[0], node.outputs[0]
        if (
            g.tensors[src].kind == TensorKind.NATIVE
            and g.tensors[src].dims == g.tensors[dst].dims
            and src in producers
            and consumers.get(src) == [g.nodes.index(node)]
        ):
            rename[src] = dst
    if rename:
        g.nodes = [
            n.model_copy(update={"outputs": [rename.get(o, o) for o in n.outputs]})
            for n in g.nodes
            if not (n.type == "Reshape" and n.inputs[0] in rename)
        ]


def _drop_dead_nodes(g: _Graph) -> None:
    while True:
        used = {n for node in g.nodes for n in node.inputs} | set(g.outputs)
        alive = [n for n in g.nodes if any(o in used or g.tensors[o].kind != TensorKind.NATIVE for o in n.outputs)]
        if len(alive) == len(g.nodes):
            return
        g.nodes = alive


def channel_last(
    desc: GraphDescription, statics: Mapping[str, np.ndarray]
) -> tuple[GraphDescription, dict[str, np.ndarray]]:
    """``desc`` rewritten so its activations stay channel-last (see the module doc); same results, the same
    boundary tensors in the same element order. Returns the new description and its static data (unused
    statics dropped, rotated ones added)."""
    g = _Graph(desc)
    data = dict(statics)
    _rotate_boundary(g)
    _collapse_reshape_chains(g)
    _relayout_islands(g, data)
    _drop_identity_reshapes(g)
    _drop_dead_nodes(g)
    _write_outputs_directly(g)
    out = g.description()
    names = {t.name for t in out.static_tensors}
    names |= {quant_key(t.name) for t in out.static_tensors if t.quant is not None}
    return out.model_copy(update={"weights": desc.weights}), {n: a for n, a in data.items() if n in names}
