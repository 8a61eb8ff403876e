"""Several prefill lengths: the prefill time a short prompt saves vs the context size and build time it costs.

Builds one model with doit (cache off) under two names: with ``chunk_sizes = [128]`` (upstream's one prefill
graph) and with ``[128, 32]`` (``--lengths`` picks them). Per build it records the wall time of ``doit bundle``
(fetch ... bundle), each stage's own seconds (its ``<stage>.origin.json``) and the bytes of the shipped context
binaries; ``--builds`` rounds (default 2, in alternating order, each from scratch), the fastest per variant
counting. Then the runtime plans a ``--prompt-tokens`` prompt (default 20) as MNN's engine does
(``Bundle.prefill_blocks``: one block padded to 128, or to 32 with the short graph) and runs those forwards
``--repeat`` times in the hybrid runtime (CPU ops in MNN, every plugin's unshared twin in the x86 HTP simulator,
as verify runs them): the medians of the simulator's share and of the whole forward. The ratios (second /
first) come from this one run.

    python benchmarks/bench_chunks.py                               # the tiny model
    python benchmarks/bench_chunks.py --qwen3-layers 4 --builds 1   # bench_scale's real-size Qwen3-1.7B slice

Prints a table and writes ``benchmarks/results/chunks.json`` (the key is the model, so runs of the tiny model
and of the real-size slice sit side by side).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, RESULTS, machine, print_table  # noqa: E402
from bench_scale import MODELS_CACHE_ENV, cache_args  # noqa: E402

BUILD_STAGES = ("fetch", "io", "partition", "config", "context", "bundle", "twin")
PER_PLUGIN = ("context", "twin")


def write_spec(models_dir: Path, name: str, model_dir: Path, lengths: list[int], arch: str) -> None:
    text = f'name = "{name}"\nsource = {{ local = "{model_dir}" }}\nchunk_sizes = {lengths}\ntargets = ["{arch}"]\n'
    (models_dir / f"{name}.toml").write_text(text)


def build(name: str, arch: str, env: dict[str, str]) -> float:
    """Wall seconds of ``doit bundle:<name>-<arch> twin:<name>-<arch>`` (every stage up to the bundle, and the
    unshared twins the runtime runs in the simulator)."""
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "doit",
            "-f",
            str(PROJECT_ROOT / "dodo.py"),
            f"bundle:{name}-{arch}",
            f"twin:{name}-{arch}",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"doit bundle/twin:{name}-{arch} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return time.perf_counter() - started


def stage_seconds(artifacts: Path, name: str, arch: str) -> dict[str, float]:
    """Each stage's own seconds (context, twin: their subtasks summed), from the origin files the tasks wrote."""
    from mnnbuild.pipeline.layout import origin_file
    from mnnbuild.stages.chain import CHAIN, stage_dir

    seconds: dict[str, float] = {}
    for stage in BUILD_STAGES:
        where = stage_dir(artifacts, stage, name, arch if CHAIN[stage].per_target else None)
        files = sorted(where.glob(f"*/{origin_file(stage)}")) if stage in PER_PLUGIN else [where / origin_file(stage)]
        seconds[stage] = round(sum(json.loads(f.read_text())["seconds"] for f in files), 3)
    return seconds


def measure_prefill(artifacts: Path, name: str, arch: str, tokens: int, repeat: int) -> dict[str, Any]:
    """Median seconds of the forwards MNN's engine would run for a ``tokens`` prompt, in the hybrid runtime."""
    from mnnbuild_runtime import Embeddings, HybridModel, llm_inputs

    from mnnbuild.manifests.bundle import BundleManifest
    from mnnbuild.manifests.partition import read_merge
    from mnnbuild.pipeline.layout import BUNDLE_MODEL_DIR
    from mnnbuild.qnn import QnnLibrary
    from mnnbuild.stages.chain import stage_dir
    from mnnbuild.verify.checks import read_contexts, read_twins

    lib = QnnLibrary()
    merge = read_merge(stage_dir(artifacts, "partition", name))
    contexts, _ = read_contexts(stage_dir(artifacts, "context", name, arch), merge)
    twins, _ = read_twins(stage_dir(artifacts, "twin", name, arch), contexts, merge)  # the twin stage's
    bundle = stage_dir(artifacts, "bundle", name, arch)
    model_dir = bundle / BUNDLE_MODEL_DIR / BundleManifest.read(bundle).model_name
    overrides = {p: t.override() for p, t in twins.items()}
    with HybridModel(model_dir, binary_overrides=overrides, qnn_lib=lib) as model:
        model.load()
        embed = Embeddings(model.bundle.model_dir)
        ids = list(range(10, 10 + tokens))
        blocks = model.bundle.prefill_blocks(tokens)
        # the blocks' shapes and order are the engine's; without a KV cache their numbers are not (timing only)
        feeds, at = [], 0
        for b in blocks:
            feeds.append(llm_inputs(embed(ids[at : at + b.tokens]), b.size))
            at += b.tokens
        for feed in feeds:  # warm-up: first-call allocations
            model.run(feed)
        runs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            results = [model.run(feed) for feed in feeds]
            wall = time.perf_counter() - t0
            runs.append((sum(r.qnn_seconds for r in results), sum(r.mnn_seconds for r in results), wall))
    return {
        "blocks": [[b.tokens, b.size] for b in blocks],
        "simulator_ms": round(statistics.median(r[0] for r in runs) * 1e3, 3),
        "mnn_ms": round(statistics.median(r[1] for r in runs) * 1e3, 3),
        "forward_ms": round(statistics.median(r[2] for r in runs) * 1e3, 3),
        "graphs_run": sorted({s.graph for r in results for s in r.steps if s.graph}),
    }


def measure(model_dir: Path, label: str, variants: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    from mnnbuild.manifests.bundle import BundleManifest
    from mnnbuild.pipeline.layout import BUNDLE_MODEL_DIR
    from mnnbuild.stages.chain import stage_dir

    names = [f"{label}-c{'-'.join(map(str, lengths))}" for lengths in variants]
    with tempfile.TemporaryDirectory(prefix="bench-chunks-") as tmp:
        work = Path(tmp)
        (work / "models").mkdir()
        for name, lengths in zip(names, variants, strict=True):
            write_spec(work / "models", name, model_dir, lengths, args.arch)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MNNBUILD_")}
        env.update({"MNNBUILD_MODELS_PATH": str(work / "models"), "MNNBUILD_CACHE": "off", "HF_HUB_OFFLINE": "1"})
        env["MNNBUILD_LOG_LEVEL"] = "WARNING"
        # rounds alternate the order and each builds from scratch in its own root; the fastest round counts,
        # so a busy moment of a shared machine hurts one variant less
        rounds: list[dict[str, tuple[float, dict[str, float]]]] = []
        for r in range(args.builds):
            artifacts = work / f"artifacts{r}"
            env["MNNBUILD_ARTIFACTS"] = str(artifacts)
            done = {}
            for name in names if r % 2 == 0 else names[::-1]:
                sys.stderr.write(f"round {r + 1}/{args.builds}: building {name} ...\n")
                wall = build(name, args.arch, env)
                done[name] = (wall, stage_seconds(artifacts, name, args.arch))
            rounds.append(done)
        results = []
        for name, lengths in zip(names, variants, strict=True):
            best = min(range(args.builds), key=lambda r: sum(rounds[r][name][1].values()))
            wall, stages = rounds[best][name]
            bundle = stage_dir(artifacts, "bundle", name, args.arch)
            qnn = bundle / BUNDLE_MODEL_DIR / BundleManifest.read(bundle).model_name / "qnn"
            binaries = sorted(qnn.glob("graph*.bin"))
            sys.stderr.write(f"timing the prefill of {args.prompt_tokens} tokens on {name} ...\n")
            results.append(
                {
                    "chunk_sizes": lengths,
                    "chunk_limits": [*sorted(lengths, reverse=True), 1],
                    "plugins": len(binaries),
                    "graphs_per_plugin": 1 + len(lengths),
                    "context_bytes": sum(b.stat().st_size for b in binaries),
                    "build_wall_s": round(wall, 2),
                    "stage_s": stages,
                    "build_rounds_stage_s": [round(sum(d[name][1].values()), 3) for d in rounds],
                    "prefill": measure_prefill(artifacts, name, args.arch, args.prompt_tokens, args.repeat),
                }
            )
    base, more = results[0], results[-1]
    ratios = {
        "context_bytes": more["context_bytes"] / base["context_bytes"],
        "build_wall_s": more["build_wall_s"] / base["build_wall_s"],
        "build_stage_s": sum(more["stage_s"].values()) / sum(base["stage_s"].values()),
        "context_stage_s": more["stage_s"]["context"] / base["stage_s"]["context"],
        "prefill_simulator_ms": more["prefill"]["simulator_ms"] / base["prefill"]["simulator_ms"],
        "prefill_forward_ms": more["prefill"]["forward_ms"] / base["prefill"]["forward_ms"],
    }
    return {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        # no machine path in the results: the project's models relative to it, an exported one under $MODELS_CACHE
        "model_dir": str(
            model_dir.relative_to(PROJECT_ROOT)
            if model_dir.is_relative_to(PROJECT_ROOT)
            else f"${MODELS_CACHE_ENV}/{model_dir.name}"
        ),
        "arch": args.arch,
        "prompt_tokens": args.prompt_tokens,
        "repeat": args.repeat,
        "builds": args.builds,
        "load_average": os.getloadavg()[0],
        "variants": results,
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=PROJECT_ROOT / "models" / "tiny-qwen3")
    parser.add_argument("--qwen3-layers", type=int, help="use bench_scale's Qwen3-1.7B slice of this many layers")
    cache_args(parser)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 32], help="the several-length variant")
    parser.add_argument("--arch", default="v79")
    parser.add_argument("--prompt-tokens", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5, help="timed prefills per variant (median)")
    parser.add_argument("--builds", type=int, default=2, help="from-scratch builds per variant (fastest counts)")
    args = parser.parse_args()
    if args.qwen3_layers:
        from bench_scale import ensure_model, model_name, require_cache

        model_dir = ensure_model(args.qwen3_layers, require_cache(parser, args), args.export_python)
        label = model_name(args.qwen3_layers)
    else:
        model_dir, label = args.model_dir.resolve(), args.model_dir.name.lower()
    variants = [[max(args.lengths)], sorted(args.lengths, reverse=True)]
    data = measure(model_dir, label, variants, args)

    rows = []
    for v in data["variants"]:
        p = v["prefill"]
        rows.append(
            (
                str(v["chunk_sizes"]),
                v["graphs_per_plugin"],
                f"{v['context_bytes'] / 1e6:.2f}",
                v["stage_s"]["context"],
                sum(v["stage_s"].values()),
                v["build_wall_s"],
                " ".join(f"{t}@{s}" for t, s in p["blocks"]),
                p["simulator_ms"],
                p["forward_ms"],
            )
        )
    r = data["ratios"]
    rows.append(
        (
            "ratio",
            "",
            f"{r['context_bytes']:.2f}x",
            f"{r['context_stage_s']:.2f}x",
            f"{r['build_stage_s']:.2f}x",
            f"{r['build_wall_s']:.2f}x",
            "",
            f"{r['prefill_simulator_ms']:.2f}x",
            f"{r['prefill_forward_ms']:.2f}x",
        )
    )
    headers = [
        "chunk_sizes", "graphs/plugin", "context MB", "context s", "stages s", "build wall s",
        f"prefill of {data['prompt_tokens']}", "simulator ms", "forward ms",
    ]  # fmt: skip
    print_table(headers, rows)
    path = RESULTS / "chunks.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.is_file() else {}
    runs = {**old.get("runs", {}), label: data}
    path.write_text(json.dumps({"machine": machine(), "runs": runs}, indent=2) + "\n")
    sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
