"""Cold build vs warm-cache build vs no-op rebuild of the default (tiny) bundle, in one run.

Each build runs ``doit`` in a subprocess with its own artifact root; the warm build uses the
cache the cold build filled. Peak RSS is the largest child's (``ru_maxrss`` of children).

With ``--baseline REV`` the same three builds also run on the tree of git revision ``REV``
(extracted with ``git archive`` into a temp dir, put first on ``PYTHONPATH``), alternating with
the working tree's, and the table gives this tree's time over the baseline's for each: a ratio
from one run, so the machine's load hits both alike.

    python benchmarks/bench_build.py [--task TASK] [--repeat N] [--baseline REV]
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, print_table, write_results  # noqa: E402

KINDS = ("cold", "warm", "noop")


def run_doit(tree: Path, task: list[str], artifacts: Path, cache: Path) -> float:
    env = {
        **os.environ,
        "MNNBUILD_ARTIFACTS": str(artifacts),
        "MNNBUILD_CACHE": str(cache),
        "MNNBUILD_LOG_LEVEL": "WARNING",
    }
    if tree != PROJECT_ROOT:  # the baseline's packages shadow the editable install of this tree
        env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "runtime")])
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "doit", "-f", str(tree / "dodo.py"), *task],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - started


def three_builds(tree: Path, task: list[str], base: Path) -> dict[str, float]:
    cold = run_doit(tree, task, base / "a", base / "cache")
    noop = run_doit(tree, task, base / "a", base / "cache")
    warm = run_doit(tree, task, base / "b", base / "cache")
    return {"cold": cold, "warm": warm, "noop": noop}


def extract(rev: str, dest: Path) -> Path:
    data = subprocess.run(["git", "-C", str(PROJECT_ROOT), "archive", rev], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", action="append", default=[], help="doit task(s); default: the default tasks")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", help="git revision to compare with, in the same run")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": PROJECT_ROOT}
        if args.baseline:
            trees["baseline"] = extract(args.baseline, Path(tmp) / "baseline-tree")
        for i in range(args.repeat):
            for name, tree in trees.items():
                runs.append({"run": i, "tree": name, **three_builds(tree, args.task, Path(tmp) / f"{name}{i}")})
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    rows = [(r["run"], r["tree"], *(r[k] for k in KINDS)) for r in runs]
    print_table(["run", "tree", "cold s", "warm-cache s", "no-op s"], rows)
    ratios = {}
    if args.baseline:
        for k in KINDS:
            this = sorted(r[k] for r in runs if r["tree"] == "this")
            base = sorted(r[k] for r in runs if r["tree"] == "baseline")
            ratios[k] = this[len(this) // 2] / base[len(base) // 2]  # medians
        sys.stdout.write(
            f"this tree / {args.baseline} (medians): " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()) + "\n"
        )
    sys.stdout.write(f"peak child RSS {peak_mb:.0f} MB; load average {os.getloadavg()[0]:.1f}\n")
    path = write_results(
        "build",
        {
            "task": args.task or ["(default)"],
            "baseline": args.baseline,
            "runs": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in runs],
            "this_over_baseline": {k: round(v, 3) for k, v in ratios.items()},
            "peak_child_rss_mb": round(peak_mb, 1),
            "load_average_end": round(os.getloadavg()[0], 2),
        },
    )
    sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
