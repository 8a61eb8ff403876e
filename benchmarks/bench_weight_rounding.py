"""Where the error of ``npu_weights = "int4"`` comes from: the rounding each NPU weight form implies, on a model's
own convolutions, in numpy (no QNN; seconds).

The HTP keeps fp16 weights in a ``float16`` bundle; in an ``int4`` bundle it keeps the model's exact codes ``q``
with a float scale and offset per block (``BW_FLOAT_BLOCK`` for llmexport's asymmetric blocks, real =
(q + offset) * scale; ``BLOCK`` for symmetric ones, real = q * scale) and must dequantize them to fp16 before it
multiplies. How it does that is not documented; this script measures, for each conv of the model, the error
against MNN's own float32 dequantization (``ConvCodes.dequantized``) of:

- ``fp16``: the weights rounded to fp16 once (what a ``float16`` bundle stores);
- ``params fp16``: scale and offset rounded to fp16, the rest exact;
- ``two roundings``: ``q + offset`` rounded to fp16, then ``* scale`` rounded again (an fp16 dequantizer);
- ``symmetric``: the same weights requantized symmetric (llmexport ``--sym``) and dequantized in fp16 (one
  rounding of ``q * scale``), against their own float32 values.

Two numbers each: the rms weight error over the rms weight, and the max error of ``x @ W.T`` over its max for
``x`` of 1 and 128 rows (standard normal, fixed seed), as verify measures logits. The ratio of each form over
``fp16`` is what an ``int4`` bundle can expect over a ``float16`` one per op, before the model compounds it.

    python benchmarks/bench_weight_rounding.py [--model-dir DIR] [--max-convs 14]

``--model-dir`` (or ``$MNNBUILD_BENCH_MODEL``) defaults to the shipped trained tiny model. Prints a table and
merges into ``benchmarks/results/weight_rounding.json`` under the model dir's name. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, RESULTS, machine, print_table  # noqa: E402

from mnnbuild.base.errors import MnnbuildError  # noqa: E402
from mnnbuild.mnn import load_model  # noqa: E402
from mnnbuild.mnn.weights import ConvCodes, WeightFile, conv_codes, conv_ops, quantize_blocks, weight_path_for  # noqa: E402

log = logging.getLogger("bench_weight_rounding")
FORMS = ("fp16", "params fp16", "two roundings", "symmetric")


def f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float64)


def forms(cc: ConvCodes) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each form's (weights as the HTP would hold them, the float64 weights they stand for)."""
    out_ch, in_ch = cc.codes.shape
    q = cc.codes.reshape(out_ch, -1, cc.block).astype(np.float64)
    scale = cc.scale[:, :, None].astype(np.float64)
    zero = (cc.zero if cc.zero is not None else np.zeros_like(cc.scale))[:, :, None].astype(np.float64)
    exact = (q * scale + zero).reshape(out_ch, in_ch)
    with np.errstate(divide="ignore", invalid="ignore"):
        offset = np.where(scale != 0, zero / scale, 0.0)
    sym_codes, sym_scale, _ = quantize_blocks(exact.astype(np.float32), 4, cc.block, symmetric=True)
    sym_exact = sym_codes.reshape(out_ch, -1, cc.block).astype(np.float64) * sym_scale.reshape(out_ch, -1, 1)
    return {
        "fp16": (f16(exact), exact),
        "params fp16": (((q + f16(offset)) * f16(scale)).reshape(out_ch, in_ch), exact),
        "two roundings": (f16(f16(q + f16(offset)) * f16(scale)).reshape(out_ch, in_ch), exact),
        "symmetric": (f16(sym_exact).reshape(out_ch, in_ch), sym_exact.reshape(out_ch, in_ch)),
    }


def errors(held: np.ndarray, meant: np.ndarray, x: np.ndarray) -> dict[str, float]:
    rms = float(np.sqrt(np.mean((held - meant) ** 2)) / np.sqrt(np.mean(meant**2)))
    found = {"weight_rms": rms}
    for rows in (1, 128):
        y = x[:rows] @ meant.T
        found[f"rows{rows}"] = float(np.abs(x[:rows] @ held.T - y).max() / np.abs(y).max())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("MNNBUILD_BENCH_MODEL") or PROJECT_ROOT / "models" / "tiny-qwen3-trained"
    parser.add_argument("--model-dir", type=Path, default=Path(default))
    parser.add_argument("--max-convs", type=int, default=14, help="the first N quantized convs (default 14)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model_path = args.model_dir / "llm.mnn"
    try:
        model = load_model(model_path)
    except MnnbuildError as exc:
        raise SystemExit(f"--model-dir: {exc}") from None
    rng = np.random.default_rng(0)
    per_conv: dict[str, dict[str, dict[str, float]]] = {}
    with WeightFile(weight_path_for(model_path)) as wf:
        for op in conv_ops(model):
            if len(per_conv) >= args.max_convs:
                break
            cc = conv_codes(op, wf)
            if cc is None or cc.bits > 4:
                continue
            x = rng.standard_normal((128, cc.codes.shape[1]))
            per_conv[cc.name] = {name: errors(*pair, x) for name, pair in forms(cc).items()}
            log.info("%s %s block %d %s", cc.name, cc.codes.shape, cc.block, "asym" if cc.zero is not None else "sym")
    if not per_conv:
        raise SystemExit(f"{model_path}: no convolution with codes of 4 bits or fewer")
    keys = ("weight_rms", "rows1", "rows128")
    mean = {f: {k: float(np.mean([c[f][k] for c in per_conv.values()])) for k in keys} for f in FORMS}
    rows = [[f, *(f"{mean[f][k]:.2e} ({mean[f][k] / mean['fp16'][k]:.2f}x)" for k in keys)] for f in FORMS]
    print_table(["form", "weight rms err", "x@W rows 1", "x@W rows 128"], rows, left=True)
    path = RESULTS / "weight_rounding.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    results["machine"] = machine()
    results.setdefault("models", {})[args.model_dir.name] = {"convs": len(per_conv), "mean": mean, "per_conv": per_conv}
    path.write_text(json.dumps(results, indent=2) + "\n")
    log.info("wrote %s", path)


if __name__ == "__main__":
    main()
