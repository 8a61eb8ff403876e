"""One plugin's graphs composed into an HTP context binary, checked and recorded: the context stage's shipped,
weight-shared binary and the twin stage's unshared twin (which verify runs) are both made here.

The graphs named by the plugin's ``merge`` entry are lowered from the partition's graph dirs and the model's weights
(`PluginGraphs`), composed in a fresh process (`mnnbuild.plugin.compose.compose_checked`) and read back through
QnnSystem. What the two stages differ in, each stage's entry passes: the file written, whether the graphs share
weights, and its manifest, made from what was composed (`PluginBinary`). Neither manifest model is imported here, so
each stage's key follows its own manifest's code only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mnnbuild.base.fsutil import confined, staged_dir
from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.manifests.plugin import PluginInputs, PluginParams, plugin_part, plugin_sources
from mnnbuild.pipeline.manifest import Manifest, record_outputs, tool_versions
from mnnbuild.pipeline.stage import At

if TYPE_CHECKING:
    from mnnbuild.qnn import BinaryInfo, QnnVersion

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Manifest)


@dataclass(frozen=True)
class PluginBinary:
    """One plugin's binary as composed and read back, for its stage to make its manifest of."""

    file: str
    """The binary, relative to the stage's dir (in ``recorded["outputs"]`` with its sha256)."""
    info: BinaryInfo
    qnn: QnnVersion
    recorded: dict[str, Any]
    """The fields both manifests have: model, target, inputs (what it was built from, by hash), params, tools,
    outputs, binary (the merge entry's key), soc_type and weights (how it stores each conv weight)."""


BYTES_PER_WEIGHT = 16
"""What QNN holds per weight while it serializes a context (Qwen3-1.7B's unsplit lm_head, 311M weights: 4.8 GiB)."""


def composing_memory(at: At) -> int:
    """The memory composing a plugin's binary holds beyond the process's own (`Stage.memory`)."""
    return BYTES_PER_WEIGHT * at.cost


def build_plugin_binary(
    inputs: PluginInputs,
    params: PluginParams,
    out_dir: Path,
    manifest: Callable[[PluginBinary], M],
    *,
    file: str,
    weight_sharing: bool,
    what: str,
) -> M:
    """Compose ``inputs.graphs`` into ``out_dir / file`` for ``params.soc`` (``weight_sharing``: with shared weights)
    and check it through its binary info; ``out_dir`` gets it and ``manifest`` of it, atomically. A lowering or QNN
    error names ``what``."""
    from mnnbuild.plugin.compose import compose_checked
    from mnnbuild.plugin.lowered import MERGE_FIELD, PluginGraphs
    from mnnbuild.qnn import QnnLibrary

    fetch = inputs.manifest(FetchManifest, inputs.model_dir)
    partition = inputs.manifest(PartitionManifest, inputs.partition_dir)
    lib = QnnLibrary()
    soc = params.soc
    with staged_dir(out_dir) as tmp:
        dest = confined(tmp, file, MERGE_FIELD)
        part = plugin_part(fetch, partition)
        source = PluginGraphs.of(inputs.model_dir, part, inputs.partition_dir, inputs.graphs, params.npu_weights)
        # a one-graph plugin (a VL encoder built for one image size) has nothing to share: QNN marks it unshared
        sharing = weight_sharing and len(source.graphs) > 1
        info, size, seconds, notes = compose_checked(lib, soc, source, source.names, sharing, dest, what)
        recorded = {
            "model": inputs.model,
            "target": soc.dsp_arch,
            "inputs": plugin_sources(fetch, partition, inputs.graphs),
            "params": params,
            "tools": tool_versions(qnn=lib.version.build_id),
            "outputs": record_outputs(tmp),
            "binary": inputs.binary,
            "soc_type": info.soc_type,
            "weights": notes,
        }
        made = manifest(PluginBinary(file, info, lib.version, recorded))
        made.write(tmp)
    log.debug(
        "%s %s %s for %s: %.1f MB, graphs %s, %.1fs",
        made.stage,
        inputs.model,
        inputs.binary,
        soc.name,
        size / 1e6,
        ", ".join(info.graph_names),
        seconds,
    )
    return made
