"""Running a whole graph in segments of bounded weight gives MNN's whole-graph results, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mnnbuild.cpu import CpuRuntime, load_module, to_numpy, to_var
from mnnbuild.cpu.segments import plan_segments, run_segmented
from mnnbuild.mnn import load_model
from mnnbuild.mnn.summary import op_parameter_count
from mnnbuild.stages.io import make_inputs
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR

MODELS = [TINY_MODEL_DIR, FIXTURE_MODELS / "llama-int4-cw"]


@pytest.mark.parametrize("model_dir", MODELS, ids=lambda p: p.name)
def test_segments_cover_the_graph_within_the_budget(model_dir) -> None:
    model = load_model(model_dir / "llm.mnn")
    inputs, outputs = model.input_indexes, model.output_indexes
    heaviest = max(4 * op_parameter_count(op) for op in model.ops)
    budget = 64 << 10
    segments = plan_segments(model, inputs, outputs, budget)
    assert len(segments) > 3
    made: set[int] = set(inputs)
    for seg in segments:
        assert set(seg.inputs) <= made  # fed only what the graph inputs and earlier segments made
        made |= set(seg.outputs)
        weight = sum(4 * op_parameter_count(model.ops[i]) for i in seg.ops)
        assert weight <= max(budget, heaviest) or len(seg.ops) == 1
    assert set(outputs) <= made
    whole = plan_segments(model, inputs, outputs, 1 << 40)
    assert len(whole) == 1 and whole[0].inputs == sorted(inputs) and set(whole[0].outputs) == set(outputs)


@pytest.mark.parametrize("model_dir", MODELS, ids=lambda p: p.name)
def test_segmented_run_equals_the_whole_graph_bit_for_bit(model_dir) -> None:
    hidden = json.loads((model_dir / "llm_config.json").read_text())["hidden_size"]
    model = load_model(model_dir / "llm.mnn")
    names, outs = model.input_names, model.output_names
    samples = [{n: make_inputs(seq, hidden, 5)[n] for n in names} for seq in (1, 24)]
    rt = CpuRuntime().create(model_dir / "llm.mnn.weight")
    module = load_module(model_dir / "llm.mnn", rt)
    order = module.get_info()["outputNames"]
    whole = [
        dict(zip(order, (to_numpy(v) for v in module.forward([to_var(s[n]) for n in names])), strict=True))
        for s in samples
    ]
    segmented = run_segmented(model_dir / "llm.mnn", rt, model, samples, outs, budget=64 << 10)
    for want, got in zip(whole, segmented, strict=True):
        assert set(got) == set(outs)
        for n in outs:
            assert np.array_equal(to_numpy(got[n]), want[n]), n
