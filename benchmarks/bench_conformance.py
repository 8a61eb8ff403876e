"""Conformance of the tiny models (random and trained) and every fixture model: bundle vs original model in
MNN's own Llm engine.

Builds each model's bundle and twins with doit (the fixtures through a temporary spec dir, as
tests/test_verify.py does; the tiny model once more as ``tiny-qwen3-renamed``, from a folder named otherwise),
then runs ``python -m mnnbuild conform <model>-<arch>`` for each (MNN built once from ``MNN_SOURCE``, QNN headers
from ``QNN_SDK_ROOT`` or ``--qnn-headers``; see docs/conformance.md), prints tables and writes
``benchmarks/results/conformance.json``: per model the conform report (verdict, plugin boundaries against MNN's
``compilefornpu``, and with ``--patch-effect NAME`` what that patch changes at prompt lengths around the chunk),
plus a ``boundaries`` and a ``patch_effect`` summary. Not part of CI: the first run builds MNN (~15 minutes on
2 cores; a second build without one patch is mostly ccache hits).

    python benchmarks/bench_conformance.py [--arch v79] [--artifacts DIR] [--qnn-headers DIR] [--mnn-source SRC]
        [--patch-effect 0004-cpu-attention-padded-nc4hw4] [--npu-weights int4 [--models tiny-qwen3,...]] [--eagle]

``--npu-weights ENC`` builds the chosen models (default: the two tiny ones) as ``<model>-<ENC>`` with that spec
field ``npu_weights`` and merges their reports into ``conformance.json`` under ``npu_weights.<ENC>``, leaving the
rest of the file as it was. ``--eagle`` does the same for the Eagle3 bundle (``models/tiny-qwen3-eagle``, whose
``Llm::generate`` runs MNN's EagleGeneration), under ``eagle``, with a table of its engine loop's forwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, RESULTS, print_table, write_results  # noqa: E402

from mnnbuild.conform.build import SOURCE_ENV, cache_root  # noqa: E402

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "models"


RENAMED = ("tiny-qwen3-renamed", "qwen3-tiny-folder")
"""A spec named unlike its model's folder (the bundle names the model dir after the folder): conform must find it."""
EAGLE_MODEL = "tiny-qwen3-eagle"
"""The Eagle3 pair (a project spec): its bundle and original run EagleGeneration in Llm::generate."""


def _specs(arch: str, specs_dir: Path) -> list[str]:
    specs_dir.mkdir(parents=True, exist_ok=True)
    # text LLMs only: a VL fixture's llm.mnn takes M-RoPE inputs, which the chain does not build yet
    names = sorted(p.name for p in FIXTURES.iterdir() if (p / "llm.mnn").is_file() and not (p / "visual.mnn").exists())
    sources = {name: FIXTURES / name for name in names}
    spec, folder = RENAMED
    copy = specs_dir.parent / "conformance-models" / folder
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(PROJECT_ROOT / "models" / "tiny-qwen3", copy)
    sources[spec] = copy
    for name, source in sources.items():
        (specs_dir / f"{name}.toml").write_text(
            f'name = "{name}"\nsource = {{ local = "{source}" }}\nchunk_size = 128\ntargets = ["{arch}"]\n'
        )
    return ["tiny-qwen3", "tiny-qwen3-trained", *names, spec]


def _encoding_specs(models: list[str], encoding: str, arch: str, specs_dir: Path) -> list[str]:
    """Specs ``<model>-<encoding>`` on the models' own dirs with ``npu_weights = encoding``."""
    specs_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for model in models:
        source = PROJECT_ROOT / "models" / model
        if not (source / "llm.mnn").is_file():
            source = FIXTURES / model
        name = f"{model}-{encoding}"
        (specs_dir / f"{name}.toml").write_text(
            f'name = "{name}"\nsource = {{ local = "{source}" }}\nchunk_size = 128\ntargets = ["{arch}"]\n'
            f'npu_weights = "{encoding}"\n'
        )
        names.append(name)
    return names


def summaries(reports: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Print the boundary and patch-effect tables; return their compact summaries per model."""
    boundaries: dict[str, Any] = {}
    effects: dict[str, Any] = {}
    b_rows, e_rows = [], []
    for model, report in reports.items():
        b = report.get("boundaries")
        if b:
            if b.get("problem"):
                boundaries[model] = {"problem": b["problem"]}
                b_rows.append([model, "-", "-", "-", b["problem"][:60]])
            else:
                ours, up = b["ours"], b["upstream"]
                boundaries[model] = {
                    "plugins": {"ours": len(ours["plugins"]), "upstream": len(up["plugins"])},
                    "cpu_ops": {"ours": ours["cpu_ops"], "upstream": up["cpu_ops"]},
                    "differences": b["differences"],
                }
                b_rows.append(
                    [
                        model,
                        f"{len(ours['plugins'])} / {len(up['plugins'])}",
                        f"{len(ours['cpu_ops'])} / {len(up['cpu_ops'])}",
                        sum(d["same_cut"] for d in b["plugins"]),
                        len(b["differences"]),
                    ]
                )
        e = report.get("patch_effect")
        if e:
            cosines = [x["first_token_logits"]["cosine"] for x in e["lengths"] if x["changed"]]
            effects[model] = {k: e[k] for k in ("patch", "chunk_limits", "changed_lengths", "padded_lengths")} | {
                "changed_exactly_where_padded": e["changed_exactly_where_padded"]
            }
            e_rows.append(
                [
                    model,
                    ",".join(map(str, e["changed_lengths"])),
                    ",".join(map(str, e["padded_lengths"])),
                    e["changed_exactly_where_padded"],
                    min((c for c in cosines if c is not None), default=float("nan")),
                    sum(x["first_divergence"] is not None for x in e["lengths"]),
                ]
            )
    if b_rows:
        print_table(["model", "plugins ours / upstream", "CPU ops ours / upstream", "same cut", "differences"], b_rows)
    if e_rows:
        print_table(
            ["model", "changed at (tokens)", "padded at", "= padded", "min cosine", "token flips"],
            e_rows,
        )
    return boundaries, effects


def eagle_summary(reports: dict[str, Any]) -> dict[str, Any]:
    """Per model and prompt: whether Llm::generate's speculative tokens are the stepped plain greedy ones, and its
    target forwards (after the prompt's) and accepted tokens per forward, for each run; printed as a table."""
    out: dict[str, Any] = {}
    rows = []
    for model, report in reports.items():
        for p in report.get("prompts", []):
            runs = {}
            for label in ("bundle", "original", "unchunked"):
                run = p.get(label) or {}
                if run.get("engine_forwards") is not None:
                    same = run["engine_loop_tokens"][: len(run["tokens"])] == run["tokens"]
                    runs[label] = {
                        "engine_loop_equals_plain_greedy": same,
                        "forwards": run["engine_forwards"],
                        "accepted_per_forward": run["engine_accepted_per_forward"],
                    }
                    rows.append([model, p["name"], label, "yes" if same else "NO", run["engine_forwards"],
                                 run["engine_accepted_per_forward"]])  # fmt: skip
            out.setdefault(model, {})[p["name"]] = runs
    if rows:
        print_table(["model", "prompt", "run", "Llm::generate = greedy", "forwards", "accepted / forward"], rows)
    return out


def portable(doc: Any, places: dict[str, str]) -> Any:
    """``doc`` with this machine's directories (``places``: path -> placeholder) named by placeholders, so a
    committed result holds no machine paths (the MNN source by its file name)."""
    if isinstance(doc, dict):
        return {k: portable(v, places) for k, v in doc.items()}
    if isinstance(doc, list):
        return [portable(v, places) for v in doc]
    if isinstance(doc, str):
        for path, placeholder in sorted(places.items(), key=lambda p: -len(p[0])):
            doc = doc.replace(path, placeholder)
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="v79")
    parser.add_argument("--artifacts", type=Path, default=PROJECT_ROOT / "artifacts")
    parser.add_argument("--mnn-source")
    parser.add_argument("--qnn-headers")
    parser.add_argument("--patch-effect", metavar="NAME", help="passed to conform: what this patch changes")
    parser.add_argument("--npu-weights", metavar="ENC", help="the chosen models built with this npu_weights")
    parser.add_argument("--models", default="tiny-qwen3,tiny-qwen3-trained", help="with --npu-weights: which")
    parser.add_argument("--eagle", action="store_true", help=f"only the Eagle3 bundle ({EAGLE_MODEL}), under 'eagle'")
    args = parser.parse_args()
    artifacts = args.artifacts.resolve()
    # specs (and the renamed model's copy) outside the artifact root, which may hold no spec dir of its own
    scratch = tempfile.TemporaryDirectory(prefix="bench-conformance-")
    specs_dir = Path(scratch.name) / "specs"
    if args.eagle:
        specs_dir.mkdir(parents=True)
        models = [EAGLE_MODEL]
    elif args.npu_weights:
        models = _encoding_specs([m for m in args.models.split(",") if m], args.npu_weights, args.arch, specs_dir)
    else:
        models = _specs(args.arch, specs_dir)
    env = {**os.environ, "MNNBUILD_ARTIFACTS": str(artifacts), "MNNBUILD_MODELS_PATH": str(specs_dir)}
    tasks = [f"{stage}:{m}-{args.arch}" for m in models for stage in ("bundle", "twin")]
    subprocess.run([sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), *tasks], env=env, check=True)
    extra = [f"--mnn-source={args.mnn_source}"] * bool(args.mnn_source)
    extra += [f"--qnn-headers={args.qnn_headers}"] * bool(args.qnn_headers)
    extra += [f"--patch-effect={args.patch_effect}"] * bool(args.patch_effect)
    reports: dict[str, Any] = {}
    rows = []
    for model in models:
        report_path = artifacts / model / args.arch / "conform" / "conform.json"
        report_path.unlink(missing_ok=True)  # a stale report must not stand for this run
        proc = subprocess.run(
            [sys.executable, "-m", "mnnbuild", "conform", f"{model}-{args.arch}", *extra], env=env, check=False
        )
        if not report_path.is_file():
            reports[model] = {"passed": False, "problem": f"conform exited {proc.returncode} without a report"}
            rows.append([model, "-", "-", "-", "-", "-", "-", "FAILED"])
            continue
        report = json.loads(report_path.read_text())
        reports[model] = report
        for p in report["prompts"]:
            worst_cos = min((s["logits"]["cosine"] or 1.0 for s in p["steps"]), default=float("nan"))
            worst_rel = max((s["logits"]["rel_err"] or 0.0 for s in p["steps"]), default=float("nan"))
            bundle = p.get("bundle") or {}
            rows.append(
                [
                    model,
                    p["name"],
                    p["prompt_tokens"],
                    "yes" if p["tokens_equal"] else "NO",
                    worst_cos,
                    worst_rel,
                    bundle.get("decode_s", float("nan")),
                    "ok" if p["passed"] else "FAILED",
                ]
            )
    print_table(
        ["model", "prompt", "tokens", "bundle = original", "min cosine", "max rel err", "bundle decode s", "verdict"],
        rows,
    )
    boundaries, effects = summaries(reports)
    places = {str(artifacts): "<artifacts>", str(cache_root()): "<conform build>"}
    source = args.mnn_source or os.environ.get(SOURCE_ENV)
    if source:
        places[str(Path(source).expanduser().resolve().parent)] = "<mnn source dir>"
    doc = {"arch": args.arch, "boundaries": boundaries, "patch_effect": effects, "models": reports}
    if args.eagle:
        doc["engine_loop"] = eagle_summary(reports)
    if args.npu_weights or args.eagle:  # beside the other runs' results, which stay as they were
        existing = (
            json.loads((RESULTS / "conformance.json").read_text()) if (RESULTS / "conformance.json").is_file() else {}
        )
        existing.pop("machine", None)
        if args.eagle:
            existing["eagle"] = portable(doc, places)
        else:
            existing.setdefault("npu_weights", {})[args.npu_weights] = portable(doc, places)
        doc = existing
    if not (args.npu_weights or args.eagle):  # the other runs' sections stay as they were
        last = RESULTS / "conformance.json"
        kept = json.loads(last.read_text()) if last.is_file() else {}
        doc = portable(doc, places) | {k: kept[k] for k in ("npu_weights", "eagle") if k in kept}
        if not effects and kept.get("patch_effect"):  # not measured this time: the last measurement, said to be one
            doc["patch_effect"] = kept["patch_effect"]
            builds = {r.get("mnn_build") for r in kept.get("models", {}).values() if r.get("mnn_build")}
            doc["patch_effect_from"] = kept.get("patch_effect_from") or {
                "mnn_build": sorted(builds),
                "note": "measured by an earlier run with --patch-effect (its per-model details are in that run's "
                "file); this run did not measure it",
            }
    path = write_results("conformance", doc)
    sys.stdout.write(f"wrote {path}\n")
    return 0 if all(r.get("passed") for r in reports.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
