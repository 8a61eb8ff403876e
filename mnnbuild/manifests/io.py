"""io: the decode and prefill reference inputs/outputs, one sample per length (``testdir/<seq_len>``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from mnnbuild.cpu import CpuRuntime
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.model.modeldir import ChainPart
from mnnbuild.model.spec import DEFAULT_PROMPT, VisualEncoderKind
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.stage import From, StageInputs

DECODE_SEQ = 1


def _distinct(lengths: tuple[int, ...]) -> tuple[int, ...]:
    if len(set(lengths)) != len(lengths):
        raise ValueError(f"prefill lengths {list(lengths)} repeat a length; each gets its own graph")
    return lengths


PrefillLengths = Annotated[
    tuple[Annotated[int, Field(gt=DECODE_SEQ)], ...], Field(min_length=1), AfterValidator(_distinct)
]
"""The prefill lengths of a build in graph order (the spec's ``prefill_lengths``, longest first)."""


class IoInputs(StageInputs):
    model: str
    model_dir: Annotated[Path, From(FetchManifest)]
    """The fetch stage's output directory."""


class IoParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    chunk_sizes: PrefillLengths | tuple[()] = ()
    """The language model's prefill lengths (its part only)."""
    seed: int = 0
    runtime: CpuRuntime = CpuRuntime()
    part: ChainPart = "llm"
    """Which model file: the language model (``llm.mnn``) or a VL model's encoder (``visual.mnn``)."""
    visual_encoder: VisualEncoderKind | None = None
    image_sizes: tuple[str, ...] = ()
    """The encoder's samples, one per size in this order (the visual part only)."""
    prompt: str = DEFAULT_PROMPT
    """verify's generation prompt (the spec's): it must leave room in the longest prefill length."""

    @model_validator(mode="after")
    def _shapes_of_the_part(self) -> IoParams:
        if self.part == "llm" and (not self.chunk_sizes or self.image_sizes or self.visual_encoder):
            raise ValueError("the llm part takes chunk_sizes and no image sizes or visual encoder")
        if self.part == "visual" and (self.chunk_sizes or not self.image_sizes or self.visual_encoder is None):
            raise ValueError("the visual part takes a visual_encoder and image_sizes, no chunk_sizes")
        return self


class TensorInfo(BaseModel):
    name: str
    shape: list[int]
    dtype: str


class IoSample(BaseModel):
    seq_len: int
    """Tokens (llm part) or patches (visual part: one sample per image size)."""
    image_size: str | None = None
    """The visual part's image size, ``<width>x<height>``."""
    dir: str
    """Relative to the output dir: ``testdir/<seq_len>`` (a whole-block sample's ``testdir/<seq_len>-last``)."""
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    logits_index: int | None = None
    """A whole-block sample's ``logits_index`` (-1); None for the graph samples (their own is in their inputs)."""


class IoManifest(Manifest):
    stage = "io"
    params: IoParams
    samples: list[IoSample]
    """Decode first, then one per prefill length in ``chunk_sizes`` order: the order the partition names graphs in."""
    whole_block_samples: list[IoSample] = []
    """Shapes MNN's engine feeds that no graph is compiled for: each prefill block a prompt fills whole (every full
    chunk, and a last chunk of exactly a ``chunk_limits`` length) runs unpadded with ``logits_index`` -1, the last
    row's logits only (``Llm::forwardRaw``), so the ops after the ``logits_index`` slice see 1 row while the others
    see the block. verify runs them through the bundle: each plugin must find a graph for their shapes."""

    def sample_dirs(self, out_dir: Path) -> list[Path]:
        return [Path(out_dir) / s.dir for s in self.samples]

    def whole_block_dirs(self, out_dir: Path) -> list[Path]:
        return [Path(out_dir) / s.dir for s in self.whole_block_samples]
