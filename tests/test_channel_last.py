"""The channel-last layout pass: what it rewrites, what it must leave alone, and that results do not move.

Whole lowered layers are checked against MNN in ``test_lowering.py`` (the pass runs inside
``lower_subgraph``); here small hand-made graphs pin down each rule, and one lowered tiny layer shows the
property the pass exists for: no activation inside a graph is laid out with QNN channel 1.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from mnnbuild.lowering.channel_last import channel_last
from mnnbuild.lowering.context import tensor_param
from mnnbuild.lowering.graph import GraphDescription, QnnNodeDesc, QnnTensorDesc, TensorKind, raw_file_name
from mnnbuild.lowering.lower import LoweredGraph, lower_subgraph
from mnnbuild.mnn import load_model
from mnnbuild.qnn import QnnLibrary, same_element_order
from tests.lowering_check import simulate

from .test_lowering import MODEL_FILE, WEIGHT_FILE, _layer_ops, _tiny_info, op_boundary


@pytest.fixture(scope="module")
def lib() -> QnnLibrary:
    logging.getLogger("mnnbuild.qnn.lib").setLevel(logging.ERROR)
    return QnnLibrary()


def _t(name: str, kind: str, dims: list[int]) -> QnnTensorDesc:
    raw = raw_file_name(name) if kind == "STATIC" else None
    return QnnTensorDesc(name=name, kind=TensorKind(kind), dims=dims, raw=raw)


def _n(name: str, kind: str, inputs: list[str], outputs: list[str]) -> QnnNodeDesc:
    return QnnNodeDesc(name=name, type=kind, inputs=inputs, outputs=outputs)


def _silu_mlp_tail(seq: int, c: int, transpose: bool = False) -> tuple[GraphDescription, dict[str, np.ndarray]]:
    """What a lowered MLP looks like around SiLU: channel-last conv outputs reshaped to MNN's
    [seq, C, 1, 1], Sigmoid and multiplies there (one by a broadcast static), a Reshape chain out."""
    tensors = [
        _t("gate", "APP_WRITE", [1, 1, seq, c]),
        _t("up", "APP_WRITE", [1, 1, seq, c]),
        _t("g4", "NATIVE", [seq, c, 1, 1]),
        _t("u4", "NATIVE", [seq, c, 1, 1]),
        _t("sig", "NATIVE", [seq, c, 1, 1]),
        _t("silu", "NATIVE", [seq, c, 1, 1]),
        _t("scale", "STATIC", [1, c, 1, 1]),
        _t("act", "NATIVE", [seq, c, 1, 1]),
        _t("act2", "NATIVE", [seq, c, 1, 1]),
        _t("y", "APP_READ", [1, seq, c]),
    ]
    nodes = [
        _n("r_gate", "Reshape", ["gate"], ["g4"]),
        _n("r_up", "Reshape", ["up"], ["u4"]),
        _n("sigmoid", "Sigmoid", ["g4"], ["sig"]),
        _n("silu", "ElementWiseMultiply", ["g4", "sig"], ["silu"]),
        _n("scaled", "ElementWiseMultiply", ["silu", "scale"], ["act"]),
        _n("mul", "ElementWiseMultiply", ["act", "u4"], ["act2"]),
    ]
    if transpose:  # a consumer that reads the layout: the island must stay as it is
        tensors.append(_t("moved", "NATIVE", [c, seq, 1, 1]))
        tensors[-2] = _t("y", "APP_READ", [1, c, seq])
        nodes += [
            QnnNodeDesc(
                name="perm",
                type="Transpose",
                inputs=["act2"],
                outputs=["moved"],
                params=[tensor_param([1, 0, 2, 3]).model_copy(update={"name": "perm"})],
            ),
            _n("r_out", "Reshape", ["moved"], ["y"]),
        ]
    else:
        tensors.append(_t("act3", "NATIVE", [seq, c, 1, 1]))
        nodes += [_n("r_mid", "Reshape", ["act2"], ["act3"]), _n("r_out", "Reshape", ["act3"], ["y"])]
    rng = np.random.default_rng(0)
    statics = {"scale": rng.uniform(0.5, 1.5, (1, c, 1, 1)).astype(np.float32)}
    return GraphDescription(inputs=["gate", "up"], outputs=["y"], tensors=tensors, nodes=nodes), statics


def test_elementwise_island_moves_to_channel_last_and_reshape_chains_collapse() -> None:
    desc, statics = _silu_mlp_tail(16, 64)
    out, data = channel_last(desc, statics)
    dims = {t.name: t.dims for t in out.tensors}
    # the island is [1, 1, seq, C] now; the identity Reshapes into it and the chain out of it are gone
    assert [n.type for n in out.nodes] == ["Sigmoid"] + ["ElementWiseMultiply"] * 3 + ["Reshape"]
    assert dims["sig"] == dims["silu"] == dims["act"] == dims["act2"] == [1, 1, 16, 64]
    assert out.nodes[0].inputs == ["gate"] and out.nodes[-1].inputs == ["act2"]
    # boundary as it was; the broadcast static re-laid-out under a new name, same bytes
    assert (out.inputs, out.outputs, dims["gate"], dims["y"]) == (["gate", "up"], ["y"], [1, 1, 16, 64], [1, 16, 64])
    (scale,) = (t for t in out.static_tensors)
    assert scale.name != "scale" and scale.dims == [1, 1, 1, 64] and set(data) == {scale.name}
    assert data[scale.name].tobytes() == statics["scale"].tobytes()
    # a second pass has nothing left to do
    again, _ = channel_last(out, data)
    assert again == out


def test_island_read_by_a_layout_dependent_op_is_left_alone() -> None:
    desc, statics = _silu_mlp_tail(16, 64, transpose=True)
    out, data = channel_last(desc, statics)
    assert {t.name: t.dims for t in out.tensors}["act2"] == [16, 64, 1, 1]
    assert "Transpose" in [n.type for n in out.nodes] and set(data) == {"scale"}


@pytest.mark.parametrize("transpose", [False, True], ids=["rewritten", "left-alone"])
def test_rewritten_graph_computes_the_same_in_the_simulator(lib: QnnLibrary, transpose: bool) -> None:
    seq, c = 8, 32
    desc, statics = _silu_mlp_tail(seq, c, transpose)
    rng = np.random.default_rng(1)
    feed = {n: rng.normal(size=(1, 1, seq, c)).astype(np.float32) for n in ("gate", "up")}
    g, u = (feed[n].reshape(seq, c, 1, 1) for n in ("gate", "up"))
    ref = g / (1 + np.exp(-g)) * statics["scale"] * u
    ref = ref.transpose(1, 0, 2, 3) if transpose else ref
    got = simulate(lib, LoweredGraph(*channel_last(desc, statics)), feed)["y"]
    # fp16 on the HTP: the lowering tests' tolerance
    assert np.allclose(got.ravel(), ref.ravel(), rtol=0.02, atol=0.02 * np.abs(ref).max())


def test_lowered_tiny_layer_has_no_channel_one_activation() -> None:
    """The decoder layer of the tiny model (prefill): inside the graph no rank-4 activation ends in a 1
    (QNN channel 1) and no Reshape reads a Reshape; the boundary holds MNN's tensors in channel-last dims."""
    tiny = load_model(MODEL_FILE)
    ops = _layer_ops(tiny)
    inputs, outputs = op_boundary(tiny, ops)
    info = _tiny_info(tiny, 8)
    desc = lower_subgraph(tiny, WEIGHT_FILE, ops, info, inputs, outputs).description
    by_name = {t.name: t for t in desc.tensors}
    channel_one = [
        t.name
        for t in desc.tensors
        if t.kind == TensorKind.NATIVE and len(t.dims) == 4 and t.dims[-1] == 1 and int(np.prod(t.dims)) > 1
    ]
    assert channel_one == []
    producers = {o: n for n in desc.nodes for o in n.outputs}
    chained = [
        n.name
        for n in desc.nodes
        if n.type == "Reshape" and getattr(producers.get(n.inputs[0]), "type", "") == "Reshape"
    ]
    assert chained == []
    # the boundary holds MNN's tensors element for element; a rank-4 one has its trailing 1s in front
    for names, tensors in ((desc.inputs, inputs), (desc.outputs, outputs)):
        for name, t in zip(names, tensors, strict=True):
            dims, mnn = by_name[name].dims, list(info[t].shape)
            assert same_element_order(dims, mnn) and int(np.prod(dims)) == int(np.prod(mnn)), (name, dims, mnn)
            assert not (len(dims) == 4 and dims[-1] == 1 and int(np.prod(dims)) > 1), (name, dims)


def _boundary_in_mnn_dims(seq: int, c: int) -> GraphDescription:
    """A plugin fed and read in MNN's [seq, C, 1, 1] (the attention output into o_proj), channel-last inside."""
    tensors = [
        _t("x", "APP_WRITE", [seq, c, 1, 1]),
        _t("x4", "NATIVE", [1, 1, seq, c]),
        _t("s", "NATIVE", [1, 1, seq, c]),
        _t("y", "APP_READ", [seq, c, 1, 1]),
    ]
    nodes = [
        _n("in", "Reshape", ["x"], ["x4"]),
        _n("sig", "Sigmoid", ["x4"], ["s"]),
        _n("out", "Reshape", ["s"], ["y"]),
    ]
    return GraphDescription(inputs=["x"], outputs=["y"], tensors=tensors, nodes=nodes)


def test_boundary_ending_in_ones_is_declared_channel_last(lib: QnnLibrary) -> None:
    """MNN's [seq, C, 1, 1] at the boundary is declared [1, 1, seq, C] (the same bytes): the Reshapes that
    turned it channel-last inside disappear (at Qwen3-1.7B size, that Reshape made a prefill graph 20x slower
    to prepare), and the simulator computes the same from the same buffers."""
    seq, c = 8, 32
    out, _ = channel_last(_boundary_in_mnn_dims(seq, c), {})
    dims = {t.name: t.dims for t in out.tensors}
    assert (out.inputs, out.outputs) == (["x"], ["y"])
    assert dims["x"] == dims["y"] == [1, 1, seq, c]
    assert [n.type for n in out.nodes] == ["Sigmoid"] and out.nodes[0].inputs == ["x"]
    assert channel_last(out, {})[0] == out  # nothing left to do
    x = np.random.default_rng(2).normal(size=(seq, c, 1, 1)).astype(np.float32)
    got = simulate(lib, LoweredGraph(out, {}), {"x": x.reshape(1, 1, seq, c)})["y"]
    ref = 1 / (1 + np.exp(-x))
    assert np.allclose(got.reshape(x.shape), ref, rtol=0.02, atol=0.02)


def test_same_element_order_only_moves_ones() -> None:
    assert same_element_order([128, 2048, 1, 1], [1, 1, 128, 2048])
    assert same_element_order([1, 2048], [2048, 1, 1, 1])
    assert not same_element_order([2048, 128, 1, 1], [1, 1, 128, 2048])  # a transpose, not a move of 1s
    assert not same_element_order([128, 2048], [128, 1024])
