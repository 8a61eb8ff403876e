"""Running a whole graph in segments of bounded weight gives MNN's whole-graph results, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mnnbuild.cpu import CpuRuntime, load_module, return_freed_memory, to_numpy, to_var
from mnnbuild.cpu.segments import plan_segments, run_segmented
from mnnbuild.mnn import load_model
from mnnbuild.mnn.summary import op_parameter_count
from mnnbuild.samples.inputs import make_inputs
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


@pytest.mark.parametrize("model_dir", MODELS, ids=lambda p: p.name)
def test_thread_count_changes_no_value(model_dir) -> None:
    # CpuRuntime records 4 threads in the manifests and runs references on up to 4 (as many as there are cores);
    # the values must be the one-thread values bit for bit, or a reference would depend on the setting or the box
    hidden = json.loads((model_dir / "llm_config.json").read_text())["hidden_size"]
    model = load_model(model_dir / "llm.mnn")
    samples = [{n: make_inputs(seq, hidden, 3)[n] for n in model.input_names} for seq in (1, 24)]
    runs = {
        n: run_segmented(
            model_dir / "llm.mnn",
            CpuRuntime(num_thread=n).create(model_dir / "llm.mnn.weight", threads=n),  # n even past the cores
            model,
            samples,
            model.output_names,
        )
        for n in (1, CpuRuntime().num_thread)
    }
    assert CpuRuntime().num_thread > 1
    for one, many in zip(*runs.values(), strict=True):
        for name in model.output_names:
            assert np.array_equal(to_numpy(one[name]), to_numpy(many[name])), name


def test_a_zero_dim_array_is_a_scalar_var() -> None:
    # numpy's ascontiguousarray makes a 0-d array 1-d: a folded scalar fed as [1] made a Gather add an axis
    for value in (np.array(3, dtype=np.int32), np.array(2.5, dtype=np.float32)):
        var = to_var(value)
        assert var.shape == [] and to_numpy(var).shape == () and to_numpy(var) == value
    assert to_var(np.zeros((1,), dtype=np.int32)).shape == [1]


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_freed_heap_memory_goes_back_to_the_os() -> None:
    """What MNN frees stays in glibc's heap (at Qwen3-1.7B size 1.1 GB through verify's simulator pass) until
    :func:`return_freed_memory`; here 200 MB of 100 KB blocks, every 20th kept so the heap cannot shrink by itself."""
    blocks = [np.ones(100_000 // 8) for _ in range(2000)]
    kept = blocks[::20]
    del blocks
    held = _rss_bytes()
    return_freed_memory()
    assert _rss_bytes() < held - 100_000_000
    assert len(kept) == 100


@pytest.mark.parametrize("budget", [1 << 40, 64 << 10], ids=["one segment", "several segments"])
def test_samples_are_made_when_needed_and_given_back_when_done(tmp_path, budget: int) -> None:
    """iter_segmented makes each sample when its first segment runs and yields its outputs when its last one ran:
    with one segment the next sample is made only after the previous one was given back (io writes it, so one
    sample is in memory at a time); with several, what crosses a cut waits on disk (spill_dir), and the outputs are
    still the whole graph's, bit for bit."""
    from mnnbuild.cpu.segments import iter_segmented

    model_dir = TINY_MODEL_DIR
    model = load_model(model_dir / "llm.mnn")
    names, outs = model.input_names, model.output_names
    seqs = (1, 24, 7)
    rt = CpuRuntime().create(model_dir / "llm.mnn.weight")
    events: list[str] = []

    def sample(i: int) -> dict[str, np.ndarray]:
        events.append(f"make {i}")
        return {n: make_inputs(seqs[i], 128, 5)[n] for n in names}

    spill = tmp_path / "spill"
    spill.mkdir()
    got = {}
    for i, res in iter_segmented(model_dir / "llm.mnn", rt, model, 3, sample, outs, budget, spill_dir=spill):
        events.append(f"done {i}")
        got[i] = {n: to_numpy(v) for n, v in res.items()}
    if budget == 1 << 40:
        assert events == ["make 0", "done 0", "make 1", "done 1", "make 2", "done 2"]
    else:
        assert events == ["make 0", "make 1", "make 2", "done 0", "done 1", "done 2"]
    assert list(spill.iterdir()) == [], "spilled values are removed once mapped"
    whole = run_segmented(model_dir / "llm.mnn", rt, model, [sample(i) for i in range(3)], outs)
    for i in range(3):
        for n in outs:
            assert np.array_equal(got[i][n], to_numpy(whole[i][n])), (i, n)
