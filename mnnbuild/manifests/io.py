"""io: the decode and prefill reference inputs/outputs (``testdir/<seq_len>``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mnnbuild.cpu import CpuRuntime
from mnnbuild.manifest import Manifest
from mnnbuild.stage import StageInputs

INPUT_NAMES = ("input_ids", "attention_mask", "position_ids", "logits_index")


DECODE_SEQ = 1


class IoInputs(StageInputs):
    model: str
    model_dir: Path
    """The fetch stage's output directory."""


class IoParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    chunk_size: int = Field(gt=DECODE_SEQ)
    seed: int = 0
    runtime: CpuRuntime = CpuRuntime()


class TensorInfo(BaseModel):
    name: str
    shape: list[int]
    dtype: str


class IoSample(BaseModel):
    seq_len: int
    dir: str
    """Relative to the output dir: ``testdir/<seq_len>``."""
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]


class IoManifest(Manifest):
    stage = "io"
    params: IoParams
    samples: list[IoSample]
    """Decode first, then prefill: the order the partition names graphs in."""

    def sample_dirs(self, out_dir: Path) -> list[Path]:
        return [Path(out_dir) / s.dir for s in self.samples]
