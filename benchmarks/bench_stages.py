"""Per-stage wall time and peak memory of the tiny bundle, and context-build speed-up with ``doit -n 2``.

Each stage runs as its own ``doit`` process (earlier stages already up to date), so a process's
peak RSS is that stage's. Then the context binaries are rebuilt with ``-n 1`` and ``-n 2``.
Everything is measured in this one run, cache off.

    python benchmarks/bench_stages.py [--model tiny-qwen3] [--arch v79]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, print_table, write_results  # noqa: E402

from mnnbuild.pipeline.layout import MODEL_STAGES, origin_file, stage_dir  # noqa: E402

STAGES = ("fetch", "io", "partition", "config", "context", "bundle")  # what `doit bundle` runs


def run(task: list[str], artifacts: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one doit process."""
    env = {**os.environ, "MNNBUILD_ARTIFACTS": str(artifacts), "MNNBUILD_CACHE": "off", "MNNBUILD_LOG_LEVEL": "WARNING"}
    cmd = [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), *task]
    # /usr/bin/time is not everywhere; measure the child's RSS with a wrapper that reports getrusage
    wrapper = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:])\n"
        "sys.stderr.write('RSS %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(r.returncode)\n"
    )
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", wrapper, *cmd], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(task)} failed:\n{proc.stdout}\n{proc.stderr}")
    rss = next(int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("RSS "))
    return seconds, rss / 1024


def stage_seconds(artifacts: Path, model: str, arch: str, stage: str) -> float:
    """The stage's own time, as its ``<stage>.origin.json`` recorded it (summed over context subtasks)."""
    where = stage_dir(artifacts, stage, model, None if stage in MODEL_STAGES else arch)
    found = sorted(where.glob("graph*")) if stage == "context" else [where]
    return sum(json.loads((d / origin_file(stage)).read_text()).get("seconds", 0.0) for d in found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--arch", default="v79")
    args = parser.parse_args()
    target = f"{args.model}-{args.arch}"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = Path(tmp) / "artifacts"
        for stage in STAGES:
            task = f"{stage}:{target}" if stage in ("config", "context", "bundle") else f"{stage}:{args.model}"
            seconds, rss = run([task], artifacts)
            rows.append((stage, stage_seconds(artifacts, args.model, args.arch, stage), seconds, rss))
        context_dir = stage_dir(artifacts, "context", args.model, args.arch)
        speed = {}
        for jobs in (1, 2):
            shutil.rmtree(context_dir)
            speed[jobs], _ = run(["-n", str(jobs), f"context:{target}"], artifacts)
    print_table(["stage", "stage s", "process wall s", "peak RSS MB"], rows)
    ratio = speed[1] / speed[2]
    sys.stdout.write(f"context build: -n 1 {speed[1]:.2f} s, -n 2 {speed[2]:.2f} s, speed-up {ratio:.2f}x\n")
    path = write_results(
        "stages",
        {
            "target": target,
            "stages": [
                {"stage": s, "stage_s": round(t, 3), "process_wall_s": round(w, 3), "peak_rss_mb": round(r, 1)}
                for s, t, w, r in rows
            ],
            "context_n1_s": round(speed[1], 3),
            "context_n2_s": round(speed[2], 3),
            "context_speedup": round(ratio, 3),
            "note": "stage_s: the stage function alone; process_wall_s: its doit process incl. start-up",
        },
    )
    sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
