"""The tiny chain against its own floor and against the reference commit's chain, by turns in one run; ``--check``
fails when this checkout's chain regressed.

One round: a cold ``doit bundle:tiny-qwen3-v79`` on a fresh artifact root (cache off; fetch, io, partition, config,
context, bundle), then the floor from that root: one fresh Python process that lowers every plugin's graphs and
composes each plugin's weight-shared context in memory (the context stage's own work, without doit, without the
other stages, without a process per binary). With ``--check`` (or ``--vs-reference``) each round also runs the same
cold chain from the ``reference`` commit's tree (``git archive`` of it into the temp dir, run with the same Python),
the two chains in alternating order, so the box's load and its speed hit both alike.

Results are merged into ``benchmarks/results/chain.json`` under the checkout's commit: the chain over the floor (the
median of each round's own ratio). ``reference`` in that file names the commit the check compares against (set with
``--set-reference``). ``--check`` exits 1 when this checkout's chain over the reference's, measured in this run (the
median of the rounds' paired ratios), exceeds 1 + ``--margin`` (default 20%). A ratio against a number stored from
another machine is not a check: the chain over its floor was 3.2x on the box that set the reference and 4.1x on CI's
box for the same code (docs/benchmarks.md). Without the reference commit in the clone (a shallow one) the check falls
back to that stored ratio and says so.

    python benchmarks/bench_chain.py [--rounds 5] [--check] [--margin 0.2] [--set-reference]

``--slow-chain 0.3`` is the check's own test: each of this checkout's chains sleeps 0.3 x its own time before its
doit process exits, a chain 30% slower than the reference's whatever the box's load (docs/benchmarks.md has the runs).
"""

from __future__ import annotations

import argparse
import compileall
import io
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, RESULTS, add_result, checkout_commit, print_table  # noqa: E402

MODEL = "tiny-qwen3"
ARCH = "v79"
RESULTS_NAME = "chain"
DEFAULT_MARGIN = 0.2

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


def _env(root: Path, tree: Path | None = None) -> dict[str, str]:
    """The chain's environment: ``root`` its artifacts, cache off; ``tree`` (the reference's) first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    env.update(MNNBUILD_ARTIFACTS=str(root), MNNBUILD_CACHE="off", MNNBUILD_LOG_LEVEL="WARNING", HF_HUB_OFFLINE="1")
    if tree is not None:
        # its own mnnbuild and runtime, not the ones this venv installed from this checkout
        env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "runtime"), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _timed(cmd: list[str], env: dict[str, str], what: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds


def chain(tree: Path, root: Path, slow: float = 0.0) -> float:
    """Seconds of one cold ``doit bundle`` of ``tree``'s dodo.py into the fresh artifact root ``root`` (``slow``:
    made that fraction slower)."""
    doit = ["-c", SLOWED, str(slow)] if slow else ["-m", "doit"]
    env = _env(root, None if tree == PROJECT_ROOT else tree)
    what = "doit" if tree == PROJECT_ROOT else "the reference's doit"
    return _timed([sys.executable, *doit, "-f", str(tree / "dodo.py"), f"bundle:{MODEL}-{ARCH}"], env, what)


def floor(root: Path) -> float:
    """Seconds of the floor on the artifacts of a chain built into ``root``."""
    here = str(Path(__file__).resolve().parent)
    return _timed([sys.executable, "-c", FLOOR, here, str(root / MODEL), ARCH, "float16"], _env(root), "floor")


def one_round(work: Path, n: int, reference: Path | None, slow: float = 0.0) -> dict[str, float]:
    """One round's seconds: this checkout's chain (``slow``: made that fraction slower), its floor, and with a
    ``reference`` tree that tree's chain, first in odd rounds, so neither always runs on the box the other warmed."""
    times: dict[str, float] = {}
    order = [PROJECT_ROOT] if reference is None else [reference, PROJECT_ROOT][:: -1 if n % 2 == 0 else 1]
    for tree in order:
        root = work / f"round{n}-{'this' if tree == PROJECT_ROOT else 'reference'}"
        try:
            if tree == PROJECT_ROOT:
                times["chain"] = chain(tree, root, slow)
                times["floor"] = floor(root)
            else:
                times["reference"] = chain(tree, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return times


def compile_tree(tree: Path) -> None:
    """Byte-compile ``tree``'s Python code: with ``PYTHONDONTWRITEBYTECODE`` set, a tree without ``__pycache__``
    compiles every module in every process again (3 s more per chain on this box), which is not the chain's cost."""
    for part in ("mnnbuild", "runtime"):
        compileall.compile_dir(tree / part, quiet=1)


def read_reference() -> dict[str, Any] | None:
    path = RESULTS / f"{RESULTS_NAME}.json"
    if not path.is_file():
        return None
    try:
        reference = json.loads(path.read_text(encoding="utf-8")).get("reference")
    except (ValueError, AttributeError) as exc:
        raise SystemExit(f"{path}: not a JSON object of results ({exc})") from None
    if reference is not None and not (
        isinstance(reference, dict)
        and isinstance(reference.get("ratio"), (int, float))
        and not isinstance(reference["ratio"], bool)
        and math.isfinite(reference["ratio"])  # JSON's Infinity would pass any chain as within the margin
        and reference["ratio"] > 0
        and isinstance(reference.get("commit"), str)
        and re.fullmatch(r"[0-9a-f]{7,40}", reference["commit"])
    ):
        raise SystemExit(
            f"{path}: field 'reference' must hold a positive number 'ratio' and its 'commit' (7-40 hex digits)"
        )
    return reference


def reference_tree(commit: str, work: Path) -> Path | None:
    """The tree of ``commit`` extracted into ``work`` (``git archive``), or None when this clone lacks it."""
    git = ["git", "-C", str(PROJECT_ROOT)]
    if subprocess.run([*git, "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True).returncode != 0:
        return None
    tree = work / f"reference-{commit}"
    archive = subprocess.run([*git, "archive", "--format=tar", commit], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {commit} failed: {archive.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit 1 when the chain regressed against the reference's")
    parser.add_argument(
        "--vs-reference", action="store_true", help="also time the reference commit's chain (what --check does)"
    )
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    parser.add_argument("--set-reference", action="store_true", help="record this checkout as the reference")
    parser.add_argument("--no-save", action="store_true", help="do not write results (what CI runs)")
    parser.add_argument(
        "--slow-chain", type=float, default=0.0, metavar="FRACTION", help="make the chain this much slower (0.3: 30%%)"
    )
    args = parser.parse_args()
    if args.rounds < 1 or not 0 < args.margin < 10 or not 0 <= args.slow_chain < 10:
        raise SystemExit("--rounds must be >= 1, --margin in (0, 10) and --slow-chain in [0, 10)")
    if args.slow_chain and (args.set_reference or not args.no_save):
        raise SystemExit("--slow-chain measures a deliberately slowed chain: give --no-save, never --set-reference")
    if args.set_reference and not re.fullmatch(r"[0-9a-f]{12}", checkout_commit()):
        raise SystemExit("--set-reference needs a committed checkout (the check runs that commit's tree)")
    reference = read_reference()  # a bad results file is one line before minutes of rounds
    if args.check and reference is None:
        raise SystemExit(f"no reference in {RESULTS / (RESULTS_NAME + '.json')}: run with --set-reference")
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="mnnbuild-chain-") as tmp:
        work = Path(tmp)
        tree = None
        if reference is not None and (args.check or args.vs_reference):
            tree = reference_tree(reference["commit"], work)
            if tree is None:
                sys.stderr.write(
                    f"the reference commit {reference['commit']} is not in this clone (shallow?): comparing with its "
                    f"stored ratio {reference['ratio']:.2f}x, measured on another box\n"
                )
        for compiled in filter(None, [PROJECT_ROOT, tree]):
            compile_tree(compiled)
        for n in range(args.rounds):
            rounds.append(one_round(work, n, tree, args.slow_chain))
            sys.stderr.write(
                f"round {n + 1}/{args.rounds}: " + ", ".join(f"{k} {v:.2f} s" for k, v in rounds[-1].items()) + "\n"
            )
    ratio = statistics.median(r["chain"] / r["floor"] for r in rounds)
    commit = checkout_commit()
    result: dict[str, Any] = {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rounds": args.rounds,
        "chain_s": [round(r["chain"], 2) for r in rounds],
        "floor_s": [round(r["floor"], 2) for r in rounds],
        "ratio": round(ratio, 3),
        "load_avg": round(os.getloadavg()[0], 1),
    }
    rows: list[list[Any]] = [["this checkout", commit, statistics.median(result["chain_s"]), ratio, ""]]
    versus = None
    if tree is not None:
        versus = statistics.median(r["chain"] / r["reference"] for r in rounds)
        ref_ratio = statistics.median(r["reference"] / r["floor"] for r in rounds)
        result.update(reference=reference["commit"], reference_chain_s=[round(r["reference"], 2) for r in rounds],
                      vs_reference=round(versus, 3))  # fmt: skip
        rows.append(["reference", reference["commit"], statistics.median(result["reference_chain_s"]), ref_ratio, ""])
        rows[0][4] = versus
    elif reference is not None:
        rows.append(["reference (stored)", reference["commit"], "", reference["ratio"], ""])
    print_table(["chain", "commit", "chain s (median)", "chain / floor", "this / reference"], rows)
    if not args.no_save:
        add_result(RESULTS_NAME, commit, result)
        if args.set_reference:
            add_result(RESULTS_NAME, "reference", {"commit": commit, **result})
    if args.check:
        assert reference is not None
        if versus is None:  # no reference tree: the stored ratio, the only number there is
            versus, what = (
                ratio / reference["ratio"],
                f"its floor, against the reference's stored {reference['ratio']:.2f}x",
            )
        else:
            what = f"the chain of {reference['commit']}, measured by turns in this run"
        if versus > 1 + args.margin:
            raise SystemExit(f"the tiny chain regressed: {versus:.2f}x {what} (allowed {1 + args.margin:.2f}x)")
        sys.stdout.write(f"the tiny chain: {versus:.2f}x {what}, within {1 + args.margin:.2f}x\n")


if __name__ == "__main__":
    main()
