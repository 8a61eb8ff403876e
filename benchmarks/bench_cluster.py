"""What a stage run on a Dask cluster adds to it: the per-task overhead of submitting, fetching inputs and storing.

A loopback cluster (``dask scheduler`` and one ``dask worker``, one task at a time, on 127.0.0.1) and a shared cache
directory. One run each, on fresh artifact roots:

1. floor: ``doit bundle:<model>-<arch>`` on this machine, the cache off: each task's own seconds (its origin record).
2. cluster: the same with ``MNNBUILD_SCHEDULER`` and ``doit -n 1`` (one task at a time, so nothing overlaps): per
   task, from its origin record, the worker's check (key recomputed: code, schema, tools), its restore of the inputs
   from the cache, the stage's run, its store; the client's wait for the result (submit + the worker's part) and its
   restore of the outputs. Overhead = the client's wait + its restore - the worker's run of the stage.

    python benchmarks/bench_cluster.py [--model tiny-qwen3] [--arch v79]

Prints a table; writes ``benchmarks/results/cluster.json`` under the model's name. Ratios are against the floor
measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, add_result, print_table  # noqa: E402


def doit(args: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), *args], env=env,
                          cwd=cwd, capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return time.perf_counter() - started


def origins(root: Path) -> dict[str, dict[str, Any]]:
    """Every stage dir's origin record, by its path under the artifact root (fetch left out: it runs here)."""
    found = {}
    for path in root.rglob("*.origin.json"):
        if not path.name.startswith("fetch"):
            found[path.parent.relative_to(root).as_posix()] = json.loads(path.read_text())
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--arch", default="v79")
    args = parser.parse_args()
    target = f"bundle:{args.model}-{args.arch}"
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    path = os.pathsep.join([str(PROJECT_ROOT), str(PROJECT_ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MNNBUILD_", "DASK_"))}
    base.update({"PYTHONPATH": path, "HF_HUB_OFFLINE": "1"})
    procs: list[subprocess.Popen[bytes]] = []
    try:
        floor_wall = doit([target], {**base, "MNNBUILD_ARTIFACTS": str(work / "floor"), "MNNBUILD_CACHE": "off"}, work)
        floor = origins(work / "floor")
        port = free_port()
        address = f"tcp://127.0.0.1:{port}"
        cluster_env = {**base, "MNNBUILD_CACHE": "off", "MNNBUILD_WORKER_DIR": str(work / "scratch")}
        worker = ["worker", address, "--no-nanny", "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1",
                  "--preload", "mnnbuild.cluster.worker"]  # fmt: skip
        for cmd in (["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], worker):
            procs.append(subprocess.Popen([sys.executable, "-m", "dask", *cmd], env=cluster_env, cwd=work,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
            time.sleep(3)
        env = {**base, "MNNBUILD_ARTIFACTS": str(work / "cluster"), "MNNBUILD_CACHE": str(work / "cache"),
               "MNNBUILD_SCHEDULER": address, "MNNBUILD_SCHEDULER_TIMEOUT": "30"}  # fmt: skip
        cluster_wall = doit(["-n", "1", target], env, work)
        remote = origins(work / "cluster")
    finally:
        below = [p for proc in procs if proc.poll() is None for p in psutil.Process(proc.pid).children(recursive=True)]
        for proc in reversed(procs):
            proc.kill()
            proc.wait()
        psutil.wait_procs(below, timeout=10)
        for p in below:  # what a worker started ends with it (mnnbuild.cluster.child); if not, not beyond this run
            if p.is_running():
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
    rows, tasks = [], {}
    for rel, record in sorted(remote.items()):
        t = record["cluster"]
        run = float(t["run"])
        overhead = float(t["wait"]) + float(t["restore_here"]) - run
        own = float(floor[rel]["seconds"])
        submit = float(t["wait"]) - sum(float(t[k]) for k in ("check", "restore", "run", "store"))
        tasks[rel] = {**t, "floor_seconds": own, "overhead": round(overhead, 3), "submit": round(submit, 3)}
        rows.append([rel, own, run, submit, t["check"], t["restore"], t["store"], t["restore_here"], overhead,
                     round(overhead / own, 2) if own else "-"])  # fmt: skip
    print_table(["stage dir", "floor s", "run s", "submit", "check", "fetch", "store", "restore here", "overhead",
                 "overhead / floor"], rows)  # fmt: skip
    overheads = [v["overhead"] for v in tasks.values()]
    summary = {
        "target": target,
        "floor_wall_seconds": round(floor_wall, 2),
        "cluster_wall_seconds": round(cluster_wall, 2),
        "median_overhead_seconds": round(statistics.median(overheads), 3),
        "tasks": tasks,
    }
    sys.stdout.write(f"wall: {floor_wall:.1f} s here, {cluster_wall:.1f} s on the loopback cluster (one task at a "
                     f"time); median overhead per task {summary['median_overhead_seconds']:.2f} s\n")  # fmt: skip
    print(add_result("cluster", args.model, summary))  # noqa: T201


if __name__ == "__main__":
    main()
