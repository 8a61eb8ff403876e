"""What an exported MNN LLM directory holds, and checks that it is usable.

A build chain converts one graph of the directory: its :class:`ModelPart` says which file (``config.json``'s
``llm_model`` / ``llm_weight``, as MNN's engine reads them), which inputs it takes and which output it is judged
by. Every stage reads the part the fetch stage recorded instead of assuming ``llm.mnn`` and ``logits``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from mnnbuild.base.errors import MNNFormatError, ModelDirError
from mnnbuild.base.fsutil import read_json_object
from mnnbuild.mnn.llm import (
    DEEPSTACK_INPUT,
    DEFAULT_EMBEDDINGS,
    DEFAULT_MODEL,
    DEFAULT_WEIGHT,
    LLM_INPUTS,
    MODEL_CONFIG,
    attention_window,
)
from mnnbuild.model.spec import DEFAULT_PROMPT as DEFAULT_PROMPT_TEXT
from mnnbuild.model.spec import ChainPart, Family
from mnnbuild.pipeline.layout import LLM_GRAPHS, QNN_DIR, VISUAL_GRAPHS

LLM_CONFIG = "llm_config.json"
TOKENIZER_FILES = ("tokenizer.txt", "tokenizer.mtok")
OPTIONAL_FILES = (DEFAULT_EMBEDDINGS,)
VISUAL_FILE = "visual.mnn"
VISUAL_WEIGHT_FILE = "visual.mnn.weight"
VISUAL_FILES = (VISUAL_FILE, VISUAL_WEIGHT_FILE)
"""A vision-language model's encoder (docs/families.md section 3), besides its language model."""
#: The 4th input of ``visual.mnn`` tells the encoder kinds apart, as MNN's runtime does.
ENCODER_MARKERS = {"window_index": "qwen2.5-vl", "idx_tensor": "qwen3-vl"}
VISUAL_INPUTS = ("patches", "position_ids", "attention_mask", "window_index", "idx_tensor", "weight_tensor")
"""Inputs a visual encoder may take (Qwen2.5-VL: the first four; Qwen3-VL: all but ``window_index``)."""


def prompt_file_text(prompt: str) -> str:
    """The bundle's prompt.txt for a spec's prompt: what run.sh feeds the phone and verify generates from."""
    return f"{prompt}\n"


DEFAULT_PROMPT = prompt_file_text(DEFAULT_PROMPT_TEXT)
#: A file name from config.json: it becomes a path in the artifact tree and on the device, so plain names only.
PLAIN_FILE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"

PartFamily = Literal["llm", "embedding", "visual"]
LLM_PART_INPUTS = (*LLM_INPUTS, DEEPSTACK_INPUT)
"""The inputs a language model graph may take, in the order the io stage writes them: MNN's four (a VL language
model's ``position_ids`` have 3 rows) and Qwen3-VL's ``deepstack_embeds``."""


class ModelPart(BaseModel):
    """The graph of a model dir that one build chain converts (docs/families.md, sections 2 and 4).

    ``family`` fixes what the graph must look like; ``model_file``/``weight_file`` are the model dir's own names
    for it. The fetch stage resolves it (:func:`model_part`) and records it in its manifest.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: PartFamily = "llm"
    model_file: str = DEFAULT_MODEL
    weight_file: str = DEFAULT_WEIGHT

    @field_validator("model_file", "weight_file")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        # a file of the model dir (config.json's llm_model, llm_weight): the chain joins it to the model dir and to
        # its own dirs (qnn/<model_file>), so one read back from a manifest may not lead elsewhere
        if not re.fullmatch(PLAIN_FILE_NAME, name):
            raise ValueError("expected a file name of the model dir (letters, digits, '.', '_', '-')")
        return name

    @property
    def inputs(self) -> tuple[str, ...]:
        """Inputs the graph may take: an embedding model has no ``logits_index`` (it returns one vector)."""
        return {"llm": LLM_PART_INPUTS, "embedding": LLM_INPUTS[:3], "visual": VISUAL_INPUTS}[self.family]

    @property
    def output(self) -> str:
        """The output the family is about: ``logits`` (a text LLM), ``sentence_embeddings`` or ``image_embeds``."""
        return {"llm": "logits", "embedding": "sentence_embeddings", "visual": "image_embeds"}[self.family]

    @property
    def graph_prefix(self) -> str:
        """Its plugins' graph and binary name prefix: ``graphvisual`` for a VL model's encoder, else ``graphllm``
        (upstream's names, so both parts of a VL model share one ``qnn/``)."""
        return VISUAL_GRAPHS if self.family == "visual" else LLM_GRAPHS

    @property
    def generates(self) -> bool:
        """Whether the model generates tokens (verify's greedy generation; the prompt must fit a chunk)."""
        return self.family == "llm"

    @property
    def mask_from_llm_config(self) -> bool:
        """MNN's LLM engine builds the attention mask ``llm_config.json`` says, so the graph must agree with it;
        llmexport writes ``"int"`` there for embedding models whose graph takes a float mask, so an embedding
        model's mask follows the graph's declared input."""
        return self.family == "llm"

    @property
    def result_model(self) -> str:
        """The partitioned model, relative to the partition dir and the device model dir: ``qnn/<model file>``."""
        return f"{QNN_DIR}/{self.model_file}"

    @property
    def shipped_weight_file(self) -> str:
        """Where the partition dir and the bundle keep the weights ``result_model`` reads, relative to each: the part's
        own weight file name (``config_qnn.json``'s ``llm_weight``) for the model's graph; ``qnn/visual.mnn.weight``
        for a VL encoder (MNN's engine loads ``visual_model`` with ``<file>.weight`` beside it)."""
        return f"{self.result_model}.weight" if self.family == "visual" else self.weight_file


FAMILY_FILES: dict[str, tuple[str, str]] = {
    "llm": (DEFAULT_MODEL, DEFAULT_WEIGHT),
    "embedding": ("embedding.mnn", "embedding.mnn.weight"),
    "visual": (VISUAL_FILE, VISUAL_WEIGHT_FILE),
}
"""Each family's graph and weight file when ``config.json`` names none (the names upstream's export uses)."""

VISUAL_PART = ModelPart(family="visual", model_file=VISUAL_FILE, weight_file=VISUAL_WEIGHT_FILE)
"""A VL model's encoder: MNN's engine loads ``visual_model`` (default ``visual.mnn``) with ``<file>.weight``."""


def chain_part(fetched: ModelPart, chain: ChainPart) -> ModelPart:
    """The part a chain builds: the fetched graph, or a VL model's encoder."""
    return VISUAL_PART if chain == "visual" else fetched


def family_files(family: PartFamily) -> tuple[str, ...]:
    """The files fetch takes for ``family`` (an HF download asks for these only), in canonical order."""
    model, weight = FAMILY_FILES[family]
    return (MODEL_CONFIG, LLM_CONFIG, model, weight, *TOKENIZER_FILES, *OPTIONAL_FILES)


ALL_FILES = family_files("llm")


def _read_json_object(path: Path, what: str) -> dict[str, Any]:
    return read_json_object(
        path, ModelDirError, missing=f"file missing; an MNN LLM directory must have {what}", invalid="not valid JSON"
    )


def read_model_config(model_dir: Path) -> dict[str, Any]:
    """Parse the model dir's ``config.json`` (MNN's LLM config: a JSON object)."""
    return _read_json_object(Path(model_dir) / MODEL_CONFIG, MODEL_CONFIG)


def model_part(model_dir: Path, family: PartFamily) -> ModelPart:
    """The part ``config.json`` names (``llm_model``, ``llm_weight``; the family's file names when absent)."""
    path = Path(model_dir) / MODEL_CONFIG
    config = read_model_config(model_dir)
    names: dict[str, str] = {}
    for field in ("llm_model", "llm_weight"):
        # without llm_weight: the model's own <file>.weight, as upstream's export names it (the bundle's
        # config_qnn.json then says so whenever it is not MNN's default)
        default = FAMILY_FILES[family][0] if field == "llm_model" else f"{names['llm_model']}.weight"
        name = config.get(field, default)
        if not isinstance(name, str) or not re.fullmatch(PLAIN_FILE_NAME, name):
            raise ModelDirError(
                f"{path}: field {field!r} must name a file in the model directory (letters, digits, '.', '_', '-'), "
                f"got {name!r}"
            )
        names[field] = name
    return ModelPart(family=family, model_file=names["llm_model"], weight_file=names["llm_weight"])


def check_part_graph(part: ModelPart, inputs: list[str], outputs: list[str], model_path: Path) -> None:
    """Refuse a graph that is not of the part's family: an embedding spec on an LLM (``logits_index``, no
    ``sentence_embeddings``) would build a bundle MNN's embedding engine cannot load."""
    if part.family == "llm":
        return  # the io stage names any input an LLM does not take
    extra = [n for n in inputs if n not in part.inputs]
    if extra:
        raise ModelDirError(
            f"{model_path}: graph input {extra[0]!r} is not an {part.family} model's (spec field 'family' is "
            f"{part.family!r}); expected inputs among {', '.join(part.inputs)}"
        )
    if part.output not in outputs:
        raise ModelDirError(
            f"{model_path}: graph has no output {part.output!r} (outputs {outputs}), which spec field 'family' = "
            f"{part.family!r} needs"
        )


def read_llm_config(model_dir: Path) -> dict[str, Any]:
    """Parse ``llm_config.json`` and check the fields the chain needs."""
    path = Path(model_dir) / LLM_CONFIG
    config = _read_json_object(path, LLM_CONFIG)
    hidden = config.get("hidden_size")
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden <= 0:
        raise ModelDirError(f"{path}: field 'hidden_size' must be a positive integer, got {hidden!r}")
    mask = config.get("attention_mask")
    if not isinstance(mask, str):
        raise ModelDirError(f"{path}: field 'attention_mask' must be a string such as \"float\", got {mask!r}")
    for field, (kind, check) in LLM_CONFIG_FIELDS.items():
        if field in config and not check(config[field]):
            raise ModelDirError(f"{path}: field {field!r} must be {kind}, got {config[field]!r}")
    try:
        attention_window(config)
    except ValueError as exc:
        raise ModelDirError(f"{path}: {exc}") from None
    return config


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


LLM_CONFIG_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    **{
        field: ("true or false", lambda v: isinstance(v, bool))
        for field in ("is_visual", "is_embedding", "is_audio", "has_talker", "has_deepstack", "is_mrope")
    },
    **{
        field: ("a positive integer", _positive_int)
        for field in ("layer_nums", "max_position_embeddings", "image_max_pixels", "image_min_pixels", "mrope_axes")
    },
    "attn_scale": (
        "a finite number",
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    ),  # fmt: skip
    "attention_type": ('a string such as "full"', lambda v: isinstance(v, str)),
    "key_value_shape": ("a list of positive integers", lambda v: isinstance(v, list) and all(map(_positive_int, v))),
}
"""``llm_config.json`` fields MNN's engine reads (``llmconfig.hpp``) beyond those the chain checks itself: the file
ships in the bundle as it is, and the engine takes a value of another type for its default or stops."""


LAYER_OP_TYPES = frozenset({"Attention", "LinearAttention"})
"""The op kinds one per layer: full attention with its KV cache, and the linear-attention family's state."""


def check_layer_nums(llm_config: dict[str, Any], model: Any, path: Path, model_file: str) -> None:
    """``layer_nums`` sizes MNN's per-layer state bookkeeping (one per layer): it must be the graph's count of
    Attention ops and of ``LinearAttention`` ops (a hybrid model's state-carrying layers, e.g. LFM2's short convs)."""
    layers = sum(op.type in LAYER_OP_TYPES for op in model.ops)
    if "layer_nums" in llm_config and layers and llm_config["layer_nums"] != layers:
        raise ModelDirError(
            f"{path}: field 'layer_nums' is {llm_config['layer_nums']}, but {model_file} has {layers} layers "
            f"(Attention and LinearAttention ops); expected layer_nums = {layers}"
        )


def tokenizer_file(model_dir: Path) -> str:
    """The tokenizer file name present in ``model_dir`` (``tokenizer.txt`` preferred)."""
    for name in TOKENIZER_FILES:
        if (Path(model_dir) / name).is_file():
            return name
    raise ModelDirError(f"{model_dir}: no tokenizer file; expected one of {', '.join(TOKENIZER_FILES)}")


def present_files(model_dir: Path, part: ModelPart | None = None) -> list[str]:
    """The chain's files that exist in ``model_dir`` (the part's graph and weights included), in canonical order."""
    part = part or ModelPart()
    names = (MODEL_CONFIG, LLM_CONFIG, part.model_file, part.weight_file, *TOKENIZER_FILES, *OPTIONAL_FILES)
    return [name for name in dict.fromkeys(names) if (Path(model_dir) / name).is_file()]


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


FAMILY_NAMES: dict[str, str] = {"llm": "a text LLM", "vl": "a vision-language model", "embedding": "an embedding model"}
EMBEDDING_OUTPUT = "sentence_embeddings"
OMNI_FIELDS = ("is_audio", "has_talker")
"""``llm_config.json`` fields that make MNN's engine load an audio encoder or a speech talker (``Llm::createLLM``)."""


def model_family(llm_config: dict[str, Any], model_file: str, outputs: list[str]) -> tuple[Family, str]:
    """The spec family the model's own files say it is, and the evidence, as MNN's engine decides: ``is_visual``
    in ``llm_config.json`` makes it load the visual encoder (``Llm::createLLM``); an embedding engine loads a graph
    with the output ``sentence_embeddings`` (``embedding.cpp``), which upstream's export script also takes
    ``is_embedding`` as a sign of."""
    if llm_config.get("is_visual") is True:
        return "vl", f"{LLM_CONFIG} field 'is_visual' is true"
    if EMBEDDING_OUTPUT in outputs:
        return "embedding", f"{model_file} outputs {EMBEDDING_OUTPUT!r}"
    if llm_config.get("is_embedding") is True:
        return "embedding", f"{LLM_CONFIG} field 'is_embedding' is true"
    return "llm", f"{model_file} outputs {outputs[:2]} and {LLM_CONFIG} has no 'is_visual': true"


def family_mismatch(model_dir: Path, label: str, found: Family, why: str, asked: Family) -> ModelDirError:
    """The one line saying which family the model is and the spec field to set."""
    setting = f"family = {found!r}"
    if found == "vl":
        kind = encoder_kind(model_dir) if (model_dir / VISUAL_FILE).is_file() else None
        setting += f", visual_encoder = {kind!r}" if kind else ", visual_encoder"
        setting += " and image_sizes"
    return ModelDirError(
        f"{label}: {why}: the model is {FAMILY_NAMES[found]}, but its spec says family = {asked!r}; set spec "
        f"field {setting}"
    )


def check_hidden_size(llm_config: dict[str, Any], model: Any, model_dir: Path, model_file: str) -> None:
    """``llm_config.json``'s ``hidden_size`` sizes every sample's embeddings: it must be the width of the graph's
    ``input_ids`` (the embeddings MNN's engine feeds), or MNN fails deep inside the graph."""
    dims = model.input_dims.get("input_ids") or []
    width = dims[-1] if dims else 0
    if width > 0 and llm_config["hidden_size"] != width:
        raise ModelDirError(
            f"{model_dir / LLM_CONFIG}: field 'hidden_size' is {llm_config['hidden_size']}, but {model_file} takes "
            f"input_ids of width {width} (its hidden size); expected hidden_size = {width}"
        )


def validate_model_dir(
    model_dir: Path, where: str | None = None, family: PartFamily = "llm", visual_encoder: str | None = None
) -> tuple[ModelPart, list[str]]:
    """Check a model directory is complete and its graph is of ``family``; returns the part and the chain's file
    names found in it.

    ``where`` describes the directory in errors (e.g. an HF repo and revision); ``visual_encoder`` (a VL model's
    spec) also requires the encoder files and checks their kind.
    """
    model_dir = Path(model_dir)
    label = where or str(model_dir)
    if not model_dir.is_dir():
        raise ModelDirError(f"{label}: model directory does not exist")
    configs = (MODEL_CONFIG, LLM_CONFIG)
    if (model_dir / MODEL_CONFIG).is_file():
        part = model_part(model_dir, family)
    else:  # named missing below, with the family's own file names
        part = ModelPart(family=family, model_file=FAMILY_FILES[family][0], weight_file=FAMILY_FILES[family][1])
    required = (*configs, part.model_file, part.weight_file)
    missing = [name for name in required if not (model_dir / name).is_file()]
    asked: Family = "vl" if visual_encoder is not None else family
    if part.model_file in missing:  # another family's graph in its place says which family the model is
        for other, (graph, _) in FAMILY_FILES.items():
            if other in ("llm", "embedding") and other != family and (model_dir / graph).is_file():
                found: Family = "embedding" if other == "embedding" else "llm"
                why = f"it holds {graph}, not {part.model_file}"
                raise family_mismatch(model_dir, label, found, why, asked)
    if missing:
        raise ModelDirError(f"{label}: required file {missing[0]} is missing (need {', '.join(required)})")
    llm_config = read_llm_config(model_dir)
    if (model_dir / part.weight_file).stat().st_size == 0:
        raise ModelDirError(f"{model_dir / part.weight_file}: weight file is empty")
    # a truncated or foreign graph, or a weight file of another model, is named here and not met
    # later as an error inside MNN
    try:
        from mnnbuild.mnn import (  # the schema: only here
            WeightFile,
            check_conv_scales,
            check_weight_ranges,
            load_model,
            tie_embeddings,
        )

        model = load_model(model_dir / part.model_file)
        check_weight_ranges(model, model_dir / part.weight_file)
        check_conv_scales(model, model_dir / part.weight_file)
        tie = tie_embeddings(llm_config, model_dir / LLM_CONFIG)
        tied = tie.weight_range() if tie is not None else None
        if tied is not None:  # MNN's engine reads the embeddings there (the partition keeps them for the bundle)
            with WeightFile(model_dir / part.weight_file) as weights:
                weights.read(tied.offset, tied.size, tied.reader)
    except MNNFormatError as exc:
        raise ModelDirError(str(exc)) from None
    omni = [field for field in OMNI_FIELDS if llm_config.get(field) is True]
    if omni:
        raise ModelDirError(
            f"{label}: {LLM_CONFIG} field {omni[0]!r} is true: MNN's engine runs it as an omni model (audio in or "
            "out), which no spec family builds; expected a text LLM, a vision-language or an embedding model"
        )
    found, why = model_family(llm_config, part.model_file, list(model.output_names))
    if found != asked:
        raise family_mismatch(model_dir, label, found, why, asked)
    check_part_graph(part, model.input_names, list(model.output_names), model_dir / part.model_file)
    check_hidden_size(llm_config, model, model_dir, part.model_file)
    check_layer_nums(llm_config, model, model_dir / LLM_CONFIG, part.model_file)
    try:
        tokenizer = tokenizer_file(model_dir)
    except ModelDirError:
        raise ModelDirError(f"{label}: no tokenizer file; expected one of {', '.join(TOKENIZER_FILES)}") from None
    try:  # MNN's engine crashes on a tokenizer it cannot read (SIGSEGV, nothing printed)
        from mnnbuild.mnn import embedding_info
        from mnnbuild.mnn.tokenizer import check_tokenizer

        tokens = check_tokenizer(model_dir / tokenizer)
        rows = embedding_info(model_dir)
    except MNNFormatError as exc:
        raise ModelDirError(str(exc)) from None
    if tokens.largest_id >= rows.vocab:  # the engine would read an embedding row past the table
        raise ModelDirError(
            f"{model_dir / tokenizer}: gives token ids up to {tokens.largest_id}, but the model's embeddings "
            f"({rows.path.name}) have {rows.vocab} rows; expected this model's tokenizer"
        )
    files = present_files(model_dir, part)
    if visual_encoder is None:
        return part, files
    validate_visual(model_dir, visual_encoder, label)
    return part, [*files, *VISUAL_FILES]
