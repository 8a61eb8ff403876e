"""What an exported MNN LLM directory holds, and checks that it is usable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mnnbuild.errors import MNNFormatError, ModelDirError

MODEL_FILE = "llm.mnn"
WEIGHT_FILE = "llm.mnn.weight"
LLM_CONFIG = "llm_config.json"
REQUIRED_FILES = ("config.json", LLM_CONFIG, MODEL_FILE, WEIGHT_FILE)
TOKENIZER_FILES = ("tokenizer.txt", "tokenizer.mtok")
OPTIONAL_FILES = ("embeddings_bf16.bin",)
ALL_FILES = REQUIRED_FILES + TOKENIZER_FILES + OPTIONAL_FILES
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


def present_files(model_dir: Path) -> list[str]:
    """The chain's files that exist in ``model_dir``, in canonical order."""
    return [name for name in ALL_FILES if (Path(model_dir) / name).is_file()]


def validate_model_dir(model_dir: Path, where: str | None = None) -> list[str]:
    """Check a model directory is complete; returns the chain's file names found in it.

    ``where`` describes the directory in errors (e.g. an HF repo and revision).
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
    return present_files(model_dir)
