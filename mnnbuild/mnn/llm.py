"""MNN's LLM conventions, as its engine (``transformers/llm/engine``) has them: the model directory's file names,
a language model graph's input names, and the causal attention mask it is fed.

The format layer both the build and the runtime import: what MNN names and expects is declared once here.
"""

from __future__ import annotations

import numpy as np

MODEL_CONFIG = "config.json"
"""The model directory's engine config (``llm_model``, ``llm_weight``, ``tokenizer_file``...)."""
DEFAULT_MODEL = "llm.mnn"
DEFAULT_WEIGHT = "llm.mnn.weight"
"""MNN's default graph and weight file when a config names none (llmconfig.hpp ``llm_model``, ``llm_weight``)."""
DEFAULT_TOKENIZER = "tokenizer.txt"
"""MNN's default ``tokenizer_file``."""
DEFAULT_EMBEDDINGS = "embeddings_bf16.bin"
"""MNN's default ``embedding_file``: an untied model's token embeddings, bf16."""

LLM_INPUTS = ("input_ids", "attention_mask", "position_ids", "logits_index")
"""A language model graph's inputs as MNN's engine feeds them, in that order (``input_ids`` holds the embeddings)."""
DEEPSTACK_INPUT = "deepstack_embeds"
"""Qwen3-VL's language model input: visual features added to the first layers' hidden states."""


def causal_mask(seq: int) -> np.ndarray:
    """``attention_mask`` for ``seq`` rows: ``[1,1,seq,seq]`` float, 0 on and below the diagonal, the lowest float
    above it."""
    mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, dtype=np.float32), k=1)
    return mask.reshape(1, 1, seq, seq)
