"""The tiny chain against its own floor, by turns in one run; ``--check`` fails when the ratio regressed.

One round: a cold ``doit bundle:tiny-qwen3-v79`` on a fresh artifact root (cache off; fetch, io, partition, config,
context, bundle), then the floor from that root: one fresh Python process that lowers every plugin's graphs and
composes each plugin's weight-shared context in memory (the context stage's own work, without doit, without the
other stages, without a process per binary). The rounds alternate, so the box's load hits both alike; the ratio is
the median chain time over the median floor time.

Results are merged into ``benchmarks/results/chain.json`` under the checkout's commit. ``reference`` in that file is
the ratio the check compares against (set with ``--set-reference``, from a run on a quiet box); ``--check`` exits 1
when this run's ratio exceeds it by more than ``--margin`` (default 25%): a 30% slowdown of the whole chain at equal
floor grows the ratio by 30%, while a loaded box slows chain and floor nearly alike (measured in docs/benchmarks.md:
at load 8-12 the unslowed ratio stayed within 23% of the reference, and 35% let one of five 30% slowdowns pass).

    python benchmarks/bench_chain.py [--rounds 3] [--check] [--margin 0.25] [--set-reference]

``--slow-chain 0.3`` is the check's own test: each chain's doit process sleeps 0.3 x its own time before it exits,
a chain 30% slower at the same floor whatever the box's load (docs/benchmarks.md has the measured run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, RESULTS, add_result, checkout_commit, print_table  # noqa: E402

MODEL = "tiny-qwen3"
ARCH = "v79"
RESULTS_NAME = "chain"
DEFAULT_MARGIN = 0.25

FLOOR = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from _floor import compose_plugins
root = Path(sys.argv[2])
compose_plugins(root / "model", root / "partition", sys.argv[3], sys.argv[4], keep=None)
"""


SLOWED = """
import runpy, sys, time
started, fraction = time.perf_counter(), float(sys.argv[1])
sys.argv = ["doit", *sys.argv[2:]]
try:
    runpy.run_module("doit", run_name="__main__")
finally:
    time.sleep(fraction * (time.perf_counter() - started))
"""
"""doit, made ``fraction`` slower (``--slow-chain``)."""


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    env.update(MNNBUILD_ARTIFACTS=str(root), MNNBUILD_CACHE="off", MNNBUILD_LOG_LEVEL="WARNING", HF_HUB_OFFLINE="1")
    return env


def _timed(cmd: list[str], env: dict[str, str], what: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds


def one_round(work: Path, n: int, slow: float = 0.0) -> tuple[float, float]:
    """Seconds of the cold chain (``slow``: made that fraction slower) and of its floor, on one fresh root (removed
    after)."""
    root = work / f"round{n}"
    env = _env(root)
    doit = ["-c", SLOWED, str(slow)] if slow else ["-m", "doit"]
    try:
        task = f"bundle:{MODEL}-{ARCH}"
        chain = _timed([sys.executable, *doit, "-f", str(PROJECT_ROOT / "dodo.py"), task], env, "doit")
        npu_weights = "float16"
        floor = _timed(
            [sys.executable, "-c", FLOOR, str(Path(__file__).resolve().parent), str(root / MODEL), ARCH, npu_weights],
            env,
            "floor",
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return chain, floor


def read_reference() -> dict[str, Any] | None:
    path = RESULTS / f"{RESULTS_NAME}.json"
    if not path.is_file():
        return None
    try:
        reference = json.loads(path.read_text(encoding="utf-8")).get("reference")
    except (ValueError, AttributeError) as exc:
        raise SystemExit(f"{path}: not a JSON object of results ({exc})") from None
    if reference is not None and not (
        isinstance(reference, dict) and isinstance(reference.get("ratio"), (int, float)) and reference["ratio"] > 0
    ):
        raise SystemExit(f"{path}: field 'reference' must hold a positive number 'ratio' and its 'commit'")
    return reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="exit 1 when the ratio exceeds the reference's + margin")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    parser.add_argument("--set-reference", action="store_true", help="record this run's ratio as the reference")
    parser.add_argument("--no-save", action="store_true", help="do not write results (what CI runs)")
    parser.add_argument(
        "--slow-chain", type=float, default=0.0, metavar="FRACTION", help="make the chain this much slower (0.3: 30%%)"
    )
    args = parser.parse_args()
    if args.rounds < 1 or not 0 < args.margin < 10 or not 0 <= args.slow_chain < 10:
        raise SystemExit("--rounds must be >= 1, --margin in (0, 10) and --slow-chain in [0, 10)")
    if args.slow_chain and (args.set_reference or not args.no_save):
        raise SystemExit("--slow-chain measures a deliberately slowed chain: give --no-save, never --set-reference")
    reference = read_reference()  # a bad results file is one line before minutes of rounds
    chains: list[float] = []
    floors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="mnnbuild-chain-") as work:
        for n in range(args.rounds):
            chain, floor = one_round(Path(work), n, args.slow_chain)
            chains.append(chain)
            floors.append(floor)
            sys.stderr.write(f"round {n + 1}/{args.rounds}: chain {chain:.2f} s, floor {floor:.2f} s\n")
    chain_s, floor_s = statistics.median(chains), statistics.median(floors)
    ratio = chain_s / floor_s
    commit = checkout_commit()
    result = {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rounds": args.rounds,
        "chain_s": [round(c, 2) for c in chains],
        "floor_s": [round(f, 2) for f in floors],
        "ratio": round(ratio, 3),
        "load_avg": round(os.getloadavg()[0], 1),
    }
    rows: list[list[Any]] = [["this run", commit, chain_s, floor_s, ratio]]
    if reference:
        rows.append(["reference", reference["commit"], "", "", reference["ratio"]])
    print_table(["run", "commit", "chain s (median)", "floor s (median)", "chain / floor"], rows)
    if not args.no_save:
        add_result(RESULTS_NAME, commit, result)
        if args.set_reference:
            add_result(RESULTS_NAME, "reference", {"commit": commit, "ratio": round(ratio, 3), **result})
    if args.check:
        if reference is None:
            raise SystemExit(f"no reference ratio in {RESULTS / (RESULTS_NAME + '.json')}: run with --set-reference")
        limit = reference["ratio"] * (1 + args.margin)
        if ratio > limit:
            raise SystemExit(
                f"the tiny chain regressed: {ratio:.2f}x its floor, more than {limit:.2f}x (reference "
                f"{reference['ratio']:.2f}x at {reference['commit']} + {args.margin:.0%})"
            )
        sys.stdout.write(f"chain/floor {ratio:.2f}x within {limit:.2f}x (reference {reference['ratio']:.2f}x)\n")


if __name__ == "__main__":
    main()
