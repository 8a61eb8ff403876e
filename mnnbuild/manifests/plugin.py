"""What a plugin's binaries (the shipped context binary and its unshared twin) are built from.

Its own module, not the context manifest's: the twin stage and verify read it, and a change to the context
manifest's fields must not reach the twin's key.
"""

from __future__ import annotations

from mnnbuild.manifests.fetch import FetchManifest
from mnnbuild.manifests.partition import PartitionManifest
from mnnbuild.model.modeldir import ModelPart, chain_part
from mnnbuild.pipeline.manifest import FileRecord


def plugin_part(fetch: FetchManifest, partition: PartitionManifest) -> ModelPart:
    """The model file and weight file a plugin's graphs are lowered from: the fetched graph, or a VL encoder."""
    return chain_part(fetch.part, partition.params.part)


def plugin_sources(fetch: FetchManifest, partition: PartitionManifest, graphs: list[str]) -> list[FileRecord]:
    """What a plugin's binary is built from, by hash: the partition's files of its graph dirs (and the split model
    they index, if any) and the fetched model and weight file they are lowered from (paths prefixed with the stage
    that made them). The context and twin stages record it as their inputs; verify compares both against the
    current upstream manifests."""
    part = plugin_part(fetch, partition)
    model = [r for r in fetch.outputs if r.path in (part.model_file, part.weight_file)]
    return [
        *(r.model_copy(update={"path": f"partition/{r.path}"}) for r in partition.plugin_files(graphs)),
        *(r.model_copy(update={"path": f"fetch/{r.path}"}) for r in model),
    ]
