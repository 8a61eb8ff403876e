"""Run a finished mnnbuild bundle the way the phone does: CPU parts in MNN, QNN plugins in the HTP simulator.

::

    from mnnbuild_runtime import HybridModel, greedy_generate, llm_inputs, load_twins, Embeddings

    with HybridModel("artifacts/tiny-qwen3/v79/bundle/model/tiny-qwen3",
                     binary_overrides=load_twins("artifacts/tiny-qwen3/v79")) as model:
        emb = Embeddings(model.bundle.model_dir)
        logits = model.forward(llm_inputs(emb([1, 2, 3]), seq=model.bundle.chunk_size))["logits"]
        tokens = greedy_generate(model, [1, 2, 3], max_new_tokens=8).tokens
        report = model.report()   # which binary each plugin ran, simulator vs MNN time
"""

from mnnbuild_runtime.bundle import Bundle, OutputDesc, PluginSpec, parse_plugins
from mnnbuild_runtime.chunks import Block, block_sizes, fit_block, prefill_blocks
from mnnbuild_runtime.errors import BinaryCheckError, BundleError, PluginShapeError, RuntimeBundleError
from mnnbuild_runtime.generate import (
    DraftOutcome,
    Embeddings,
    GenerationResult,
    causal_mask,
    cpu_forward_fn,
    cpu_greedy_generate,
    draft_feeds,
    draft_rows,
    follow_draft,
    greedy_generate,
    kv_cache_draft,
    kv_cache_redraft,
    llm_inputs,
    loop_redraft,
    recompute_generate,
)
from mnnbuild_runtime.hashes import FileHashes, KnownHash
from mnnbuild_runtime.hybrid import (
    ForwardResult,
    HybridExecutor,
    HybridModel,
    PluginFn,
    PluginStep,
    Segment,
    StepTiming,
    build_plan,
    plan_steps,
    text_feeds,
)
from mnnbuild_runtime.plugin import BinaryOverride, PluginRunner, check_structure, select_shape_index, shape_index
from mnnbuild_runtime.tokenizer import Tokenizer
from mnnbuild_runtime.twins import Twin, load_twins, read_twins, twin_of

__all__ = [
    "FileHashes",
    "KnownHash",
    "Block",
    "block_sizes",
    "fit_block",
    "prefill_blocks",
    "shape_index",
    "plan_steps",
    "parse_plugins",
    "PluginFn",
    "HybridExecutor",
    "BinaryCheckError",
    "BinaryOverride",
    "Bundle",
    "BundleError",
    "DraftOutcome",
    "Embeddings",
    "ForwardResult",
    "GenerationResult",
    "HybridModel",
    "OutputDesc",
    "PluginRunner",
    "PluginShapeError",
    "PluginSpec",
    "PluginStep",
    "RuntimeBundleError",
    "Segment",
    "StepTiming",
    "Tokenizer",
    "build_plan",
    "causal_mask",
    "check_structure",
    "cpu_forward_fn",
    "cpu_greedy_generate",
    "draft_feeds",
    "draft_rows",
    "follow_draft",
    "greedy_generate",
    "kv_cache_draft",
    "kv_cache_redraft",
    "llm_inputs",
    "loop_redraft",
    "recompute_generate",
    "select_shape_index",
    "text_feeds",
    "Twin",
    "load_twins",
    "read_twins",
    "twin_of",
]
