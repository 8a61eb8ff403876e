"""What a stage run on a Dask cluster adds to it: the per-task overhead of submitting, fetching inputs and storing.

A loopback cluster (``dask scheduler`` and one ``dask worker``, one task at a time, on 127.0.0.1) and a shared cache
directory. One run each, on fresh artifact roots:

1. floor: ``doit bundle:<model>-<arch>`` on this machine, the cache off: each task's own seconds (its origin record).
2. cluster: the same with ``MNNBUILD_SCHEDULER`` and ``doit -n 1`` (one task at a time, so nothing overlaps): per
   task, from its origin record, the worker's check (key recomputed: code, schema, tools), its restore of the inputs
   from the cache, the stage's run, its store; the client's wait for the result (submit + the worker's part) and its
   restore of the outputs. Overhead = the client's wait + its restore - the worker's run of the stage.

   Overhead also counts the client's publish of the task's inputs to the shared cache (the fetched model, once).

    python benchmarks/bench_cluster.py [--model tiny-qwen3] [--arch v79]

A real-size model (read only): ``--model-dir DIR`` writes a spec for it into a temp models dir
(``MNNBUILD_MODELS_PATH``) with ``--npu-weights`` and ``--speculative`` (``off``: an Eagle export's plain target);
``--no-floor`` skips the local build (each task's own time is then its run on the worker); ``--workers N`` starts N
workers and runs ``doit -n N``. E.g. at 28 layers, int4:

    nice python benchmarks/bench_cluster.py --model-dir DIR --model qwen3-1.7b-l28-off --npu-weights int4 \
        --speculative off --no-floor --key qwen3-1.7b-l28-int4

Then a projection, labelled as one: the measured task graph (each task's inputs from its record) with each task's
own time and overhead, list-scheduled in doit's order on 2, 8 and 32 one-task workers (``doit bundle``, and with a
28-layer int4 local build in scale.json, ``doit verify``: a twin per plugin and verify on the client, their seconds
from there, at this run's load); its critical path, named; the bound of the goal: the critical path's own seconds
plus its bytes at the shared cache's measured rate. The Qwen3-1.7B shape is also scaled to the Qwen3-4B and 8B
shapes by their dims (`scaled`). ``--project-only`` recomputes it from the recorded measurement.

Prints tables; writes ``benchmarks/results/cluster.json`` under ``--key`` (default the model's name). Ratios are
against the floor measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, RESULTS, add_result, checkout_commit, print_table  # noqa: E402
from bench_scale import write_spec  # noqa: E402


def doit(args: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), *args], env=env,
                          cwd=cwd, capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return time.perf_counter() - started


def origins(root: Path, with_fetch: bool = False) -> dict[str, dict[str, Any]]:
    """Every stage dir's origin record, by its path under the artifact root (fetch, which runs here, if asked)."""
    found = {}
    for path in root.rglob("*.origin.json"):
        if with_fetch or not path.name.startswith("fetch"):
            found[path.parent.relative_to(root).as_posix()] = json.loads(path.read_text())
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the spec to build (default tiny-qwen3; with --model-dir: its dir's name)")
    parser.add_argument("--arch", default="v79")
    parser.add_argument("--model-dir", type=Path, help="an exported model dir (read only): built from a spec written "
                        "to a temp models dir (MNNBUILD_MODELS_PATH)")  # fmt: skip
    parser.add_argument("--npu-weights", help="the spec's npu_weights (with --model-dir)")
    parser.add_argument("--speculative", help="the spec's speculative, e.g. off for an Eagle export's plain target")
    parser.add_argument("--workers", type=int, default=1, help="dask workers (one thread each) and doit -n")
    parser.add_argument("--no-floor", action="store_true", help="skip the local build; own time = the worker's run")
    parser.add_argument("--key", help="the key in cluster.json (default: the model's name)")
    parser.add_argument("--project-only", action="store_true",
                        help="recompute the projection from the key's recorded measurement, build nothing")  # fmt: skip
    args = parser.parse_args()
    if args.model_dir is not None:
        model = args.model or args.model_dir.name.lower()
    else:
        model = args.model or "tiny-qwen3"
    key = args.key or model
    if args.project_only:
        summary = json.loads((RESULTS / "cluster.json").read_text())[key]
        if args.model_dir is not None:
            summary.update(model_shape(args.model_dir))
        summary["projection"] = project(summary)
        print_projection(summary["projection"])
        print(add_result("cluster", key, summary))  # noqa: T201
        return
    summary = measure(args, model)
    if args.model_dir is not None:
        summary.update(model_shape(args.model_dir))
    add_result("cluster", key, summary)  # the measurement first: a projection's failure loses nothing
    summary["projection"] = project(summary)
    print_projection(summary["projection"])
    print(add_result("cluster", key, summary))  # noqa: T201


# ---- projection: the measured task graph on W workers (list scheduling in doit's order) ---------------------------

WORKERS = (2, 8, 32)
SHAPES: dict[str, dict[str, int]] = {
    # the shapes: layers, hidden, intermediate, heads, KV heads, head_dim, vocab, tied (1) or not (0)
    "qwen3-1.7b": {
        "layers": 28,
        "hidden": 2048,
        "inter": 6144,
        "heads": 16,
        "kv": 8,
        "head_dim": 128,
        "vocab": 151936,
        "tied": 1,
    },  # fmt: skip
    "qwen3-4b": {
        "layers": 36,
        "hidden": 2560,
        "inter": 9728,
        "heads": 32,
        "kv": 8,
        "head_dim": 128,
        "vocab": 151936,
        "tied": 1,
    },  # fmt: skip
    "qwen3-8b": {
        "layers": 36,
        "hidden": 4096,
        "inter": 12288,
        "heads": 32,
        "kv": 8,
        "head_dim": 128,
        "vocab": 151936,
        "tied": 0,
    },  # fmt: skip
}
MOVING = ("publish", "restore", "store", "restore_here")
"""The parts of a task's overhead that move bytes (scaled with them); the rest (submit, check) is per task."""


def layer_weights(shape: dict[str, int]) -> int:
    h, d = shape["hidden"], shape["head_dim"]
    return 2 * h * shape["heads"] * d + 2 * h * shape["kv"] * d + 3 * h * shape["inter"]


def total_weights(shape: dict[str, int]) -> int:
    return shape["layers"] * layer_weights(shape) + (2 - shape["tied"]) * shape["vocab"] * shape["hidden"]


def natural(rel: str) -> list[Any]:
    """Sort key: graphllm2 before graphllm10 (doit defines the plugins' tasks in their order)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", rel)]


@dataclass
class Node:
    rel: str
    own: float
    overhead: float
    inputs: list[str]
    moved: int
    remote: bool = True

    @property
    def cost(self) -> float:
        return self.own + self.overhead


def bundle_graph(summary: dict[str, Any]) -> dict[str, Node]:
    """The measured graph: each remote task's own seconds, its overhead, its inputs and the bytes it moved."""
    nodes = {rel: Node(rel, float(v["seconds"]), 0.0, [], 0, remote=False) for rel, v in summary["local_tasks"].items()}
    for rel, t in summary["tasks"].items():
        moved = int(t.get("fetched", 0)) + int(t.get("stored", 0)) + int(t.get("restored", 0))
        nodes[rel] = Node(rel, float(t["floor_seconds"]), float(t["overhead"]), list(t.get("inputs", [])), moved)
    return nodes


def schedule(nodes: dict[str, Node], workers: int) -> float:
    """Wall seconds of the graph on ``workers`` one-task workers: a ready task starts on the first free worker, in
    doit's order (not longest first); local tasks (fetch, verify) take no worker."""
    order = sorted(nodes, key=natural)
    done: dict[str, float] = {}
    free = [0.0] * workers
    while len(done) < len(nodes):
        ready = [r for r in order if r not in done and all(i in done for i in nodes[r].inputs)]
        if not ready:
            raise SystemExit(f"the task graph has a cycle or a missing input: {sorted(set(order) - set(done))}")
        for rel in ready:
            node = nodes[rel]
            start = max([done[i] for i in node.inputs], default=0.0)
            if node.remote:
                slot = min(range(workers), key=lambda k: max(free[k], start))
                start = max(free[slot], start)
                free[slot] = start + node.cost
            done[rel] = start + node.cost
    return max(done.values())


def critical_path(nodes: dict[str, Node], weight: Callable[[Node], float]) -> tuple[float, list[str]]:
    memo: dict[str, tuple[float, list[str]]] = {}

    def longest(rel: str) -> tuple[float, list[str]]:
        if rel not in memo:
            best = max((longest(i) for i in nodes[rel].inputs), default=(0.0, []), key=lambda x: x[0])
            memo[rel] = (best[0] + weight(nodes[rel]), [*best[1], rel])
        return memo[rel]

    return max((longest(r) for r in nodes), key=lambda x: x[0])


def scaled(nodes: dict[str, Node], summary: dict[str, Any], shape: dict[str, int]) -> dict[str, Node]:
    """The 1.7B-28 graph at another shape (a projection): layer plugins by their weights per layer (and as many more
    as it has layers), the lm_head plugins (the context tasks over twice the median) by vocab x hidden, io, partition,
    bundle, fetch and verify by the model's weights; the moving part of each overhead and its bytes alike."""
    base = SHAPES["qwen3-1.7b"]
    whole = total_weights(shape) / total_weights(base)
    layer = layer_weights(shape) / layer_weights(base)
    head = shape["hidden"] / base["hidden"]
    plugins = {n.rel for n in nodes.values() if "/context/" in n.rel or "/twin/" in n.rel}
    median = statistics.median(nodes[r].own for r in plugins) if plugins else 0.0
    out: dict[str, Node] = {}
    for rel, n in nodes.items():
        if rel.endswith("/config"):
            factor = 1.0
        elif rel in plugins:
            factor = head if n.own > 2 * median else layer
        else:
            factor = whole
        t = summary["tasks"].get(rel, {})
        moving = sum(float(t.get(k, 0.0)) for k in MOVING)
        fixed = n.overhead - moving
        out[rel] = Node(rel, n.own * factor, fixed + moving * factor, list(n.inputs), int(n.moved * factor), n.remote)
    extra = shape["layers"] - base["layers"]
    for kind in ("context", "twin"):
        layers = sorted((n for n in out.values() if f"/{kind}/" in n.rel and nodes[n.rel].own <= 2 * median),
                        key=lambda n: n.own)  # fmt: skip
        if not layers:
            continue
        typical = layers[len(layers) // 2]
        for k in range(extra):
            rel = f"{typical.rel}+{k}"
            out[rel] = Node(rel, typical.own, typical.overhead, list(typical.inputs), typical.moved)
            for dependent in out.values():  # what reads every plugin (bundle, verify) reads this one too
                if typical.rel in dependent.inputs and dependent.rel != rel and "+" not in dependent.rel:
                    dependent.inputs.append(rel)
    return out


def verify_graph(nodes: dict[str, Node], local: dict[str, Any]) -> dict[str, Node]:
    """``doit verify``: the bundle graph, a twin per context plugin (its own seconds from the local build in
    scale.json, the context task's measured overhead and inputs), and verify itself on the client (scale.json's)."""
    out = {r: Node(n.rel, n.own, n.overhead, list(n.inputs), n.moved, n.remote) for r, n in nodes.items()}
    twins = {k: float(v) * local["load_factor"] for k, v in local["twin_plugins_s"].items()}
    bundle = next(r for r in nodes if r.endswith("/bundle"))
    names = []
    for rel, n in nodes.items():
        plugin = rel.rsplit("/", 1)[-1]
        if "/context/" in rel and plugin in twins:
            name = rel.replace("/context/", "/twin/")
            out[name] = Node(name, float(twins[plugin]), n.overhead, list(n.inputs), n.moved)
            names.append(name)
    verify = bundle.replace("/bundle", "/verify")
    out[verify] = Node(verify, float(local["verify_s"]) * local["load_factor"], 0.0, [bundle, *names], 0, remote=False)
    return out


def local_times(layers: int) -> dict[str, Any] | None:
    """The newest int4 local build of ``layers`` layers in scale.json with twin and verify: their seconds."""
    path = RESULTS / "scale.json"
    if not path.is_file():
        return None
    found = []
    for commit, runs in json.loads(path.read_text()).get("layers", {}).items():
        for name, run in runs.items():
            stages = run.get("stages", {})
            if name.startswith(f"{layers}-int4") and "loaded" not in name and {"twin", "verify"} <= set(stages):
                found.append((run.get("measured", ""), f"layers/{commit}/{name}", stages))
    if not found:
        return None
    measured, key, stages = max(found)
    return {
        "from": f"scale.json {key} ({measured})",
        "context_plugins_s": stages["context"]["plugins_s"],
        "twin_plugins_s": stages["twin"]["plugins_s"],
        "verify_s": stages["verify"]["stage_s"],
    }


def shape_projection(nodes: dict[str, Node], bandwidth: float, client: float) -> dict[str, Any]:
    """One graph's projection; ``client``: the client's own seconds (doit's start and bookkeeping), added to each
    wall time, as the serial check found them."""
    cp, path = critical_path(nodes, lambda n: n.cost)
    cp_own, own_path = critical_path(nodes, lambda n: n.own)
    cp_bytes = sum(nodes[r].moved for r in own_path)
    floor = cp_own + cp_bytes / bandwidth
    walls = {str(w): round(schedule(nodes, w) + client, 1) for w in WORKERS}
    return {
        "tasks": sum(n.remote for n in nodes.values()),
        "serial_seconds": round(sum(n.cost for n in nodes.values()) + client, 1),
        "wall_seconds": walls,
        "critical_path_seconds": round(cp, 1),
        "critical_path": [r.split("/", 1)[-1] for r in path],
        "critical_path_own_seconds": round(cp_own, 1),
        "critical_path_bytes_mb": round(cp_bytes / 1e6, 1),
        "bytes_mb": round(sum(n.moved for n in nodes.values()) / 1e6, 1),
        "bound_seconds": round(floor, 1),
        "wall_32_over_bound": round(walls["32"] / floor, 2),
    }


def model_shape(model_dir: Path) -> dict[str, Any]:
    """The measured model's layers, and which of `SHAPES` it has (its dims but the layer count): for the scaling."""
    config = json.loads((model_dir / "llm_config.json").read_text())
    layers, hidden = int(config["layer_nums"]), int(config["hidden_size"])
    shape = next((name for name, s in SHAPES.items() if s["hidden"] == hidden and s["layers"] == layers), None)
    return {"layers": layers, "shape": shape}


def dir_bytes(summary: dict[str, Any], rel: str) -> int:
    """An upstream dir's bytes: what its task stored; fetch's (it runs here), what a task reading it alone fetched."""
    if rel in summary["tasks"]:
        return int(summary["tasks"][rel].get("stored", 0))
    alone = [int(t.get("fetched", 0)) for t in summary["tasks"].values() if t.get("inputs") == [rel]]
    return max(alone, default=0)


def project(summary: dict[str, Any]) -> dict[str, Any]:
    """Projections (not measurements) of ``doit bundle`` / ``doit verify`` on 2, 8 and 32 workers."""
    nodes = bundle_graph(summary)
    tasks = summary["tasks"].values()
    seconds = sum(float(t[k]) for t in tasks for k in ("restore", "store", "restore_here"))
    moved = sum(n.moved for n in nodes.values())
    bandwidth = moved / seconds if seconds else float("inf")
    serial = schedule(nodes, 1)
    # what the tasks' records do not hold (doit's start, its up-to-date checks): the measured 1-worker wall less the
    # graph's, one worker at a time
    client = max(0.0, float(summary["cluster_wall_seconds"]) - serial) if summary["workers"] == 1 else 0.0
    out: dict[str, Any] = {
        "note": "projections from the measured graph and per-task costs, not measurements",
        "shared_cache_mb_per_s": round(bandwidth / 1e6, 1),
        "serial_check": {
            "projected_1_worker_s": round(serial, 1),
            "client_s": round(client, 1),
            "measured_1_worker_s": summary["cluster_wall_seconds"],
        },
    }
    plugin = [sum(dir_bytes(summary, i) for i in t.get("inputs", [])) for r, t in summary["tasks"].items()
              if "/context/" in r]  # fmt: skip
    if plugin:
        # a worker machine fetches a plugin task's inputs (the model, the partition) once, into its own cache
        # tier: 32 machines, 32 times from the shared store
        out["context_inputs_mb"] = round(statistics.median(plugin) / 1e6, 1)
        out["store_fan_out_32_gb"] = round(32 * statistics.median(plugin) / 1e9, 1)
    if "context" in summary:
        out["context_overhead_over_own"] = summary["context"]["median_overhead_over_median_own"]
    layers = summary.get("layers")
    local = local_times(layers) if layers else None
    if local is not None:
        # scale.json's twin and verify seconds at this run's load: as this run's context tasks to that build's
        here = [float(t["floor_seconds"]) for r, t in summary["tasks"].items() if "/context/" in r]
        local["load_factor"] = round(
            statistics.median(here) / statistics.median(local["context_plugins_s"].values()), 2
        )
    shapes = {"measured": {}}
    if summary.get("shape") == "qwen3-1.7b":
        shapes = {name: shape for name, shape in SHAPES.items()}
    for name, shape in shapes.items():
        graphs = {"bundle": nodes if not shape else scaled(nodes, summary, shape)}
        if local is not None:
            verify = verify_graph(nodes, local)
            graphs["verify"] = verify if not shape else scaled(verify, summary, shape)
        out[name] = {target: shape_projection(g, bandwidth, client) for target, g in graphs.items()}
    if local is not None:
        out["local_times"] = {"from": local["from"], "load_factor": local["load_factor"]}
    return out


def print_projection(projection: dict[str, Any]) -> None:
    rows = []
    for name, targets in projection.items():
        if not isinstance(targets, dict) or "bundle" not in targets:
            continue
        for target, p in targets.items():
            w = p["wall_seconds"]
            rows.append([name, f"doit {target}", p["tasks"], p["serial_seconds"], w["2"], w["8"], w["32"],
                         p["critical_path_seconds"], " > ".join(p["critical_path"]), p["critical_path_own_seconds"],
                         p["critical_path_bytes_mb"], p["bound_seconds"],
                         p["wall_32_over_bound"]])  # fmt: skip
    print_table(["shape (projection)", "target", "tasks", "1 worker s", "2", "8", "32", "critical path s",
                 "critical path", "its own s", "its MB", "bound s", "32 / bound"], rows)  # fmt: skip
    check = projection["serial_check"]
    sys.stdout.write(f"model check: 1 worker: the tasks {check['projected_1_worker_s']} s, measured "
                     f"{check['measured_1_worker_s']} s; the rest ({check['client_s']} s, the client's own) is added "
                     "to every projected wall\n")  # fmt: skip


def measure(args: argparse.Namespace, model: str) -> dict[str, Any]:
    target = f"bundle:{model}-{args.arch}"
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    path = os.pathsep.join([str(PROJECT_ROOT), str(PROJECT_ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MNNBUILD_", "DASK_"))}
    base.update({"PYTHONPATH": path, "HF_HUB_OFFLINE": "1"})
    if args.model_dir is not None:
        write_spec(
            work / "models", model, args.model_dir.resolve(), args.arch, args.npu_weights, args.speculative or ""
        )
        base["MNNBUILD_MODELS_PATH"] = str(work / "models")
    procs: list[subprocess.Popen[bytes]] = []
    floor: dict[str, dict[str, Any]] = {}
    floor_wall = None
    try:
        if not args.no_floor:
            floor_env = {**base, "MNNBUILD_ARTIFACTS": str(work / "floor"), "MNNBUILD_CACHE": "off"}
            floor_wall = doit([target], floor_env, work)
            floor = origins(work / "floor")
            shutil.rmtree(work / "floor", ignore_errors=True)
        port = free_port()
        address = f"tcp://127.0.0.1:{port}"
        cluster_env = {**base, "MNNBUILD_CACHE": "off", "MNNBUILD_WORKER_DIR": str(work / "scratch")}
        worker = ["worker", address, "--no-nanny", "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1",
                  "--preload", "mnnbuild.cluster.worker"]  # fmt: skip
        for cmd in (["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                    *[worker] * args.workers):  # fmt: skip
            procs.append(subprocess.Popen([sys.executable, "-m", "dask", *cmd], env=cluster_env, cwd=work,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
            time.sleep(3)
        env = {**base, "MNNBUILD_ARTIFACTS": str(work / "cluster"), "MNNBUILD_CACHE": str(work / "cache"),
               "MNNBUILD_SCHEDULER": address, "MNNBUILD_SCHEDULER_TIMEOUT": "30"}  # fmt: skip
        cluster_wall = doit(["-n", str(args.workers), target], env, work)
        remote = origins(work / "cluster", with_fetch=True)
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
    rows, tasks, local = [], {}, {}
    for rel, record in sorted(remote.items()):
        if "cluster" not in record:  # fetch: it runs here
            local[rel] = {"seconds": float(record.get("seconds") or 0.0)}
            continue
        t = record["cluster"]
        run = float(t["run"])
        publish = float(t.get("publish", 0.0))
        overhead = publish + float(t["wait"]) + float(t["restore_here"]) - run
        own = float(floor[rel]["seconds"]) if rel in floor else run
        submit = float(t["wait"]) - sum(float(t[k]) for k in ("check", "restore", "run", "store"))
        tasks[rel] = {**t, "floor_seconds": own, "overhead": round(overhead, 3), "submit": round(submit, 3),
                      **record.get("moved", {})}  # fmt: skip
        rows.append([rel, own, run, publish, submit, t["check"], t["restore"], t["store"], t["restore_here"],
                     overhead, round(overhead / own, 2) if own else "-"])  # fmt: skip
    print_table(["stage dir", "own s" if args.no_floor else "floor s", "run s", "publish", "submit", "check", "fetch",
                 "store", "restore here", "overhead", "overhead / own"], rows)  # fmt: skip
    overheads = [v["overhead"] for v in tasks.values()]
    contexts = [v for rel, v in tasks.items() if "/context/" in rel]
    summary: dict[str, Any] = {
        "target": target,
        "commit": checkout_commit(),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "workers": args.workers,
        "load_avg": round(os.getloadavg()[0], 1),
        "floor_wall_seconds": round(floor_wall, 2) if floor_wall is not None else None,
        "own_seconds_from": "worker run (no local build)" if args.no_floor else "local build, cache off",
        "cluster_wall_seconds": round(cluster_wall, 2),
        "median_overhead_seconds": round(statistics.median(overheads), 3),
        "local_tasks": local,
        "tasks": tasks,
    }
    if contexts:
        median_context = statistics.median(float(v["floor_seconds"]) for v in contexts)
        worst = max(float(v["overhead"]) for v in contexts)
        summary["context"] = {
            "count": len(contexts),
            "median_own_seconds": round(median_context, 3),
            "median_overhead_seconds": round(statistics.median(float(v["overhead"]) for v in contexts), 3),
            "max_overhead_seconds": round(worst, 3),
            "median_overhead_over_median_own": round(
                statistics.median(float(v["overhead"]) for v in contexts) / median_context, 3
            ),
        }
    sys.stdout.write(f"wall: {floor_wall or 0:.1f} s here, {cluster_wall:.1f} s on the loopback cluster "
                     f"({args.workers} worker(s)); median overhead per task {summary['median_overhead_seconds']:.2f} s"
                     "\n")  # fmt: skip
    return summary


if __name__ == "__main__":
    main()
