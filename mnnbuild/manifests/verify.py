"""verify: the bundle checked CPU (MNN) vs QNN (HTP simulator)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from mnnbuild.base.compare import Tolerance
from mnnbuild.cpu import CpuRuntime
from mnnbuild.manifests.bundle import BundleManifest
from mnnbuild.manifests.context import ContextManifest
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.io import IoManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.manifests.twin import TwinManifest
from mnnbuild.model.targets import Soc
from mnnbuild.pipeline.manifest import Manifest
from mnnbuild.pipeline.stage import From, StageInputs


class VerifyInputs(StageInputs):
    model: str
    bundle_dir: Annotated[Path, From(BundleManifest)]
    """bundle output (``bundle.manifest.json``, ``model/<name>/``)."""
    partition_dir: Annotated[Path, From(PartitionManifest)]
    io_dir: Annotated[Path, From(IoManifest)]
    model_dir: Annotated[Path, From(FetchManifest)]
    """fetch output: the original model, run whole in MNN for the references."""
    context_dir: Annotated[Path, From(ContextManifest, contents=False)]  # of the contexts, their manifests only
    """context outputs (one subdir per plugin): each shipped binary must have its recorded hash."""
    twin_dir: Annotated[Path, From(TwinManifest)]
    """twin outputs (one subdir per plugin): the unshared twins, which run in the simulator in the shipped
    binaries' place."""
    visual_io_dir: Annotated[Path | None, From(IoManifest, part="visual")] = None
    """A VL model's encoder (its visual part): io and partition outputs; None: no encoder."""
    visual_partition_dir: Annotated[Path | None, From(PartitionManifest, part="visual")] = None


class VerifyParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    soc: Soc
    graph_tolerance: Tolerance = Tolerance()
    model_tolerance: Tolerance = Tolerance()
    prompt: str | None = None
    """Prompt of the generation check; None: the bundle's prompt.txt (what run.sh feeds the phone)."""
    max_new_tokens: int = Field(default=16, ge=1)
    runtime: CpuRuntime = CpuRuntime()
    max_loaded_plugins: int = Field(default=1, ge=1)
    """Plugin contexts loaded at once in the simulator: peak memory follows the largest plugins, not the model."""
    follow_divergence: bool = False
    """After the bundle's first greedy token that differs from the CPU's (a tolerated near-tie), run the bundle's
    own loop on to ``max_new_tokens`` for the report's text. Off: the check is the same (every step is compared on
    the CPU's sequence either way), the bundle's tokens stop at its own pick; each later token the bundle picks on
    its own costs a simulator prefill (Qwen3-1.7B: over a minute each)."""


class VerifyManifest(Manifest):
    stage = "verify"
    params: VerifyParams
    passed: bool
    """Always true: a failed verify writes no manifest."""
    executed: dict[str, str]
    """Plugin path -> what ran in the simulator (``override`` = unshared twin)."""
    worst_graph_cosine: float | None
    worst_graph_rel_err: float | None
    tokens_match: bool | None
    """Greedy tokens equal the CPU's; None for a model that does not generate (an embedding model)."""
