"""Hybrid forward time of a bundle per shape (decode, prefill) and the share spent in the HTP simulator vs MNN.

Builds the bundle with doit (into a temp artifact root unless ``--artifacts`` names one that has it), takes the
unshared twins verify runs from the twin stage (the x86 library cannot load weight-shared binaries), loads
everything once,
then times ``--repeat`` forwards per io sample. "glue" is the rest of a forward: layout conversions and
copies between MNN Vars and numpy. The original model run whole in MNN on the CPU is the baseline.

    python benchmarks/bench_runtime.py [--model tiny-qwen3] [--arch v79] [--repeat 5] [--artifacts DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, print_table, write_results  # noqa: E402

from mnnbuild.pipeline.layout import manifest_file, stage_dir  # noqa: E402

log = logging.getLogger("bench_runtime")


def build(model: str, arch: str, artifacts: Path) -> None:
    """The bundle and the unshared twins it runs with (the twin stage's)."""
    env = {**os.environ, "MNNBUILD_ARTIFACTS": str(artifacts), "MNNBUILD_LOG_LEVEL": "WARNING"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "doit",
            "-f",
            str(PROJECT_ROOT / "dodo.py"),
            f"bundle:{model}-{arch}",
            f"twin:{model}-{arch}",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )


def measure(artifacts: Path, model: str, arch: str, repeat: int) -> dict[str, Any]:
    from mnnbuild_runtime import HybridModel, cpu_forward_fn
    from tqdm import tqdm

    from mnnbuild.cpu import load_vars
    from mnnbuild.manifests.bundle import BundleManifest
    from mnnbuild.manifests.io import IoManifest
    from mnnbuild.manifests.partition import read_merge
    from mnnbuild.pipeline.layout import BUNDLE_MODEL_DIR, REFERENCE_INPUT, stage_dir
    from mnnbuild.verify.checks import read_contexts, read_twins

    def where(stage: str, target: str | None = None, name: str = model) -> Path:
        return stage_dir(artifacts, stage, name, target)  # bound now: ``model`` is the HybridModel below

    merge = read_merge(where("partition"))
    t0 = time.perf_counter()
    contexts, problems = read_contexts(where("context", arch), merge)
    twins, more = read_twins(where("twin", arch), contexts, merge)
    if problems or more:
        raise SystemExit(f"no twins to run: {(problems + more)[0]}")
    twin_seconds = time.perf_counter() - t0
    bundle = where("bundle", arch)
    model_dir = bundle / BUNDLE_MODEL_DIR / BundleManifest.read(bundle).model_name
    io = IoManifest.read(where("io"))
    cpu = cpu_forward_fn(where("fetch"))
    shapes = []
    with HybridModel(model_dir, binary_overrides={p: t.override() for p, t in twins.items()}) as model:
        t0 = time.perf_counter()
        model.load()
        load_seconds = time.perf_counter() - t0
        for sample, sample_dir in zip(io.samples, io.sample_dirs(where("io")), strict=True):
            feed = load_vars(sample_dir / REFERENCE_INPUT)
            model.run(feed)  # warm-up: first-call allocations
            cpu(feed)
            runs = []
            for _ in tqdm(range(repeat), desc=f"seq {sample.seq_len}", leave=False, disable=None):
                t0 = time.perf_counter()
                result = model.run(feed)
                total = time.perf_counter() - t0
                t0 = time.perf_counter()
                cpu(feed)
                runs.append((total, result.qnn_seconds, result.mnn_seconds, time.perf_counter() - t0, result))
            med = {k: statistics.median(r[i] for r in runs) for i, k in enumerate(["total", "qnn", "mnn", "cpu"])}
            per_plugin: dict[str, float] = {}
            for r in runs:
                for step in r[4].steps:
                    if step.kind == "qnn":
                        per_plugin[step.name] = per_plugin.get(step.name, 0.0) + step.seconds / len(runs)
            shapes.append(
                {
                    "seq_len": sample.seq_len,
                    "hybrid_ms": med["total"] * 1e3,
                    "simulator_ms": med["qnn"] * 1e3,
                    "mnn_ms": med["mnn"] * 1e3,
                    "glue_ms": (med["total"] - med["qnn"] - med["mnn"]) * 1e3,
                    "simulator_share": med["qnn"] / med["total"],
                    "mnn_share": med["mnn"] / med["total"],
                    "cpu_whole_model_ms": med["cpu"] * 1e3,
                    "simulator_ms_per_plugin": {k: round(v * 1e3, 3) for k, v in per_plugin.items()},
                }
            )
    return {
        "plugins": len(twins),
        "twin_read_s": round(twin_seconds, 3),
        "load_s": round(load_seconds, 3),
        "repeat": repeat,
        "shapes": shapes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--arch", default="v79")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--artifacts", type=Path, help="artifact root that already has the bundle")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = args.artifacts or Path(tmp) / "artifacts"
        if not (stage_dir(artifacts, "bundle", args.model, args.arch) / manifest_file("bundle")).is_file():
            build(args.model, args.arch, artifacts)
        data = measure(artifacts, args.model, args.arch, args.repeat)
    rows = [
        (
            s["seq_len"],
            s["hybrid_ms"],
            s["simulator_ms"],
            s["mnn_ms"],
            s["glue_ms"],
            f"{s['simulator_share']:.1%}",
            f"{s['mnn_share']:.1%}",
            s["cpu_whole_model_ms"],
        )
        for s in data["shapes"]
    ]
    headers = ["seq", "hybrid ms", "simulator ms", "MNN ms", "glue ms", "sim share", "MNN share", "CPU-only ms"]
    print_table(headers, rows)
    sys.stdout.write(
        f"{data['plugins']} plugins; twins found in {data['twin_read_s']:.2f} s, contexts + modules loaded in "
        f"{data['load_s']:.2f} s; median of {data['repeat']} forwards\n"
    )
    path = write_results("runtime", {"model": args.model, "arch": args.arch, **data})
    sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
