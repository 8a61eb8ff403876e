"""The whole chain on a Qwen3-1.7B-shaped model (real dims, N layers), stage by stage, against Qualcomm's floor.

The model is built on demand by ``models/export/make_models.py --qwen3-1.7b-layers N`` into a cache dir outside the
repo (``--models-cache`` or ``$MODELS_CACHE``, a ``READY`` file in it or a ``<dir>.READY`` beside it marks it
complete; exporting needs ``--export-python`` or ``$EXPORT_PYTHON``, a python with the export extra) and described
by a spec written into a temp models dir (``MNNBUILD_MODELS_PATH``); ``--npu-weights`` sets the spec's
``npu_weights``. Each stage (fetch, io, partition, config, context, bundle, then twin, verify, and last the
model-lib, which no bundle or verify builds) runs as its own ``doit`` process with a fresh artifact cache, recording
its wall time, peak RSS (the largest process of its tree), bytes written (``du`` of the artifact and cache dirs
before and after, hard links counted once, a cache blob linked to an artifact too, and the block-device writes of
its process tree), and for context the seconds of each plugin (its ``context.origin.json``).

The floor, measured in the same run: per plugin, a weight-shared context (same SoC and settings) of its
decode and prefill graphs holding only their linear ops (Conv2d / FullyConnected, MatMul with a static
operand) with the shapes and weights the lowering gave them, in fp16; with another ``--npu-weights``, also in
that encoding (Qualcomm's prepare of the same ops with quantized weights). The table ends with our context time
and our whole bundle time (fetch ... bundle) over that floor (and over the second). Optionally ``-n 1`` vs ``-n 2``
on context, and
(``--end-to-end``) one ``doit -n 1`` / ``-n 2 bundle`` each on a fresh root, what a user waits for, with the floor
measured again right after.

    MODELS_CACHE=... python benchmarks/bench_scale.py --layers 4 [--npu-weights int4] [--jobs] [--end-to-end] [--keep]

``--shape qwen3-4b`` / ``qwen3-8b`` takes those models' real dims instead (``make_models.py --shape``; N of their 36
layers, exported to ``<shape>-L<n>``); their rows are keyed ``<shape>-<layers>-<npu weights>[-<label>]``. More layers
than export whole here (4B: 4, 8B: 2; ``--repeat-from K`` to choose, 0 for a whole export) are made from a K-layer
export by ``models/export/repeat_layers.py`` (``<shape>-L<n>-from<k>``); such a row's key ends in ``-from<k>`` and its
``made_by_repetition`` is the model dir's ``repeated_layers.json``.

Besides the stages: the bundle's bytes by part, the twins' bytes, how the contexts store their weights (the NPU
weight bytes a phone reads per decoded token: every weight once, as stored; a size, not a speed), and verify's
logits error and greedy agreement against the CPU.

Results are merged into ``benchmarks/results/scale.json`` under ``layers`` / the commit measured (``+``: with
changes) / ``<layers>-<npu weights>[-<label>]``, e.g. ``layers / 3fc9602cf2b0 / 28-int4``. Runs from before commits
were recorded sit under the date they were measured (``layers / 2026-12-01 / 28-float16``), each with the key it
had (``was``) and its commit where a note named it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, RESULTS, TreeRssSampler, checkout_commit, machine, print_table  # noqa: E402

sys.path.insert(0, str(PROJECT_ROOT / "models" / "export"))
from make_models import DEFAULT_SHAPE, QWEN3_SHAPES  # noqa: E402  (no torch at import)
from repeat_layers import NOTE_FILE as REPEATED_NOTE  # noqa: E402

from mnnbuild.model.npu_weights import DEFAULT_NPU_WEIGHTS  # noqa: E402
from mnnbuild.pipeline.layout import LLM_GRAPHS, VERIFY_REPORT_JSON, origin_file  # noqa: E402
from mnnbuild.stages.chain import CHAIN, stage_dir  # noqa: E402

STAGES = ("fetch", "io", "partition", "config", "context", "bundle", "twin", "verify", "modellib")
BUNDLE_STAGES = STAGES[: STAGES.index("bundle") + 1]
"""What ``doit bundle`` runs: its wall time over the floor and its bytes over the bundle's are the goals."""
EXPORT_SCRIPT = PROJECT_ROOT / "models" / "export" / "make_models.py"
EAGLE_SCRIPT = PROJECT_ROOT / "models" / "export" / "train_eagle.py"
READY = "READY"
DRAFT_PREFIX = "eagle"
"""An Eagle bundle's draft files: ``eagle.mnn``, ``eagle_fc.mnn``, ``eagle_d2t.mnn`` and their ``.weight``."""

# Runs a command and reports the peak RSS of its process tree and its block writes (getrusage of children).
RUSAGE_WRAPPER = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:])\n"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "sys.stderr.write('RUSAGE %d %d\\n' % (u.ru_maxrss, u.ru_oublock))\n"
    "sys.exit(r.returncode)\n"
)


def model_name(layers: int, shape: str = DEFAULT_SHAPE) -> str:
    """The spec and task name (lower case, as specs require); the export dir is `<shape>-L<n>`."""
    return f"{shape}-l{layers}"


MODELS_CACHE_ENV = "MODELS_CACHE"
EXPORT_PYTHON_ENV = "EXPORT_PYTHON"


REPEAT_SCRIPT = PROJECT_ROOT / "models" / "export" / "repeat_layers.py"
WHOLE_EXPORT_LAYERS = {"qwen3-4b": 4, "qwen3-8b": 2}
"""The most layers of these shapes exported whole on the 24 GB box (llmexport and its check: 9.7 GB at 4B x 4,
15.6 GB at 8B x 2, docs/benchmarks.md); a deeper model of them is made by repeating that many exported layers unless
``--repeat-from`` says otherwise."""


def repeated_model(
    layers: int, repeat_from: int, cache: Path, export_python: Path | None, shape: str = DEFAULT_SHAPE
) -> Path:
    """The ``layers``-layer model made from the ``repeat_from``-layer export (exported first if missing) by
    ``models/export/repeat_layers.py`` (this python: it needs only mnnbuild), ``<shape>-L<n>-from<k>``."""
    dest = cache / f"{shape}-L{layers}-from{repeat_from}"
    if (dest / READY).is_file():
        return dest
    source = ensure_model(repeat_from, cache, export_python, shape=shape)
    cmd = [sys.executable, str(REPEAT_SCRIPT), str(source), "--layers", str(layers), "--out", str(dest)]
    sys.stderr.write(f"repeating {source.name} to {layers} layers: {' '.join(cmd)}\n")
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    (dest / READY).write_text(f"made by benchmarks/bench_scale.py from {source.name}\n")
    return dest


def ensure_model(
    layers: int, cache: Path, export_python: Path | None, eagle: bool = False, shape: str = DEFAULT_SHAPE
) -> Path:
    """The exported model dir, built by the export script unless a complete one is there (``eagle``: the target
    exported with a random Eagle3 draft of Qwen3-1.7B-Eagle3's sizes, ``qwen3-1.7b-eagle-L<n>``; ``shape``: the
    real dims, one of make_models' ``QWEN3_SHAPES``, ``<shape>-L<n>``)."""
    if eagle and shape != DEFAULT_SHAPE:
        raise SystemExit(f"--eagle: only the {DEFAULT_SHAPE} shape has an Eagle3 draft here, not {shape}")
    dest = cache / (f"qwen3-1.7b-eagle-L{layers}" if eagle else f"{shape}-L{layers}")
    if (dest / READY).is_file() or dest.with_name(f"{dest.name}.{READY}").is_file():  # inside it, or beside it
        return dest
    if export_python is None:
        raise SystemExit(f"{dest} is not exported yet: give --export-python or ${EXPORT_PYTHON_ENV} to export it")
    if eagle:  # the target's own export check loads the HF model again (~8 GB at 28 layers): the draft's is kept
        cmd = [str(export_python), str(EAGLE_SCRIPT), "--random", str(dest), "--qwen3-1.7b-layers", str(layers)]
        cmd.append("--no-verify")
    else:
        cmd = [str(export_python), str(EXPORT_SCRIPT), "--qwen3-1.7b-layers", str(layers), "--out", str(dest)]
        cmd += ["--shape", shape] if shape != DEFAULT_SHAPE else []
    sys.stderr.write(f"exporting {dest.name}: {' '.join(cmd)}\n")
    subprocess.run(cmd, check=True)
    (dest / READY).write_text("exported by benchmarks/bench_scale.py\n")
    return dest


def write_spec(
    models_dir: Path,
    name: str,
    model_dir: Path,
    arch: str,
    npu_weights: str | None = None,
    speculative: str = "",
    decode_graph: bool = True,
) -> None:
    models_dir.mkdir(parents=True, exist_ok=True)
    text = f'name = "{name}"\nsource = {{ local = "{model_dir}" }}\nchunk_size = 128\ntargets = ["{arch}"]\n'
    if npu_weights is not None:
        text += f'npu_weights = "{npu_weights}"\n'
    if speculative:
        text += f'speculative = "{speculative}"\n'
    if not decode_graph:
        text += "decode_graph = false\n"
    (models_dir / f"{name}.toml").write_text(text)


def regular_files(root: Path) -> dict[tuple[int, int], int]:
    """(device, inode) -> size of the regular files under ``root`` (symlinks left out, hard links once)."""
    found = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                found[(st.st_dev, st.st_ino)] = st.st_size
    return found


def disk_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root``, each inode once (hard links are one file on disk)."""
    return sum(regular_files(root).values())


def written(artifacts: Path, cache: Path) -> tuple[int, int]:
    """Bytes on disk of the artifacts, and of the cache beyond them (a blob hard-linked to an artifact is one
    file on disk, counted with the artifacts)."""
    arts = regular_files(artifacts)
    return sum(arts.values()), sum(size for key, size in regular_files(cache).items() if key not in arts)


def run_doit(args: list[str], env: dict[str, str]) -> dict[str, float]:
    """Wall seconds, peak RSS (MB) and block writes (MB) of one doit process tree."""
    cmd = [sys.executable, "-c", RUSAGE_WRAPPER, sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py")]
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([*cmd, *args], env=env, stdout=out, stderr=err, text=True)
        with TreeRssSampler(child.pid) as sampled:
            child.wait()
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if child.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed:\n{stdout[-4000:]}\n{stderr[-4000:]}")
    line = next(x for x in stderr.splitlines() if x.startswith("RUSAGE "))
    maxrss_kb, oublock = (int(v) for v in line.split()[1:])
    # a reaped process's peak (rusage) or a sampled one the rusage cannot see (forkserver compose workers)
    peak = max(maxrss_kb * 1024, sampled.peak_process)
    return {
        "wall_s": round(seconds, 2),
        "peak_rss_mb": round(peak / 2**20, 1),
        "peak_tree_rss_mb": round(sampled.peak_tree / 2**20, 1),
        # reaped processes' block writes (rusage) or the sampled tree's, which sees the forkserver workers too
        "io_written_mb": max(oublock * 512, sampled.written) / 2**20,
    }


def origin_seconds(stage_dir: Path, stage: str) -> float | None:
    path = stage_dir / origin_file(stage)
    return json.loads(path.read_text()).get("seconds") if path.is_file() else None


def plugin_dirs(group_dir: Path) -> list[Path]:
    return sorted(group_dir.glob("graph*"), key=lambda p: int(p.name.removeprefix(LLM_GRAPHS)))


def timed_stage(
    stage: str, name: str, arch: str, env: dict[str, str], artifacts: Path, cache: Path
) -> tuple[dict[str, Any], Path]:
    """One stage's doit run on model ``name`` (per target on ``arch``): its wall time, RSS and writes, and the stage's
    own seconds from its origin record (per plugin too); with the stage dir."""
    per_target = CHAIN[stage].per_target
    task = f"{stage}:{name}-{arch}" if per_target else f"{stage}:{name}"
    rec = measure_stage(task, env, artifacts, cache)
    where = stage_dir(artifacts, stage, name, arch if per_target else None)
    if CHAIN[stage].placement == "plugin":
        per = {d.name: origin_seconds(d, stage) for d in plugin_dirs(where)}
        rec["plugins_s"] = per
        rec["stage_s"] = round(sum(v or 0.0 for v in per.values()), 2)
    else:
        rec["stage_s"] = origin_seconds(where, stage)
    return rec, where


def stale_stages(stages: list[str], name: str, arch: str, env: dict[str, str]) -> list[str]:
    """Of ``stages`` (run earlier), the tasks this checkout's doit would run again (``doit list --status``)."""
    cmd = [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), "list", "--status", "--all"]
    listing = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    status = {parts[1]: parts[0] for parts in (line.split() for line in listing.splitlines()) if len(parts) > 1}
    tasks = [f"{s}:{name}-{arch}" if CHAIN[s].per_target else f"{s}:{name}" for s in stages]
    return [t for t in tasks if status.get(t) != "U"]


def floor_worker(model_dir: Path, partition_dir: Path, arch: str, out_json: Path, npu_weights: str) -> None:
    """Per plugin: seconds to compose, finalize and serialize a weight-shared context of its linear ops alone
    (lowered in memory first, not timed: Qualcomm's part only), their weights stored as ``npu_weights`` says."""
    from _floor import compose_plugins

    out_json.write_text(json.dumps(compose_plugins(model_dir, partition_dir, arch, npu_weights), indent=1))


def measure_floor(
    artifacts: Path, name: str, arch: str, env: dict[str, str], npu_weights: str = "float16"
) -> dict[str, Any]:
    out = artifacts / "floor.json"
    cmd = [
        sys.executable, "-c", RUSAGE_WRAPPER, sys.executable, __file__, "--floor-worker",
        str(artifacts / name / "model"), str(artifacts / name / "partition"), arch, str(out), npu_weights,
    ]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"floor failed:\n{proc.stderr[-4000:]}")
    line = next(x for x in proc.stderr.splitlines() if x.startswith("RUSAGE "))
    plugins = json.loads(out.read_text())
    return {
        "wall_s": round(time.perf_counter() - started, 2),
        "peak_rss_mb": round(int(line.split()[1]) / 1024, 1),
        "seconds": round(sum(p["seconds"] for p in plugins.values()), 2),
        "plugins": plugins,
    }


def end_to_end(work: Path, name: str, target: str, arch: str, env: dict[str, str]) -> dict[str, Any]:
    """What a user waits for: one ``doit -n N bundle:<target>`` on a fresh artifact root (cache off), for N = 1 and
    2, and right after the first the floor again from its artifacts, so both ratios are to a floor measured under
    the same load. Each root is removed after its run (a 28-layer bundle root is ~8 GB)."""
    record: dict[str, Any] = {"measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for jobs in (1, 2):
        root = work / f"end-to-end-n{jobs}"
        run_env = {**env, "MNNBUILD_ARTIFACTS": str(root), "MNNBUILD_CACHE": "off"}
        try:
            record[f"n{jobs}"] = run_doit(["-n", str(jobs), f"bundle:{target}"], run_env)
            if jobs == 1:
                record["floor_s"] = measure_floor(root, name, arch, run_env)["seconds"]
        finally:
            shutil.rmtree(root, ignore_errors=True)
    for jobs in (1, 2):
        record[f"n{jobs}_over_floor"] = round(record[f"n{jobs}"]["wall_s"] / record["floor_s"], 2)
    return record


def save_result(key: str, result: dict[str, Any], results: str = "scale.json", commit: str | None = None) -> Path:
    """Merge ``result`` into ``results`` (``scale.json``) under ``layers`` / ``commit`` / ``key`` (after every stage,
    so a long run leaves its stages); without a commit (the other scripts' files), under ``layers`` / ``key``."""
    path = RESULTS / results
    data = json.loads(path.read_text()) if path.is_file() else {}
    data["machine"] = machine()
    runs = data.setdefault("layers", {})
    if commit is not None:
        runs = runs.setdefault(commit, {})
    runs[key] = {"measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **result}
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return path


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def cache_args(parser: argparse.ArgumentParser) -> None:
    """Where the exported real-size models are and what exports them: flags or environment, no machine default."""
    parser.add_argument(
        "--models-cache",
        type=Path,
        default=_env_path(MODELS_CACHE_ENV),
        help=f"dir of the exported models (default ${MODELS_CACHE_ENV}; one of them is required)",
    )
    parser.add_argument(
        "--export-python",
        type=Path,
        default=_env_path(EXPORT_PYTHON_ENV),
        help=f"python with the export extra (llmexport, torch), to export a missing model (${EXPORT_PYTHON_ENV})",
    )


def require_cache(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
    if args.models_cache is None:
        parser.error(f"give --models-cache or set ${MODELS_CACHE_ENV} (the dir of the exported models)")
    return Path(args.models_cache)


def bundle_parts(bundle_dir: Path) -> dict[str, float]:
    """MB of the device dir by part: the context binaries, the weight file, ``qnn/llm.mnn``, an Eagle draft's files
    (``eagle*``), the rest."""
    model_dirs = [p for p in (bundle_dir / "model").iterdir() if p.is_dir()]
    parts = {"qnn_binaries": 0, "weight_file": 0, "llm_mnn": 0, "draft": 0, "other": 0}
    for root in model_dirs:
        for path in root.rglob("*"):
            if not path.is_file() or path.is_symlink():
                continue
            rel = path.relative_to(root).as_posix()
            kind = (
                "qnn_binaries"
                if rel.startswith("qnn/") and rel.endswith(".bin")
                else "draft"
                if rel.startswith(DRAFT_PREFIX)
                else "weight_file"
                if rel.endswith(".mnn.weight") or rel == "embeddings_bf16.bin"
                else "llm_mnn"
                if rel == "qnn/llm.mnn"
                else "other"
            )
            parts[kind] += path.stat().st_size
    out = {k: round(v / 1e6, 1) for k, v in parts.items()}
    out["total"] = round(sum(parts.values()) / 1e6, 1)
    return out


def weight_storage(context_dir: Path) -> dict[str, Any]:
    """How the context binaries store the conv weights (their manifests' notes): weights and bytes per encoding,
    the largest requantization error, and the NPU weight bytes a decoded token reads (every weight once, its codes
    as stored; scales and offsets come on top)."""
    by: dict[str, dict[str, float]] = {}
    worst, inexact, reasons = 0.0, 0, set()
    for path in sorted(context_dir.glob("*/context.manifest.json")):
        for note in json.loads(path.read_text()).get("weights", []):
            entry = by.setdefault(f"{note['encoding']}/{note['bitwidth']}", {"convs": 0, "weights": 0, "bytes": 0})
            entry["convs"] += 1
            entry["weights"] += note["weights"]
            entry["bytes"] += (note["weights"] + note.get("folded", 0)) * note["bitwidth"] // 8
            worst = max(worst, note.get("error", 0.0))
            inexact += not note.get("exact", True)
            if note.get("reason"):
                reasons.add(note["reason"])
    return {
        "by_encoding": by,
        "npu_weight_bytes_per_decoded_token": sum(int(e["bytes"]) for e in by.values()),
        "requantized_convs": inexact,
        "max_requantization_error": worst,
        "float16_reasons": sorted(reasons),
    }


def accuracy(report: dict[str, Any]) -> dict[str, Any]:
    """verify's whole-model logits error per sample and its greedy generation against the CPU."""
    samples = []
    for s in report.get("whole_model", []):
        logits = next((t for t in s["outputs"] if t["name"] == "logits"), None) or {}
        top1 = s.get("top1") or {}
        samples.append(
            {
                "seq_len": s["seq_len"],
                "logits_rel_err": logits.get("rel_err"),
                "logits_cosine": logits.get("cosine"),
                "top1_agree": f"{top1.get('agree')}/{top1.get('rows')}" if top1 else None,
            }
        )
    gen = report.get("generation") or {}
    steps = gen.get("steps") or []
    return {
        "samples": samples,
        "generation": {
            "tokens": len(gen.get("cpu_tokens") or []),
            "identical": gen.get("first_divergence") is None if gen else None,
            "first_divergence": gen.get("first_divergence"),
            "agree_steps": sum(st["hybrid_pick"] == st["cpu_token"] for st in steps),
            "max_step_logits_rel_err": max((st["logits"]["rel_err"] or 0.0 for st in steps), default=None),
        },
    }


def model_args(parser: argparse.ArgumentParser, layers: int) -> None:
    """The options naming the model, its target and where it is exported and built."""
    parser.add_argument("--layers", type=int, default=layers, help=f"layers of the model's (default {layers})")
    parser.add_argument("--arch", default="v79")
    cache_args(parser)
    parser.add_argument("--work", type=Path, default=None, help="dir for artifacts and cache (default: a temp dir)")


def doit_env(artifacts: Path, cache: Path, models: Path) -> dict[str, str]:
    return {
        **os.environ,
        "MNNBUILD_ARTIFACTS": str(artifacts),
        "MNNBUILD_CACHE": str(cache),
        "MNNBUILD_MODELS_PATH": str(models),
        "MNNBUILD_LOG_LEVEL": "WARNING",
    }


def measure_stage(task: str, env: dict[str, str], artifacts: Path, cache: Path) -> dict[str, Any]:
    """`run_doit` of one task, with the load beside it and the bytes it added to the artifacts and the cache."""
    before_a, before_c = written(artifacts, cache)
    load_before = os.getloadavg()[0]
    rec = run_doit([task], env)
    # the box is shared: the load beside the run says how far its times are from an idle machine's
    rec["load_avg"] = round((load_before + os.getloadavg()[0]) / 2, 1)
    after_a, after_c = written(artifacts, cache)
    rec["artifacts_mb"] = round((after_a - before_a) / 1e6, 1)
    rec["cache_mb"] = round((after_c - before_c) / 1e6, 1)
    rec["io_written_mb"] = round(rec["io_written_mb"], 1)
    return rec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor-worker", nargs=5, help=argparse.SUPPRESS)  # MODEL PARTITION ARCH OUT NPU_WEIGHTS
    model_args(parser, 4)
    parser.add_argument("--stages", default=",".join(STAGES), help="comma list, a prefix of the chain")
    parser.add_argument("--jobs", action="store_true", help="also time context with -n 1 and -n 2 (cache off)")
    parser.add_argument(
        "--end-to-end",
        action="store_true",
        help="also time one `doit -n 1 bundle` and one `doit -n 2 bundle` on fresh roots (cache off) against the floor",
    )
    parser.add_argument("--npu-weights", help="the spec's npu_weights (float16, int8, int4); default: no field")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor (it costs as much as context)")
    parser.add_argument(
        "--context-rounds",
        type=int,
        default=1,
        help="with --eagle: build the context stage of both this many times in all (alternating order), medians",
    )
    parser.add_argument(
        "--context-pairs",
        action="store_true",
        help="with --eagle: build every plugin's context again for both builds (cache off), the two adjacent in "
        "time and in turns, and sum them: the verify-length graph's cost with the load on both alike",
    )
    parser.add_argument(
        "--eagle",
        action="store_true",
        help="the model exported with a random Eagle3 draft (Qwen3-1.7B-Eagle3's sizes, at least 7 layers), built "
        "with speculative = 'off' and 'eagle' in one run; results under scale.json's 'speculative' by commit",
    )
    parser.add_argument(
        "--no-decode-graph",
        action="store_true",
        help="with --eagle: build the eagle variant with decode_graph = false (no 1-row graph in the layer plugins; "
        "the result key ends in -no-decode-graph)",
    )
    parser.add_argument(
        "--shape",
        choices=sorted(QWEN3_SHAPES),
        default=DEFAULT_SHAPE,
        help=f"the model's real dims (default {DEFAULT_SHAPE}); another shape prefixes the result key, e.g. "
        "'qwen3-8b-4-int4'",
    )
    parser.add_argument(
        "--repeat-from",
        type=int,
        metavar="K",
        help="make the model by repeating the layers of a K-layer export (models/export/repeat_layers.py); default "
        f"for more layers than exported whole here: {WHOLE_EXPORT_LAYERS}; 0: export whole",
    )
    parser.add_argument("--label", default="", help="result key suffix, e.g. 'before'")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument(
        "--resume",
        type=Path,
        help="a work dir kept by an earlier run of the same --layers/--label (and --eagle) at this commit: run "
        "--stages there and add them to its result (e.g. verify after a bundle-only run; with --eagle, stages a "
        "build has on record are not run again, and --stages '' --context-pairs only pairs)",
    )
    parser.add_argument(
        "--resume-commit",
        default=None,
        help="with --resume (not --eagle): continue the record of the run at this commit (its scale.json key) "
        "instead of this checkout's; allowed only when this checkout's doit finds that run's stages up to date, "
        "and the stages run now are recorded with the commit that ran them",
    )
    args = parser.parse_args()
    if args.floor_worker:
        model, partition, arch, out, npu_weights = args.floor_worker
        floor_worker(Path(model), Path(partition), arch, Path(out), npu_weights)
        return
    if not 1 <= args.layers <= QWEN3_SHAPES[args.shape].num_layers:
        parser.error(f"--layers: expected 1..{QWEN3_SHAPES[args.shape].num_layers} for {args.shape}")
    if args.no_decode_graph and not args.eagle:
        parser.error("--no-decode-graph is a choice for the eagle build: add --eagle")
    if args.context_pairs and not args.eagle:
        parser.error("--context-pairs compares the two builds of --eagle: add --eagle")
    if args.eagle:
        if args.shape != DEFAULT_SHAPE:
            parser.error(f"--eagle: only the {DEFAULT_SHAPE} shape has an Eagle3 draft here")
        if args.layers < 7:
            parser.error("--eagle: an Eagle3 target needs at least 7 layers (three distinct taps), give --layers")
        if args.stages == ",".join(STAGES):
            args.stages = ",".join(SPEC_STAGES)
        if args.jobs or args.end_to_end or "modellib" in args.stages.split(","):
            parser.error("--eagle runs fetch..verify for both builds: drop --jobs/--end-to-end/modellib")
        speculative_main(args, parser)
        return

    name = model_name(args.layers, args.shape)
    target = f"{name}-{args.arch}"
    stages = [s for s in args.stages.split(",") if s]
    repeat_from = args.repeat_from
    if repeat_from is None and args.layers > WHOLE_EXPORT_LAYERS.get(args.shape, args.layers):
        repeat_from = WHOLE_EXPORT_LAYERS[args.shape]
    if repeat_from and not 2 <= repeat_from < args.layers:
        parser.error(f"--repeat-from {repeat_from}: expected 2..{args.layers - 1} exported layers (0: export whole)")
    cache_dir = require_cache(parser, args)
    if repeat_from:
        model_dir = repeated_model(args.layers, repeat_from, cache_dir, args.export_python, shape=args.shape)
    else:
        model_dir = ensure_model(args.layers, cache_dir, args.export_python, shape=args.shape)
    # keyed by the code measured, as --eagle's: layers / <commit> / [<shape>-]<layers>-<npu weights>[-<label>]
    commit = checkout_commit()
    key = f"{args.layers}-{args.npu_weights or DEFAULT_NPU_WEIGHTS}" + (f"-{args.label}" if args.label else "")
    key = key if args.shape == DEFAULT_SHAPE else f"{args.shape}-{key}"
    key += f"-from{repeat_from}" if repeat_from else ""
    if args.work is not None and not args.resume:
        if args.work.exists() and not args.work.is_dir():
            raise SystemExit(f"--work {args.work}: not a directory; expected a directory for the run's work dir")
        args.work.mkdir(parents=True, exist_ok=True)  # a --work dir that does not exist yet is made, not a traceback
    work = args.resume or Path(tempfile.mkdtemp(prefix=f"bench-scale-{name}-", dir=args.work))
    artifacts, cache, models = work / "artifacts", work / "cache", work / "models"
    if not args.resume:
        artifacts.mkdir()
        cache.mkdir()
        write_spec(models, name, model_dir, args.arch, args.npu_weights)
    env = doit_env(artifacts, cache, models)
    rows: dict[str, dict[str, Any]] = {}
    result: dict[str, Any] = {"model": name, "target": target, "npu_weights": args.npu_weights, "stages": rows}
    result.update({"shape": args.shape, "layers": args.layers, "shape_layers": QWEN3_SHAPES[args.shape].num_layers})
    if repeat_from:  # how the model was made: its dir's note (repeat_layers.py)
        result["made_by_repetition"] = json.loads((model_dir / REPEATED_NOTE).read_text())
    ran_by = commit  # the code that runs this invocation's stages
    if args.resume_commit and not args.resume:
        parser.error("--resume-commit continues a kept run: add --resume DIR")
    if args.resume:  # carry the earlier stages' records on
        commit = args.resume_commit or commit
        earlier = json.loads((RESULTS / "scale.json").read_text())["layers"].get(commit, {}).get(key)
        if earlier is None:
            parser.error(f"--resume: scale.json has no layers / {commit} / {key} to add to (the code changed since?)")
        rows.update(earlier.get("stages", {}))
        result.update({k: v for k, v in earlier.items() if k not in ("stages", "measured", "partial")})
        if commit != ran_by:  # another commit's artifacts count only if this code would not rebuild them
            stale = stale_stages(list(rows), name, args.arch, env)
            if stale:
                parser.error(f"--resume-commit {commit}: this checkout ({ran_by}) would rebuild {', '.join(stale)}")
    try:
        for stage in stages:
            rec, where = timed_stage(stage, name, args.arch, env, artifacts, cache)
            if ran_by != commit:
                rec["code"] = ran_by
            if stage == "verify":
                report = json.loads((where / VERIFY_REPORT_JSON).read_text())
                rec["checks_s"] = report.get("timings", {})
                rec["passed"] = report.get("passed")
                result["accuracy"] = accuracy(report)
            if stage == "context":
                result["weights"] = weight_storage(artifacts / name / args.arch / "context")
            if stage == "bundle":
                result["bundle_parts_mb"] = bundle_parts(artifacts / name / args.arch / "bundle")
            if stage == "twin":
                twins = (artifacts / name / args.arch / "twin").glob("*/*.bin")
                result["twin_mb"] = round(sum(p.stat().st_size for p in twins) / 1e6, 1)
            rows[stage] = rec
            sys.stderr.write(f"{stage}: {rec}\n")
            if stage == "context" and not args.no_floor:  # right after our context build, under the same load
                load_before = os.getloadavg()[0]
                result["floor"] = measure_floor(artifacts, name, args.arch, env)
                result["floor"]["load_avg"] = round((load_before + os.getloadavg()[0]) / 2, 1)
                result["context_over_floor"] = round(rec["stage_s"] / result["floor"]["seconds"], 2)
                if args.npu_weights not in (None, "float16"):
                    # the same linear ops with the run's own weight encoding: what Qualcomm's prepare of them costs
                    own = measure_floor(artifacts, name, args.arch, env, args.npu_weights)
                    result["floor_npu_weights"] = own
                    result["context_over_floor_npu_weights"] = round(rec["stage_s"] / own["seconds"], 2)
            if stage == "bundle" and "floor" in result:
                bundle_wall = sum(rows[s]["wall_s"] for s in BUNDLE_STAGES if s in rows)
                result["bundle_wall_s"] = round(bundle_wall, 2)
                result["bundle_over_floor"] = round(bundle_wall / result["floor"]["seconds"], 2)
                if "floor_npu_weights" in result:
                    own_s = result["floor_npu_weights"]["seconds"]
                    result["bundle_over_floor_npu_weights"] = round(bundle_wall / own_s, 2)
            save_result(key, {**result, "partial": True}, commit=commit)
        result["final_bundle_mb"] = round(disk_bytes(artifacts / name / args.arch / "bundle") / 1e6, 1)
        result["written_mb"] = round(sum(r["artifacts_mb"] + r["cache_mb"] for r in rows.values()), 1)
        bundle_rows = [r for s, r in rows.items() if s in BUNDLE_STAGES]
        result["bundle_written_mb"] = round(sum(r["artifacts_mb"] + r["cache_mb"] for r in bundle_rows), 1)
        result["bundle_written_over_bundle"] = round(result["bundle_written_mb"] / result["final_bundle_mb"], 2)
        if args.jobs and "context" in stages:
            off = {**env, "MNNBUILD_CACHE": "off"}
            speed = {}
            for jobs in (1, 2):
                shutil.rmtree(artifacts / name / args.arch / "context")
                speed[f"n{jobs}"] = run_doit(["-n", str(jobs), f"context:{target}"], off)
            speed["speedup"] = round(speed["n1"]["wall_s"] / speed["n2"]["wall_s"], 2)
            result["context_jobs"] = speed
        if args.end_to_end:
            result["end_to_end"] = end_to_end(work, name, target, args.arch, env)
    finally:
        if not (args.keep or args.resume):
            shutil.rmtree(work, ignore_errors=True)
        else:
            sys.stderr.write(f"kept {work}\n")

    keys = ("wall_s", "peak_rss_mb", "artifacts_mb", "cache_mb", "io_written_mb", "load_avg")
    table = [(s, r.get("stage_s") or 0.0, *(r[k] for k in keys)) for s, r in rows.items()]
    headers = ["stage", "stage s", "wall s", "peak RSS MB", "artifacts MB", "cache MB", "io written MB", "load"]
    print_table(headers, table)
    out = sys.stdout.write
    if "context" in rows:
        out("context per plugin (s): " + ", ".join(f"{k} {v}" for k, v in rows["context"]["plugins_s"].items()) + "\n")
    if "floor" in result:
        f = result["floor"]
        out("floor per plugin (s): " + ", ".join(f"{k} {v['seconds']}" for k, v in f["plugins"].items()) + "\n")
        out(f"floor {f['seconds']:.1f} s; context {rows['context']['stage_s']:.1f} s = {result['context_over_floor']}x")
        if "bundle_wall_s" in result:
            out(f"; bundle (fetch..bundle) {result['bundle_wall_s']:.1f} s = {result['bundle_over_floor']}x")
        out("\n")
    if "floor_npu_weights" in result:
        f = result["floor_npu_weights"]
        out(f"floor with {result['npu_weights']} weights {f['seconds']:.1f} s; context = "
            f"{result['context_over_floor_npu_weights']}x")  # fmt: skip
        if "bundle_over_floor_npu_weights" in result:
            out(f"; bundle = {result['bundle_over_floor_npu_weights']}x")
        out("\n")
    out(
        f"written (artifacts + cache) {result['written_mb']:.0f} MB, by fetch..bundle "
        f"{result['bundle_written_mb']:.0f} MB = {result['bundle_written_over_bundle']}x the final bundle's "
        f"{result['final_bundle_mb']:.0f} MB\n"
    )
    if "bundle_parts_mb" in result:
        out("bundle MB by part: " + ", ".join(f"{k} {v}" for k, v in result["bundle_parts_mb"].items()) + "\n")
    if "weights" in result:
        w = result["weights"]
        out(f"NPU weight bytes per decoded token: {w['npu_weight_bytes_per_decoded_token'] / 1e6:.1f} MB (a size)\n")
    if "accuracy" in result:
        a = result["accuracy"]
        out("logits vs CPU: " + ", ".join(f"seq {x['seq_len']} rel {x['logits_rel_err']:.2e}" for x in a["samples"]))
        out(f"; generation agree {a['generation']['agree_steps']}/{a['generation']['tokens']}\n")
    if "verify" in rows:
        out("verify checks (s): " + ", ".join(f"{k} {v}" for k, v in rows["verify"]["checks_s"].items()) + "\n")
    if "context_jobs" in result:
        j = result["context_jobs"]
        out(f"context -n 1 {j['n1']['wall_s']} s, -n 2 {j['n2']['wall_s']} s: {j['speedup']}x\n")
    if "end_to_end" in result:
        e = result["end_to_end"]
        out(
            f"one doit bundle on a fresh root: -n 1 {e['n1']['wall_s']} s = {e['n1_over_floor']}x, -n 2 "
            f"{e['n2']['wall_s']} s = {e['n2_over_floor']}x the floor measured right after ({e['floor_s']} s)\n"
        )

    out(f"wrote {save_result(key, result, commit=commit)} (layers / {commit} / {key})\n")


# ---- speculation at real size (--eagle) ------------------------------------------------------------------------

SPEC_STAGES = ("fetch", "io", "partition", "config", "context", "bundle", "twin", "verify")
"""What ``--eagle`` measures for each variant (the model-lib is the same for both and is left out)."""
VARIANTS = ("off", "eagle")
"""The spec's ``speculative`` of the two builds of the same Eagle-exported model."""
GOAL_BUNDLE_TIME = 0.15
GOAL_BUNDLE_BYTES = 0.05
"""Issue 41's goals at 28 layers: the verify-length graph costs at most this much more ``doit bundle`` wall time /
bundle bytes."""
GOAL_BYTES_PER_TOKEN = 0.45e9
ACCEPTANCE_JSON = RESULTS / "eagle_acceptance.json"
"""The tiny trained pair's accepted tokens per target forward (``models/export/check_eagle.py``)."""
ACCEPTANCE_SETTING = "normal"
"""Its full-precision setting (``memory: normal``), where speculative tokens equal plain ones exactly."""


def speculation_summary(report: dict[str, Any]) -> dict[str, Any] | None:
    """verify's speculation check (a speculating bundle's (b) tree sample and (c) speculative tokens), in short."""
    c = report.get("speculation")
    if not c:
        return None
    tree = c.get("tree_check") or {}
    logits = next((t for t in tree.get("outputs", []) if t["name"] == "logits"), None) or {}
    return {
        "passed": c.get("passed"),
        "problem": c.get("problem"),
        "verify_length": c.get("verify_length"),
        "tree_logits_rel_err": logits.get("rel_err"),
        "tree_top1": (tree.get("top1") or {}).get("agree"),
        "tokens": len(c.get("bundle_tokens") or []),
        "first_difference": c.get("first_difference"),
        "forwards": c.get("forwards"),
        "simulator_forwards": c.get("simulator_forwards"),
        "mean_accepted": c.get("mean_accepted"),
        "npu_weight_bytes_per_forward": c.get("npu_weight_bytes_per_forward"),
        "seconds": c.get("seconds"),
    }


def projection(npu_bytes_per_forward: int) -> dict[str, Any] | None:
    """NPU weight bytes per generated token at real size, projected with the tiny trained pair's measured
    acceptance (a random draft accepts almost nothing, so the real-size pair cannot give it); None until that
    measurement is in ``results/``."""
    if not ACCEPTANCE_JSON.is_file():
        return None
    measured = json.loads(ACCEPTANCE_JSON.read_text())
    mean = measured["settings"][ACCEPTANCE_SETTING]["accepted_per_forward"]
    per_token = npu_bytes_per_forward / mean
    return {
        "label": "projection: this bundle's NPU weight bytes per forward / the tiny trained pair's accepted tokens "
        "per target forward (a size, not a speed)",
        "npu_weight_bytes_per_forward": npu_bytes_per_forward,
        "accepted_per_forward": mean,
        "accepted_from": f"{ACCEPTANCE_JSON.name} {measured.get('model')} settings.{ACCEPTANCE_SETTING}",
        "npu_weight_bytes_per_generated_token": round(per_token),
        "goal_bytes": GOAL_BYTES_PER_TOKEN,
        "meets_goal": per_token <= GOAL_BYTES_PER_TOKEN,
    }


def save_speculative(commit: str, key: str, result: dict[str, Any]) -> Path:
    """Merge ``result`` into ``scale.json`` under ``speculative`` / the commit / ``key`` (after every stage)."""
    path = RESULTS / "scale.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data["machine"] = machine()
    runs = data.setdefault("speculative", {}).setdefault(commit, {})
    runs[key] = {"measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **result}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return path


def extra(with_it: float, without: float) -> float | None:
    """How much more ``with_it`` is than ``without``, as a fraction."""
    return round(with_it / without - 1, 4) if without else None


def compare(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the verify-length graph (and the draft) cost: eagle over off, by the goals' measures."""
    off, on = runs["off"], runs["eagle"]
    out: dict[str, Any] = {}
    if "bundle_wall_s" in off and "bundle_wall_s" in on:
        out["bundle_time_extra"] = extra(on["bundle_wall_s"], off["bundle_wall_s"])
        out["bundle_time_goal"] = GOAL_BUNDLE_TIME
        out["bundle_time_meets_goal"] = out["bundle_time_extra"] <= GOAL_BUNDLE_TIME
    stages_off, stages_on = off["stages"], on["stages"]
    if "context" in stages_off and "context" in stages_on:
        out["context_stage_extra"] = extra(stages_on["context"]["stage_s"], stages_off["context"]["stage_s"])
        out["context_wall_extra"] = extra(stages_on["context"]["wall_s"], stages_off["context"]["wall_s"])
    if "verify" in stages_off and "verify" in stages_on:
        out["verify_wall_extra"] = extra(stages_on["verify"]["wall_s"], stages_off["verify"]["wall_s"])
    if "bundle_parts_mb" in off and "bundle_parts_mb" in on:
        p_off, p_on = off["bundle_parts_mb"], on["bundle_parts_mb"]
        # the goal is the verify-length graph's: the bundle without the draft files (which are the draft's own)
        out["bundle_bytes_extra_without_draft"] = extra(p_on["total"] - p_on["draft"], p_off["total"])
        out["bundle_bytes_extra"] = extra(p_on["total"], p_off["total"])
        out["qnn_binaries_extra"] = extra(p_on["qnn_binaries"], p_off["qnn_binaries"])
        out["bundle_bytes_goal"] = GOAL_BUNDLE_BYTES
        out["bundle_bytes_meets_goal"] = out["bundle_bytes_extra_without_draft"] <= GOAL_BUNDLE_BYTES
    return out


def context_rounds(
    args: argparse.Namespace,
    runs: dict[str, dict[str, Any]],
    names: dict[str, str],
    work: Path,
    envs: dict[str, dict[str, str]],
) -> dict[str, Any]:
    """The context stage again for both builds (cache off), ``--context-rounds`` - 1 more rounds, each round in the
    other order than the last, so a load that changes mid-run falls on both alike: the median of each's stage
    seconds (every round's, the chain's first included) and the verify-length graph's extra over them."""
    seconds = {v: [runs[v]["stages"]["context"]["stage_s"]] for v in VARIANTS}
    walls = {v: [runs[v]["stages"]["context"]["wall_s"]] for v in VARIANTS}
    for n in range(1, args.context_rounds):
        for variant in VARIANTS[::-1] if n % 2 else VARIANTS:
            where = stage_dir(work / variant / "artifacts", "context", names[variant], args.arch)
            shutil.rmtree(where)
            rec = run_doit([f"context:{names[variant]}-{args.arch}"], {**envs[variant], "MNNBUILD_CACHE": "off"})
            seconds[variant].append(round(sum(origin_seconds(d, "context") or 0.0 for d in plugin_dirs(where)), 2))
            walls[variant].append(rec["wall_s"])
            sys.stderr.write(f"{variant} context round {n + 1}: {seconds[variant][-1]} s\n")
    median = {v: statistics.median(seconds[v]) for v in VARIANTS}
    # doit bundle's wall with the context's median wall in place of the chain's one
    bundle = {
        v: runs[v]["bundle_wall_s"] - runs[v]["stages"]["context"]["wall_s"] + statistics.median(walls[v])
        for v in VARIANTS
        if "bundle_wall_s" in runs[v]
    }
    return {
        "stage_s": seconds,
        "wall_s": walls,
        "median_stage_s": median,
        "context_stage_extra": extra(median["eagle"], median["off"]),
        "bundle_wall_s_median_context": {v: round(x, 2) for v, x in bundle.items()},
        "bundle_time_extra": extra(bundle["eagle"], bundle["off"]) if len(bundle) == 2 else None,
    }


def context_pairs(
    arch: str, runs: dict[str, dict[str, Any]], names: dict[str, str], work: Path, envs: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """Every plugin's context built again for both builds (cache off), one right after the other, the first of the
    pair taking turns: a load that changes over the minutes falls on both of a pair alike, which whole-stage
    rounds (`context_rounds`) cannot give on a shared box. The sums are the stage's; the extra over the doit
    bundle's wall is what the verify-length graph adds to it."""
    plugins = [d.name for d in plugin_dirs(stage_dir(work / "off" / "artifacts", "context", names["off"], arch))]
    seconds: dict[str, dict[str, float]] = {}
    walls: dict[str, dict[str, float]] = {}
    for n, plugin in enumerate(plugins):
        seconds[plugin], walls[plugin] = {}, {}
        for variant in VARIANTS[::-1] if n % 2 else VARIANTS:
            where = stage_dir(work / variant / "artifacts", "context", names[variant], arch) / plugin
            shutil.rmtree(where)
            task = f"context:{names[variant]}-{arch}:{plugin}"
            rec = run_doit([task], {**envs[variant], "MNNBUILD_CACHE": "off"})
            seconds[plugin][variant] = origin_seconds(where, "context") or 0.0
            walls[plugin][variant] = rec["wall_s"]
        sys.stderr.write(f"{plugin}: {seconds[plugin]} s\n")
    total = {v: round(sum(s[v] for s in seconds.values()), 2) for v in VARIANTS}
    wall = {v: round(sum(w[v] for w in walls.values()), 2) for v in VARIANTS}
    out: dict[str, Any] = {"stage_s": seconds, "wall_s": walls, "total_stage_s": total, "total_wall_s": wall}
    out["context_stage_extra"] = extra(total["eagle"], total["off"])
    if "bundle_wall_s" in runs["off"] and "context" in runs["off"]["stages"]:
        # the plain doit bundle with its context stage as the pairs measured it: the chain's own context wall
        # was taken at another load, and dividing the pairs' seconds by it would shrink the share by that load
        others = runs["off"]["bundle_wall_s"] - runs["off"]["stages"]["context"]["wall_s"]
        added = total["eagle"] - total["off"]
        out["plain_bundle_s"] = round(others + total["off"], 2)
        out["bundle_time_extra"] = round(added / out["plain_bundle_s"], 4)
        out["bundle_time_meets_goal"] = out["bundle_time_extra"] <= GOAL_BUNDLE_TIME
    return out


def speculative_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The same Eagle-exported model built with ``speculative = "off"`` and ``"eagle"``, stage by stage in turn
    (so the shared box's load falls on both alike), each in its own artifact root and cache."""
    commit = checkout_commit()
    key = f"{args.layers}-{args.npu_weights or 'default'}" + (f"-{args.label}" if args.label else "")
    key += "-no-decode-graph" if args.no_decode_graph else ""
    base = f"qwen3-1.7b-eagle-l{args.layers}"
    names = {v: f"{base}-{v}" for v in VARIANTS}
    runs: dict[str, dict[str, Any]] = {
        v: {"model": names[v], "target": f"{names[v]}-{args.arch}", "speculative": v, "stages": {}} for v in VARIANTS
    }
    result: dict[str, Any] = {"layers": args.layers, "npu_weights": args.npu_weights, "runs": runs}
    result["eagle_decode_graph"] = not args.no_decode_graph
    if args.resume:  # a kept work dir of the same code: its record goes on, stages it has are not run again
        work = args.resume
        earlier = json.loads((RESULTS / "scale.json").read_text()).get("speculative", {}).get(commit, {}).get(key)
        if earlier is None:
            parser.error(f"--resume: scale.json has no speculative / {commit} / {key} to add to (the code changed?)")
        result.update({k: v for k, v in earlier.items() if k not in ("measured", "partial")})
        runs = result["runs"]
    else:
        model_dir = ensure_model(args.layers, require_cache(parser, args), args.export_python, eagle=True)
        work = Path(tempfile.mkdtemp(prefix=f"bench-scale-{base}-", dir=args.work))
        for variant, name in names.items():
            (work / variant / "artifacts").mkdir(parents=True)
            (work / variant / "cache").mkdir()
            bare = args.no_decode_graph and variant == "eagle"
            write_spec(work / "models", name, model_dir, args.arch, args.npu_weights, variant, decode_graph=not bare)
    envs = {v: doit_env(work / v / "artifacts", work / v / "cache", work / "models") for v in VARIANTS}
    stages = [s for s in args.stages.split(",") if s]
    try:
        for stage in stages:
            for variant in VARIANTS:
                run, name = runs[variant], names[variant]
                if args.resume and stage in run["stages"]:
                    continue
                artifacts, cache = work / variant / "artifacts", work / variant / "cache"
                rec, where = timed_stage(stage, name, args.arch, envs[variant], artifacts, cache)
                if stage == "context":
                    run["weights"] = weight_storage(where)
                if stage == "bundle":
                    run["bundle_parts_mb"] = bundle_parts(where)
                    run["final_bundle_mb"] = round(disk_bytes(where) / 1e6, 1)
                    earlier = sum(run["stages"][s]["wall_s"] for s in BUNDLE_STAGES[:-1] if s in run["stages"])
                    run["bundle_wall_s"] = round(earlier + rec["wall_s"], 2)
                if stage == "verify":
                    report = json.loads((where / VERIFY_REPORT_JSON).read_text())
                    rec["checks_s"] = report.get("timings", {})
                    rec["passed"] = report.get("passed")
                    run["accuracy"] = accuracy(report)
                    run["speculation"] = speculation_summary(report)
                run["stages"][stage] = rec
                sys.stderr.write(f"{variant} {stage}: {rec}\n")
                result["comparison"] = compare(runs)
                save_speculative(commit, key, {**result, "partial": True})
        if args.context_rounds > 1 and "context" in stages:
            result["context_rounds"] = context_rounds(args, runs, names, work, envs)
            save_speculative(commit, key, {**result, "partial": True})
        if args.context_pairs:
            result["context_pairs"] = context_pairs(args.arch, runs, names, work, envs)
            save_speculative(commit, key, {**result, "partial": True})
        if "weights" in runs["eagle"]:
            result["projection"] = projection(runs["eagle"]["weights"]["npu_weight_bytes_per_decoded_token"])
    finally:
        if not (args.keep or args.resume):
            shutil.rmtree(work, ignore_errors=True)
        else:
            sys.stderr.write(f"kept {work}\n")
    path = save_speculative(commit, key, result)
    print_speculative(runs, result)
    sys.stdout.write(f"wrote {path} (speculative / {commit} / {key})\n")


def print_speculative(runs: dict[str, dict[str, Any]], result: dict[str, Any]) -> None:
    off, on = runs["off"]["stages"], runs["eagle"]["stages"]
    table = [
        (s, off[s]["wall_s"], on[s]["wall_s"], off[s].get("stage_s") or 0.0, on[s].get("stage_s") or 0.0,
         off[s]["peak_rss_mb"], on[s]["peak_rss_mb"], off[s]["load_avg"], on[s]["load_avg"])
        for s in off if s in on
    ]  # fmt: skip
    headers = ["stage", "wall s off", "wall s eagle", "stage s off", "stage s eagle", "peak RSS MB off",
               "peak RSS MB eagle", "load off", "load eagle"]  # fmt: skip
    print_table(headers, table)
    out = sys.stdout.write
    for v in VARIANTS:
        run = runs[v]
        if "bundle_parts_mb" in run:
            parts = ", ".join(f"{k} {x}" for k, x in run["bundle_parts_mb"].items())
            out(f"{v}: doit bundle (fetch..bundle) {run['bundle_wall_s']} s; bundle MB by part: {parts}\n")
        if "context" in run["stages"]:
            plugins = run["stages"]["context"]["plugins_s"]
            out(f"{v}: context per plugin (s): " + ", ".join(f"{k} {x}" for k, x in plugins.items()) + "\n")
        if "verify" in run["stages"]:
            out(f"{v}: verify passed {run['stages']['verify']['passed']}; checks (s): "
                + ", ".join(f"{k} {x}" for k, x in run["stages"]["verify"]["checks_s"].items()) + "\n")  # fmt: skip
        if run.get("speculation"):
            out(f"{v}: speculation check: {run['speculation']}\n")
    c = result.get("comparison", {})
    if "bundle_time_extra" in c and result.get("context_pairs"):
        # one pass of each build, minutes apart: the load's difference, not the graph's (the pairs decide)
        out(f"verify-length graph, one chain run each: doit bundle {c['bundle_time_extra']:+.1%}, context stage "
            f"{c['context_stage_extra']:+.1%} (the plugin pairs below decide the goal)")  # fmt: skip
    elif "bundle_time_extra" in c:
        out(
            f"verify-length graph: doit bundle {c['bundle_time_extra']:+.1%} (goal <= {GOAL_BUNDLE_TIME:.0%}: "
            f"{'met' if c['bundle_time_meets_goal'] else 'NOT met'}), context stage {c['context_stage_extra']:+.1%}"
        )
        out("\n")
    if "bundle_bytes_extra_without_draft" in c:
        out(
            f"bundle bytes: {c['bundle_bytes_extra_without_draft']:+.2%} without the draft files (goal <= "
            f"{GOAL_BUNDLE_BYTES:.0%}: {'met' if c['bundle_bytes_meets_goal'] else 'NOT met'}), "
            f"{c['bundle_bytes_extra']:+.2%} with them\n"
        )
    if "verify_wall_extra" in c:
        out(f"verify wall: {c['verify_wall_extra']:+.1%}\n")
    r = result.get("context_rounds")
    if r:
        out(f"context stage over {len(r['stage_s']['off'])} rounds (s): off {r['stage_s']['off']}, eagle "
            f"{r['stage_s']['eagle']}; medians: {r['context_stage_extra']:+.1%}; doit bundle with the median context "
            f"wall: {r['bundle_time_extra']:+.1%}\n")  # fmt: skip
    pairs = result.get("context_pairs")
    if pairs:
        total = pairs["total_stage_s"]
        out(f"context by plugin pairs (s): off {total['off']}, eagle {total['eagle']} "
            f"({pairs['context_stage_extra']:+.1%}); added to the plain doit bundle: "
            f"{pairs.get('bundle_time_extra', float('nan')):+.1%} of {pairs.get('plain_bundle_s')} s (goal <= "
            f"{GOAL_BUNDLE_TIME:.0%}: {'met' if pairs.get('bundle_time_meets_goal') else 'NOT met'})\n")  # fmt: skip
    p = result.get("projection")
    if p:
        out(
            f"PROJECTION: {p['npu_weight_bytes_per_forward'] / 1e9:.3f} GB NPU weights per forward / "
            f"{p['accepted_per_forward']} accepted tokens per forward ({p['accepted_from']}) = "
            f"{p['npu_weight_bytes_per_generated_token'] / 1e9:.3f} GB per generated token (goal <= "
            f"{GOAL_BYTES_PER_TOKEN / 1e9} GB: {'met' if p['meets_goal'] else 'NOT met'})\n"
        )


if __name__ == "__main__":
    main()
