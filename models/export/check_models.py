#!/usr/bin/env python3
"""Smoke-check the committed MNN test models with PyPI MNN (no torch needed).

For each model dir: load ``llm.mnn`` as an ``MNN.nn`` module with its external weights,
run one prefill forward on real token embeddings (from ``embeddings_bf16.bin`` or, for tied
models, dequantized from ``llm.mnn.weight`` at ``llm_config.json``'s ``tie_embeddings``),
check the logits are finite, then load the dir with ``MNN.llm`` and generate a few tokens.

Never imports ``MNN.tools`` (its logger installs packages and sends telemetry).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

LOG = logging.getLogger("check_models")

SCRIPT_DIR = Path(__file__).resolve().parent
REPO_ROOT = SCRIPT_DIR.parent.parent
DEFAULT_DIRS = (
    "models/tiny-qwen3",
    "tests/fixtures/models/qwen3-untied-int8-b32",
    "tests/fixtures/models/llama-int4-cw",
    "tests/fixtures/models/qwen2.5-vl-tiny",
    "tests/fixtures/models/qwen3-vl-tiny",
    "tests/fixtures/models/qwen3-embedding-tiny",
)
# Image sizes the visual encoders are run at: a single window and a grid of several (docs/families.md).
CHECK_IMAGE_SIZES = {"qwen2.5-vl": ("56x56", "252x140"), "qwen3-vl": ("64x64", "160x96")}


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def load_embeddings(model_dir: Path, llm_cfg: dict, hidden: int) -> np.ndarray:
    """Return the [vocab, hidden] float32 embedding table the MNN runtime would use."""
    bf16 = model_dir / "embeddings_bf16.bin"
    if bf16.exists():
        raw = np.fromfile(bf16, dtype=np.uint16)
        return bf16_to_f32(raw).reshape(-1, hidden)
    weight_off, alpha_off, alpha_size, bits, block = llm_cfg["tie_embeddings"]
    data = np.fromfile(model_dir / "llm.mnn.weight", dtype=np.uint8)
    alpha = data[alpha_off : alpha_off + alpha_size].view(np.float32)
    block = hidden if block == 0 else block
    n_blocks = hidden // block
    vocab = alpha.size // (2 * n_blocks)  # asymmetric: (zero, scale) per block
    packed = data[weight_off : weight_off + vocab * hidden * bits // 8]
    if bits == 4:
        q = np.stack([packed >> 4, packed & 0x0F], axis=-1).reshape(-1)
    elif bits == 8:
        q = packed
    else:
        raise ValueError(f"unsupported tie_embeddings bits {bits}")
    offset = 1 << (bits - 1)
    q = (q.astype(np.float32) - offset).reshape(vocab, n_blocks, block)
    zs = alpha.reshape(vocab, n_blocks, 2)
    return (q * zs[..., 1:2] + zs[..., 0:1]).reshape(vocab, hidden)


def load_module(model_dir: Path, model_file: str, weight_file: str) -> tuple[Any, dict]:
    """An ``MNN.nn`` module of one model file in ``model_dir`` with its external weights, and its info."""
    import MNN.nn as nn

    rt = nn.create_runtime_manager(({"backend": "CPU", "precision": "high", "numThread": 1},))
    rt.set_external(str(model_dir / weight_file))
    module = nn.load_module_from_file(str(model_dir / model_file), [], [], runtime_manager=rt)
    info = module.get_info()
    LOG.info("  %s: inputs %s outputs %s", model_file, info["inputNames"], info["outputNames"])
    return module, info


def run_module(model_dir: Path, token_ids: list[int]) -> np.ndarray:
    import MNN.expr as F

    cfg = json.loads((model_dir / "config.json").read_text())
    llm_cfg = json.loads((model_dir / "llm_config.json").read_text())
    hidden = int(llm_cfg["hidden_size"])
    embed = load_embeddings(model_dir, llm_cfg, hidden)
    seq = len(token_ids)

    module, info = load_module(model_dir, cfg.get("llm_model", "llm.mnn"), cfg.get("llm_weight", "llm.mnn.weight"))
    # M-RoPE models (VL) take one row of positions per axis (t, h, w); for text all rows are equal.
    axes = next(i.shape[0] for n, i in zip(info["inputNames"], info["inputs"], strict=True) if n == "position_ids")
    positions = np.tile(np.arange(seq, dtype=np.int32), (axes, 1))

    ids = np.asarray(token_ids)
    x = embed[ids].reshape(seq, 1, hidden).astype(np.float32)
    mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), k=1).reshape(1, 1, seq, seq)
    feeds = {
        "input_ids": F.const(x, [seq, 1, hidden], F.NCHW, F.float),
        "attention_mask": F.const(mask, [1, 1, seq, seq], F.NCHW, F.float),
        "position_ids": F.const(positions, [axes, seq], F.NCHW, F.int),
        "logits_index": F.const(np.array([-1], np.int32), [1], F.NCHW, F.int),
        # Qwen3-VL: visual features added after the first decoder layers; zero for text, as the runtime feeds it.
        "deepstack_embeds": F.const(np.zeros((3, seq, hidden), np.float32), [3, seq, hidden], F.NCHW, F.float),
    }
    for name in info["inputNames"]:
        v = feeds[name]
        LOG.info("  in  %-15s %s %s", name, v.shape, v.dtype)
    outs = module.forward([feeds[n] for n in info["inputNames"]])
    result: np.ndarray | None = None
    for name, out in zip(info["outputNames"], outs, strict=True):
        arr = np.array(out.read(), dtype=np.float32)
        LOG.info("  out %-15s %s finite=%s", name, list(out.shape), bool(np.isfinite(arr).all()))
        if name == "logits":
            result = arr
    if result is None or not np.isfinite(result).all():
        raise SystemExit(f"{model_dir}: logits missing or not finite")
    return result


def run_embedding(model_dir: Path, token_ids: list[int]) -> np.ndarray:
    """Run an embedding model (config.json's ``llm_model``) once; ``sentence_embeddings`` must be [1, hidden]."""
    import MNN.expr as F

    cfg = json.loads((model_dir / "config.json").read_text())
    llm_cfg = json.loads((model_dir / "llm_config.json").read_text())
    hidden = int(llm_cfg["hidden_size"])
    embed = load_embeddings(model_dir, llm_cfg, hidden)
    seq = len(token_ids)
    module, info = load_module(model_dir, cfg["llm_model"], cfg["llm_weight"])
    if "logits_index" in info["inputNames"] or info["outputNames"] != ["sentence_embeddings"]:
        raise SystemExit(f"{model_dir}: not an embedding model: {info['inputNames']} -> {info['outputNames']}")
    # Qwen3-Embedding attends causally and pools the last token; the graph takes a float mask.
    mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), k=1).reshape(1, 1, seq, seq)
    feeds = {
        "input_ids": F.const(embed[np.asarray(token_ids)].reshape(seq, 1, hidden), [seq, 1, hidden], F.NCHW, F.float),
        "attention_mask": F.const(mask, [1, 1, seq, seq], F.NCHW, F.float),
        "position_ids": F.const(np.arange(seq, dtype=np.int32).reshape(1, seq), [1, seq], F.NCHW, F.int),
    }
    (out,) = module.forward([feeds[n] for n in info["inputNames"]])
    result = np.array(out.read(), dtype=np.float32)
    LOG.info(
        "  out sentence_embeddings %s finite=%s norm %.4f",
        list(out.shape),
        bool(np.isfinite(result).all()),
        float(np.linalg.norm(result)),
    )
    if list(out.shape) != [1, hidden] or not np.isfinite(result).all():
        raise SystemExit(f"{model_dir}: sentence_embeddings {list(out.shape)}, expected finite [1, {hidden}]")
    return result


# What llmexport's encoders return per image: one embedding per merged token (with a middle axis of 1),
# and for Qwen3-VL one deepstack feature per deepstack layer (3).
EXPECTED_VISUAL_OUTPUTS = {
    "qwen2.5-vl": lambda tokens, hidden: {"image_embeds": [tokens, 1, hidden]},
    "qwen3-vl": lambda tokens, hidden: {"image_embeds": [tokens, 1, hidden], "deepstack_feature": [3, tokens, hidden]},
}


def encoder_kind(input_names: list[str]) -> str:
    """The encoder family by its inputs, as MNN's runtime tells them apart."""
    if input_names[3:4] == ["window_index"]:
        return "qwen2.5-vl"
    if input_names[3:4] == ["idx_tensor"]:
        return "qwen3-vl"
    raise SystemExit(f"unknown visual encoder inputs {input_names}")


def run_visual(model_dir: Path) -> None:
    """Run ``visual.mnn`` once per check image size; image_embeds must be [merged tokens, hidden] and finite."""
    import MNN.expr as F

    # the encoder's input builders are mnnbuild's (its io stage feeds the same)
    from mnnbuild.model.spec import ImageSize
    from mnnbuild.model.visual import visual_inputs

    llm_cfg = json.loads((model_dir / "llm_config.json").read_text())
    hidden = int(llm_cfg["hidden_size"])
    module, info = load_module(model_dir, "visual.mnn", "visual.mnn.weight")
    kind = encoder_kind(info["inputNames"])
    for size_text in CHECK_IMAGE_SIZES[kind]:
        feeds = visual_inputs(kind, ImageSize.parse(size_text), llm_cfg, seed=0)
        args = []
        for name in info["inputNames"]:
            arr = feeds[name]
            dtype = F.int if arr.dtype == np.int32 else F.float
            args.append(F.const(arr, list(arr.shape), F.NCHW, dtype))
        outs = module.forward(args)
        tokens = feeds["patches"].shape[0] // 4
        expected = EXPECTED_VISUAL_OUTPUTS[kind](tokens, hidden)
        for name, out in zip(info["outputNames"], outs, strict=True):
            arr = np.array(out.read(), dtype=np.float32)
            shape = list(out.shape)
            LOG.info(
                "  %s %-8s %s: %-17s %s finite=%s", kind, size_text, "->", name, shape, bool(np.isfinite(arr).all())
            )
            if shape != expected.get(name) or not np.isfinite(arr).all():
                raise SystemExit(f"{model_dir}: {name} at {size_text} is {shape}, expected finite {expected.get(name)}")


def run_llm(model_dir: Path, prompt: str, max_tokens: int) -> None:
    """Load the dir with MNN.llm; its prefill logits must match the bare module's."""
    import MNN.llm as llm

    model = llm.create(str(model_dir / "config.json"))
    model.set_config(
        {
            "sampler_type": "greedy",
            "max_new_tokens": max_tokens,
            "use_template": False,
            "precision": "high",
            "memory": "high",
        }
    )
    model.load()
    ids = list(model.tokenizer_encode(prompt))
    LOG.info("  MNN.llm tokenizer_encode(%r) = %s", prompt, ids)
    llm_logits = np.array(model.forward(ids).read(), dtype=np.float32).reshape(-1)
    mod_logits = run_module(model_dir, ids).reshape(-1)
    diff = float(np.abs(llm_logits[-mod_logits.size :] - mod_logits).max())
    LOG.info("  MNN.llm forward vs module logits: max abs diff %.3g", diff)
    if diff > 1e-2:
        raise SystemExit(f"{model_dir}: MNN.llm and module logits differ by {diff}")
    model.reset()
    text = model.response(prompt)
    ctx = model.context
    LOG.info("  MNN.llm response -> %r tokens %s (status %s)", text, ctx.output_tokens, ctx.status)
    if ctx.gen_seq_len != max_tokens:
        raise SystemExit(f"{model_dir}: expected {max_tokens} generated tokens, got {ctx.gen_seq_len}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="*", help="model dirs (default: the committed test models)")
    parser.add_argument("--prompt", default="The quick brown fox")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--no-llm", action="store_true", help="skip the MNN.llm load/generate check")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    dirs = [Path(d) for d in args.dirs] or [REPO_ROOT / d for d in DEFAULT_DIRS]
    for model_dir in dirs:
        LOG.info("%s", model_dir)
        if (model_dir / "embedding.mnn").exists():
            run_embedding(model_dir, [10, 200, 300, 400, 500])
            continue
        if (model_dir / "visual.mnn").exists():
            run_visual(model_dir)
        logits = run_module(model_dir, [10, 200, 300, 400, 500])
        LOG.info("  logits argmax %d, range [%.4f, %.4f]", int(logits.argmax()), logits.min(), logits.max())
        if not args.no_llm:
            run_llm(model_dir, args.prompt, args.max_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
