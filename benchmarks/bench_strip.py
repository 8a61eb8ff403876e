"""What shipping only the weight bytes the phone reads costs and saves, on a Qwen3-1.7B-shaped model (issue 26).

Builds the model (``bench_scale.py``'s export and spec) through ``doit`` stage by stage up to verify, each stage its
own process with a local artifact cache on the artifacts' file system, recording wall time, peak RSS and bytes
written (artifacts and cache, hard links once). Then, in this process and on the same files: the bundle's bytes by
part, the shipped weight file against the source's (and what of it the tied embeddings and the CPU ops read), the
seconds the partition spends writing it (its ranges planned and copied from the source again, timed alone), and
the seconds a copy of the source weight file (what the bundle shipped before) and of the shipped one take. Verify
runs the bundle (its CPU ops on the shipped weight file, its embeddings through the moved ``tie_embeddings``).

    python benchmarks/bench_strip.py --layers 28 [--no-verify] [--label L]

Results are merged into ``benchmarks/results/strip.json`` under the layer count (plus ``-<label>``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table  # noqa: E402
from bench_scale import (  # noqa: E402
    PER_TARGET,
    doit_env,
    ensure_model,
    measure_stage,
    model_args,
    model_name,
    save_result,
    write_spec,
)

from mnnbuild.manifests.bundle import BundleManifest  # noqa: E402
from mnnbuild.manifests.partition import PartitionManifest  # noqa: E402
from mnnbuild.mnn import (  # noqa: E402
    WeightRange,
    external_ranges,
    load_model,
    plan_weights,
    tie_embeddings,
    write_weights,
)
from mnnbuild.stages.bundle import place  # noqa: E402

RESULTS_FILE = "strip.json"
CHAIN = ("fetch", "io", "partition", "config", "context", "bundle", "twin", "verify")


def bundle_parts(bundle_dir: Path, weight_file: str) -> dict[str, int]:
    """The bundle's bytes by part: the weight file, the context binaries, the partitioned model, the rest."""
    manifest = BundleManifest.read(bundle_dir)
    prefix = f"model/{manifest.model_name}/"
    parts = {"weight file": 0, "context binaries": 0, "qnn/llm.mnn": 0, "other": 0}
    for rec in manifest.outputs:
        rel = rec.path.removeprefix(prefix)
        key = (
            "weight file"
            if rel == weight_file
            else "context binaries"
            if rel.startswith("qnn/") and rel.endswith(".bin")
            else "qnn/llm.mnn"
            if rel == "qnn/llm.mnn"
            else "other"
        )
        parts[key] += rec.size
    return parts


def strip_alone(model_dir: Path, partition_dir: Path, scratch: Path) -> float:
    """Seconds to plan and write the shipped weight file again from the source: the ranges the partitioned model's
    CPU ops read (the source ops of the same names) and the tied embeddings."""
    readers = {r.reader for r in external_ranges(load_model(partition_dir / "qnn" / "llm.mnn"))}  # "op '<name>'"
    ranges = [r for r in external_ranges(load_model(model_dir / "llm.mnn")) if r.reader in readers]
    config = json.loads((model_dir / "llm_config.json").read_text())
    tie = tie_embeddings(config, model_dir / "llm_config.json")
    tied: list[WeightRange] = [r for r in [tie.weight_range() if tie else None] if r is not None]
    started = time.perf_counter()
    plan = plan_weights(model_dir / "llm.mnn.weight", ranges + tied, never_at_zero=[r.offset for r in tied])
    write_weights(plan, scratch / "stripped.weight")
    seconds = time.perf_counter() - started
    (scratch / "stripped.weight").unlink()
    return seconds


def timed_copy(src: Path, scratch: Path) -> float:
    started = time.perf_counter()
    place(src, scratch / "copy")
    seconds = time.perf_counter() - started
    (scratch / "copy").unlink()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(parser, 28)
    parser.add_argument("--no-verify", action="store_true", help="stop after the bundle (no twin, no verify)")
    parser.add_argument("--label", default="", help="result key suffix")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    args = parser.parse_args()

    name = model_name(args.layers)
    target = f"{name}-{args.arch}"
    model_dir = ensure_model(args.layers, args.models_cache, args.export_python)
    key = str(args.layers) + (f"-{args.label}" if args.label else "")
    work = Path(tempfile.mkdtemp(prefix=f"bench-strip-{name}-", dir=args.work))
    artifacts, cache, models = work / "artifacts", work / "cache", work / "models"
    artifacts.mkdir()
    cache.mkdir()
    write_spec(models, name, model_dir, args.arch)
    env = doit_env(artifacts, cache, models)
    stages = CHAIN[: CHAIN.index("bundle") + 1] if args.no_verify else CHAIN
    rows: dict[str, dict[str, Any]] = {}
    result: dict[str, Any] = {"model": name, "target": target, "stages": rows}
    try:
        for stage in stages:
            task = f"{stage}:{target}" if stage in PER_TARGET else f"{stage}:{name}"
            rec = measure_stage(task, env, artifacts, cache)
            if stage == "verify":
                report = json.loads((artifacts / name / args.arch / "verify" / "verify.json").read_text())
                rec["passed"] = report.get("passed")
                rec["checks_s"] = report.get("timings", {})
                gen = report.get("generation") or {}
                rec["generation"] = {k: gen.get(k) for k in ("passed", "cpu_tokens", "hybrid_tokens")}
            rows[stage] = rec
            sys.stderr.write(f"{stage}: {rec}\n")
            save_result(key, {**result, "partial": True}, RESULTS_FILE)
        partition_dir = artifacts / name / "partition"
        shipped = PartitionManifest.read(partition_dir).weights
        result["weights"] = {
            "source_mb": round(shipped.source_bytes / 1e6, 1),
            "shipped_mb": round(shipped.bytes / 1e6, 1),
            "shipped_over_source": round(shipped.bytes / shipped.source_bytes, 4),
            "tie_embeddings_mb": round(shipped.tie_embedding_bytes / 1e6, 1),
            "cpu_ops_mb": round(shipped.cpu_op_bytes / 1e6, 1),
            "blocks": len(shipped.blocks),
        }
        parts = bundle_parts(artifacts / name / args.arch / "bundle", shipped.file)
        result["bundle_mb"] = {k: round(v / 1e6, 1) for k, v in parts.items()}
        result["bundle_total_mb"] = round(sum(parts.values()) / 1e6, 1)
        # the same bundle with the whole source weight file, as it was shipped before
        result["bundle_total_before_mb"] = round((sum(parts.values()) - shipped.bytes + shipped.source_bytes) / 1e6, 1)
        scratch = artifacts / "scratch"
        scratch.mkdir()
        result["strip_alone_s"] = round(strip_alone(model_dir, partition_dir, scratch), 2)
        result["copy_source_weight_s"] = round(timed_copy(model_dir / "llm.mnn.weight", scratch), 2)
        result["copy_shipped_weight_s"] = round(timed_copy(partition_dir / shipped.file, scratch), 2)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            sys.stderr.write(f"kept {work}\n")

    keys = ("wall_s", "peak_rss_mb", "artifacts_mb", "cache_mb", "io_written_mb", "load_avg")
    print_table(
        ["stage", "wall s", "peak RSS MB", "artifacts MB", "cache MB", "io written MB", "load"],
        [(s, *(r[k] for k in keys)) for s, r in rows.items()],
    )
    w = result["weights"]
    out = sys.stdout.write
    out(
        f"weight file shipped: {w['shipped_mb']} MB of the source's {w['source_mb']} MB "
        f"({w['shipped_over_source']:.1%}): tied embeddings {w['tie_embeddings_mb']} MB, CPU ops {w['cpu_ops_mb']} MB\n"
    )
    out(
        "bundle by part (MB): " + ", ".join(f"{k} {v}" for k, v in result["bundle_mb"].items())
        + f"; total {result['bundle_total_mb']} MB (with the whole source weight file: "
        f"{result['bundle_total_before_mb']} MB)\n"
    )  # fmt: skip
    out(
        f"writing the shipped file alone: {result['strip_alone_s']} s; copying the source weight file (the bundle's "
        f"copy before): {result['copy_source_weight_s']} s, the shipped one: {result['copy_shipped_weight_s']} s\n"
    )
    if "verify" in rows:
        v = rows["verify"]
        out(f"verify: passed={v['passed']}, checks (s): " + ", ".join(f"{k} {t}" for k, t in v["checks_s"].items()))
        out(f"; generation {v['generation']}\n")
    out(f"wrote {save_result(key, result, RESULTS_FILE)}\n")


if __name__ == "__main__":
    main()
