#!/usr/bin/env python3
"""Measure an Eagle3 pair on the CPU with PyPI MNN's own engine (``MNN.llm``; no torch): greedy generation with and
without speculation on held-out prompts.

For each prompt and each precision setting the model dir is loaded twice, with ``speculative_type`` ``"eagle"`` and
``""`` (plain decoding), both greedy. Speculative greedy decoding is lossless by construction, so (1) the tokens must
be identical, token for token; (2) the mean number of tokens accepted per target forward after the prefill is what
it buys. MNN's ``EagleGeneration::generate`` counts its target (tree-decoding) forwards and, when it stops, appends
that count to the context's ``output_tokens`` after the last token (``speculative_decoding/eagle.cpp``); the tokens
are the rest. The engine's defaults draft a chain (``eagle_topk`` 1, ``eagle_depth`` 3, ``draft_predict_length``
3), so a forward accepts 1 to 4 tokens.

Precision settings: ``normal`` (``"memory": "normal"``, ``"precision": "high"``: float activations) must give
identical tokens; ``low`` (llmexport's default config, ``"memory": "low"``: activations quantized on the fly) is
reported as measured, since there the speculative forward (several tokens) and the plain one (one token) quantize
different activation rows and may part at a near-tie.

The prompts default to the model's ``training.json`` (``results.eval_prompts``: the first words of documents held
out of training). Writes ``benchmarks/results/eagle_acceptance.json`` (``--json``).

    python models/export/check_eagle.py [MODEL_DIR] [--max-new-tokens N] [--prompt TEXT ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

LOG = logging.getLogger("check_eagle")

SCRIPT_DIR = Path(__file__).resolve().parent
REPO_ROOT = SCRIPT_DIR.parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "tiny-qwen3-eagle"
DEFAULT_JSON = REPO_ROOT / "benchmarks" / "results" / "eagle_acceptance.json"
SETTINGS = {
    "normal": {"precision": "high", "memory": "normal"},
    "low": {"precision": "low", "memory": "low"},
}
GOAL = 2.0


def load_llm(model_dir: Path, speculative: bool, setting: str, max_new_tokens: int):  # noqa: ANN201  (MNN.llm.Llm)
    import MNN.llm

    llm = MNN.llm.create(str(model_dir / "config.json"))
    llm.set_config(
        {
            **SETTINGS[setting],
            "speculative_type": "eagle" if speculative else "",
            "sampler_type": "greedy",
            "max_new_tokens": max_new_tokens,
            "use_template": False,
            "thread_num": 1,
        }
    )
    llm.load()
    return llm


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Send the process's stdout (fd 1) to /dev/null: MNN's Python binding prints every response's text."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def tie_margin(model_dir: Path, context: list[int]) -> dict:
    """The full-precision plain model's next-token logits after ``context``: its top two tokens and the margin
    between them, absolute and relative to the row's max |logit| (how verify judges a near-tie)."""
    import numpy as np

    llm = load_llm(model_dir, False, "normal", 1)
    var = llm.forward(context)
    row = np.array(var.read(), dtype=np.float64).reshape(-1)
    del var, llm
    top = np.argsort(row)[::-1][:2]
    margin = float(row[top[0]] - row[top[1]])
    return {"top2": [int(t) for t in top], "margin": round(margin, 5),
            "relative_margin": round(margin / float(np.abs(row).max()), 5)}  # fmt: skip


def run_prompt(model_dir: Path, prompt: str, setting: str, max_new_tokens: int, depth: int) -> dict:
    """One prompt: plain and speculative greedy tokens, their agreement, the target forwards of the speculative run."""
    # response() with use_template off generates from the prompt's own tokens (config max_new_tokens)
    plain_llm = load_llm(model_dir, False, setting, max_new_tokens + depth + 1)
    ids = list(plain_llm.tokenizer_encode(prompt))
    with quiet_stdout():
        plain_llm.response(prompt)
    plain = list(plain_llm.context.output_tokens)
    del plain_llm
    spec_llm = load_llm(model_dir, True, setting, max_new_tokens)
    with quiet_stdout():
        spec_llm.response(prompt)
    out, status = list(spec_llm.context.output_tokens), spec_llm.context.status
    del spec_llm
    # the engine appends its forward count after the tokens when it stops (max tokens or a stop token)
    forwards, tokens = out[-1], out[:-1]
    decoded = len(tokens) - 1  # tokens after the prefill's
    first_diff = next((i for i, (a, b) in enumerate(zip(tokens, plain, strict=False)) if a != b), None)
    if first_diff is None and len(tokens) > len(plain):
        first_diff = len(plain)
    parting = None
    if first_diff is not None and first_diff < min(len(tokens), len(plain)):
        parting = {
            "speculative": tokens[first_diff],
            "plain": plain[first_diff],
            "full_precision": tie_margin(model_dir, ids + tokens[:first_diff]),
        }
    return {
        "prompt": prompt,
        "prompt_tokens": len(ids),
        "tokens": len(tokens),
        "status": str(status),
        "identical": first_diff is None,
        "first_difference": first_diff,
        "parting": parting,
        "target_forwards": forwards,
        "accepted_per_forward": round(decoded / forwards, 4) if forwards > 0 else None,
        "speculative_tokens": tokens,
        "plain_tokens": plain[: len(tokens)],
    }


def default_prompts(model_dir: Path) -> list[str]:
    record = json.loads((model_dir / "training.json").read_text(encoding="utf-8"))
    return list(record["results"]["eval_prompts"])


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", nargs="?", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--prompt", action="append", help="prompt text (repeatable; default: training.json's)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--setting", action="append", choices=sorted(SETTINGS), help="default: normal and low")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="results file to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    model_dir = args.model_dir.resolve()
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if config.get("speculative_type") != "eagle":
        raise SystemExit(f"{model_dir / 'config.json'}: speculative_type is {config.get('speculative_type')!r}, "
                         "expected 'eagle'")  # fmt: skip
    depth = int(config.get("draft_predict_length", 3))
    prompts = args.prompt or default_prompts(model_dir)
    results: dict[str, dict] = {}
    for setting in args.setting or ["normal", "low"]:
        rows = [run_prompt(model_dir, p, setting, args.max_new_tokens, depth) for p in prompts]
        decoded = sum(r["tokens"] - 1 for r in rows)
        forwards = sum(r["target_forwards"] for r in rows)
        results[setting] = {
            "config": SETTINGS[setting],
            "prompts": rows,
            "identical": all(r["identical"] for r in rows),
            "target_forwards": forwards,
            "decoded_tokens": decoded,
            "accepted_per_forward": round(decoded / forwards, 4),
        }
        LOG.info("%s (%s)", setting, ", ".join(f"{k} {v}" for k, v in SETTINGS[setting].items()))
        LOG.info("  %-40s %6s %9s %8s %9s  %s", "prompt", "tokens", "identical", "forwards", "accepted", "parting")
        for r in rows:
            part = r["parting"]
            where = "" if part is None else (f"at {r['first_difference']}: {part['speculative']} vs {part['plain']}, "
                                             f"margin {part['full_precision']['relative_margin']:.2%}")  # fmt: skip
            LOG.info("  %-40s %6d %9s %8d %9.2f  %s", r["prompt"][:40], r["tokens"], r["identical"],
                     r["target_forwards"], r["accepted_per_forward"] or 0.0, where)  # fmt: skip
        LOG.info("  %-40s %6d %9s %8d %9.2f", "all", decoded + len(rows), results[setting]["identical"], forwards,
                 decoded / forwards)  # fmt: skip
    data = {
        "model": model_dir.name,
        "what": "greedy decoding with MNN.llm on the CPU, speculative_type eagle vs none, same prompts",
        "engine": {
            "eagle_topk": config.get("eagle_topk", 1),
            "eagle_depth": config.get("eagle_depth", 3),
            "draft_predict_length": depth,
        },  # fmt: skip
        "max_new_tokens": args.max_new_tokens,
        "accepted_per_forward_goal": GOAL,
        "settings": results,
        "versions": {"python": platform.python_version(), "MNN": version("MNN")},
    }
    write_json(args.json, data)
    LOG.info("wrote %s", args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
