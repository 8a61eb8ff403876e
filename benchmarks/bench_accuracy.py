"""Accuracy of bundles against the original model on the CPU: the random-weight tiny model vs the trained one.

For each model (default ``tiny-qwen3`` and ``tiny-qwen3-trained``) it builds ``verify:<model>-<arch>`` with doit
(into a temp artifact root unless ``--artifacts`` names one) and reads verify's report: the whole-model logits
error and top-1 agreement on the io samples, and the generation check (greedy agreement, each step's logits error
on the CPU's sequence, near-tie steps). Then one teacher-forced pass over a fixed English text (the same
characters for every model, each tokenizer cutting it its own way; at most one prefill chunk) through the bundle
(unshared twins in the HTP simulator, as verify runs them) and the original model in MNN on the CPU: per position,
top-1 agreement, near-ties and the logits error on real text.

A near-tie is verify's: the CPU's top-1 leads the other token by at most ``tie_margin`` (0.5%) of the row's
max |logit|; a flip there is tolerated, elsewhere it fails verify.

``--npu-weights float16,int4`` builds every model once per NPU weight encoding (the spec field ``npu_weights``;
a temporary spec ``<model>-<encoding>`` on the model's own dir) and adds each encoding's error over the first
one's. A checkout whose spec has no such field refuses the option.

Prints a table and writes ``benchmarks/results/accuracy.json``. Not part of CI.

    python benchmarks/bench_accuracy.py [--models tiny-qwen3,tiny-qwen3-trained] [--arch v79] [--artifacts DIR]
        [--npu-weights float16,int4]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PROJECT_ROOT, print_table, write_results  # noqa: E402

from mnnbuild.base.compare import Tolerance  # noqa: E402
from mnnbuild.model.spec import ModelSpec, load_spec  # noqa: E402
from mnnbuild.pipeline.layout import BUNDLE_MODEL_DIR, VERIFY_REPORT_JSON  # noqa: E402
from mnnbuild.stages.chain import stage_dir  # noqa: E402
from mnnbuild.verify.compare import top2_margin  # noqa: E402
from mnnbuild.verify.verdict import VerifyReport  # noqa: E402

log = logging.getLogger("bench_accuracy")

MODELS = ("tiny-qwen3", "tiny-qwen3-trained")
NPU_WEIGHTS_FIELD = "npu_weights"

# Written for this benchmark in the style of API documentation (the trained model's domain); the random model
# reads it too, so both are measured on one text.
TEXT = (
    "Returns a new tensor with the same data as the input tensor but of a different shape. "
    "The returned tensor shares the same data and must have the same number of elements. "
    "If the input is a sparse tensor, the output is also sparse. "
    "Args: input (Tensor): the input tensor. dim (int): the dimension to reduce. "
    "keepdim (bool): whether the output tensor has dim retained or not. Default: False. "
    "Keyword args: out (Tensor, optional): the output tensor. "
    "This function supports broadcasting to a common shape, type promotion, and integer, float and complex inputs."
)


def spec_of(name: str) -> ModelSpec:
    return load_spec(PROJECT_ROOT / "models" / f"{name}.toml")


def encoding_specs(models: Sequence[str], encodings: Sequence[str], specs_dir: Path, arch: str) -> list[str]:
    """One temporary spec per model and NPU weight encoding, on the model's own dir; returns their names."""
    if NPU_WEIGHTS_FIELD not in ModelSpec.model_fields:
        raise SystemExit(
            f"--npu-weights: this checkout's model spec has no field {NPU_WEIGHTS_FIELD!r} (the int4 NPU weights of "
            "issue 26 are not merged yet)"
        )
    names = []
    specs_dir.mkdir(parents=True, exist_ok=True)
    for model in models:
        spec = spec_of(model)
        if spec.source.kind != "local":
            raise SystemExit(f"{model}: --npu-weights needs a local model dir")
        source = (spec.spec_path.parent / spec.source.local).resolve()
        for enc in encodings:
            name = f"{model}-{enc}"
            (specs_dir / f"{name}.toml").write_text(
                f"name = {name!r}\nsource = {{ local = {str(source)!r} }}\n"
                f"chunk_sizes = {list(spec.prefill_lengths)!r}\ntargets = [{arch!r}]\n"
                f"{NPU_WEIGHTS_FIELD} = {enc!r}\n",
                encoding="utf-8",
            )
            names.append(name)
    return names


def build(names: Sequence[str], arch: str, artifacts: Path, specs_dir: Path | None) -> None:
    env = {**os.environ, "MNNBUILD_ARTIFACTS": str(artifacts), "MNNBUILD_LOG_LEVEL": "WARNING"}
    if specs_dir is not None:
        env["MNNBUILD_MODELS_PATH"] = str(specs_dir)
    # bundle and twin named: this script reads their files, which a cache hit nothing else reads leaves in the cache
    tasks = [f"{stage}:{n}-{arch}" for n in names for stage in ("verify", "bundle", "twin")]
    cmd = [sys.executable, "-m", "doit", "-f", str(PROJECT_ROOT / "dodo.py"), *tasks]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"doit failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")


def near_tie(row: np.ndarray, tol: Tolerance) -> bool:
    """verify's near-tie: the top-1 leads the second by at most ``tie_margin`` of the row's max |logit|."""
    return top2_margin(row) <= tol.tie_margin * float(np.abs(row).max())


def from_report(report: VerifyReport) -> dict[str, Any]:
    """verify's numbers: whole-model logits per io sample, and the generation check."""
    tol = report.model_tolerance
    samples = []
    for s in report.whole_model:
        logits = next((t for t in s.outputs if t.name == "logits"), None)
        samples.append(
            {
                "seq_len": s.seq_len,
                "logits_rel_err": None if logits is None else logits.rel_err,
                "logits_cosine": None if logits is None else logits.cosine,
                "top1_agree": None if s.top1 is None else f"{s.top1.agree}/{s.top1.rows}",
            }
        )
    gen = report.generation
    generation: dict[str, Any] = {}
    if gen is not None and gen.problem is None:
        steps = gen.steps
        ties = [s.step for s in steps if s.cpu_margin <= tol.tie_margin * s.logits.ref_max_abs]
        generation = {
            "prompt": gen.prompt,
            "tokens": len(gen.cpu_tokens),
            "distinct_tokens": len(set(gen.cpu_tokens)),
            "identical": gen.first_divergence is None,
            "first_divergence": gen.first_divergence,
            "agree_steps": sum(s.hybrid_pick == s.cpu_token for s in steps),
            "near_tie_steps": len(ties),
            "median_margin_over_max": statistics.median(s.cpu_margin / s.logits.ref_max_abs for s in steps),
            "max_step_logits_rel_err": max(s.logits.rel_err or 0.0 for s in steps),
            "min_step_logits_cosine": min(s.logits.cosine or 1.0 for s in steps),
            "cpu_text": gen.cpu_text,
        }
    return {"passed": report.passed, "samples": samples, "generation": generation}


def teacher_forced(artifacts: Path, name: str, arch: str, tol: Tolerance) -> dict[str, Any]:
    """The fixed text through the bundle (twins in the simulator) and the original model on the CPU, one pass."""
    from mnnbuild_runtime import Embeddings, HybridModel, Tokenizer, cpu_forward_fn, llm_inputs

    from mnnbuild.manifests.bundle import BundleManifest
    from mnnbuild.manifests.partition import read_merge
    from mnnbuild.verify.checks import read_contexts, read_twins

    merge = read_merge(stage_dir(artifacts, "partition", name))
    contexts, problems = read_contexts(stage_dir(artifacts, "context", name, arch), merge)
    twins, more = read_twins(stage_dir(artifacts, "twin", name, arch), contexts, merge)
    if problems or more:
        raise SystemExit(f"{name}: no twins to run: {(problems + more)[0]}")
    bundle = stage_dir(artifacts, "bundle", name, arch)
    model_dir = bundle / BUNDLE_MODEL_DIR / BundleManifest.read(bundle).model_name
    with HybridModel(model_dir, binary_overrides={p: t.override() for p, t in twins.items()}, max_loaded=1) as model:
        chunk = max(model.bundle.block_sizes)
        ids = Tokenizer(model_dir / "config_qnn.json").encode(TEXT)[:chunk]
        feed = llm_inputs(Embeddings(model_dir)(ids), seq=chunk)
        run = model.run(feed, capture=True)
        got = np.asarray(run.outputs["logits"], dtype=np.float64).reshape(chunk, -1)[: len(ids)]
        # activation outliers: each plugin input's largest |value| over its root mean square (text rows only)
        spread = [
            float(np.abs(a).max() / np.sqrt((a**2).mean()))
            for io in run.plugin_io.values()
            for x in io["inputs"].values()
            if (a := _text_rows(np.asarray(x, dtype=np.float64), chunk, len(ids))) is not None and a.any()
        ]
    ref = np.asarray(cpu_forward_fn(stage_dir(artifacts, "fetch", name))(feed)["logits"], dtype=np.float64)
    ref = ref.reshape(chunk, -1)[: len(ids)]
    rel = np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)
    cos = (got * ref).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    agree = got.argmax(axis=1) == ref.argmax(axis=1)
    ties = np.array([near_tie(r, tol) for r in ref])
    # next-token accuracy of the model itself: does its CPU top-1 predict the text's next token?
    hits = int((ref[:-1].argmax(axis=1) == np.asarray(ids[1:])).sum())
    return {
        "positions": len(ids),
        "top1_agree": int(agree.sum()),
        "near_tie_positions": int(ties.sum()),
        "hard_flips": int((~agree & ~ties).sum()),
        "median_margin_over_max": float(statistics.median(top2_margin(r) / np.abs(r).max() for r in ref)),
        "max_logits_rel_err": float(rel.max()),
        "median_logits_rel_err": float(np.median(rel)),
        "min_logits_cosine": float(cos.min()),
        "cpu_predicts_next_token": f"{hits}/{len(ids) - 1}",
        "activation_max_over_rms": max(spread),
        "weight_max_over_std": weight_spread(stage_dir(artifacts, "fetch", name)),
    }


def _text_rows(a: np.ndarray, chunk: int, rows: int) -> np.ndarray | None:
    """The first ``rows`` sequence rows of a plugin tensor with a ``chunk``-long axis (others: None)."""
    axes = [i for i, d in enumerate(a.shape) if d == chunk]
    if not axes:
        return None
    return np.take(a, np.arange(rows), axis=axes[0])


def weight_spread(model_dir: Path) -> float:
    """Weight outliers: the largest over the model's linear ops of max |w| / std(w), as stored (dequantized)."""
    from mnnbuild.mnn import iter_conv_weights, load_model

    model_file = model_dir / "llm.mnn"
    found = [float(np.abs(cw.weight).max() / cw.weight.std()) for cw in iter_conv_weights(load_model(model_file))]
    return max(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated spec names in models/")
    parser.add_argument("--arch", default="v79")
    parser.add_argument("--artifacts", type=Path, help="artifact root (default: a temp dir)")
    parser.add_argument("--npu-weights", help="comma-separated NPU weight encodings, e.g. float16,int4")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    models = [m for m in args.models.split(",") if m]
    encodings = [e for e in (args.npu_weights or "").split(",") if e]
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = args.artifacts or Path(tmp) / "artifacts"
        specs_dir = Path(tmp) / "specs" if encodings else None
        names = encoding_specs(models, encodings, specs_dir, args.arch) if specs_dir else models
        build(names, args.arch, artifacts, specs_dir)
        results: dict[str, Any] = {}
        for name in names:
            path = stage_dir(artifacts, "verify", name, args.arch) / VERIFY_REPORT_JSON
            report = VerifyReport.model_validate_json(path.read_text(encoding="utf-8"))
            results[name] = {
                **from_report(report),
                "text": teacher_forced(artifacts, name, args.arch, report.model_tolerance),
            }
    if encodings:
        for model in models:
            base = results[f"{model}-{encodings[0]}"]["text"]["max_logits_rel_err"]
            for enc in encodings:
                entry = results[f"{model}-{enc}"]
                entry["text"][f"rel_err_over_{encodings[0]}"] = entry["text"]["max_logits_rel_err"] / base

    rows = []
    for name, r in results.items():
        g, t = r["generation"], r["text"]
        decode, prefill = r["samples"][0], r["samples"][-1]
        rows.append(
            [
                name,
                f"{decode['logits_rel_err']:.3%}",
                f"{prefill['logits_rel_err']:.3%}",
                f"{g['agree_steps']}/{g['tokens']}" + ("" if g["identical"] else f" (div@{g['first_divergence']})"),
                g["distinct_tokens"],
                f"{g['near_tie_steps']}/{g['tokens']}",
                f"{g['max_step_logits_rel_err']:.3%}",
                f"{t['top1_agree']}/{t['positions']}",
                f"{t['near_tie_positions']}/{t['positions']}",
                t["hard_flips"],
                f"{t['median_margin_over_max']:.3f}",
                f"{t['max_logits_rel_err']:.3%}",
                t["cpu_predicts_next_token"],
                f"{t['activation_max_over_rms']:.1f}",
                f"{t['weight_max_over_std']:.1f}",
            ]
        )
    headers = [
        "model", "decode err", "prefill err", "greedy agree", "distinct", "gen near-ties", "gen step err",
        "text top-1", "text near-ties", "hard flips", "margin/max", "text err", "CPU next-token", "act max/rms",
        "w max/std",
    ]  # fmt: skip
    print_table(headers, rows)
    for name, r in results.items():
        sys.stdout.write(f"{name}: greedy text from {r['generation']['prompt']!r}: {r['generation']['cpu_text']!r}\n")
    out = write_results(
        "accuracy",
        {"arch": args.arch, "text": TEXT, "npu_weights": encodings or None, "models": results},
    )
    sys.stdout.write(f"wrote {out}\n")


if __name__ == "__main__":
    main()
