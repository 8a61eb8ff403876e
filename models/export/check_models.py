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


def merge_order(grid_h: int, grid_w: int, merge: int) -> np.ndarray:
    """Row-major patch (i, j) -> its row in the encoder input, where each merge x merge block is contiguous."""
    i, j = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    return ((i // merge) * (merge * grid_w) + (j // merge) * merge * merge + (i % merge) * merge + (j % merge)).ravel()


def patch_positions(grid_h: int, grid_w: int, merge: int) -> np.ndarray:
    """``position_ids`` [2, seq]: each patch's (row, column), in merge-block order."""
    positions = np.zeros((2, grid_h * grid_w), np.int32)
    order = merge_order(grid_h, grid_w, merge)
    i, j = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    positions[0, order] = i.ravel()
    positions[1, order] = j.ravel()
    return positions


def windows(grid_h: int, grid_w: int, merge: int, window: int) -> tuple[np.ndarray, list[int]]:
    """Qwen2.5-VL window attention: merged tokens regrouped window by window, and each window's token count."""
    rows, cols = grid_h // merge, grid_w // merge
    index: list[int] = []
    counts: list[int] = []
    for top in range(0, rows, window):
        for left in range(0, cols, window):
            members = [
                r * cols + c for r in range(top, min(top + window, rows)) for c in range(left, min(left + window, cols))
            ]
            index += members
            counts.append(len(members))
    return np.asarray(index, np.int32), counts


def bilinear_corners(grid_h: int, grid_w: int, merge: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-VL: the 4 learned position embeddings (of a side x side table) around each patch, and their weights."""
    ys = np.linspace(0, side - 1, grid_h, dtype=np.float32)
    xs = np.linspace(0, side - 1, grid_w, dtype=np.float32)
    y0, x0 = ys.astype(np.int32), xs.astype(np.int32)
    y1, x1 = np.minimum(y0 + 1, side - 1), np.minimum(x0 + 1, side - 1)
    dy, dx = (ys - y0)[:, None], (xs - x0)[None, :]
    idx = np.stack([y0[:, None] * side + x0, y0[:, None] * side + x1, y1[:, None] * side + x0, y1[:, None] * side + x1])
    weight = np.stack([(1 - dy) * (1 - dx), (1 - dy) * dx, dy * (1 - dx), dy * dx])
    order = merge_order(grid_h, grid_w, merge)
    idx_out = np.zeros((4, grid_h * grid_w), np.int32)
    weight_out = np.zeros((4, grid_h * grid_w), np.float32)
    idx_out[:, order] = np.broadcast_to(idx, (4, grid_h, grid_w)).reshape(4, -1)
    weight_out[:, order] = weight.reshape(4, -1)
    return idx_out, weight_out


def visual_inputs(kind: str, size_text: str, llm_cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """Encoder inputs for one image size, shaped by mnnbuild's spec (``VisualEncoder.input_shapes``)."""
    from mnnbuild.spec import VISUAL_ENCODERS, ImageSize

    encoder = VISUAL_ENCODERS[kind]
    size = ImageSize.parse(size_text)
    shapes = encoder.input_shapes(size)
    grid_h, grid_w = size.grid(encoder)
    rng = np.random.default_rng(seed)
    feeds = {
        "patches": rng.standard_normal(shapes["patches"]).astype(np.float32),
        "position_ids": patch_positions(grid_h, grid_w, encoder.merge_size),
    }
    if kind == "qwen2.5-vl":
        index, counts = windows(grid_h, grid_w, encoder.merge_size, window=4)
        mask = np.zeros(shapes["attention_mask"], np.float32)
        mask[1] = np.finfo(np.float32).min
        start = 0
        for count in counts:  # patches attend within their window only (in window order)
            end = start + count * encoder.merge_size**2
            mask[1, 0, start:end, start:end] = 0
            start = end
        feeds["attention_mask"] = mask
        feeds["window_index"] = index
    else:
        feeds["attention_mask"] = np.zeros(shapes["attention_mask"], np.float32)
        side = int(llm_cfg.get("num_grid_per_side", 0)) or int(round(np.sqrt(llm_cfg["num_position_embeddings"])))
        feeds["idx_tensor"], feeds["weight_tensor"] = bilinear_corners(grid_h, grid_w, encoder.merge_size, side)
    for name, shape in shapes.items():
        if list(feeds[name].shape) != shape:
            raise SystemExit(f"{kind} {size_text}: {name} built as {list(feeds[name].shape)}, expected {shape}")
    return feeds


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

    llm_cfg = json.loads((model_dir / "llm_config.json").read_text())
    hidden = int(llm_cfg["hidden_size"])
    module, info = load_module(model_dir, "visual.mnn", "visual.mnn.weight")
    kind = encoder_kind(info["inputNames"])
    for size_text in CHECK_IMAGE_SIZES[kind]:
        feeds = visual_inputs(kind, size_text, llm_cfg, seed=0)
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
