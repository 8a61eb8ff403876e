"""Asymmetric int4 weights on the HTP: which exact form keeps fp16's accuracy (one linear op, x86 HTP simulator).

llmexport's default int4 is asymmetric: ``w = q * scale + zero`` per block of 64 inputs, ``q`` in [-8, 7]. Three
forms keep those codes and scales exactly (QNN 2.40, SM8750 v79, a Conv2d between Casts to and from fp16, the form
the HTP finalizes; ``mnnbuild/lowering/README.md``, "Quantized weights"):

- ``bw_float_block``: ``BW_FLOAT_BLOCK``, real = (q + zero / scale) * scale, one conv;
- ``zeros conv``: ``BLOCK`` (q * scale, offset 0) plus the zeros as an fp16 conv over the input's block sums;
- ``centered``: ``BLOCK`` on the input minus its mean per block, plus an fp16 conv of those means by the weights'
  block sums, the two results added (what ``npu_weights = "int4"`` lowered asymmetric codes to until 2026-12-05);
- ``folded``: the centered form in one ``BLOCK`` conv: the block sums as 4-bit digits of one scale per output
  channel, read against the means (times each digit's level) appended to the centered input, centered by
  ``ReduceMean`` and a broadcast subtraction (what a decode graph lowers them to: no weights besides the op's);
- ``folded grouped``: the same, centered by two fp16 convs with one group per block, one giving the centered input
  and one the means (what a prefill graph lowers them to).

Against ``fp16``, the model's weights dequantized and stored as fp16 (a ``float16`` bundle). Inputs of mean 0 and of
mean 1 (a common part, as activations have): the two parts of the split forms then cancel, and fp16 loses what they
cancel. Error = max |y - y_ref| / max |y_ref| and rms over rms, ``y_ref = x @ w.T`` in float64 on the model's
(dequantized) weights; random weights as llmexport quantizes them (``--seeds`` of them, the median is reported).
Also the binary size, the time to prepare it (compose, finalize, serialize: Qualcomm's prepare of the form) and the
simulator's execute time (the x86 emulation, not a phone figure).

    python benchmarks/bench_int4_split.py [--shape 2048 6144] [--rows 1 128] [--seeds 3] [--results int4_split]

Prints a table and writes ``benchmarks/results/int4_split.json``. Not part of CI.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_results  # noqa: E402

from mnnbuild.lowering.quantized import fold_block_sums, folded_layout, sum_levels  # noqa: E402
from mnnbuild.model.targets import soc_for_arch  # noqa: E402
from mnnbuild.qnn import ContextBuilder, HtpTarget, QnnLibrary, Quant, load_context  # noqa: E402

BLOCK = 64
FORMS = ("fp16", "bw_float_block", "zeros conv", "centered", "folded", "folded grouped")
CONV = {"stride": np.array([1, 1], np.uint32), "pad_amount": np.zeros((2, 2), np.uint32)}


class Weights:
    """A random ``[out, in]`` weight quantized as llmexport's asymmetric int4 (min/max per block of 64)."""

    def __init__(self, out_ch: int, in_ch: int, seed: int) -> None:
        w = np.random.default_rng(seed).standard_normal((out_ch, in_ch)).astype(np.float32) * 0.02
        blocks = w.reshape(out_ch, -1, BLOCK)
        low, high = blocks.min(2), blocks.max(2)
        self.scale = ((high - low) / 15).astype(np.float32)
        u = np.clip(np.round((blocks - low[:, :, None]) / self.scale[:, :, None]), 0, 15)
        self.codes = (u - 8).astype(np.int8).reshape(out_ch, in_ch)
        self.zero = (low + 8 * self.scale).astype(np.float32)
        real = self.codes.reshape(out_ch, -1, BLOCK).astype(np.float64) * self.scale[:, :, None] + self.zero[:, :, None]
        self.real = real.reshape(out_ch, in_ch)
        self.out_ch, self.in_ch, self.blocks = out_ch, in_ch, in_ch // BLOCK

    def hwio(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a.T).reshape(1, 1, self.in_ch, self.out_ch)

    def block_sums(self) -> np.ndarray:
        """Each block's sum of the (dequantized) weights, ``[blocks, out]``."""
        return np.ascontiguousarray(self.real.reshape(self.out_ch, -1, BLOCK).sum(2).T)

    def per_block(self, a: np.ndarray) -> np.ndarray:
        """``[out, blocks]`` values as an HWIO fp16 conv weight over ``blocks`` inputs."""
        return np.ascontiguousarray(a.T).reshape(1, 1, self.blocks, self.out_ch).astype(np.float16)


def build(lib: QnnLibrary, target: HtpTarget, wt: Weights, form: str, rows: int) -> bytes:
    """One graph ``g``: ``x [1, 1, rows, in]`` float32 -> ``y [1, 1, rows, out]`` through ``form``."""
    with ContextBuilder(lib, target) as ctx:
        g = ctx.add_graph("g")
        x = g.add_input("x", (1, 1, rows, wt.in_ch))
        y = g.add_output("y", (1, 1, rows, wt.out_ch))
        out_shape, grouped = (1, 1, rows, wt.out_ch), (1, rows, wt.blocks, BLOCK)
        if form == "fp16":
            weight = g.add_static("w", wt.hwio(wt.real).astype(np.float32), "float32")
            g.add_node("conv", "Conv2d", [x, weight, g.add_static("b", np.zeros(wt.out_ch, np.float32))], [y], CONV)
            return ctx.serialize()
        x16 = g.add_native("x16", (1, 1, rows, wt.in_ch), "float16")
        g.add_node("cast_in", "Cast", [x], [x16])
        bias = g.add_static("b", np.zeros(wt.out_ch, np.float16), "float16")
        y16 = g.add_native("y16", out_shape, "float16")
        block = [1, 1, BLOCK, 1]
        if form == "bw_float_block":
            offset = (wt.zero / wt.scale).reshape(-1)
            quant = Quant(wt.scale.reshape(-1), offset, block_size=block, bitwidth=4, float_offset=True)
            weight = g.add_static("w", wt.hwio(wt.codes), "sfixed8", quant=quant)
            g.add_node("conv", "Conv2d", [x16, weight, bias], [y16], CONV)
        elif form.startswith("folded"):
            digits, unit, _ = fold_block_sums(wt.block_sums().astype(np.float32), BLOCK)
            per_mean, zeros = folded_layout(wt.blocks, BLOCK)
            codes = np.ascontiguousarray(np.concatenate([wt.codes, digits], 1).T)
            scales = np.concatenate([wt.scale, np.repeat(unit[:, None], digits.shape[1] // BLOCK, 1)], 1)
            quant = Quant(scales.reshape(-1), 0, block_size=block, bitwidth=4)
            weight = g.add_static("w", codes.reshape(1, 1, -1, wt.out_ch), "sfixed8", quant=quant)
            reduced = g.add_native("reduced", (1, rows, wt.blocks, 1), "float16")
            conv_x = g.add_native("centered4", (1, 1, rows, wt.in_ch), "float16")
            if form == "folded grouped":
                per_group = {**CONV, "group": np.uint32(wt.blocks)}
                center = np.tile(np.eye(BLOCK) - 1.0 / BLOCK, (1, wt.blocks)).astype(np.float16)
                means = g.add_native("means", (1, 1, rows, wt.blocks), "float16")
                for name, w, out in (
                    ("center", center, conv_x),
                    ("mean", np.full((BLOCK, wt.blocks), 1 / BLOCK), means),
                ):
                    w16 = g.add_static(f"{name}_w", w.astype(np.float16).reshape(1, 1, BLOCK, -1), "float16")
                    b16 = g.add_static(f"{name}_b", np.zeros(w.shape[1], np.float16), "float16")
                    g.add_node(name, "Conv2d", [x16, w16, b16], [out], per_group)
                g.add_node("group", "Reshape", [means], [reduced])
            else:
                groups = g.add_native("groups", grouped, "float16")
                g.add_node("group", "Reshape", [x16], [groups])
                axes = {"axes": np.array([3], np.uint32), "keep_dims": True}
                g.add_node("mean", "ReduceMean", [groups], [reduced], axes)
                centered = g.add_native("centered", grouped, "float16")
                g.add_node("center", "ElementWiseSubtract", [groups, reduced], [centered])
                g.add_node("ungroup", "Reshape", [centered], [conv_x])
            levels = g.add_static("levels", sum_levels(per_mean).reshape(1, 1, 1, -1), "float16")
            scaled = g.add_native("scaled", (1, rows, wt.blocks, per_mean), "float16")
            g.add_node("scale", "ElementWiseMultiply", [reduced, levels], [scaled])
            parts = [conv_x, g.add_native("scaled4", (1, 1, rows, wt.blocks * per_mean), "float16")]
            g.add_node("flat", "Reshape", [scaled], [parts[1]])
            if zeros:
                parts.append(g.add_static("pad", np.zeros((1, 1, rows, zeros), np.float16), "float16"))
            conv_in = g.add_native("conv_in", (1, 1, rows, codes.shape[0]), "float16")
            g.add_node("join", "Concat", parts, [conv_in], {"axis": np.uint32(3)})
            g.add_node("conv", "Conv2d", [conv_in, weight, bias], [y16], CONV)
        else:
            weight = g.add_static(
                "w", wt.hwio(wt.codes), "sfixed8", quant=Quant(wt.scale.reshape(-1), 0, block_size=block, bitwidth=4)
            )
            groups = g.add_native("groups", grouped, "float16")
            g.add_node("group", "Reshape", [x16], [groups])
            reduced = g.add_native("reduced", (1, rows, wt.blocks, 1), "float16")
            axes = {"axes": np.array([3], np.uint32), "keep_dims": True}
            if form == "zeros conv":
                g.add_node("sum", "ReduceSum", [groups], [reduced], axes)
                conv_in, small = x16, wt.per_block(wt.zero)
            else:
                g.add_node("mean", "ReduceMean", [groups], [reduced], axes)
                centered = g.add_native("centered", grouped, "float16")
                g.add_node("center", "ElementWiseSubtract", [groups, reduced], [centered])
                conv_in = g.add_native("centered4", (1, 1, rows, wt.in_ch), "float16")
                g.add_node("ungroup", "Reshape", [centered], [conv_in])
                small = wt.per_block(wt.block_sums().T)
            part = g.add_native("part", out_shape, "float16")
            g.add_node("conv", "Conv2d", [conv_in, weight, bias], [part], CONV)
            reduced4 = g.add_native("reduced4", (1, 1, rows, wt.blocks), "float16")
            g.add_node("flat", "Reshape", [reduced], [reduced4])
            other = g.add_native("other", out_shape, "float16")
            g.add_node("small", "Conv2d", [reduced4, g.add_static("s", small, "float16")], [other], CONV)
            g.add_node("add", "ElementWiseAdd", [part, other], [y16])
        g.add_node("cast_out", "Cast", [y16], [y])
        return ctx.serialize()


def measure(lib: QnnLibrary, target: HtpTarget, wt: Weights, rows: int, mean: float, seed: int) -> dict[str, Any]:
    x = (np.random.default_rng(seed + 1000).standard_normal((1, 1, rows, wt.in_ch)) + mean).astype(np.float32)
    ref = x.reshape(rows, wt.in_ch).astype(np.float64) @ wt.real.T
    found: dict[str, Any] = {}
    for form in FORMS:
        started = time.perf_counter()
        binary = build(lib, target, wt, form, rows)
        prepare_s = time.perf_counter() - started
        with load_context(lib, binary) as runner:
            started = time.perf_counter()
            y = runner.execute("g", {"x": x})["y"].reshape(rows, wt.out_ch).astype(np.float64)
            seconds = time.perf_counter() - started
        err = y - ref
        found[form] = {
            "max_rel": float(np.abs(err).max() / np.abs(ref).max()),
            "rms_rel": float(np.sqrt((err**2).mean() / (ref**2).mean())),
            "binary_bytes": len(binary),
            "prepare_s": round(prepare_s, 2),
            "execute_s": round(seconds, 3),
        }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs=2, default=[2048, 6144], metavar=("IN", "OUT"))
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 128])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--arch", default="v79")
    parser.add_argument("--results", default="int4_split", help="results file name (another shape: another name)")
    args = parser.parse_args()
    if not args.results.replace("_", "").replace("-", "").isalnum():
        parser.error(f"--results: {args.results!r} is not a plain name (letters, digits, _ and -)")
    logging.basicConfig(level=logging.WARNING)
    in_ch, out_ch = args.shape
    if in_ch % BLOCK:
        parser.error(f"--shape: {in_ch} inputs do not split into blocks of {BLOCK}")
    soc = soc_for_arch(args.arch)
    target = HtpTarget(soc.soc_id, soc.arch_number, soc.vtcm_mb)
    lib = QnnLibrary()
    cases: dict[str, Any] = {}
    rows_out = []
    for rows in args.rows:
        for mean in (0.0, 1.0):
            runs = [measure(lib, target, Weights(out_ch, in_ch, s), rows, mean, s) for s in range(args.seeds)]
            case: dict[str, Any] = {}
            for form in FORMS:
                med = {k: statistics.median(r[form][k] for r in runs) for k in runs[0][form]}
                case[form] = {**med, "max_rel_seeds": [r[form]["max_rel"] for r in runs]}
            for form in FORMS:
                case[form]["max_over_fp16"] = case[form]["max_rel"] / case["fp16"]["max_rel"]
                case[form]["rms_over_fp16"] = case[form]["rms_rel"] / case["fp16"]["rms_rel"]
                rows_out.append(
                    [
                        rows,
                        mean,
                        form,
                        f"{case[form]['max_rel']:.2e}",
                        f"{case[form]['max_over_fp16']:.2f}",
                        f"{case[form]['rms_over_fp16']:.2f}",
                        f"{case[form]['binary_bytes'] / 1e6:.2f}",
                        case[form]["prepare_s"],
                        case[form]["execute_s"],
                    ]
                )
            cases[f"rows{rows}-mean{mean:g}"] = case
    print_table(["rows", "x mean", "form", "max rel", "max/fp16", "rms/fp16", "binary MB", "prepare s", "execute s"],
                rows_out)  # fmt: skip
    path = write_results(
        args.results,
        {"shape": [in_ch, out_ch], "block": BLOCK, "seeds": args.seeds, "arch": args.arch, "cases": cases},
    )
    sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
