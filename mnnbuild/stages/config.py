"""config: ``config_qnn.json``, the runtime config the phone's ``llm_demo`` is started with.

It is written from scratch (as upstream ``output_qnn`` does), not derived from the model's
``config.json``: the outer graph runs on MNN's CPU backend, which loads the QNN plugins.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mnnbuild.fsutil import atomic_write_text, staged_dir
from mnnbuild.manifest import FileRecord, Manifest, record_outputs, tool_versions
from mnnbuild.modeldir import tokenizer_file
from mnnbuild.stages.fetch import FetchManifest

log = logging.getLogger(__name__)

CONFIG_FILE = "config_qnn.json"
DEFAULT_TOKENIZER = "tokenizer.txt"


class ConfigQnn(BaseModel):
    """The fields of ``config_qnn.json`` (MNN's LLM config, QNN flavour)."""

    model_config = ConfigDict(extra="forbid")

    llm_model: str = "qnn/llm.mnn"
    backend_type: str = "cpu"
    thread_num: int = 1
    precision: str = "low"
    chunk_limits: list[int]
    memory: str = "low"
    sampler_type: str = "penalty"
    penalty: float = 1.1
    tokenizer_file: str | None = Field(default=None, description="Only when the tokenizer is not tokenizer.txt.")

    def to_json(self) -> str:
        return self.model_dump_json(indent=4, exclude_none=True) + "\n"


class ConfigInputs(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    target: str
    model_dir: Path
    """The fetch stage's output directory (for the tokenizer file name)."""


class ConfigParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    chunk_size: int = Field(gt=1)


class ConfigManifest(Manifest):
    stage = "config"
    params: ConfigParams
    config: ConfigQnn


def write_config(inputs: ConfigInputs, params: ConfigParams, out_dir: Path) -> ConfigManifest:
    """Write ``config_qnn.json`` with prefill and decode chunk limits and the tokenizer file."""
    fetched = FetchManifest.read(inputs.model_dir)
    tokenizer = tokenizer_file(inputs.model_dir)
    config = ConfigQnn(
        chunk_limits=[params.chunk_size, 1],
        tokenizer_file=None if tokenizer == DEFAULT_TOKENIZER else tokenizer,
    )
    with staged_dir(out_dir) as tmp:
        atomic_write_text(tmp / CONFIG_FILE, config.to_json())
        manifest = ConfigManifest(
            model=inputs.model,
            target=inputs.target,
            inputs=[
                FileRecord(path=f"model/{r.path}", size=r.size, sha256=r.sha256)
                for r in fetched.outputs
                if r.path == tokenizer
            ],
            params=params,
            tools=tool_versions(),
            outputs=record_outputs(tmp),
            config=config,
        )
        manifest.write(tmp)
    log.info("config %s-%s: chunk_limits %s, tokenizer %s", inputs.model, inputs.target, config.chunk_limits, tokenizer)
    return manifest
