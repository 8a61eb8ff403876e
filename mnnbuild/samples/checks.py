"""What a model must be for the io stage to make its samples: a float attention mask, prefill lengths and image
sizes within what the model bounds, a verify prompt and forward that fit, an encoder that takes the spec's images;
a norm with epsilon 0 is warned of. Each refusal is one line naming the file and field."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mnnbuild.base.errors import ModelDirError
from mnnbuild.manifests.io import IoInputs, IoParams
from mnnbuild.mnn import MnnModel, input_dtypes
from mnnbuild.mnn.llm import MIXED_ATTENTION, MODEL_CONFIG, attention_window
from mnnbuild.model.modeldir import (
    LLM_CONFIG,
    ModelPart,
)
from mnnbuild.model.spec import VISUAL_ENCODERS, ImageSize
from mnnbuild.model.visual import visual_inputs
from mnnbuild.samples.inputs import Feed

log = logging.getLogger(__name__)


def check_mask(part: ModelPart, model: MnnModel, model_file: Path, config: dict) -> None:
    """The mask the samples carry is float; the graph must take one (and, where MNN's engine builds the mask
    ``llm_config.json`` says, so must that file), in two parts where that file says the engine builds it so."""
    if part.mask_from_llm_config and config["attention_mask"] != "float":
        raise ModelDirError(
            f"{model_file.parent / LLM_CONFIG}: field 'attention_mask' is {config['attention_mask']!r}; "
            'only "float" attention masks are supported'
        )
    declared = input_dtypes(model).get("attention_mask", "DT_FLOAT")
    if declared != "DT_FLOAT":
        raise ModelDirError(
            f"{model_file}: graph input 'attention_mask' is {declared}; only float attention masks are supported"
        )
    dims = model.input_dims.get("attention_mask")
    if part.mask_from_llm_config and attention_window(config) is not None and dims and dims[0] not in (2, -1):
        raise ModelDirError(
            f"{model_file.parent / LLM_CONFIG}: field 'attention_type' is {MIXED_ATTENTION!r}, so MNN's engine feeds "
            f"a two-part mask [2,1,1,seq,kv] (full and sliding), but graph input 'attention_mask' of {model_file} "
            f"is {dims}; expected its first dim 2"
        )


def warn_zero_epsilon(model: MnnModel, model_file: Path) -> None:
    """A norm with epsilon 0 turns an all-zero row into 0/0 (llmexport writes GLM-4's 1.5625e-07 as 0.0): say so
    before verify meets the NaN."""
    zero = [op.name for op in model.ops_of_type("LayerNorm") if op.main is not None and float(op.main.epsilon) == 0.0]
    if zero:
        log.warning(
            "%s: %d LayerNorm ops have epsilon 0 (first %r): an all-zero input row gives 0/0 = NaN; "
            "the exporter dropped the model's epsilon",
            model_file,
            len(zero),
            zero[0],
        )


def check_prompt_fits(inputs: IoInputs, params: IoParams, model_dir: Path) -> None:
    """verify generates from the bundle's prompt inside the longest prefill chunk: refuse a chunk it cannot fit
    now, not after the whole build (imported here: io otherwise does not need the runtime)."""
    from mnnbuild_runtime import BundleError, Tokenizer

    try:
        prompt_tokens = len(Tokenizer(model_dir / MODEL_CONFIG, links=True).encode(params.prompt))
    except BundleError as exc:
        raise ModelDirError(str(exc)) from None
    longest = max(params.chunk_sizes)
    if longest <= prompt_tokens:
        one = len(params.chunk_sizes) == 1
        field = f"'chunk_size' is {longest}" if one else f"'chunk_sizes' is {list(params.chunk_sizes)}"
        raise ModelDirError(
            f"{inputs.model}: spec field {field}, but verify's prompt {params.prompt!r} is {prompt_tokens} "
            f"tokens and generation needs room after it; expected {'chunk_size' if one else 'the longest length'} "
            f">= {prompt_tokens + 1}"
        )


def config_limit(config: dict[str, Any], field: str, config_path: Path) -> int | None:
    limit = config.get(field)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
        raise ModelDirError(f"{config_path}: field {field!r} must be a positive integer, got {limit!r}")
    return limit


def check_model_bounds(params: IoParams, config: dict[str, Any], config_path: Path) -> None:
    """What the model itself bounds (the spec checked mnnbuild's own bounds): no prefill length beyond the positions
    it was trained for (``max_position_embeddings``, which llmexport writes and MNN's engine warns past), no image
    larger than MNN's engine resizes the model's images to (``image_max_pixels``)."""
    positions = config_limit(config, "max_position_embeddings", config_path)
    if positions is not None and params.chunk_sizes and max(params.chunk_sizes) > positions:
        field = "chunk_size" if len(params.chunk_sizes) == 1 else "chunk_sizes"
        raise ModelDirError(
            f"{config_path}: field 'max_position_embeddings' is {positions}: the model has no positions beyond it, "
            f"but spec field {field!r} asks for a prefill length of {max(params.chunk_sizes)}; expected lengths "
            f"<= {positions}"
        )
    pixels = config_limit(config, "image_max_pixels", config_path)
    for text in params.image_sizes:
        size = ImageSize.parse(text)
        if pixels is not None and size.width * size.height > pixels:
            raise ModelDirError(
                f"{config_path}: field 'image_max_pixels' is {pixels}: MNN's engine resizes every image to at most "
                f"that many pixels, so spec field 'image_sizes' entry {text!r} ({size.width * size.height} pixels) "
                "would never run"
            )


def check_verify_length(verify: int, params: IoParams, model_dir: Path) -> None:
    """The verify forward must fit one prefill block (lookahead's goes through the engine's chunking, which asserts
    it): checked here when the length came from the model's config (the spec checks its own)."""
    longest = max(params.chunk_sizes)
    if verify > longest:
        raise ModelDirError(
            f"{model_dir / MODEL_CONFIG}: field 'draft_predict_length' is {verify - 1}: a verify forward of {verify} "
            f"tokens is longer than the longest prefill length {longest}; set spec field draft_predict_length "
            f"<= {longest - 1} or a longer chunk"
        )


def visual_feed(params: IoParams, model: MnnModel, model_file: Path, config: dict[str, Any]) -> Callable[[int], Feed]:
    """A VL encoder's samples, one per image size in spec order, each made when asked for."""
    assert params.visual_encoder is not None
    encoder = VISUAL_ENCODERS[params.visual_encoder]
    expected = list(encoder.input_shapes(ImageSize(width=encoder.alignment, height=encoder.alignment)))
    if list(model.input_names) != expected:
        raise ModelDirError(
            f"{model_file}: inputs {list(model.input_names)}; a {encoder.kind} encoder takes {expected} "
            "(spec field 'visual_encoder')"
        )
    return lambda i: visual_inputs(encoder.kind, ImageSize.parse(params.image_sizes[i]), config, params.seed)
