"""Warm `doit bundle` on a fresh artifact root against one copy of the bundle, for one or more checkouts in one run.

Issue 30's goal: a warm-cache ``doit bundle:<task>`` on a fresh runner takes at most the time to copy the bundle once,
plus 20%. Each ``--code LABEL=DIR`` is a checkout (this one, or a worktree of another commit: before and after in one
run); each gets its own local cache, filled once by a cold ``doit bundle`` (its code's keys are its own). Then, round
after round with the order rotated (a busy box slows them alike), every checkout runs ``doit bundle`` on a fresh root
with its warm cache, and the bundle is copied once (``shutil.copytree``, same file system), and the floor runs: a fresh
Python that imports doit, hashes the model's files and copies the bundle (what no content-addressed restore on a fresh
runner can skip: no key is known before the inputs are hashed); ``sync`` before each, so none pays for another's
writeback. A ``LABEL-nostamp`` runs that checkout with the stamp records of its cache deleted
first: a cache none of whose blobs were vouched for (restored from elsewhere), every blob hashed.

    python benchmarks/bench_warm_bundle.py --model-dir DIR --code before=<worktree> --code after=. --rounds 6

Prints the medians and writes ``benchmarks/results/warm_bundle.json`` (under ``--label``, default the model dir's name).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, add_result, checkout_commit, print_table  # noqa: E402

NOSTAMP = "-nostamp"

FLOOR = """
import hashlib, shutil, sys
from pathlib import Path
import doit  # noqa: F401 - the DAG runner every build starts with
model, bundle, dest = map(Path, sys.argv[1:4])
for path in sorted(p for p in model.iterdir() if p.is_file()):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
shutil.copytree(bundle, dest)
"""
"""The least a warm bundle on a fresh runner can do: start Python with doit, hash the model's files once (no key is
known before; a cache cannot vouch for files it did not write) and copy the bundle once."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="an exported model dir (llm.mnn, ...)")
    parser.add_argument("--code", action="append", default=[], help="LABEL=DIR, a checkout (default: this one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--arch", default="v79")
    parser.add_argument("--work", type=Path, default=None, help="dir for roots and caches (default: a temp dir)")
    parser.add_argument("--label", default=None)
    args = parser.parse_args()
    if not (args.model_dir / "llm.mnn").is_file():
        raise SystemExit("--model-dir: expected an exported model dir (llm.mnn, llm.mnn.weight, ...)")
    codes = dict(c.split("=", 1) for c in args.code) if args.code else {"this": str(PROJECT_ROOT)}
    for label, tree in codes.items():
        if not (Path(tree) / "dodo.py").is_file():
            raise SystemExit(f"--code {label}={tree}: no dodo.py there")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-warm-bundle-"))
    models = work / "models"
    models.mkdir(parents=True, exist_ok=True)
    name = "warm-bundle-model"
    task = f"{name}-{args.arch}"
    model_dir = args.model_dir.resolve()
    (models / f"{name}.toml").write_text(
        f'name = "{name}"\nsource = {{ local = "{model_dir}" }}\nchunk_size = 128\ntargets = ["{args.arch}"]\n'
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
    base |= {"MNNBUILD_MODELS_PATH": str(models), "MNNBUILD_LOG_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1"}

    def doit(label: str, root: Path) -> float:
        tree = Path(codes[label])
        cache = work / f"cache-{label.removesuffix(NOSTAMP)}"
        if label.endswith(NOSTAMP):
            for record in cache.glob("blobs/*/*.stamp"):
                record.unlink()
        # PYTHONPATH: the checkout's own mnnbuild, whichever the interpreter has installed
        env = base | {"MNNBUILD_ARTIFACTS": str(root), "MNNBUILD_CACHE": str(cache), "PYTHONPATH": str(tree)}
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "doit", "-f", str(tree / "dodo.py"), f"bundle:{task}"],
            env=env,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"{label}: doit bundle:{task} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return seconds

    # each checkout by its commit (its directory is this machine's)
    commits = {label: checkout_commit(Path(tree)) for label, tree in codes.items()}
    result: dict[str, Any] = {"model": model_dir.name, "arch": args.arch, "codes": commits, "cold_s": {}}
    for label in [c for c in codes if not c.endswith(NOSTAMP)]:
        result["cold_s"][label] = round(doit(label, work / f"cold-{label}"), 2)
    bundle = work / f"cold-{next(iter(codes)).removesuffix(NOSTAMP)}" / name / args.arch / "bundle"
    result["bundle_bytes"] = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())

    runs = [*codes, "copy", "floor"]
    times: dict[str, list[float]] = {run: [] for run in runs}
    for n in range(args.rounds):
        for run in runs[n % len(runs) :] + runs[: n % len(runs)]:
            dest = work / (run if run in ("copy", "floor") else f"warm-{run}")
            shutil.rmtree(dest, ignore_errors=True)
            os.sync()
            if run == "copy":
                started = time.perf_counter()
                shutil.copytree(bundle, dest)
                seconds = time.perf_counter() - started
            elif run == "floor":
                started = time.perf_counter()
                subprocess.run([sys.executable, "-c", FLOOR, str(model_dir), str(bundle), str(dest)], check=True)
                seconds = time.perf_counter() - started
            else:
                seconds = doit(run, dest)
            shutil.rmtree(dest)
            times[run].append(round(seconds, 3))
    median = {run: sorted(t)[len(t) // 2] for run, t in times.items()}
    result["rounds"] = times
    result["median_s"] = median
    result["ratio"] = {run: round(median[run] / median["copy"], 2) for run in codes}
    result["ratio_over_floor"] = {run: round(median[run] / median["floor"], 2) for run in codes}

    print_table(
        ["run", "median s", "min s", "over one copy", "over the floor"],
        [
            [run, median[run], min(times[run]), result["ratio"].get(run, ""), result["ratio_over_floor"].get(run, "")]
            for run in runs
        ],
    )
    path = add_result("warm_bundle", args.label or model_dir.name, result)
    sys.stdout.write(f"wrote {path}\n")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
