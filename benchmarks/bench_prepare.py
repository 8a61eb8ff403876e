"""HTP prepare (graph finalize) time of a model's plugins against Qualcomm's floor, measured in one run.

For every plugin (a ``merge`` entry of the partition's ``npu_postreat.json``) the decode and prefill graphs
are composed from the modellib graph dirs into one weight-shared context for the target, with the context
stage's settings, and each graph's ``graphFinalize`` is timed (wall and process CPU: QNN prepares on
threads, and the CPU time moves less when the machine is shared). The floor is the same plugin's linear
ops alone (each ``Conv2d`` with its weights, fed by its own graph input), composed and finalized the
same way. Another variant wires those linear ops as the graph does (each reads the nearest linear op
upstream, nothing in between): the part of the gap that is Qualcomm's cost of a chained layer rather than
our other nodes. When the graphs were lowered before the channel-last layout pass existed (an older
modellib), the pass is applied to them too and measured, so one run shows before, after and the floor.
Results are added to ``benchmarks/results/prepare.json`` under ``--label``.

    python benchmarks/bench_prepare.py artifacts/qwen3-1.7b-l1 [--label L1] [--plugin qnn/graphllm1.bin]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, print_table, write_results  # noqa: E402
from _floor import linear_ops_alone, linear_ops_chained  # noqa: E402

from mnnbuild.lowering.channel_last import channel_last  # noqa: E402
from mnnbuild.lowering.graph import (  # noqa: E402
    GraphDescription,
    compose,
    read_graph_description,
    read_static,
)
from mnnbuild.manifests.partition import read_merge  # noqa: E402
from mnnbuild.model.targets import soc_for_arch  # noqa: E402
from mnnbuild.qnn import ContextBuilder, HtpTarget, QnnLibrary  # noqa: E402

Graph = tuple[GraphDescription, dict[str, np.ndarray]]


def prepare(lib: QnnLibrary, target: HtpTarget, graphs: dict[str, Graph]) -> tuple[list[dict[str, Any]], int]:
    """Compose ``graphs`` (name -> description, static data) into one weight-shared context, finalize each;
    per graph its node count, node kinds and finalize wall/CPU seconds, and the context binary's size."""
    rows = []
    with ContextBuilder(lib, target, weight_sharing=True) as ctx:
        for name, (desc, statics) in graphs.items():
            builder = ctx.add_graph(name)
            compose(desc, statics, builder)
            wall, cpu = time.perf_counter(), time.process_time()
            builder.finalize()
            rows.append(
                {
                    "graph": name,
                    "nodes": len(desc.nodes),
                    "kinds": dict(Counter(n.type for n in desc.nodes)),
                    "finalize_s": round(time.perf_counter() - wall, 3),
                    "finalize_cpu_s": round(time.process_time() - cpu, 3),
                }
            )
        size = len(ctx.serialize())
    return rows, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_artifacts", type=Path, help="artifacts/<model> after `doit modellib:<model>`")
    parser.add_argument("--arch", default="v79")
    parser.add_argument(
        "--plugin", action="append", help="merge key(s) to measure, e.g. qnn/graphllm1.bin (default all)"
    )
    parser.add_argument("--label", default="current", help="key of this run in prepare.json (before, after ...)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("mnnbuild.qnn.lib").setLevel(logging.ERROR)

    modellib = args.model_artifacts / "modellib"
    merge = read_merge(args.model_artifacts / "partition")
    soc = soc_for_arch(args.arch)
    target = HtpTarget(soc.soc_id, soc.arch_number, soc.vtcm_mb)
    lib = QnnLibrary()
    plugins = []
    table = []
    for binary, graph_dirs in merge.items():
        if args.plugin and binary not in args.plugin:
            continue
        graphs: dict[str, Graph] = {}
        for g in graph_dirs:
            desc = read_graph_description(modellib / g)
            graphs[Path(g).name] = (desc, {t.name: read_static(modellib / g, t) for t in desc.static_tensors})
        variants = {"as built": prepare(lib, target, graphs)}
        # graphs lowered before the layout pass existed: measure what the lowering makes of them now
        relaid = {name: channel_last(desc, statics) for name, (desc, statics) in graphs.items()}
        if any(relaid[name][0] != desc for name, (desc, _) in graphs.items()):
            variants["layout pass"] = prepare(lib, target, relaid)
        # the linear ops wired as in the layer, nothing between them: how much of the gap the chain itself costs
        chained = {name: (linear_ops_chained(desc), statics) for name, (desc, statics) in graphs.items()}
        variants["linear ops chained"] = prepare(lib, target, chained)
        floor_graphs = {name: (linear_ops_alone(desc), statics) for name, (desc, statics) in graphs.items()}
        floor, floor_size = prepare(lib, target, floor_graphs)
        floor_total = sum(r["finalize_s"] for r in floor)
        record: dict[str, Any] = {"binary": binary, "floor": {"graphs": floor, "binary_bytes": floor_size}}
        for variant, (rows, size) in variants.items():
            for o, f in zip(rows, floor, strict=True):
                ratio = o["finalize_s"] / f["finalize_s"]
                table.append((binary, variant, o["graph"], o["nodes"], o["finalize_s"], f["finalize_s"], ratio))
            total = sum(r["finalize_s"] for r in rows)
            table.append((binary, variant, "total", "", total, floor_total, total / floor_total))
            record[variant] = {
                "graphs": rows,
                "finalize_s": round(total, 3),
                "ratio_to_floor": round(total / floor_total, 2),
                "binary_bytes": size,
            }
        plugins.append(record)
    print_table(["plugin", "variant", "graph", "nodes", "finalize s", "floor s", "ratio"], table)
    previous = RESULTS / "prepare.json"
    runs = json.loads(previous.read_text()).get("runs", {}) if previous.exists() else {}
    runs[args.label] = {
        "model": args.model_artifacts.name,
        "target": soc.name,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "plugins": plugins,
    }
    path = write_results(
        "prepare",
        {
            "note": "graphFinalize per graph of one weight-shared context (decode + prefill), ours vs the same "
            "plugin's linear ops alone (floor) in the same run; finalize_cpu_s is process CPU time",
            "runs": runs,
        },
    )
    sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
