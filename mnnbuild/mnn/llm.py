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


# -- speculative decoding (llmconfig.hpp, speculative_decoding/ of MNN 4d40bdbd) ---------------------------------
SPECULATIVE_TYPE = "speculative_type"
"""The config field that turns speculation on (empty: off)."""
EAGLE = "eagle"
LOOKAHEAD = "lookahead"
SPECULATIVE_TYPES = (EAGLE, LOOKAHEAD)
"""The kinds a bundle can be built for: Eagle3 (a draft model) and lookahead (n-gram drafts, any model)."""
DRAFT_LENGTH_FIELD = "draft_predict_length"
DEFAULT_DRAFT_LENGTH = 3
"""``draft_predict_length``'s engine default: a verify forward holds it + 1 tokens."""
EAGLE_FILE_FIELDS = {"eagle_model": "eagle.mnn", "eagle_fc": "eagle_fc.mnn", "eagle_d2t": "eagle_d2t.mnn"}
"""An Eagle model's draft files: config field -> the engine's default name."""
EAGLE_TREE_DEFAULTS = {"eagle_depth": 3, "eagle_topk": 1}
LOOKAHEAD_DEFAULTS: dict[str, object] = {
    "draft_match_strictness": "low",
    "draft_selection_rule": "freqxlen",
    "ngram_match_maxlen": 4,
    "ngram_update": False,
}
"""lookahead's settings and their engine defaults (``llmconfig.hpp``), written out so the bundle says what it runs."""
LOOKUP_FILE_FIELD = "lookup_file"
DEFAULT_LOOKUP_FILE = "lookup_file.txt"
"""lookahead's optional prior-text file, read when present."""


def eagle_tree_tokens(config: dict) -> int:
    """How many draft tokens an Eagle tree can hold (``tokentree.hpp``): ``topk`` at the first level, then
    ``topk * topk`` per further level of ``eagle_depth``; the engine verifies at most that many."""
    depth = config.get("eagle_depth", EAGLE_TREE_DEFAULTS["eagle_depth"])
    topk = config.get("eagle_topk", EAGLE_TREE_DEFAULTS["eagle_topk"])
    return topk + topk * topk * (depth - 1)


def verify_length(config: dict) -> int | None:
    """The tokens one verify forward of ``config``'s speculation holds (None: no speculation): the sampled token
    plus ``draft_predict_length`` drafts. Eagle runs it through ``Llm::forwardRaw`` unpadded (``treeDecoding``);
    lookahead through ``Llm::forwardVec``, padded to the drafts' full length (``ngram_cache_search``)."""
    if not config.get(SPECULATIVE_TYPE):
        return None
    return int(config.get(DRAFT_LENGTH_FIELD, DEFAULT_DRAFT_LENGTH)) + 1
