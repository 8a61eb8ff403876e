"""Cold build vs warm-cache build vs no-op rebuild of the default (tiny) bundle, in one run.

Each build runs ``doit`` in a subprocess with its own artifact root; the warm build uses the
cache the cold build filled. Peak RSS is the largest child's (``ru_maxrss`` of children).

    python benchmarks/bench_build.py [--task TASK] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, print_table, write_results  # noqa: E402


def run_doit(task: list[str], artifacts: Path, cache: Path) -> float:
    env = {
        **os.environ,
        "MNNBUILD_ARTIFACTS": str(artifacts),
        "MNNBUILD_CACHE": str(cache),
        "MNNBUILD_LOG_LEVEL": "WARNING",
    }
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), *task],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", action="append", default=[], help="doit task(s); default: the default tasks")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            base = Path(tmp) / str(i)
            cold = run_doit(args.task, base / "a", base / "cache")
            noop = run_doit(args.task, base / "a", base / "cache")
            warm = run_doit(args.task, base / "b", base / "cache")
            rows.append((i, cold, warm, noop, cold / warm, cold / noop))
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print_table(["run", "cold s", "warm-cache s", "no-op s", "cold/warm", "cold/no-op"], rows)
    sys.stdout.write(f"peak child RSS {peak_mb:.0f} MB\n")
    path = write_results(
        "build",
        {
            "task": args.task or ["(default)"],
            "runs": [
                dict(zip(["run", "cold_s", "warm_s", "noop_s", "cold_over_warm", "cold_over_noop"], r, strict=True))
                for r in rows
            ],
            "peak_child_rss_mb": round(peak_mb, 1),
        },
    )
    sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
