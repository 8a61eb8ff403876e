"""Model specs: one TOML file per model, parsed into a pydantic model.

A spec says where the MNN LLM comes from (a local directory or a Hugging Face repo),
the prefill length(s) and which NPU targets to build. Specs are found in the
project's ``models/`` directory and in every directory of ``MNNBUILD_MODELS_PATH``.

A spec also names the model family (docs/families.md): a text LLM (``llm.mnn``), a
vision-language model (``llm.mnn`` with M-RoPE plus a ``visual.mnn`` encoder compiled for
each listed image size) or an embedding model (``embedding.mnn``).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mnnbuild.base.errors import SpecError, field_problem
from mnnbuild.mnn.llm import MAX_DRAFT_LENGTH
from mnnbuild.model.npu_weights import DEFAULT_NPU_WEIGHTS, NpuWeights
from mnnbuild.model.targets import Soc, known_archs, soc_for_arch
from mnnbuild.pipeline.models import Models

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
MAX_NAME_LENGTH = 100
"""A spec's name is a path component (``<artifact root>/<name>/``) and part of task names and of the temp names
written next to it; a file system takes 255 bytes per component. 100 holds every Hugging Face repo name (96)."""
#: The model's directory name on the device (a local dir's or HF repo's name): it reaches shell scripts.
DEVICE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"

DEFAULT_CHUNK = 128
MAX_CHUNK = 4096
"""mnnbuild's ceiling on one prefill length (docs/guarantees.md "Bounded requests"); the model's
``max_position_embeddings`` and the spec's ``max_kv_size`` may bound it lower."""
MAX_PREFILL_LENGTHS = 12
"""At most this many prefill lengths (each is one more graph in every plugin's context binary). MNN's engine pads a
prompt's remainder up to the smallest length holding it, so the 12 powers of two from 2 to 4096 already keep that
padding below the remainder itself; more lengths buy less than they cost."""
MAX_IMAGE_SIZES = MAX_PREFILL_LENGTHS
"""At most this many image sizes: each is one more graph in every encoder plugin's binary, like a prefill length."""
QNN_MAX_TENSOR_BYTES = (1 << 32) - 1
"""The most bytes one QNN graph input or output can hold: ``Qnn_ClientBuffer_t.dataSize`` is a ``uint32_t``."""
DEFAULT_MAX_PLUGIN_PARAMETERS = 200_000_000
"""QNN holds ~16 bytes per weight while it serializes a context: 200M bounds a context build's memory and splits
Qwen3-1.7B's (and 4B's) lm_head in two, no layer (50M at 1.7B); the measured peaks are in docs/benchmarks.md."""

IMAGE_SIZE_PATTERN = r"^([0-9]+)x([0-9]+)$"

DEFAULT_PROMPT = "hello"
"""verify's generation prompt where a spec names none; the bundle ships the prompt as ``prompt.txt`` (what run.sh
feeds the phone)."""

Family = Literal["llm", "vl", "embedding"]
Speculative = Literal["eagle", "lookahead", "off"]
"""mnnbuild's ceiling on ``draft_predict_length``: the verify graph is one more graph of that many + 1 tokens in
every plugin; a longer draft is accepted whole too rarely to pay for it."""
VisualEncoderKind = Literal["qwen2.5-vl", "qwen3-vl"]
ChainPart = Literal["llm", "visual"]
"""Which chain of a model a part stage builds: the model's own graph (``llm``: a text LLM, a VL model's language
model or an embedding model, as fetch recorded it) or a VL model's encoder (``visual``:
`mnnbuild.model.modeldir.VISUAL_PART`)."""
VISUAL: ChainPart = "visual"


def chain_parts(family: str) -> tuple[ChainPart, ...]:
    """The chains a model of spec family ``family`` is built in, each with its own io, partition and modellib: the
    language model (``llm``) and, for a VL model, its encoder (``visual``)."""
    return ("llm", VISUAL) if family == "vl" else ("llm",)


class VisualEncoder(BaseModel):
    """How a vision tower turns an image into patches (the facts upstream's export hard-codes per model)."""

    model_config = ConfigDict(frozen=True)

    kind: VisualEncoderKind
    patch_size: int  # pixels per patch side
    merge_size: int  # patches per merged token side (the patch merger)
    patch_dim: int  # floats per patch row: channels * temporal patch * patch_size**2
    max_pixels: int  # MNN's engine resizes every image to at most this many pixels (omni.cpp, image_max_pixels)

    @property
    def alignment(self) -> int:
        """Image sides must be multiples of this (one merged token)."""
        return self.patch_size * self.merge_size

    def input_shapes(self, size: ImageSize) -> dict[str, list[int]]:
        """The encoder graph's inputs for one aligned image size, in the order ``visual.mnn`` takes them."""
        seq = size.patch_count(self)
        shapes = {"patches": [seq, self.patch_dim], "position_ids": [2, seq]}
        if self.kind == "qwen2.5-vl":
            # A full and a windowed mask; the window permutation works on merged tokens (merge_size**2 patches).
            shapes["attention_mask"] = [2, 1, seq, seq]
            shapes["window_index"] = [seq // self.merge_size**2]
        else:
            # Learned position embeddings are interpolated bilinearly: 4 corner indices and weights per patch.
            shapes["attention_mask"] = [1, seq, seq]
            shapes["idx_tensor"] = [4, seq]
            shapes["weight_tensor"] = [4, seq]
        return shapes


VISUAL_ENCODERS: dict[str, VisualEncoder] = {
    "qwen2.5-vl": VisualEncoder(
        kind="qwen2.5-vl", patch_size=14, merge_size=2, patch_dim=3 * 2 * 14 * 14, max_pixels=12_845_056
    ),
    "qwen3-vl": VisualEncoder(
        kind="qwen3-vl", patch_size=16, merge_size=2, patch_dim=3 * 2 * 16 * 16, max_pixels=16_777_216
    ),
}


def largest_input(shapes: dict[str, list[int]]) -> tuple[str, int]:
    """The graph input with the most bytes (every input of these graphs is 4-byte float or int32), and its bytes."""
    sizes = {name: 4 * math.prod(dims) for name, dims in shapes.items()}
    name = max(sizes, key=lambda n: sizes[n])
    return name, sizes[name]


class ImageSize(BaseModel):
    """One image size the visual encoder is compiled for, written ``"<width>x<height>"`` as upstream does."""

    model_config = ConfigDict(frozen=True)

    width: int
    height: int

    @classmethod
    def parse(cls, text: str) -> ImageSize:
        match = re.fullmatch(IMAGE_SIZE_PATTERN, text)
        if match is None:
            raise ValueError(f"image size {text!r} is not '<width>x<height>', e.g. '448x448'")
        return cls(width=int(match.group(1)), height=int(match.group(2)))

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"

    def grid(self, encoder: VisualEncoder) -> tuple[int, int]:
        """Patches along (height, width); the size must already be aligned."""
        return self.height // encoder.patch_size, self.width // encoder.patch_size

    def patch_count(self, encoder: VisualEncoder) -> int:
        """The encoder's sequence length for this size (patches before merging)."""
        grid_h, grid_w = self.grid(encoder)
        return grid_h * grid_w


class LocalSource(BaseModel):
    """A model directory on this machine, relative to the spec file or absolute."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    local: str

    @property
    def kind(self) -> Literal["local"]:
        return "local"

    @property
    def where(self) -> str:
        return self.local


def hf_revision(revision: str) -> str:
    """A branch, tag or commit as git names them: huggingface-hub keeps a branch's commit in ``<its cache>/refs/
    <revision>`` (read offline), so a revision with ``..`` named a file outside its cache."""
    parts = revision.split("/")
    if not revision or revision.startswith("/") or "\\" in revision or any(p in ("", ".", "..") for p in parts):
        raise ValueError("expected a branch, tag or commit name (no '..', no leading or doubled '/')")
    return revision


class HfSource(BaseModel):
    """A Hugging Face model repo holding an exported MNN LLM."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    hf: Annotated[str, Field(pattern=r"^[\w.-]+/[\w.-]+$")]
    revision: Annotated[str, AfterValidator(hf_revision)] = "main"

    @property
    def kind(self) -> Literal["hf"]:
        return "hf"

    @property
    def where(self) -> str:
        return f"{self.hf}@{self.revision}"


def _aligned_image_size(text: str, info: ValidationInfo) -> str:
    """One ``image_sizes`` entry: ``WxH``, both sides positive multiples of the encoder's alignment."""
    size = ImageSize.parse(text)
    encoder = VISUAL_ENCODERS.get(info.data.get("visual_encoder") or "")
    if encoder is None:
        return text  # no (valid) encoder: the visual_encoder field reports that
    for side, value in (("width", size.width), ("height", size.height)):
        if value <= 0 or value % encoder.alignment:
            raise ValueError(
                f"{side} {value} is not a positive multiple of {encoder.alignment} "
                f"(one {encoder.kind} merged patch: {encoder.merge_size} x {encoder.patch_size} px)"
            )
    pixels = size.width * size.height
    if pixels > encoder.max_pixels:
        raise ValueError(
            f"{pixels} pixels is more than the {encoder.max_pixels} MNN's engine resizes a {encoder.kind} image to "
            "at most (image_max_pixels), so a graph for it would never run"
        )
    name, nbytes = largest_input(encoder.input_shapes(size))
    if nbytes > QNN_MAX_TENSOR_BYTES:
        raise ValueError(
            f"its encoder input {name!r} would be {nbytes} bytes, more than one QNN tensor holds "
            f"({QNN_MAX_TENSOR_BYTES}: a uint32 byte count)"
        )
    return text


class VerifySpec(BaseModel):
    """The ``verify`` table: how much the generation check asks of a bundle (its tolerances are fixed)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_new_tokens: int = Field(default=16, ge=1, description="Greedy tokens generation compares, CPU vs bundle.")
    prompt: str = Field(
        default=DEFAULT_PROMPT,
        description="What generation starts from (the bundle's prompt.txt, which run.sh feeds the phone).",
    )
    follow_divergence: StrictBool = Field(
        default=False,
        description="After a tolerated near-tie flip, run the bundle's own greedy loop on for the report's text "
        "(a simulator prefill per wrong guess); the check itself is the same.",
    )

    @field_validator("prompt")
    @classmethod
    def _plain_prompt(cls, prompt: str) -> str:
        if not prompt.strip() or prompt != prompt.strip():
            # prompt.txt is read back stripped: the text must be what verify and the phone generate from
            raise ValueError("expected text that neither is empty nor starts or ends with whitespace")
        return prompt


class ModelSpec(BaseModel):
    """One model to build bundles for, as written in ``models/<name>.toml``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=MAX_NAME_LENGTH)]
    source: LocalSource | HfSource
    chunk_size: Annotated[int, Field(gt=1, le=MAX_CHUNK)] | None = Field(
        default=None, description=f"The one prefill length (tokens per chunk; default {DEFAULT_CHUNK}); decode is 1."
    )
    chunk_sizes: Annotated[list[Annotated[int, Field(gt=1, le=MAX_CHUNK)]], Field(min_length=1)] | None = Field(
        default=None, description="Several prefill lengths, one graph each per plugin; instead of chunk_size."
    )
    targets: Annotated[list[str], Field(min_length=1)]
    socs: dict[str, str] = Field(default_factory=dict, description="Per-arch SoC override, e.g. {v79 = 'SM8735'}.")
    seed: int = Field(default=0, ge=0, description="Seed of the random io samples (numpy takes no negative seed).")
    skips: list[str] = Field(default_factory=list, description="Op names the partition keeps on the CPU.")
    max_kv_size: int = Field(
        default=0, ge=0, description="KV cache length for NPU Attention; 0 keeps Attention on the CPU."
    )
    max_plugin_parameters: int = Field(
        default=DEFAULT_MAX_PLUGIN_PARAMETERS,
        ge=0,
        description="Most convolution weights in one plugin; a bigger convolution (an lm_head) is split by output "
        "channels over several plugins, so no context build holds it whole (0: no limit).",
    )
    npu_weights: NpuWeights = Field(
        default=DEFAULT_NPU_WEIGHTS,
        description="How the plugins store convolution weights: float16 (every weight decoded), int4 (the model's "
        "own int4 codes and scales, 8-bit ones as int8 per channel) or int8 (int8 per channel).",
    )
    family: Family = Field(default="llm", description="llm (llm.mnn), vl (llm.mnn + visual.mnn) or embedding.")
    visual_encoder: VisualEncoderKind | None = Field(
        default=None,
        validate_default=True,
        description="vl only: the vision tower's kind, which fixes its patch size and inputs.",
    )
    image_sizes: list[Annotated[str, AfterValidator(_aligned_image_size)]] = Field(
        default_factory=list,
        validate_default=True,
        description="vl only: '<width>x<height>' sizes the visual encoder is compiled for, one graph each.",
    )
    speculative: Speculative | None = Field(
        default=None,
        description="Speculative decoding the bundle is built for: 'eagle' (the model's Eagle3 draft files), "
        "'lookahead' (n-gram drafts, any model) or 'off'; default: the model's config.json speculative_type. Each "
        "plugin also gets a graph at the verify length, draft_predict_length + 1.",
    )
    draft_predict_length: Annotated[int, Field(ge=1, le=MAX_DRAFT_LENGTH)] | None = Field(
        default=None,
        description="Draft tokens per verify forward (default: the model's config.json, else MNN's 3).",
    )
    decode_graph: bool = Field(
        default=True,
        description="Build each plugin's one-token decode graph. An Eagle bundle can do without it (false): MNN's "
        "Eagle loop never runs the target at one token (prefill blocks, then verify forwards), and the engine pads "
        "any one-token forward to the smallest chunk_limits length, here the verify length; one graph fewer per "
        "layer plugin to prepare.",
    )
    verify: VerifySpec = Field(default_factory=VerifySpec, description="What `doit verify` checks of each bundle.")
    spec_path: Path = Field(exclude=True, description="The TOML file this spec was read from.")

    @field_validator("targets")
    @classmethod
    def _known_targets(cls, targets: list[str]) -> list[str]:
        unknown = [t for t in targets if t not in known_archs()]
        if unknown:
            raise ValueError(f"unknown target {unknown[0]!r}; expected one of {', '.join(known_archs())}")
        if len(set(targets)) != len(targets):
            raise ValueError("targets are listed twice")
        return targets

    @field_validator("chunk_sizes")
    @classmethod
    def _distinct_chunks(cls, sizes: list[int] | None) -> list[int] | None:
        if sizes is not None and len(sizes) > MAX_PREFILL_LENGTHS:
            raise ValueError(
                f"lists {len(sizes)} prefill lengths; at most {MAX_PREFILL_LENGTHS} (each is one more graph in every "
                "plugin's binary, and the powers of two from 2 to 4096 are 12)"
            )
        if sizes is not None and len(set(sizes)) != len(sizes):
            # two graphs of one shape: MNN's plugin picks a graph by input shape and would never reach the second
            raise ValueError(f"lists a length twice ({sizes}); every prefill length gets its own graph")
        return sizes

    @field_validator("visual_encoder")
    @classmethod
    def _encoder_for_vl_only(cls, kind: str | None, info: ValidationInfo) -> str | None:
        family = info.data.get("family")
        if family == "vl" and kind is None:
            raise ValueError(f"required for family = 'vl'; expected one of {', '.join(VISUAL_ENCODERS)}")
        if family in ("llm", "embedding") and kind is not None:
            raise ValueError(f"only a family = 'vl' model has a visual encoder (family is {family!r})")
        return kind

    @field_validator("image_sizes")
    @classmethod
    def _sizes_for_vl_only(cls, sizes: list[str], info: ValidationInfo) -> list[str]:
        family = info.data.get("family")
        if family in ("llm", "embedding") and sizes:
            raise ValueError(f"only a family = 'vl' model has a visual encoder (family is {family!r})")
        if family == "vl" and not sizes:
            raise ValueError("family = 'vl' needs at least one '<width>x<height>' size, e.g. ['448x448']")
        if len(sizes) > MAX_IMAGE_SIZES:
            raise ValueError(
                f"lists {len(sizes)} image sizes; at most {MAX_IMAGE_SIZES} (each is one more graph in every encoder "
                "plugin's binary)"
            )
        encoder = VISUAL_ENCODERS.get(info.data.get("visual_encoder") or "")
        if encoder is not None:
            seen: dict[int, str] = {}
            for text in sizes:
                patches = ImageSize.parse(text).patch_count(encoder)
                if patches in seen:
                    # The encoder's input shapes depend only on the patch count: the two graphs would be one.
                    raise ValueError(
                        f"{text!r} gives the same encoder input shapes as {seen[patches]!r} "
                        f"({patches} patches); list only one of them"
                    )
                seen[patches] = text
        return sizes

    @model_validator(mode="after")
    def _socs_match_archs(self) -> ModelSpec:
        for arch, soc_name in self.socs.items():
            if arch not in self.targets:
                raise SpecFieldError(
                    f"socs.{arch}", f"{arch} is not in targets {self.targets}; add it there or drop the override"
                )
            try:
                soc_for_arch(arch, soc_name)
            except KeyError as exc:
                raise SpecFieldError(f"socs.{arch}", exc.args[0]) from None
        return self

    @model_validator(mode="after")
    def _one_chunk_form(self) -> ModelSpec:
        if self.chunk_size is not None and self.chunk_sizes is not None:
            raise SpecFieldError(
                "chunk_sizes", f"give either chunk_size = {self.chunk_size} (one length) or chunk_sizes, not both"
            )
        return self

    @model_validator(mode="after")
    def _prefill_fits_the_kv_cache(self) -> ModelSpec:
        longest = max(self.prefill_lengths)
        if self.max_kv_size and longest > self.max_kv_size:
            field = "chunk_sizes" if self.chunk_sizes is not None else "chunk_size"
            raise SpecFieldError(
                field,
                f"prefill length {longest} is longer than max_kv_size = {self.max_kv_size}: a chunk writes all its "
                "tokens into the NPU's KV cache, which holds max_kv_size; expected lengths <= max_kv_size",
            )
        return self

    @model_validator(mode="after")
    def _draft_fits(self) -> ModelSpec:
        if self.draft_predict_length is None:
            return self
        if self.speculative == "off" or self.family == "embedding":
            why = "speculative = 'off'" if self.speculative == "off" else "an embedding model generates nothing"
            raise SpecFieldError("draft_predict_length", f"is set, but {why}; drop it or ask for speculation")
        verify = self.draft_predict_length + 1
        longest = max(self.prefill_lengths)
        if verify > longest:
            # lookahead's verify forward goes through the engine's chunking, which asserts it fits one block (and
            # the prefill lengths already fit max_kv_size)
            raise SpecFieldError(
                "draft_predict_length",
                f"{self.draft_predict_length} + 1 = {verify} tokens per verify forward is longer than the longest "
                f"prefill length {longest}; expected draft_predict_length <= {longest - 1}",
            )
        return self

    @model_validator(mode="after")
    def _decode_graph_needs_a_verify_length(self) -> ModelSpec:
        if not self.decode_graph and (self.speculative == "off" or self.family == "embedding"):
            why = "speculative = 'off'" if self.speculative == "off" else "an embedding model generates nothing"
            raise SpecFieldError(
                "decode_graph",
                f"is false, but {why}: a one-token forward then has no graph to run on (it pads only to a "
                "speculative bundle's verify length); expected decode_graph = true",
            )
        return self

    @model_validator(mode="after")
    def _speculation_of_a_generator(self) -> ModelSpec:
        if self.speculative not in (None, "off") and self.family == "embedding":
            raise SpecFieldError("speculative", "an embedding model generates no tokens to draft; expected 'off'")
        return self

    @model_validator(mode="after")
    def _device_name_is_plain(self) -> ModelSpec:
        field, name = (
            ("source.hf", self.source.hf.rpartition("/")[2])
            if isinstance(self.source, HfSource)
            else ("source.local", self.local_dir().name)
        )
        if not re.fullmatch(DEVICE_NAME_PATTERN, name):
            raise SpecFieldError(
                field,
                f"the model directory name {name!r} becomes a path on the device and in push.sh/run.sh; it may "
                "only hold letters, digits, '.', '_' and '-' and start with a letter or digit",
            )
        return self

    @property
    def prefill_lengths(self) -> tuple[int, ...]:
        """Every prefill length, longest first: graph ``graphllm1_<k>`` is the longest, ``graphllm2_<k>`` the next, ...
        (the order written in the spec does not matter: MNN's engine sorts ``chunk_limits`` itself)."""
        if self.chunk_sizes is not None:
            return tuple(sorted(self.chunk_sizes, reverse=True))
        return (self.chunk_size or DEFAULT_CHUNK,)

    @property
    def encoder(self) -> VisualEncoder | None:
        """The visual encoder's patch facts (vl models only)."""
        return VISUAL_ENCODERS[self.visual_encoder] if self.visual_encoder else None

    def parsed_image_sizes(self) -> list[ImageSize]:
        """``image_sizes`` as validated sizes, in spec order (the encoder's graph order)."""
        return [ImageSize.parse(text) for text in self.image_sizes]

    def soc(self, arch: str) -> Soc:
        """The SoC this spec builds for ``arch``."""
        return soc_for_arch(arch, self.socs.get(arch))

    def npu_weights_of(self, part: str | None) -> NpuWeights:
        """How the plugins of model part ``part`` store conv weights: ``npu_weights`` for the language model; a VL
        model's vision encoder keeps float16 (quantized weights were measured on linear layers only)."""
        return self.npu_weights if part in (None, "llm") else DEFAULT_NPU_WEIGHTS

    def local_dir(self) -> Path:
        """The model directory of a ``local`` source, resolved against the spec file."""
        if not isinstance(self.source, LocalSource):
            raise TypeError(f"{self.name} is not a local model")
        path = Path(self.source.local).expanduser()
        return path if path.is_absolute() else (self.spec_path.parent / path).resolve()

    @property
    def lock_path(self) -> Path:
        """Where the resolved Hugging Face revision is pinned, next to the spec."""
        return self.spec_path.with_suffix(".lock.json")

    @property
    def parts(self) -> tuple[ChainPart, ...]:
        """The model parts built each in their own chain: the language model and, for a VL model, its encoder."""
        return chain_parts(self.family)


class SpecFieldError(ValueError):
    """A whole-spec check that blames one field (so the message names it, not the whole spec)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}\0{problem}")


def _describe(err: dict[str, Any]) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if "\0" in msg:  # a SpecFieldError: the field it names and its problem, without the spec dump
        field, _, problem = msg.partition("\0")
        return f"field {field!r}: {problem}"
    return field_problem(err)


def load_spec(path: Path) -> ModelSpec:
    """Read and validate one spec file; every problem raises `SpecError` naming the file and field."""
    path = Path(path).resolve()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: spec file does not exist") from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); expected a UTF-8 TOML file"
        ) from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec file: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    if "spec_path" in data:
        raise SpecError(f"{path}: field 'spec_path' is set by mnnbuild and may not be written")
    try:
        return ModelSpec.model_validate({**data, "spec_path": path})
    except ValidationError as exc:
        problems = "; ".join(_describe(e) for e in exc.errors(include_url=False))
        raise SpecError(f"{path}: {problems}") from None


def declared_name(path: Path) -> str | None:
    """The ``name`` a spec file writes, read without validating anything else (None: unreadable or not a string)."""
    try:
        name = tomllib.loads(Path(path).read_text(encoding="utf-8")).get("name")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    return name if isinstance(name, str) else None


def discover_specs(spec_dirs: list[Path], bad: dict[Path, SpecError] | None = None) -> dict[str, ModelSpec]:
    """Load every ``*.toml`` in ``spec_dirs`` (in order); a name defined twice is an error. ``bad``: a spec that
    does not load is put there (by path) and the others are still loaded, instead of the first one failing all."""
    specs: dict[str, ModelSpec] = {}
    for directory in spec_dirs:
        if not directory.is_dir():
            raise SpecError(f"{directory}: model spec directory does not exist")
        for path in sorted(directory.glob("*.toml")):
            try:
                spec = load_spec(path)
            except SpecError as exc:
                if bad is None:
                    raise
                bad[path] = exc
                continue
            if spec.name in specs:
                raise SpecError(f"{path}: model name {spec.name!r} is already defined by {specs[spec.name].spec_path}")
            specs[spec.name] = spec
    return specs


MODELS = Models(discover=discover_specs, declared_name=declared_name)
"""How mnnbuild's chain finds its models (`mnnbuild.stages.chain.CHAIN`): the spec files of the spec dirs."""
