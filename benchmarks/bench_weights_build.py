"""How much longer a bundle's context binaries take to build with the model's own int4 weights than in float16.

The two specs of one Qwen3-1.7B-shaped model (``bench_scale.py``'s export), one with ``npu_weights = "int4"``, share
every stage before the context (built once, untimed); then the context stage of each is rebuilt from scratch by
turns (``doit clean`` and ``doit context``, the artifact cache off, each its own process), float16 first in every
round, for ``--rounds`` rounds. The ratio is taken round by round, so the machine's drift during the run moves both
sides of it: a single run of each, minutes apart, differs by ±10% on a shared box. Everything else a bundle build
does (fetch, io, partition, config, the bundle's copy) does not depend on ``npu_weights``.

    MODELS_CACHE=... python benchmarks/bench_weights_build.py --layers 28 [--rounds 3] [--label L]

Prints the rounds and the median ratio; merged into ``benchmarks/results/weights_build.json`` under
``<layers>[-<label>]``. Not part of CI.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table  # noqa: E402
from bench_scale import (  # noqa: E402
    doit_env,
    ensure_model,
    model_args,
    model_name,
    require_cache,
    run_doit,
    save_result,
    write_spec,
)

MODES = ("float16", "int4")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_args(parser, layers=28)
    parser.add_argument("--rounds", type=int, default=3, help="float16 then int4, this many times (default 3)")
    parser.add_argument("--label", default="", help="result key suffix")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds: give at least 1")
    model_dir = ensure_model(args.layers, require_cache(parser, args), args.export_python)
    with tempfile.TemporaryDirectory(prefix="mnnbuild-weights-build-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        models = work / "models"
        names = {mode: f"{model_name(args.layers)}-{mode}" for mode in MODES}
        for mode, name in names.items():
            write_spec(models, name, model_dir, args.arch, mode)
        env = {**doit_env(work / "artifacts", work / "cache", models), "MNNBUILD_CACHE": "off"}
        started = time.perf_counter()
        # everything the context stage reads (the partition and the config), built once, untimed
        run_doit([task for name in names.values() for task in (f"partition:{name}", f"config:{name}-{args.arch}")], env)
        sys.stderr.write(f"partitions built in {time.perf_counter() - started:.0f} s\n")
        rounds: list[dict[str, Any]] = []
        for number in range(1, args.rounds + 1):
            found: dict[str, Any] = {}
            for mode, name in names.items():
                task = f"context:{name}-{args.arch}"
                run_doit(["clean", task], env)
                found[mode] = run_doit([task], env)
            found["ratio"] = round(found["int4"]["wall_s"] / found["float16"]["wall_s"], 3)
            rounds.append(found)
            sys.stderr.write(f"round {number}: {found['float16']['wall_s']} s / {found['int4']['wall_s']} s\n")
    ratios = [r["ratio"] for r in rounds]
    rows = [
        [
            i,
            r["float16"]["wall_s"],
            r["int4"]["wall_s"],
            r["ratio"],
            r["float16"]["peak_rss_mb"],
            r["int4"]["peak_rss_mb"],
        ]
        for i, r in enumerate(rounds, 1)
    ]
    print_table(["round", "float16 s", "int4 s", "int4 / float16", "float16 peak MB", "int4 peak MB"], rows)
    median = statistics.median(ratios)
    sys.stdout.write(f"context stage, int4 over float16: median {median:.3f} (min {min(ratios)}, max {max(ratios)})\n")
    result = {
        "layers": args.layers,
        "arch": args.arch,
        "rounds": rounds,
        "ratio_median": median,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    key = f"{args.layers}" + (f"-{args.label}" if args.label else "")
    path = save_result(key, result, "weights_build.json")
    sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
