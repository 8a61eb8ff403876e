#!/usr/bin/env python3
"""Build the committed random-weight MNN test models with PyPI ``llmexport``.

Each model is a tiny Hugging Face model (config + random weights drawn with a fixed
seed + a byte-level BPE tokenizer trained here on text generated here) that is written
to a temporary directory and exported by llmexport into an MNN LLM directory. Only the
files the mnnbuild chain needs are copied to the destination.

Fully offline: nothing is downloaded (HF_HUB_OFFLINE=1). Needs the ``export`` extra
(``pip install -e '.[export]'``). This is a maintenance tool: it is never run by CI or tests.

The MNN conversion inside llmexport normally goes through ``MNN.tools.mnnconvert``,
whose logger runs ``pip install aliyun-log-python-sdk`` and sends usage telemetry.
This script avoids that by handing llmexport a ``--mnnconvert`` executable that calls
the converter core ``_tools.mnnconvert`` directly (see README.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import transformers
    from tokenizers import Tokenizer

from publish import PublishError, check_replaceable, staged_model_dir  # noqa: E402  (this script's dir)

LOG = logging.getLogger("make_models")

SCRIPT_DIR = Path(__file__).resolve().parent
REPO_ROOT = SCRIPT_DIR.parent.parent

DEFAULT_SEED = 20251129

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
# Vision-language models also need the image placeholder tokens (appended after training, so the
# text tokenizer's ids and merges stay those of the text models).
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# Qwen2/Qwen3 pre-tokenizer split pattern (same as the released Qwen tokenizer.json).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Files copied from llmexport's output directory (if present).
KEEP_FILES = (
    "config.json",
    "llm_config.json",
    "llm.mnn",
    "llm.mnn.weight",
    "tokenizer.txt",
    "tokenizer.mtok",
    "embeddings_bf16.bin",
    "visual.mnn",
    "visual.mnn.weight",
    "embedding.mnn",
    "embedding.mnn.weight",
    # an Eagle3 draft (llmexport --eagle_path): its decoder layer + lm_head, the fc over the target's taps, d2t
    "eagle.mnn",
    "eagle.mnn.weight",
    "eagle_fc.mnn",
    "eagle_fc.mnn.weight",
    "eagle_d2t.mnn",
)
EAGLE_FILES = ("eagle.mnn", "eagle_fc.mnn", "eagle_d2t.mnn")

BASE_TEXT = """\
MNN is a lightweight deep learning inference engine. It runs large language models on
phones, laptops and embedded boards. A model is exported from PyTorch, converted to the
MNN format and quantized to four or eight bits. The weights are stored in blocks; every
block has a scale and a zero point. The runtime loads the graph, maps the weights and
runs the attention layers with a key value cache.
Qualcomm chips have a Hexagon tensor processor. The QNN library composes graphs, prepares
them for a target and serializes a context binary. The build system splits the model into
sub graphs, compiles each one and writes a bundle that the phone can load.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.
User: What is the capital of France? Assistant: The capital of France is Paris.
User: Write a short poem about the sea. Assistant: The sea is wide, the sea is blue,
it sings all night and morning too.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2048 3.14 2.718 -1 +7 1e-5.
Code: def add(a, b):\n    return a + b\nfor i in range(10):\n    print(i)\n
Symbols: ( ) [ ] { } < > = + - * / % & | ^ ~ ! ? , . ; : ' " @ # $ _ \\
Unicode: café, naïve, über, señor, 你好世界, こんにちは, привет, 😀.
"""

WORDS = """
the a an and or but if then else when while for to of in on at by with from into over under
model layer tensor graph weight bias scale zero point block quant int4 int8 float half bf16
token vocab merge byte pair encoding decode encode prompt reply chat user assistant system
hidden size head heads key value query cache attention rotary embedding norm residual mlp
gate up down projection linear convolution matrix vector shape reshape concat slice gather
phone laptop chip processor memory cache bandwidth latency throughput battery power speed
build compile prepare serialize load run test check verify bundle context binary library
small tiny large random seed export convert runtime engine backend kernel operator network
apple river mountain city house garden window table chair book paper music story light
red green blue yellow black white bright dark warm cold fast slow early late new old good
run walk jump read write speak listen think learn teach open close start stop make take
one two three four five six seven eight nine ten hundred thousand first second last next
""".split()


@dataclass(frozen=True)
class VisionTower:
    """The tiny vision encoder of a VL test model (HF vision config + llmexport's visual quantization)."""

    kind: str  # "qwen2.5-vl" or "qwen3-vl" (mnnbuild's spec field visual_encoder)
    hidden_size: int
    depth: int
    num_heads: int
    intermediate_size: int
    quant_bit: int
    quant_block: int


@dataclass(frozen=True)
class ModelSpec:
    """One test model: HF architecture, dimensions and llmexport quantization."""

    name: str
    dest: str  # relative to the repository root
    arch: str  # "qwen3" or "llama"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_embeddings: bool
    quant_bit: int
    quant_block: int  # 0 = channel-wise
    symmetric: bool
    purpose: str
    family: str = "llm"  # "llm", "vl" or "embedding" (mnnbuild's spec field family)
    vision: VisionTower | None = None
    mrope_section: tuple[int, ...] = ()  # vl only: rotary pairs per (t, h, w) axis, sums to head_dim / 2
    vocab_size: int | None = None  # model vocabulary; None = the tokenizer's (the extra rows are never produced)


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="tiny-qwen3",
        dest="models/tiny-qwen3",
        arch="qwen3",
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=256,
        tie_embeddings=True,
        quant_bit=4,
        quant_block=64,
        symmetric=False,
        purpose="main end-to-end test model (Qwen3, tied embeddings, int4 block 64 asymmetric)",
    ),
    ModelSpec(
        name="qwen3-untied-int8-b32",
        dest="tests/fixtures/models/qwen3-untied-int8-b32",
        arch="qwen3",
        hidden_size=96,
        num_layers=3,
        num_heads=4,
        num_kv_heads=1,
        head_dim=24,
        intermediate_size=192,
        tie_embeddings=False,
        quant_bit=8,
        quant_block=32,
        symmetric=False,
        purpose="untied embeddings (embeddings_bf16.bin), int8 block 32, MQA (1 KV head), 3 layers",
    ),
    ModelSpec(
        name="llama-int4-cw",
        dest="tests/fixtures/models/llama-int4-cw",
        arch="llama",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=4,
        head_dim=16,
        intermediate_size=160,
        tie_embeddings=False,
        quant_bit=4,
        quant_block=0,
        symmetric=True,
        purpose="Llama architecture (no q/k norm), int4 channel-wise symmetric, MHA",
    ),
    ModelSpec(
        name="qwen2.5-vl-tiny",
        dest="tests/fixtures/models/qwen2.5-vl-tiny",
        arch="qwen2.5-vl",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        tie_embeddings=True,
        quant_bit=4,
        quant_block=64,
        symmetric=False,
        purpose="Qwen2.5-VL: M-RoPE llm.mnn (position_ids [3, seq]) + visual.mnn with window attention",
        family="vl",
        vision=VisionTower(
            kind="qwen2.5-vl", hidden_size=32, depth=2, num_heads=2, intermediate_size=64, quant_bit=8, quant_block=32
        ),
        mrope_section=(2, 3, 3),
    ),
    ModelSpec(
        name="qwen3-vl-tiny",
        dest="tests/fixtures/models/qwen3-vl-tiny",
        arch="qwen3-vl",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        tie_embeddings=True,
        quant_bit=4,
        quant_block=64,
        symmetric=False,
        purpose="Qwen3-VL: M-RoPE llm.mnn with deepstack_embeds + visual.mnn (interpolated position embeddings)",
        family="vl",
        vision=VisionTower(
            kind="qwen3-vl", hidden_size=32, depth=3, num_heads=2, intermediate_size=64, quant_bit=8, quant_block=32
        ),
        mrope_section=(4, 2, 2),
    ),
    ModelSpec(
        name="qwen3-embedding-tiny",
        dest="tests/fixtures/models/qwen3-embedding-tiny",
        arch="qwen3",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        tie_embeddings=False,
        quant_bit=4,
        quant_block=64,
        symmetric=False,
        purpose="Qwen3-Embedding: embedding.mnn, output sentence_embeddings (last token, final norm)",
        family="embedding",
    ),
)

# llmexport picks its embedding exporter by the model path (bge, gte, Qwen3-Embedding), so the HF dir is named so.
EMBEDDING_HF_DIR = "Qwen3-Embedding-tiny"
VL_ROPE_THETA = 10000.0
VISION_QKV_GAIN = 8.0
# MNN vs HF (quant-dequant) encoder outputs, relative to the output's range. Measured: Qwen3-VL <= 0.1%;
# Qwen2.5-VL ~1% even at 56x56 (one window, so not the windowing), cause not found (see README.md).
VISUAL_TOLERANCE = {"qwen2.5-vl": 1.5e-2, "qwen3-vl": 2e-3}


@dataclasses.dataclass(frozen=True)
class Qwen3Shape:
    """A released Qwen3 model's text dimensions (from its Hugging Face config.json)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_embeddings: bool
    vocab_size: int = 151936


QWEN3_SHAPES = {
    "qwen3-1.7b": Qwen3Shape(2048, 28, 16, 8, 128, 6144, tie_embeddings=True),
    "qwen3-4b": Qwen3Shape(2560, 36, 32, 8, 128, 9728, tie_embeddings=True),
    "qwen3-8b": Qwen3Shape(4096, 36, 32, 8, 128, 12288, tie_embeddings=False),
}
"""The benchmark shapes (issue 44): real dims, random weights, ``num_layers`` of them exported on demand."""
DEFAULT_SHAPE = "qwen3-1.7b"


def qwen3_spec(shape: str, num_layers: int) -> ModelSpec:
    """``shape``'s real dimensions with ``num_layers`` of its layers (benchmark model, never committed);
    int4 block 64 asymmetric, as llmexport exports it by default."""
    dims = QWEN3_SHAPES[shape]
    if not 1 <= num_layers <= dims.num_layers:
        raise ValueError(f"{shape}: num_layers {num_layers}, expected 1..{dims.num_layers}")
    tied = "tied" if dims.tie_embeddings else "untied"
    return ModelSpec(
        name=f"{shape}-L{num_layers}",
        dest="",  # given with --out
        arch="qwen3",
        hidden_size=dims.hidden_size,
        num_layers=num_layers,
        num_heads=dims.num_heads,
        num_kv_heads=dims.num_kv_heads,
        head_dim=dims.head_dim,
        intermediate_size=dims.intermediate_size,
        tie_embeddings=dims.tie_embeddings,
        quant_bit=4,
        quant_block=64,
        symmetric=False,
        purpose=f"real-size benchmark model: {shape} dims, {tied} embeddings, int4 block 64 asymmetric",
        vocab_size=dims.vocab_size,
    )


def qwen3_1_7b_spec(num_layers: int) -> ModelSpec:
    """Qwen3-1.7B's real dimensions with ``num_layers`` of its 28 layers (benchmark model, never committed)."""
    return qwen3_spec("qwen3-1.7b", num_layers)


def build_corpus(seed: int) -> list[str]:
    """Deterministic training text for the tokenizer: fixed prose plus generated sentences."""
    rng = random.Random(seed)
    lines = BASE_TEXT.splitlines()
    for _ in range(3000):
        n = rng.randint(4, 14)
        words = [rng.choice(WORDS) for _ in range(n)]
        words[0] = words[0].capitalize()
        sentence = " ".join(words) + rng.choice([".", ".", ".", "?", "!", ",", ":"])
        if rng.random() < 0.2:
            sentence += f" {rng.randint(0, 9999)}"
        lines.append(sentence)
    return lines


def train_tokenizer(seed: int, vocab_size: int) -> Tokenizer:
    """Train a Qwen2-style byte-level BPE tokenizer (``tokenizers.Tokenizer``) on the text made from ``seed``."""
    return bpe_tokenizer(build_corpus(seed), vocab_size)


def bpe_tokenizer(lines: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a Qwen2-style byte-level BPE tokenizer (``tokenizers.Tokenizer``) on ``lines``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path) -> int:
    """Save ``tok`` as a Qwen2 fast tokenizer with a chat template; return its vocab size."""
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        model_max_length=4096,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out_dir)
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return len(hf_tok)


def build_hf_model(spec: ModelSpec, seed: int, vocab_size: int, out_dir: Path) -> None:
    """Create the random-weight HF model for ``spec`` and save it (fp32 safetensors)."""
    import torch

    config, model_cls = hf_config(spec, vocab_size)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    with torch.no_grad():
        # RMSNorm weights are initialised to exactly 1; perturb them so a wrong norm weight shows.
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.1)
            # With HF's init (std 0.02) the encoder's attention is nearly uniform, so its output hardly
            # depends on position_ids, masks or windows; sharper attention makes a wrong input layout show.
            if spec.vision is not None and ".visual.blocks." in f".{name}" and name.endswith("attn.qkv.weight"):
                param.mul_(VISION_QKV_GAIN)
    model.save_pretrained(out_dir, safe_serialization=True)
    if spec.arch == "qwen2.5-vl":
        add_legacy_text_fields(spec, out_dir)


def hf_config(spec: ModelSpec, vocab_size: int) -> tuple[transformers.PretrainedConfig, type]:
    """The HF config and model class of ``spec`` with a vocabulary of ``vocab_size``."""
    import transformers

    tok_ids = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    common = {
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": spec.tie_embeddings,
        "bos_token_id": tok_ids[ENDOFTEXT],
        "eos_token_id": tok_ids[IM_END],
        # No pad_token_id: HF would zero that embedding row, giving all-zero quant blocks (scale 0).
        "pad_token_id": None,
        "initializer_range": 0.02,
        "rope_theta": 1000000.0 if spec.arch == "qwen3" else 500000.0,
    }
    config: transformers.PretrainedConfig
    if spec.arch == "qwen3":
        config = transformers.Qwen3Config(**common, attention_bias=False, use_sliding_window=False)
        model_cls: type = transformers.Qwen3ForCausalLM
    elif spec.arch == "llama":
        config = transformers.LlamaConfig(**common, attention_bias=False, mlp_bias=False)
        model_cls = transformers.LlamaForCausalLM
    elif spec.arch in ("qwen2.5-vl", "qwen3-vl"):
        config, model_cls = vl_config(spec, common, vocab_size)
    else:
        raise ValueError(f"unknown arch {spec.arch!r}")
    return config, model_cls


def vl_config(spec: ModelSpec, common: dict, vocab_size: int) -> tuple[transformers.PretrainedConfig, type]:
    """HF config and class of a tiny Qwen2.5-VL / Qwen3-VL: the text model of ``common`` plus a tiny vision tower."""
    import transformers

    vision = spec.vision
    if vision is None or sum(spec.mrope_section) * 2 != spec.head_dim:
        raise ValueError(f"{spec.name}: a VL model needs a vision tower and mrope_section summing to head_dim / 2")
    first_vision_id = vocab_size - len(VISION_TOKENS)
    token_ids = {
        "vision_start_token_id": first_vision_id,
        "vision_end_token_id": first_vision_id + 1,
        "image_token_id": first_vision_id + 2,
        "video_token_id": first_vision_id + 3,
    }
    text = {k: v for k, v in common.items() if k not in ("rope_theta", "tie_word_embeddings")}
    # llmexport 0.0.5 finds no rope_theta in a transformers 5 VL config and uses 1e4: match it.
    rope = {"rope_type": "default", "rope_theta": VL_ROPE_THETA, "mrope_section": list(spec.mrope_section)}
    tower = {
        "depth": vision.depth,
        "hidden_size": vision.hidden_size,
        "intermediate_size": vision.intermediate_size,
        "num_heads": vision.num_heads,
        "out_hidden_size": spec.hidden_size,
        "initializer_range": 0.02,
    }
    if spec.arch == "qwen2.5-vl":
        # Qwen2.5-VL derives head_dim from hidden_size / heads; llmexport reads it from the config, so it stays.
        config = transformers.Qwen2_5_VLConfig(
            text_config={**text, "rope_parameters": rope},
            # Windows of 112 px = 4 merged tokens; the last block attends to the whole image.
            vision_config={**tower, "patch_size": 14, "window_size": 112, "fullatt_block_indexes": [vision.depth - 1]},
            tie_word_embeddings=spec.tie_embeddings,
            **token_ids,
        )
        return config, transformers.Qwen2_5_VLForConditionalGeneration
    config = transformers.Qwen3VLConfig(
        text_config={**text, "rope_parameters": {**rope, "mrope_interleaved": True}},
        # 8 x 8 learned position embeddings, interpolated to each grid; a deepstack feature from every block.
        vision_config={
            **tower,
            "patch_size": 16,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": list(range(vision.depth)),
        },
        tie_word_embeddings=spec.tie_embeddings,
        **token_ids,
    )
    return config, transformers.Qwen3VLForConditionalGeneration


def add_legacy_text_fields(spec: ModelSpec, hf_dir: Path) -> None:
    """Repeat a Qwen2.5-VL's text settings at the top level of config.json, as the released checkpoints do.

    llmexport 0.0.5 reads Qwen2.5-VL's sizes and M-RoPE sections from there; transformers 5 writes them only
    under ``text_config`` (and ignores the top-level copies when loading).
    """
    path = hf_dir / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    text = config["text_config"]
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "head_dim"):
        config[key] = text[key]
    config["max_position_embeddings"] = text["max_position_embeddings"]
    config["rope_theta"] = VL_ROPE_THETA
    config["rope_scaling"] = {"type": "mrope", "mrope_section": list(spec.mrope_section)}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def with_vision_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """A copy of the text tokenizer with the VL placeholder tokens appended as special tokens."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.add_special_tokens(VISION_TOKENS)
    return copy


def llmexport_dir() -> Path:
    """Folder of the installed llmexport package (its ``llmexport.py`` imports ``utils.*``)."""
    import importlib.util

    spec = importlib.util.find_spec("llmexport")
    if spec is None or spec.origin is None:
        raise SystemExit("llmexport is not installed: pip install -e '.[export]'")
    return Path(spec.origin).resolve().parent


def write_mnnconvert_shim(work: Path) -> Path:
    """Executable that runs MNN's converter core without ``MNN.tools`` (no telemetry logger)."""
    shim = work / "mnnconvert-nolog"
    code = "import sys, _tools; _tools.mnnconvert(sys.argv)"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(code)} "$@"\n', encoding="utf-8")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return shim


def run_llmexport(
    spec: ModelSpec, hf_dir: Path, out_dir: Path, work: Path, shim: Path, eagle_dir: Path | None = None
) -> None:
    """Run ``python llmexport.py ... --export mnn`` in ``work`` (it writes .export.log to cwd); with ``eagle_dir``
    also export that Eagle3 draft (``--eagle_path``)."""
    exp_dir = llmexport_dir()
    cmd = [
        sys.executable,
        str(exp_dir / "llmexport.py"),
        "--path",
        str(hf_dir),
        "--export",
        "mnn",
        "--dst_path",
        str(out_dir),
        "--quant_bit",
        str(spec.quant_bit),
        "--quant_block",
        str(spec.quant_block),
        "--mnnconvert",
        str(shim),
    ]
    if spec.symmetric:
        cmd.append("--sym")
    if eagle_dir is not None:
        cmd += ["--eagle_path", str(eagle_dir)]
    if spec.vision is not None:
        cmd += ["--visual_quant_bit", str(spec.vision.quant_bit), "--visual_quant_block", str(spec.vision.quant_block)]
    if any(ch.isspace() or ch in "'\"$`\\;&|<>*?" for ch in str(work) + str(eagle_dir or "")):
        # llmexport runs the converter through os.popen(" ".join(args)) without quoting.
        raise SystemExit(f"temporary dir {work} must not contain spaces or shell characters (set TMPDIR)")
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(exp_dir), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1",
        }
    )
    LOG.info("running: %s", " ".join(cmd))
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, check=False)
    log_file = work / ".export.log"
    if proc.returncode != 0 or not (out_dir / "llm.mnn").exists():
        LOG.error("llmexport stdout:\n%s", proc.stdout)
        LOG.error("llmexport stderr:\n%s", proc.stderr)
        if log_file.exists():
            LOG.error("converter log:\n%s", log_file.read_text(errors="replace"))
        raise SystemExit(f"llmexport failed for {spec.name} (exit {proc.returncode})")
    LOG.debug("llmexport stdout:\n%s", proc.stdout)


def check_export(spec: ModelSpec, out_dir: Path, eagle: bool = False) -> None:
    """Sanity checks on llmexport's output before copying (``eagle``: exported with an Eagle3 draft)."""
    llm_cfg = json.loads((out_dir / "llm_config.json").read_text(encoding="utf-8"))
    if eagle:
        config = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
        if config.get("speculative_type") != "eagle" or config.get("hidden_states") is not True:
            raise SystemExit(f"{spec.name}: config.json lacks speculative_type eagle / hidden_states true")
        missing = [name for name in EAGLE_FILES if not (out_dir / name).exists()]
        if missing:
            raise SystemExit(f"{spec.name}: llmexport --eagle_path wrote no {', '.join(missing)}")
    if llm_cfg.get("hidden_size") != spec.hidden_size:
        raise SystemExit(f"{spec.name}: llm_config hidden_size {llm_cfg.get('hidden_size')}")
    # llmexport labels an embedding model's mask "int" although its graph takes a float mask (docs/families.md).
    if llm_cfg.get("attention_mask") != ("int" if spec.family == "embedding" else "float"):
        raise SystemExit(f"{spec.name}: llm_config attention_mask {llm_cfg.get('attention_mask')}")
    has_embed = (out_dir / "embeddings_bf16.bin").exists()
    if has_embed == spec.tie_embeddings:
        raise SystemExit(f"{spec.name}: tie={spec.tie_embeddings} but embeddings_bf16.bin={has_embed}")
    if spec.tie_embeddings and "tie_embeddings" not in llm_cfg:
        raise SystemExit(f"{spec.name}: tied model without tie_embeddings in llm_config.json")


def pin_model_uuid(spec: ModelSpec, seed: int, mnn_path: Path, part: str = "") -> None:
    """Replace the random ``Net.mnn_uuid`` MNNConvert writes with one derived from name and seed.

    The UUID is the only byte difference between two exports with the same seed; it is a
    36-character string, so it is swapped in place without touching the flatbuffer layout.
    """
    import MNN  # top-level package only; never MNN.tools

    old = MNN.get_model_uuid(str(mnn_path)).encode("ascii")
    key = f"mnnbuild-test-model:{spec.name}:{seed}" + (f":{part}" if part else "")
    new = str(uuid.uuid5(uuid.NAMESPACE_URL, key)).encode("ascii")
    data = mnn_path.read_bytes()
    if len(old) != len(new) or data.count(old) != 1:
        raise SystemExit(f"{spec.name}: cannot pin mnn_uuid {old!r} in {mnn_path}")
    mnn_path.write_bytes(data.replace(old, new))
    if MNN.get_model_uuid(str(mnn_path)) != new.decode("ascii"):
        raise SystemExit(f"{spec.name}: mnn_uuid not pinned")


def adapt_family_outputs(spec: ModelSpec, seed: int, out_dir: Path) -> None:
    """Family-specific fixes to llmexport's output: pin the encoder's UUID; name an embedding model as MNN's tools do.

    llmexport 0.0.5 writes an embedding model as ``llm.mnn``; MNN's NPU export script and ``generateLlmIO``
    look for ``embedding.mnn`` (+ ``.weight``), so the files are renamed and config.json points at them.
    """
    if spec.family == "vl":
        pin_model_uuid(spec, seed, out_dir / "visual.mnn", part="visual")
    if spec.family != "embedding":
        return
    (out_dir / "llm.mnn").rename(out_dir / "embedding.mnn")
    (out_dir / "llm.mnn.weight").rename(out_dir / "embedding.mnn.weight")
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["llm_model"] = "embedding.mnn"
    config["llm_weight"] = "embedding.mnn.weight"
    config_path.write_text(json.dumps(config, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")


def quant_dequant(weight: torch.Tensor, bits: int, block: int, symmetric: bool) -> torch.Tensor:
    """What llmexport stores for a Linear weight, dequantized back to float."""
    import torch

    oc, ic = weight.shape
    bs = ic if block == 0 else block
    while ic % bs:
        bs //= 2
    x = weight.reshape(oc, ic // bs, bs)
    offset = 1 << (bits - 1)
    cmax = offset - 1
    if symmetric:
        scale = x.abs().amax(-1, keepdim=True) / cmax
        q = torch.clamp(torch.round(x / scale.clamp_min(1e-30)), -cmax, cmax)
        deq = q * scale
    else:
        cmin = -offset
        mx = x.amax(-1, keepdim=True)
        mn = x.amin(-1, keepdim=True)
        scale = (mx - mn) / (cmax - cmin)
        q = torch.clamp(torch.round((x - mn) / scale.clamp_min(1e-30)) + cmin, cmin, cmax)
        deq = (q - cmin) * scale + mn
    return deq.reshape(oc, ic)


VERIFY_STRINGS = (
    "The quick brown fox",
    "Hello, world! 1234 café 你好 😀\n\n  x",
    "def add(a, b):\n    return a + b",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
)
VERIFY_IDS = (10, 200, 300, 400, 500, 600, 700)


def verify_export(spec: ModelSpec, hf_dir: Path, out_dir: Path) -> None:
    """Check the export against the HF model it came from.

    1. MNN's tokenizer (``tokenizer.mtok``) encodes like the HF tokenizer.
    2. MNN's prefill logits equal the HF model's with every Linear weight quantized and
       dequantized the way llmexport stores it (and untied embeddings rounded to bf16).
    """
    import MNN.llm
    import numpy as np
    import torch
    import transformers

    if str(SCRIPT_DIR) not in sys.path:
        sys.path.insert(0, str(SCRIPT_DIR))
    from check_models import run_module

    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    mnn_llm = MNN.llm.create(str(out_dir / "config.json"))
    mnn_llm.load()
    for text in VERIFY_STRINGS:
        want = hf_tok.encode(text, add_special_tokens=False)
        got = list(mnn_llm.tokenizer_encode(text))
        if want != got:
            raise SystemExit(f"{spec.name}: tokenizer mismatch on {text!r}: HF {want} MNN {got}")
    del mnn_llm

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    ids = list(VERIFY_IDS)
    with torch.no_grad():
        fp32 = model(torch.tensor([ids])).logits[0, -1].numpy()
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(quant_dequant(module.weight, spec.quant_bit, spec.quant_block, spec.symmetric))
        if not spec.tie_embeddings:
            emb = model.get_input_embeddings().weight
            emb.copy_(emb.bfloat16().float())
        ref = model(torch.tensor([ids])).logits[0, -1].numpy()
    got = run_module(out_dir, ids).reshape(-1)
    diff = float(np.abs(ref - got).max())
    corr = float(np.corrcoef(fp32, got)[0, 1])
    LOG.info(
        "%s: MNN vs HF(quant-dequant) max abs diff %.3g; corr with fp32 HF %.4f (quantization error)",
        spec.name,
        diff,
        corr,
    )
    if diff > 1e-3:
        raise SystemExit(f"{spec.name}: MNN logits differ from the quant-dequant HF reference by {diff}")


def quant_dequant_linears(
    module: torch.nn.Module, bits: int, block: int, symmetric: bool, by_mnnconvert: bool = False
) -> None:
    """Replace every Linear (and patch-embedding Conv3d) weight under ``module`` by what the export stores for it.

    ``by_mnnconvert``: the weights were quantized by MNNConvert (llmexport's encoders), which uses a block only
    when it divides the input size and is a multiple of 16, and is channel-wise otherwise.
    """
    import torch

    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, (torch.nn.Linear, torch.nn.Conv3d)):
                # A Conv3d patch embedding is a Linear over flattened patches, quantized the same way.
                flat = sub.weight.reshape(sub.weight.shape[0], -1)
                layer_block = block
                if by_mnnconvert and (flat.shape[1] % block or block % 16):
                    layer_block = 0
                sub.weight.copy_(quant_dequant(flat, bits, layer_block, symmetric).reshape(sub.weight.shape))


def verify_vl_export(spec: ModelSpec, hf_dir: Path, out_dir: Path) -> None:
    """Check a VL export against its HF model: text logits of llm.mnn and the encoder's outputs per image size.

    The encoder inputs are built by check_models.py from mnnbuild's per-size shapes (docs/families.md); HF
    computes its own positions, windows and interpolation from the grid, so equal outputs mean our inputs
    are laid out the way the model expects.
    """
    import MNN.expr as F
    import numpy as np
    import torch
    import transformers

    if str(SCRIPT_DIR) not in sys.path:
        sys.path.insert(0, str(SCRIPT_DIR))
    from check_models import CHECK_IMAGE_SIZES, load_module, run_module, visual_inputs

    from mnnbuild.model.spec import VISUAL_ENCODERS, ImageSize

    if spec.vision is None:
        raise SystemExit(f"{spec.name}: a VL model without a vision tower")
    model_cls = {"qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration", "qwen3-vl": "Qwen3VLForConditionalGeneration"}
    model = getattr(transformers, model_cls[spec.arch]).from_pretrained(hf_dir).eval()
    visual = model.model.visual
    quant_dequant_linears(model.model.language_model, spec.quant_bit, spec.quant_block, spec.symmetric)
    quant_dequant_linears(model.lm_head, spec.quant_bit, spec.quant_block, spec.symmetric)
    quant_dequant_linears(visual, spec.vision.quant_bit, spec.vision.quant_block, False, by_mnnconvert=True)

    ids = list(VERIFY_IDS)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0, -1].numpy()
    got = run_module(out_dir, ids).reshape(-1)
    diff = float(np.abs(ref - got).max())
    LOG.info("%s: llm.mnn vs HF(quant-dequant) text logits max abs diff %.3g", spec.name, diff)
    if diff > 1e-3:
        raise SystemExit(f"{spec.name}: llm.mnn logits differ from the quant-dequant HF reference by {diff}")

    llm_cfg = json.loads((out_dir / "llm_config.json").read_text(encoding="utf-8"))
    module, info = load_module(out_dir, "visual.mnn", "visual.mnn.weight")
    for size_text in CHECK_IMAGE_SIZES[spec.vision.kind]:
        feeds = visual_inputs(spec.vision.kind, size_text, llm_cfg, seed=1)
        grid = torch.tensor([[1, *ImageSize.parse(size_text).grid(VISUAL_ENCODERS[spec.vision.kind])]])
        with torch.no_grad():
            out = visual(torch.from_numpy(feeds["patches"]), grid_thw=grid)
        refs = {"image_embeds": out.pooler_output.numpy()}
        if spec.vision.kind == "qwen3-vl":
            refs["deepstack_feature"] = torch.stack(list(out.deepstack_features)).numpy()
        args = [
            F.const(feeds[n], list(feeds[n].shape), F.NCHW, F.int if feeds[n].dtype == np.int32 else F.float)
            for n in info["inputNames"]
        ]
        for name, var in zip(info["outputNames"], module.forward(args), strict=True):
            mnn_out = np.array(var.read(), dtype=np.float32).reshape(refs[name].shape)
            scale = float(np.abs(refs[name]).max())
            vdiff = float(np.abs(mnn_out - refs[name]).max())
            LOG.info(
                "%s: visual %s %s vs HF(quant-dequant) max abs diff %.3g (max |ref| %.3g)",
                spec.name,
                size_text,
                name,
                vdiff,
                scale,
            )
            if vdiff > VISUAL_TOLERANCE[spec.vision.kind] * scale:
                raise SystemExit(f"{spec.name}: visual.mnn {name} at {size_text} differs from HF by {vdiff}")
        # The check only means something if a wrong layout is caught: swap each patch's row and column.
        swapped = dict(feeds, position_ids=np.ascontiguousarray(feeds["position_ids"][::-1]))
        wrong = module.forward(
            [
                F.const(swapped[n], list(swapped[n].shape), F.NCHW, F.int if swapped[n].dtype == np.int32 else F.float)
                for n in info["inputNames"]
            ]
        )[0]
        wdiff = float(
            np.abs(np.array(wrong.read(), np.float32).reshape(refs["image_embeds"].shape) - refs["image_embeds"]).max()
        )
        LOG.info("%s: visual %s with row/column swapped: max abs diff %.3g", spec.name, size_text, wdiff)
        if wdiff < 2 * VISUAL_TOLERANCE[spec.vision.kind] * float(np.abs(refs["image_embeds"]).max()):
            raise SystemExit(f"{spec.name}: visual.mnn output hardly depends on position_ids ({wdiff})")


def verify_embedding_export(spec: ModelSpec, hf_dir: Path, out_dir: Path) -> None:
    """Check an embedding export: MNN's sentence_embeddings equal the HF model's final-norm last-token state."""
    import numpy as np
    import torch
    import transformers

    if str(SCRIPT_DIR) not in sys.path:
        sys.path.insert(0, str(SCRIPT_DIR))
    from check_models import run_embedding

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    quant_dequant_linears(model.model, spec.quant_bit, spec.quant_block, spec.symmetric)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb.copy_(emb.bfloat16().float())
    ids = list(VERIFY_IDS)
    with torch.no_grad():
        ref = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1].numpy()
    got = run_embedding(out_dir, ids).reshape(-1)
    diff = float(np.abs(ref - got).max())
    cos = float(np.dot(ref, got) / (np.linalg.norm(ref) * np.linalg.norm(got)))
    LOG.info("%s: sentence_embeddings vs HF(quant-dequant) max abs diff %.3g, cosine %.6f", spec.name, diff, cos)
    if diff > 1e-3:
        raise SystemExit(f"{spec.name}: sentence_embeddings differ from the quant-dequant HF reference by {diff}")


def copy_outputs(out_dir: Path, dest: Path, extra: Sequence[str] = ()) -> None:
    """Replace ``dest``'s model files with the kept files (and the ``extra`` ones) from ``out_dir``."""
    dest.mkdir(parents=True, exist_ok=True)
    names = (*KEEP_FILES, *extra)
    for name in names:
        stale = dest / name
        if stale.exists():
            stale.unlink()
    for name in names:
        src = out_dir / name
        if src.exists():
            shutil.copyfile(src, dest / name)
            LOG.info("  %-22s %9d bytes", name, (dest / name).stat().st_size)


def publish_outputs(out_dir: Path, dest: Path, extra: Sequence[str] = ()) -> None:
    """Copy the kept files (and the ``extra`` ones) into a fresh dir beside ``dest`` and rename it into place
    (replacing ``dest``, if it is a model directory: `publish.staged_model_dir`)."""
    with staged_model_dir(dest) as staging:
        copy_outputs(out_dir, staging, extra)


def make_model(
    spec: ModelSpec, seed: int, tokenizer: Tokenizer, keep_tmp: bool, verify: bool, out: Path | None = None
) -> None:
    """Build, export and copy one model (to ``out`` as a whole new dir if given, else to its repo dir)."""
    dest = out if out is not None else REPO_ROOT / spec.dest
    if out is not None:
        check_replaceable(out)  # before minutes of export, not after
    work = Path(tempfile.mkdtemp(prefix=f"mnnbuild-{spec.name}-"))
    try:
        hf_dir = work / (EMBEDDING_HF_DIR if spec.family == "embedding" else "hf")
        hf_dir.mkdir()
        vocab_size = max(
            save_tokenizer(with_vision_tokens(tokenizer) if spec.vision else tokenizer, hf_dir), spec.vocab_size or 0
        )
        build_hf_model(spec, seed, vocab_size, hf_dir)
        out_dir = export_hf_model(spec, seed, hf_dir, work, verify)
        LOG.info("%s -> %s", spec.name, dest)
        if out is not None:
            publish_outputs(out_dir, dest)
        else:
            copy_outputs(out_dir, dest)
    finally:
        if keep_tmp:
            LOG.info("kept temporary dir %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def make_repeated(
    spec: ModelSpec, shape: str, layers: int, seed: int, tokenizer: Tokenizer, args: argparse.Namespace, out: Path
) -> None:
    """``spec`` (K layers of ``shape``) exported beside ``out``, then ``out`` made from it with ``layers`` layers by
    `repeat_layers.repeat_dir` (the K-layer export removed after)."""
    if str(SCRIPT_DIR) not in sys.path:
        sys.path.insert(0, str(SCRIPT_DIR))
    import repeat_layers

    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        make_model(spec, seed, tokenizer, args.keep_tmp, not args.no_verify, out=scratch / spec.name)
        made = {
            "tool": "models/export/make_models.py",
            "shape": shape,
            "exported_layers": spec.num_layers,
            "seed": seed,
            "verified_against_hf": not args.no_verify,
            "purpose": spec.purpose,
        }
        repeat_layers.repeat_dir(scratch / spec.name, out, layers, made=made)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def export_hf_model(
    spec: ModelSpec, seed: int, hf_dir: Path, work: Path, verify: bool, eagle_dir: Path | None = None
) -> Path:
    """Export the HF model in ``hf_dir`` (with the Eagle3 draft in ``eagle_dir`` if given) with llmexport into
    ``work/mnn`` (UUIDs pinned, checked against the HF model unless not ``verify``) and return that dir."""
    out_dir = work / "mnn"
    shim = write_mnnconvert_shim(work)
    run_llmexport(spec, hf_dir, out_dir, work, shim, eagle_dir)
    check_export(spec, out_dir, eagle=eagle_dir is not None)
    pin_model_uuid(spec, seed, out_dir / "llm.mnn")
    if eagle_dir is not None:
        pin_model_uuid(spec, seed, out_dir / "eagle.mnn", part="eagle")
        pin_model_uuid(spec, seed, out_dir / "eagle_fc.mnn", part="eagle_fc")
    adapt_family_outputs(spec, seed, out_dir)
    if verify and spec.family == "vl":
        verify_vl_export(spec, hf_dir, out_dir)
    elif verify and spec.family == "embedding":
        verify_embedding_export(spec, hf_dir, out_dir)
    elif verify:
        verify_export(spec, hf_dir, out_dir)
    return out_dir


def parse_export_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser``'s arguments plus the options every export script takes (``--no-verify``, ``--keep-tmp``,
    ``-v``); logging set up and Hugging Face kept offline for the run."""
    parser.add_argument("--no-verify", action="store_true", help="skip the tokenizer/logits check against the HF model")
    parser.add_argument("--keep-tmp", action="store_true", help="keep the temporary HF/export dirs")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (llmexport output)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed for tokenizer text and weights")
    parser.add_argument("--vocab-size", type=int, default=1024, help="BPE vocabulary size (incl. specials)")
    parser.add_argument("--only", action="append", choices=[m.name for m in MODELS], help="build only these models")
    parser.add_argument(
        "--family", action="append", choices=["llm", "vl", "embedding"], help="build only models of these families"
    )
    parser.add_argument(
        "--qwen3-1.7b-layers",
        dest="qwen3_layers",
        type=int,
        metavar="N",
        help="instead of the test models: a Qwen3-1.7B-shaped (or --shape) model (real dims) with N layers, into --out",
    )
    parser.add_argument(
        "--shape",
        choices=sorted(QWEN3_SHAPES),
        default=DEFAULT_SHAPE,
        help=f"the real dims --qwen3-1.7b-layers exports (default {DEFAULT_SHAPE})",
    )
    parser.add_argument(
        "--out", type=Path, help="output dir for --qwen3-1.7b-layers or one --only model (replaced as a whole)"
    )
    parser.add_argument(
        "--repeat-from",
        type=int,
        metavar="K",
        help="with --qwen3-1.7b-layers N: export only K layers (2 or more) and make the N-layer model by repeating "
        "exported layers 1..K-1 (repeat_layers.py; for shapes whose whole export does not fit the machine)",
    )
    parser.add_argument(
        "--symmetric",
        action="store_true",
        help="symmetric int4/int8 codes (llmexport --sym) instead of the model's own setting; needs --out",
    )
    args = parse_export_args(parser, argv)

    if args.qwen3_layers is not None:
        most = QWEN3_SHAPES[args.shape].num_layers
        if not 1 <= args.qwen3_layers <= most:
            parser.error(f"--qwen3-1.7b-layers: expected 1..{most} ({args.shape} has {most} layers)")
        if args.out is None or args.only:
            parser.error("--qwen3-1.7b-layers needs --out DIR and excludes --only")
    elif args.out is not None and not (args.only and len(args.only) == 1):
        parser.error("--out is for --qwen3-1.7b-layers or one --only model")
    if args.repeat_from is not None and (args.qwen3_layers is None or not 2 <= args.repeat_from <= args.qwen3_layers):
        parser.error("--repeat-from K needs --qwen3-1.7b-layers N with 2 <= K <= N")
    if args.symmetric and args.out is None:
        parser.error("--symmetric needs --out DIR (the shipped models stay as they are)")

    try:
        return make_models(args)
    except PublishError as exc:
        raise SystemExit(f"make_models: {exc}") from None


def make_models(args: argparse.Namespace) -> int:
    """The models ``args`` asks for, each exported and published."""
    tokenizer = train_tokenizer(args.seed, args.vocab_size)
    if args.qwen3_layers is not None:
        exported = args.repeat_from or args.qwen3_layers
        spec = qwen3_spec(args.shape, exported)
        spec = dataclasses.replace(spec, symmetric=True) if args.symmetric else spec
        if args.repeat_from is None:
            make_model(spec, args.seed, tokenizer, args.keep_tmp, not args.no_verify, out=args.out.resolve())
            return 0
        make_repeated(spec, args.shape, args.qwen3_layers, args.seed, tokenizer, args, args.out.resolve())
        return 0
    for spec in MODELS:
        if args.only and spec.name not in args.only:
            continue
        if args.family and spec.family not in args.family:
            continue
        spec = dataclasses.replace(spec, symmetric=True) if args.symmetric else spec
        make_model(spec, args.seed, tokenizer, args.keep_tmp, not args.no_verify, out=args.out and args.out.resolve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
