"""twin: the unshared twin of each plugin's context binary, which verify runs in the x86 simulator."""

from __future__ import annotations

from mnnbuild.manifests.plugin import PluginInputs, PluginParams
from mnnbuild.model.npu_weights import WeightNote
from mnnbuild.pipeline.manifest import Manifest


class TwinInputs(PluginInputs):
    """`PluginInputs`, of the shipped binary the twin stands in for. Not ContextInputs: the twin's key then does
    not follow the context manifest's code (a new context manifest field rebuilds no twin)."""


class TwinParams(PluginParams):
    """`PluginParams`: a twin is never weight-shared (the simulator could not load it)."""


class TwinManifest(Manifest):
    stage = "twin"
    params: TwinParams
    binary: str
    """The shipped binary (in the context stage's dir) this twin stands in for."""
    twin: str
    """The twin, relative to this dir (in ``outputs`` with its sha256)."""
    graphs: list[str]
    """Its graph names, in order."""
    soc_type: str | None
    weights: list[WeightNote] = []
    """How the binary stores each conv weight (encoding, exactness, requantization error, why float16)."""
