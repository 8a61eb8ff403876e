"""mnn.split: a Convolution split by output channels computes what it did, bit for bit, in MNN."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from mnnbuild.base.errors import MNNFormatError
from mnnbuild.mnn import MnnModel, load_model, save_model
from mnnbuild.mnn.split import conv_parameters, split_bounds, split_convolution, unsplittable
from mnnbuild.mnn.weights import WeightFile, conv_ops, decode_conv
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR
from tests.lowering_check import mnn_run

# llmexport's layouts the split must keep: asymmetric int4 block scales (tiny), int8 block 32, channel-wise int4
MODELS = {
    "tiny-qwen3": TINY_MODEL_DIR,
    "qwen3-untied-int8-b32": FIXTURE_MODELS / "qwen3-untied-int8-b32",
    "llama-int4-cw": FIXTURE_MODELS / "llama-int4-cw",
}


def biggest_conv(model: MnnModel) -> int:
    return model.ops.index(max(conv_ops(model), key=conv_parameters))


def test_split_bounds_cover_the_channels_in_aligned_steps() -> None:
    assert split_bounds(151936, 2) == [0, 75968, 151936]
    bounds = split_bounds(1000, 3)
    assert bounds[0] == 0 and bounds[-1] == 1000 and len(bounds) == 4
    assert all(b % 32 == 0 for b in bounds[1:-1])


@pytest.mark.parametrize("name", MODELS)
def test_parts_decode_to_the_rows_of_the_original(name: str) -> None:
    model = load_model(MODELS[name] / "llm.mnn")
    index = biggest_conv(model)
    with WeightFile(MODELS[name] / "llm.mnn.weight") as weights:
        whole = decode_conv(model.ops[index], weights)
        out = int(model.ops[index].main.common.outputCount)
        bounds = split_bounds(out, 3)
        new = split_convolution(model, index, bounds, weights)
    parts = [decode_conv(model.ops[i], None) for i in new[:-1]]  # inline: no weight file needed
    assert [p.weight.shape[0] for p in parts] == [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    assert np.array_equal(np.concatenate([p.weight for p in parts]), whole.weight)
    assert np.array_equal(np.concatenate([p.bias for p in parts]), whole.bias)
    assert all(p.quant.bits == whole.quant.bits and p.quant.symmetric == whole.quant.symmetric for p in parts)
    concat = model.ops[new[-1]]
    assert concat.type == "Concat" and concat.outputs == whole_outputs(MODELS[name], index)


def whole_outputs(model_dir: Path, index: int) -> list[int]:
    return load_model(model_dir / "llm.mnn").ops[index].outputs


@pytest.mark.parametrize("name", MODELS)
def test_split_model_computes_the_same_logits_bit_for_bit(name: str, tmp_path: Path) -> None:
    model_dir = MODELS[name]
    model = load_model(model_dir / "llm.mnn")
    index = biggest_conv(model)
    norm = model.ops[index - 3]  # final norm, pre-reshape, pre-convert, lm_head: what llmexport writes
    feed_name = model.tensor_names[norm.inputs[0]]
    hidden = int(model.ops[index].main.common.inputCount)
    with WeightFile(model_dir / "llm.mnn.weight") as weights:
        split_convolution(model, index, split_bounds(int(model.ops[index].main.common.outputCount), 2), weights)
    save_model(model, tmp_path / "llm.mnn")
    x = np.random.default_rng(3).standard_normal((1, 5, hidden)).astype(np.float32)
    want = mnn_run(model_dir / "llm.mnn", model_dir / "llm.mnn.weight", {feed_name: x}, ["logits"])["logits"]
    got = mnn_run(tmp_path / "llm.mnn", model_dir / "llm.mnn.weight", {feed_name: x}, ["logits"])["logits"]
    assert got.shape == want.shape and np.array_equal(got, want)


def test_bad_bounds_and_non_convolutions_are_refused() -> None:
    model = load_model(TINY_MODEL_DIR / "llm.mnn")
    index = biggest_conv(model)
    with WeightFile(TINY_MODEL_DIR / "llm.mnn.weight") as weights:
        with pytest.raises(ValueError, match="do not split"):
            split_convolution(model, index, [0, 1024], weights)
        with pytest.raises(ValueError, match="do not split"):
            split_convolution(model, index, [0, 600, 500, 1024], weights)
        with pytest.raises(MNNFormatError, match="not a one-output Convolution"):
            split_convolution(model, index - 1, [0, 1, 2], weights)
    float_conv = copy.deepcopy(model.ops[index])
    float_conv.main.quanParameter = None
    assert unsplittable(model.ops[index]) is None and "IDST" in str(unsplittable(float_conv))
