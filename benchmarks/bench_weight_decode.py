"""Weight decode throughput: MB/s of quantized input turned into float32, next to a plain numpy copy of
the same bytes, measured in one run.

Builds a synthetic weight file with Qwen3-1.7B-sized projections (llmexport's layout: int4/int8,
block-wise/channel-wise, asymmetric/symmetric), then times ``decode_conv`` on each op (page cache warm,
best of N) against ``np.array(memmap_slice)`` of the op's bytes. Prints a table and writes
``benchmarks/results/weight_decode.json`` next to this file.

    python benchmarks/bench_weight_decode.py [--repeat 5] [--small]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from mnnbuild.mnn import Op, WeightFile, decode_conv, quantize_linear, schema

log = logging.getLogger("bench_weight_decode")
RESULTS = Path(__file__).resolve().parent / "results" / "weight_decode.json"

# (label, out, in, bits, block (0 = channel-wise), symmetric)
CASES = [
    ("int4 asym block64", 6144, 2048, 4, 64, False),
    ("int4 sym channel", 6144, 2048, 4, 0, True),
    ("int8 asym block32", 6144, 2048, 8, 32, False),
    ("int8 sym channel", 6144, 2048, 8, 0, True),
    ("int4 asym block128 (down_proj)", 2048, 6144, 4, 128, False),
]


def build(cases: list[tuple[str, int, int, int, int, bool]], path: Path) -> list[tuple[str, Op, int]]:
    """Write every case's quantized weights to ``path``; return (label, conv op, stored bytes)."""
    rng = np.random.default_rng(0)
    ops = []
    offset = 0
    with path.open("wb") as fh:
        for label, out_ch, in_ch, bits, block, symmetric in cases:
            w = (rng.standard_normal((out_ch, in_ch)) * 0.02).astype(np.float32)
            ql = quantize_linear(w, bits, block, symmetric)
            bias = rng.standard_normal(out_ch).astype(np.float32)
            fh.write(ql.weight_block + ql.alpha + bias.tobytes())
            conv = schema.Convolution2DT()
            conv.common = schema.Convolution2DCommonT()
            conv.common.inputCount, conv.common.outputCount = in_ch, out_ch
            conv.quanParameter = ql.idst_quan()
            sizes = [len(ql.weight_block), len(ql.alpha), bias.nbytes]
            conv.external = np.array([offset, *sizes, 0], "<i8")
            offset += sum(sizes)
            ops.append((label, Op("Convolution", label, [0], [1], conv), sum(sizes)))
    return ops


def best_time(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run(repeat: int, small: bool) -> dict[str, Any]:
    cases = [(label, o // 8, i // 8, b, min(k, i // 8), s) for label, o, i, b, k, s in CASES] if small else CASES
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.mnn.weight"
        ops = build(cases, path)
        with WeightFile(path) as wf:
            for label, op, stored in ops:
                ext = [int(v) for v in op.main.external]
                decode_conv(op, wf)  # warm the page cache and numpy
                t_decode = best_time(lambda op=op: decode_conv(op, wf), repeat)
                t_copy = best_time(lambda e=ext: np.array(wf.read(e[0], sum(e[1:4]), "copy")), repeat)
                out_ch, in_ch = op.main.common.outputCount, op.main.common.inputCount
                rows.append(
                    {
                        "case": label,
                        "shape": [out_ch, in_ch],
                        "quantized_bytes": stored,
                        "float32_bytes": out_ch * in_ch * 4,
                        "decode_s": t_decode,
                        "copy_s": t_copy,
                        "decode_MBps": stored / t_decode / 1e6,
                        "copy_MBps": stored / t_copy / 1e6,
                        "decode_float_out_MBps": out_ch * in_ch * 4 / t_decode / 1e6,
                    }
                )
    return {
        "benchmark": "weight_decode",
        "unit": "MB/s of quantized input (1 MB = 1e6 bytes), best of repeat",
        "repeat": repeat,
        "small": small,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "results": rows,
    }


def table(report: dict[str, Any]) -> str:
    head = f"{'case':<32} {'shape':>12} {'quant MB':>9} {'decode MB/s':>12} {'copy MB/s':>10} {'ratio':>7}"
    lines = [head, "-" * len(head)]
    for r in report["results"]:
        shape = "x".join(str(d) for d in r["shape"])
        ratio = r["copy_MBps"] / r["decode_MBps"]
        lines.append(
            f"{r['case']:<32} {shape:>12} {r['quantized_bytes'] / 1e6:>9.2f} {r['decode_MBps']:>12.1f} "
            f"{r['copy_MBps']:>10.1f} {ratio:>6.1f}x"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="1/64 of the sizes, for a quick check")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = run(args.repeat, args.small)
    sys.stdout.write(table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
