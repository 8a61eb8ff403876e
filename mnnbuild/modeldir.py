"""What an exported MNN LLM directory holds, and checks that it is usable."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mnnbuild.errors import MNNFormatError, ModelDirError
from mnnbuild.layout import LLM_GRAPHS, QNN_DIR, VISUAL_GRAPHS

MODEL_FILE = "llm.mnn"
WEIGHT_FILE = "llm.mnn.weight"
LLM_CONFIG = "llm_config.json"
REQUIRED_FILES = ("config.json", LLM_CONFIG, MODEL_FILE, WEIGHT_FILE)
TOKENIZER_FILES = ("tokenizer.txt", "tokenizer.mtok")
OPTIONAL_FILES = ("embeddings_bf16.bin",)
ALL_FILES = REQUIRED_FILES + TOKENIZER_FILES + OPTIONAL_FILES
VISUAL_FILE = "visual.mnn"
VISUAL_WEIGHT_FILE = "visual.mnn.weight"
VISUAL_FILES = (VISUAL_FILE, VISUAL_WEIGHT_FILE)
"""A vision-language model's encoder (docs/families.md section 3), besides its language model."""
VL_FILES = ALL_FILES + VISUAL_FILES
PartName = Literal["llm", "visual"]


@dataclass(frozen=True)
class ModelPart:
    """One model file of a model dir that the chain partitions on its own: a VL model has two (docs/families.md)."""

    name: PartName
    model_file: str
    weight_file: str
    graph_prefix: str
    """Its plugins' graph and binary name prefix (``graphllm`` / ``graphvisual``)."""

    @property
    def result_model(self) -> str:
        """The partitioned model with Plugin ops, relative to the partition dir and the device model dir."""
        return f"{QNN_DIR}/{self.model_file}"


PARTS: dict[str, ModelPart] = {
    "llm": ModelPart("llm", MODEL_FILE, WEIGHT_FILE, LLM_GRAPHS),
    "visual": ModelPart("visual", VISUAL_FILE, VISUAL_WEIGHT_FILE, VISUAL_GRAPHS),
}

#: The 4th input of ``visual.mnn`` tells the encoder kinds apart, as MNN's runtime does.
ENCODER_MARKERS = {"window_index": "qwen2.5-vl", "idx_tensor": "qwen3-vl"}
#: What run.sh feeds the phone and verify generates from (the bundle's prompt.txt).
DEFAULT_PROMPT = "hello\n"


def read_llm_config(model_dir: Path) -> dict[str, Any]:
    """Parse ``llm_config.json`` and check the fields the chain needs."""
    path = Path(model_dir) / LLM_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelDirError(f"{path}: file missing; an MNN LLM directory must have {LLM_CONFIG}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelDirError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ModelDirError(f"{path}: expected a JSON object, got {type(config).__name__}")
    hidden = config.get("hidden_size")
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden <= 0:
        raise ModelDirError(f"{path}: field 'hidden_size' must be a positive integer, got {hidden!r}")
    mask = config.get("attention_mask")
    if not isinstance(mask, str):
        raise ModelDirError(f"{path}: field 'attention_mask' must be a string such as \"float\", got {mask!r}")
    return config


def tokenizer_file(model_dir: Path) -> str:
    """The tokenizer file name present in ``model_dir`` (``tokenizer.txt`` preferred)."""
    for name in TOKENIZER_FILES:
        if (Path(model_dir) / name).is_file():
            return name
    raise ModelDirError(f"{model_dir}: no tokenizer file; expected one of {', '.join(TOKENIZER_FILES)}")


def present_files(model_dir: Path, files: tuple[str, ...] = ALL_FILES) -> list[str]:
    """The chain's files that exist in ``model_dir``, in canonical order."""
    return [name for name in files if (Path(model_dir) / name).is_file()]


def encoder_kind(model_dir: Path) -> str | None:
    """The encoder kind ``visual.mnn`` declares by its 4th input (None: neither known kind)."""
    from mnnbuild.mnn import load_model  # the large schema module: only when checking

    names = load_model(Path(model_dir) / VISUAL_FILE).input_names
    return ENCODER_MARKERS.get(names[3]) if len(names) > 3 else None


def validate_visual(model_dir: Path, encoder: str, label: str) -> None:
    """Check a VL model's encoder files exist, match each other and are of the spec's ``visual_encoder`` kind."""
    model_dir = Path(model_dir)
    missing = [name for name in VISUAL_FILES if not (model_dir / name).is_file()]
    if missing:
        raise ModelDirError(
            f"{label}: required file {missing[0]} is missing (a family = 'vl' model needs {', '.join(VISUAL_FILES)})"
        )
    try:
        from mnnbuild.mnn import check_weight_ranges, load_model

        check_weight_ranges(load_model(model_dir / VISUAL_FILE), model_dir / VISUAL_WEIGHT_FILE)
        kind = encoder_kind(model_dir)
    except MNNFormatError as exc:
        raise ModelDirError(str(exc)) from None
    if kind != encoder:
        found = f"a {kind} encoder" if kind else f"an encoder of neither kind ({', '.join(ENCODER_MARKERS)} 4th input)"
        raise ModelDirError(
            f"{model_dir / VISUAL_FILE}: spec field 'visual_encoder' is {encoder!r}, but the model holds {found}"
        )


def validate_model_dir(model_dir: Path, where: str | None = None, visual_encoder: str | None = None) -> list[str]:
    """Check a model directory is complete; returns the chain's file names found in it.

    ``where`` describes the directory in errors (e.g. an HF repo and revision); ``visual_encoder`` (a VL model's
    spec) also requires the encoder files and checks their kind.
    """
    model_dir = Path(model_dir)
    label = where or str(model_dir)
    if not model_dir.is_dir():
        raise ModelDirError(f"{label}: model directory does not exist")
    missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]
    if missing:
        raise ModelDirError(f"{label}: required file {missing[0]} is missing (need {', '.join(REQUIRED_FILES)})")
    read_llm_config(model_dir)
    if (model_dir / WEIGHT_FILE).stat().st_size == 0:
        raise ModelDirError(f"{model_dir / WEIGHT_FILE}: weight file is empty")
    # a truncated or foreign llm.mnn, or a weight file of another model, is named here and not met
    # later as an error inside MNN
    try:
        from mnnbuild.mnn import check_weight_ranges, load_model  # the large schema module: only when checking

        check_weight_ranges(load_model(model_dir / MODEL_FILE), model_dir / WEIGHT_FILE)
    except MNNFormatError as exc:
        raise ModelDirError(str(exc)) from None
    try:
        tokenizer_file(model_dir)
    except ModelDirError:
        raise ModelDirError(f"{label}: no tokenizer file; expected one of {', '.join(TOKENIZER_FILES)}") from None
    if visual_encoder is None:
        return present_files(model_dir)
    validate_visual(model_dir, visual_encoder, label)
    return present_files(model_dir, VL_FILES)
