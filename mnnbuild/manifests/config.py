"""config: ``config_qnn.json`` per target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict

from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import PrefillLengths
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.stage import From, StageInputs


class ConfigQnn(BaseModel):
    """``config_qnn.json``: the model's ``config.json`` with the entries upstream's export sets for the NPU.

    The three fields are ours (always written); every other entry is the model's own, kept as is (extra fields,
    in ``config.json``'s order, after ours). Runtime settings such as ``thread_num``, ``precision`` or
    ``sampler_type`` are therefore the model author's, as upstream ships them: nothing of ours relies on them.
    """

    model_config = ConfigDict(extra="allow")

    llm_model: str
    """``qnn/<model file>``: the partitioned graph."""
    llm_weight: str
    """The model's weight file (the partitioned graph's CPU ops keep their offsets into it)."""
    chunk_limits: list[int]
    """Every prefill length, then 1 (decode)."""

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=4) + "\n"


class ConfigInputs(StageInputs):
    model: str
    target: str
    model_dir: Annotated[Path, From(FetchManifest)]
    """The fetch stage's output directory (its ``config.json`` and tokenizer file)."""


class ConfigParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    chunk_sizes: PrefillLengths
    visual_model: str | None = None
    """A VL model's encoder, relative to the model dir (``config_qnn.json``'s ``visual_model``)."""


class ConfigManifest(Manifest):
    stage = "config"
    params: ConfigParams
    config: ConfigQnn
