"""config: ``config_qnn.json`` per target."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mnnbuild.manifest import Manifest
from mnnbuild.manifests.io import PrefillLengths
from mnnbuild.stage import StageInputs


class ConfigQnn(BaseModel):
    """The fields of ``config_qnn.json`` (MNN's LLM config, QNN flavour)."""

    model_config = ConfigDict(extra="forbid")

    llm_model: str
    llm_weight: str | None = Field(default=None, description="Only when it is not MNN's default llm.mnn.weight.")
    backend_type: str = "cpu"
    thread_num: int = 1
    precision: str = "low"
    chunk_limits: list[int]
    memory: str = "low"
    sampler_type: str = "penalty"
    penalty: float = 1.1
    tokenizer_file: str | None = Field(default=None, description="Only when the tokenizer is not tokenizer.txt.")
    visual_model: str | None = Field(
        default=None, description="VL models: the encoder MNN loads (its weights: the same path + '.weight')."
    )

    def to_json(self) -> str:
        return self.model_dump_json(indent=4, exclude_none=True) + "\n"


class ConfigInputs(StageInputs):
    model: str
    target: str
    model_dir: Path
    """The fetch stage's output directory (for the tokenizer file name)."""


class ConfigParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    chunk_sizes: PrefillLengths
    visual_model: str | None = None
    """A VL model's encoder, relative to the model dir (``config_qnn.json``'s ``visual_model``)."""


class ConfigManifest(Manifest):
    stage = "config"
    params: ConfigParams
    config: ConfigQnn
