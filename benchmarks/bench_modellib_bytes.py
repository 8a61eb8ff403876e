"""Bytes the modellib stage writes for one partition, in its artifact dir and in a fresh cache.

Runs whatever ``mnnbuild`` is importable, so a before/after pair is two runs on the same partition (e.g. of
``bench_scale.py --keep``), one with ``PYTHONPATH`` pointing at an older checkout:

    python benchmarks/bench_modellib_bytes.py MODEL_DIR PARTITION_DIR WORK_DIR [--label before] [--layers 4]

Hard links count once (``du``), a cache blob linked to an output too; ``io_written_mb`` is what the process
wrote to the block device. The result is merged into ``benchmarks/results/scale.json`` under
``layers`` / the commit of the code measured / ``<n>-modellib-bytes`` / ``<label>``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, checkout_commit  # noqa: E402
from bench_scale import written  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("partition_dir", type=Path)
    parser.add_argument("work", type=Path, help="a new dir for the output and the cache")
    parser.add_argument("--label", default="after")
    parser.add_argument("--layers", default="4")
    args = parser.parse_args()
    import mnnbuild
    from mnnbuild.pipeline.cache import ArtifactCache
    from mnnbuild.stages.modellib import ModellibInputs, ModellibParams, build_modellib

    out = args.work / "modellib"
    started = time.perf_counter()
    inputs = ModellibInputs(model="bench", model_dir=args.model_dir, partition_dir=args.partition_dir)
    build_modellib(inputs, ModellibParams(), out)
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    ArtifactCache(str(args.work / "cache")).store("modellib", "bench", out)
    total = resource.getrusage(resource.RUSAGE_SELF)
    artifacts_bytes, cache_bytes = written(out, args.work / "cache")
    result = {
        "code": checkout_commit(Path(mnnbuild.__file__).resolve().parent.parent),
        "seconds": round(seconds, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "io_written_mb": round(total.ru_oublock / 2048),
        "artifacts_mb": round(artifacts_bytes / 1e6, 1),
        "cache_mb": round(cache_bytes / 1e6, 1),
    }
    sys.stdout.write(json.dumps(result) + "\n")
    path = RESULTS / "scale.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    runs = data.setdefault("layers", {}).setdefault(result["code"], {})
    runs.setdefault(f"{args.layers}-modellib-bytes", {})[args.label] = result
    path.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
