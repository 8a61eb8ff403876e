"""fetch: the model files linked (local) or downloaded (Hugging Face), and the HF lock."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from mnnbuild.base.errors import MnnbuildError
from mnnbuild.model.modeldir import ALL_FILES, ModelPart, PartFamily
from mnnbuild.model.spec import HfSource, LocalSource
from mnnbuild.model.speculation import Speculation, SpeculativeAsk
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.stage import StageInputs


class HfLock(BaseModel):
    """The commit a requested HF revision resolved to; delete the lock (or run update) to move on."""

    model_config = ConfigDict(extra="forbid")
    repo: str
    revision: str
    commit: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]
    """What fetch downloads (huggingface-hub's revision): a commit's full hash, which it finds in its cache as is."""


class FetchInputs(StageInputs):
    model: str
    source: LocalSource | HfSource
    source_dir: Path | None = None
    """Resolved directory of a local source."""
    lock_path: Path | None = None
    """Lock file of an hf source."""


class FetchParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    family: PartFamily = "llm"
    """The spec's model family: which graph the chain converts and what it must look like."""
    files: tuple[str, ...] = ALL_FILES
    """File names the chain needs; nothing else is downloaded (``modeldir.family_files``)."""
    visual_encoder: str | None = None
    """A VL model's encoder kind (the spec's): its files are required and must be of this kind."""
    speculative: SpeculativeAsk | None = None
    """The spec's ``speculative`` (None: the model's own ``speculative_type``)."""
    draft_predict_length: int | None = None
    """The spec's override of the model's ``draft_predict_length``."""
    decode_graph: bool = Field(default=True, exclude_if=lambda keep: keep)
    """The spec's ``decode_graph`` (left out of the manifest when true, so bundles built before it keep their keys)."""


class SourceRecord(BaseModel):
    kind: Literal["local", "hf"]
    location: str
    """The spec's local path, or the HF repo id."""
    revision: str | None = None
    commit: str | None = None


class FetchManifest(Manifest):
    stage = "fetch"
    params: FetchParams
    source: SourceRecord
    part: ModelPart = ModelPart()
    """The graph the later stages convert, as the model dir names it (``config.json``'s ``llm_model``)."""
    speculation: Speculation | None = None
    """The speculative decoding the bundle is built for (None: none); its files are among the outputs."""


def lock_pinned(lock_path: Path, out_dir: Path) -> bool:
    """Whether the fetch dir ``out_dir`` still holds the commit the lock file pins (`Stage.pinned`)."""
    try:
        lock = HfLock.model_validate_json(lock_path.read_text(encoding="utf-8"))
        return FetchManifest.read(out_dir).source.commit == lock.commit
    except (OSError, ValueError, MnnbuildError):
        return False
