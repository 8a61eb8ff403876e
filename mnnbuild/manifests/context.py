"""context: one HTP context binary per plugin."""

from __future__ import annotations

from pydantic import BaseModel

from mnnbuild.manifests.plugin import PluginInputs, PluginParams
from mnnbuild.model.npu_weights import WeightNote
from mnnbuild.pipeline.manifest import Manifest


class ContextInputs(PluginInputs):
    """`PluginInputs`, of the shipped binary."""


class ContextParams(PluginParams):
    weight_sharing: bool = True
    """Whether the plugin's graphs share their weights (a one-graph plugin has nothing to share)."""


class GraphIo(BaseModel):
    name: str
    inputs: list[str]
    outputs: list[str]


class ContextManifest(Manifest):
    stage = "context"
    params: ContextParams
    binary: str
    graphs: list[GraphIo]
    weight_shared: bool
    soc_type: str | None
    weights: list[WeightNote] = []
    """How the binary stores each conv weight (encoding, exactness, requantization error, why float16)."""
    qnn: dict[str, str]
    """QNN library versions (build id, API versions)."""
