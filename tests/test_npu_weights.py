"""Spec field ``npu_weights``: the model's own quantized weights in the context binaries (issue 26).

One doit build (verify included) of the shipped tiny model (asymmetric int4, block 64) and the int8 and
channel-wise fixtures with ``npu_weights = "int4"``, and of the tiny model with the field spelled ``"float16"``:
each int4 bundle verifies with verify's own tolerances, stores what the mapping says for its codes, and is smaller
by what those codes save; ``"float16"`` is today's binaries byte for byte."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mnnbuild.base.fsutil import sha256_file
from mnnbuild.lowering.quantized import SUM_DIGITS, fold_block_sums, folded_layout, npu_weight, sum_levels
from mnnbuild.mnn import WeightFile, conv_ops, decode_conv, load_model
from tests.conftest import FIXTURE_MODELS, TINY_MODEL_DIR, doit

ARCH = "v79"
MODELS = {
    # spec name -> (model dir, npu_weights, the encoding its convs get, exact)
    "tiny-int4": (TINY_MODEL_DIR, "int4", "block", True),
    "cw-int4": (FIXTURE_MODELS / "llama-int4-cw", "int4", "bw_axis_scale_offset", True),
    "int8-int4": (FIXTURE_MODELS / "qwen3-untied-int8-b32", "int4", "bw_float_block", True),
    "tiny-f16": (TINY_MODEL_DIR, "float16", "float16", True),
}


FLOAT16_FIXTURES = {"llama-int4-cw": "cw-f16", "qwen3-untied-int8-b32": "int8-f16"}
"""The fixtures built without the field too (their contexts only), for the size comparison."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Artifacts of ``doit verify`` of every int4 spec of MODELS, and of the float16 contexts and twins of
    ``tiny-f16`` and of the shipped tiny-qwen3 (no field), and the fixtures' float16 contexts."""
    root = tmp_path_factory.mktemp("npu-weights")
    specs = root / "specs"
    specs.mkdir()
    fields = {name: (model_dir, f"npu_weights = {mode!r}\n") for name, (model_dir, mode, _, _) in MODELS.items()}
    fields |= {name: (FIXTURE_MODELS / fixture, "") for fixture, name in FLOAT16_FIXTURES.items()}
    for name, (model_dir, field) in fields.items():
        (specs / f"{name}.toml").write_text(
            f"name = {name!r}\nsource = {{ local = {str(model_dir)!r} }}\nchunk_size = 128\n"
            f"targets = [{ARCH!r}]\n{field}"
        )
    # one doit per bundle verified (each well inside the helper's timeout on a loaded box), then the float16 builds
    float16 = [f"{stage}:{name}-{ARCH}" for name in ("tiny-f16", "tiny-qwen3") for stage in ("context", "twin")]
    float16 += [f"context:{name}-{ARCH}" for name in FLOAT16_FIXTURES.values()]
    runs = [[f"verify:{name}-{ARCH}"] for name, spec in MODELS.items() if spec[1] != "float16"] + [float16]
    for tasks in runs:
        proc = doit(root, *tasks, env={"MNNBUILD_MODELS_PATH": str(specs)})
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return root / "artifacts"


def _manifests(artifacts: Path, model: str, stage: str) -> dict[str, dict[str, Any]]:
    return {
        p.parent.name: json.loads(p.read_text())
        for p in sorted((artifacts / model / ARCH / stage).glob(f"*/{stage}.manifest.json"))
    }


def _binaries(artifacts: Path, model: str) -> dict[str, Path]:
    return {p.name: p for p in sorted((artifacts / model / ARCH / "context").glob("*/qnn/*.bin"))}


@pytest.mark.slow
@pytest.mark.parametrize("model", list(MODELS))
def test_bundle_verifies_with_its_weights_encoded_as_mapped(built: Path, model: str) -> None:
    _, mode, encoding, exact = MODELS[model]
    if mode != "float16":
        report = json.loads((built / model / ARCH / "verify" / "verify.json").read_text())
        assert report["passed"] is True
    contexts, twins = _manifests(built, model, "context"), _manifests(built, model, "twin")
    assert contexts and set(contexts) == set(twins)
    for plugin, manifest in contexts.items():
        assert manifest["params"]["npu_weights"] == mode
        notes = manifest["weights"]
        assert notes and {n["encoding"] for n in notes} == {encoding}, plugin
        assert all(n["exact"] == exact for n in notes)
        # the twin verify ran stores the very weights the shipped binary does
        assert twins[plugin]["weights"] == notes
        # the model's codes: nothing requantized; folded block sums (centered asymmetric codes) miss at most half
        # their last base-14 digit's step: below 14**-4 of the largest weight
        assert all(n["error"] == 0 or (n["centered"] and 0 < n["error"] < 14.0**-4) for n in notes)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-int4", "cw-int4", "int8-int4"])
def test_int4_bundle_is_smaller_by_what_its_codes_save(built: Path, model: str) -> None:
    """Every plugin's binary is smaller, and all of them together by the fp16 bytes of their weights minus the stored
    codes (4 or 8 bits each) and minus the fp16 weights of the convs that center prefill's inputs (read from the
    model-lib's graphs); the scales and the binaries' 4 KB granularity take the rest."""
    from mnnbuild.lowering.graph import read_graph_description

    source = MODELS[model][0]
    f16 = {p: path.stat().st_size for p, path in _binaries(built, _float16_of(source)).items()}
    quantized = {p: path.stat().st_size for p, path in _binaries(built, model).items()}
    assert set(f16) == set(quantized)
    assert all(quantized[p] < f16[p] for p in f16), (f16, quantized)
    notes = [n for m in _manifests(built, model, "context").values() for n in m["weights"]]
    expected = sum(n["weights"] * 2 - (n["weights"] + n["folded"]) * n["bitwidth"] // 8 for n in notes)
    proc = doit(built.parent, f"modellib:{model}", env={"MNNBUILD_MODELS_PATH": str(built.parent / "specs")})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    centering: dict[tuple[str, str], int] = {}  # one copy per plugin (its graphs share a static by name)
    for graph in (built / model / "modellib" / "qnn").iterdir():
        plugin = graph.name.replace("graphllm1_", "graphllm", 1)
        for t in read_graph_description(graph).static_tensors:
            if t.name.startswith(("block_center.", "block_mean.")):
                centering[(plugin, t.name)] = int(np.prod(t.dims)) * t.raw_dtype.itemsize
    expected -= sum(centering.values())
    saved = sum(f16.values()) - sum(quantized.values())
    assert 0.75 * expected <= saved <= 1.1 * expected, (f16, quantized, expected)


def _float16_of(source: Path) -> str:
    return "tiny-qwen3" if source == TINY_MODEL_DIR else FLOAT16_FIXTURES[source.name]


@pytest.mark.slow
def test_float16_is_todays_binaries_byte_for_byte(built: Path) -> None:
    """``npu_weights = "float16"`` written out builds the very binaries (and twins) of a spec without the field."""
    for stage, pattern in (("context", "*/qnn/*.bin"), ("twin", "*/*.bin")):
        ours = {p.name: sha256_file(p) for p in (built / "tiny-f16" / ARCH / stage).glob(pattern)}
        today = {p.name: sha256_file(p) for p in (built / "tiny-qwen3" / ARCH / stage).glob(pattern)}
        assert ours and ours == today, stage
    # and nothing in them is quantized
    assert all(
        n["encoding"] == "float16" for m in _manifests(built, "tiny-qwen3", "context").values() for n in m["weights"]
    )


@pytest.mark.parametrize(
    ("model_dir", "mode"),
    [
        (TINY_MODEL_DIR, "int4"),
        (FIXTURE_MODELS / "llama-int4-cw", "int4"),
        (FIXTURE_MODELS / "qwen3-untied-int8-b32", "int4"),
        (TINY_MODEL_DIR, "int8"),
    ],
    ids=["tiny-int4", "cw-int4", "int8-int4", "tiny-int8"],
)
def test_mapping_keeps_the_models_weights(model_dir: Path, mode: str) -> None:
    """What a graph computes from the int4 form of every model's convs (real = (q + offset) * scale; asymmetric
    codes on the input centered per block, the block means times the weights' block sums added back) is the model's
    conv up to float rounding; int8 per channel of the asymmetric int4 model is within half its step."""
    model = load_model(model_dir / "llm.mnn")
    rng = np.random.default_rng(0)
    with WeightFile(model_dir / "llm.mnn.weight") as wf:
        for op in conv_ops(model)[:4]:
            qw, reason = npu_weight(op, wf, mode)
            assert qw is not None and not reason
            ref = decode_conv(op, wf).weight.astype(np.float64)  # [out, in]
            codes = qw.codes.reshape(qw.codes.shape[2], qw.codes.shape[3]).T.astype(np.float64)  # [out, in + folded]
            out_ch, all_in = codes.shape
            in_ch = qw.in_channels
            scale = qw.params[:, 0].reshape(out_ch, -1, 1)
            offset = qw.params[:, 1].reshape(out_ch, -1, 1)
            real = ((codes.reshape(out_ch, -1, qw.block) + offset) * scale).reshape(out_ch, all_in)
            x = rng.standard_normal((8, in_ch)) + 1.0  # a common part, which the centering must keep
            if qw.block_sums is None:
                assert not qw.folded
                y = x @ real.T
            else:
                # what the graph computes: the centered input, then the block means times each digit's level
                assert mode == "int4" and qw.encoding == "block" and qw.folded >= in_ch // qw.block * SUM_DIGITS
                means = x.reshape(8, -1, qw.block).mean(2)
                per_mean, _ = folded_layout(means.shape[1], qw.block)
                levels = (means[:, :, None] * sum_levels(per_mean).astype(np.float64)).reshape(8, -1)
                pad = np.zeros((8, qw.folded - levels.shape[1]))
                folded = np.concatenate([x - np.repeat(means, qw.block, axis=1), levels, pad], 1) @ real.T
                # the codes and scales are the model's: with the block sums themselves it is exact (checked below)
                sums = qw.block_sums.astype(np.float64)
                y = (x - np.repeat(means, qw.block, axis=1)) @ real[:, :in_ch].T + means @ sums
                # the digits hold each block sum to half the last digit's step (per output channel), and the
                # weights the op computes with are that far from the model's, as its note says (``error``)
                held = real[:, in_ch : in_ch + levels.shape[1]].reshape(out_ch, -1, per_mean)
                dsums = (held * sum_levels(per_mean).astype(np.float64)).sum(2).T - sums  # [blocks, out]
                step = np.abs(sums).max(0) / 7 * float(sum_levels()[-1])
                assert np.all(np.abs(dsums) <= step * 0.51 + 1e-12), op.name
                np.testing.assert_allclose(folded, y + means @ dsums, rtol=0, atol=1e-9 * np.abs(y).max())
                dw = np.abs(dsums).max() / qw.block / np.abs(ref).max()
                assert 0 < qw.error and abs(dw - qw.error) <= 1e-3 * qw.error, (op.name, dw, qw.error)
            expected = x @ ref.T
            err = np.abs(y - expected).max() / np.abs(expected).max()
            if mode == "int4":
                assert qw.exact and err < 1e-5, (op.name, err)
            else:
                weight_err = np.abs(real - ref).max() / np.abs(ref).max()
                assert not qw.exact and 0 < weight_err <= 0.5 / 127 + 1e-6 and abs(weight_err - qw.error) < 1e-4
                assert 0 < err < 0.05, (op.name, err)


def test_bad_npu_weights_is_one_line(tmp_path: Path) -> None:
    from mnnbuild.base.errors import SpecError
    from mnnbuild.model.spec import load_spec

    spec = tmp_path / "m.toml"
    spec.write_text('name = "m"\nsource = { local = "m" }\ntargets = ["v79"]\nnpu_weights = "int3"\n')
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    message = str(info.value)
    assert "\n" not in message and str(spec) in message and "npu_weights" in message and "'int4'" in message


@pytest.mark.slow
def test_the_int4_modellib_composes_the_shipped_binaries(built: Path, tmp_path: Path) -> None:
    """The model-lib stores the same quantized weights: every int4 plugin composed from its graph dirs (codes and
    (scale, offset) raws read back) is byte for byte the binary the context stage composed in memory."""
    import functools

    from mnnbuild.lowering.graph import read_graph_description, read_graph_dirs
    from mnnbuild.manifests.partition import read_merge
    from mnnbuild.model.targets import soc_for_arch
    from mnnbuild.plugin.compose import compose_in_fresh_process
    from mnnbuild.qnn import HtpTarget

    proc = doit(built.parent, "modellib:tiny-int4", env={"MNNBUILD_MODELS_PATH": str(built.parent / "specs")})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    modellib = built / "tiny-int4" / "modellib"
    desc = read_graph_description(modellib / "qnn" / "graphllm1")
    quantized = [t for t in desc.static_tensors if t.quant is not None]
    assert quantized and all(t.dtype == "sfixed8" and t.quant.encoding == "block" for t in quantized)
    soc = soc_for_arch(ARCH)
    target = HtpTarget(soc.soc_id, soc.arch_number, soc.vtcm_mb)
    shipped = _binaries(built, "tiny-int4")
    for binary, graphs in read_merge(built / "tiny-int4" / "partition").items():
        dest = tmp_path / binary
        compose_in_fresh_process(target, functools.partial(read_graph_dirs, modellib, graphs), True, dest)
        assert dest.read_bytes() == shipped[Path(binary).name].read_bytes(), binary


@pytest.mark.slow
def test_prefill_centers_by_grouped_convs_and_decode_reads_no_more_weights(built: Path) -> None:
    """Asymmetric int4 reads its input centered per block. At one row (decode, read once per token) the means are a
    ReduceMean and a broadcast subtraction, no weights; at several rows (prefill) two fp16 convs with one group per
    block give the centered input and the means, with no subtraction and no ReduceMean left."""
    from mnnbuild.lowering.graph import read_graph_description

    proc = doit(built.parent, "modellib:tiny-int4", env={"MNNBUILD_MODELS_PATH": str(built.parent / "specs")})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    qnn = built / "tiny-int4" / "modellib" / "qnn"
    decode = sorted(d for d in qnn.iterdir() if d.is_dir() and "_" not in d.name)
    checked = {1: 0, 128: 0}
    for graph in decode:
        prefill = qnn / graph.name.replace("graphllm", "graphllm1_", 1)
        for directory, rows in ((graph, 1), (prefill, 128)):
            desc = read_graph_description(directory)
            dims = {t.name: t.dims for t in desc.tensors}
            subtractions = [n for n in desc.nodes if n.type == "ElementWiseSubtract" and "center" in n.name]
            grouped = [n for n in desc.nodes if n.type == "Conv2d" and any(p.name == "group" for p in n.params)]
            statics = {t.name for t in desc.static_tensors if t.name.startswith(("block_mean.", "block_center."))}
            if rows == 1:
                assert not grouped and not statics, directory.name
                assert not any(dims[n.inputs[0]] == dims[n.inputs[1]] for n in subtractions), directory.name
                checked[rows] += bool(subtractions) and any(n.type == "ReduceMean" for n in desc.nodes)
            else:
                assert not subtractions and not any(n.type == "ReduceMean" for n in desc.nodes), directory.name
                if grouped:
                    checked[rows] += 1
                    groups = {p.value for n in grouped for p in n.params if p.name == "group"}
                    assert len(grouped) % 2 == 0 and groups and min(groups) > 1, directory.name
                    wanted = {f"block_center.64x{64 * g}" for g in groups} | {f"block_mean.64x{g}" for g in groups}
                    wanted |= {f"{name}.bias" for name in wanted}
                    assert statics == wanted, directory.name
    assert checked[1] >= 2 and checked[128] >= 2, f"too few centered int4 convs in the tiny model's graphs: {checked}"


@pytest.mark.parametrize(("blocks", "block"), [(2, 64), (3, 64), (24, 64), (32, 64), (140, 64), (5, 32)])
def test_block_sums_fold_into_whole_blocks_of_digits(blocks: int, block: int) -> None:
    """The folded inputs fill the fewest whole blocks that hold every block mean's digits (zeros from the levels where
    the blocks divide evenly, else after them), and the digits hold each sum to half the last digit's step."""
    sums = np.random.default_rng(blocks).standard_normal((blocks, 7)) * np.array([1e-3, 1, 50, 0, 1, 1, 1])
    sums[0, 5] = 40.0  # one large sum against small ones in the same output channel
    codes, unit, _ = fold_block_sums(sums.astype(np.float32), block)
    per_mean, zeros = folded_layout(blocks, block)
    assert per_mean >= SUM_DIGITS and codes.shape == (7, blocks * per_mean + zeros)
    assert codes.shape[1] == -(-blocks * SUM_DIGITS // block) * block
    assert zeros == 0 or per_mean == SUM_DIGITS
    digits = codes[:, : blocks * per_mean].reshape(7, blocks, per_mean).astype(np.float64)
    assert codes.min() >= -8 and codes.max() <= 7
    assert not digits[:, :, SUM_DIGITS:].any() and not codes[:, blocks * per_mean :].any()
    assert not codes[3].any() and unit[3] == 1.0  # an output channel whose sums are all 0
    held = (digits * sum_levels(per_mean).astype(np.float64)).sum(2) * unit[:, None].astype(np.float64)
    step = unit.astype(np.float64) * float(sum_levels()[SUM_DIGITS - 1])
    assert np.all(np.abs(held - sums.T) <= 0.5 * step[:, None] * (1 + 1e-3))
    top = np.abs(sums).max(0)
    assert np.all(np.abs(held - sums.T).max(1) <= top / (2 * 7 * 14**3) * 1.01)
