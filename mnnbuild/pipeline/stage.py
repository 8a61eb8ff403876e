"""A stage declared as data (as doit's Task and DVC's Stage are): what the DAG needs to know to run it.

Each stage module ends with one ``STAGE = Stage(...)``: its name, entry function, Inputs / Params /
Manifest models, the stages whose manifests it reads, its main outputs, whether its outputs can be
restored from the cache, and which external tools it calls. `mnnbuild.dag` derives every task's
file_dep, output dir, key and cacheability from these declarations; the stage itself knows nothing
about doit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from mnnbuild.pipeline.manifest import Manifest

M = TypeVar("M", bound=Manifest)
Tool = Literal["MNN", "QNN"]


class StageInputs(BaseModel):
    """Base of a stage's Inputs: what it is built from. Directory fields locate upstream outputs.

    ``upstream`` holds the upstream manifests the DAG has already read and validated, by directory; a
    stage asks for them with `manifest`, which reads the file itself only when called outside the DAG
    (tests, scripts). It is not part of the inputs' identity.
    """

    model_config = ConfigDict(frozen=True)

    upstream: Mapping[str, Any] = Field(default_factory=dict, exclude=True, repr=False)

    def manifest(self, cls: type[M], directory: Path) -> M:
        found = self.upstream.get(str(Path(directory)))
        return found if isinstance(found, cls) else cls.read(Path(directory))


@dataclass(frozen=True)
class Stage:
    """One stage of the chain."""

    name: str
    entry: Callable[[Any, Any, Path], Manifest]
    """``(inputs, params, out_dir) -> Manifest``; writes ``out_dir`` atomically."""
    inputs: type[BaseModel]
    params: type[BaseModel]
    manifest: type[Manifest]
    upstream: tuple[str, ...] = ()
    """Stages whose manifests it reads: its file_dep, by content."""
    upstream_files: tuple[str, ...] = ()
    """Those of ``upstream`` whose outputs it reads only in part: its file_dep are the files it reads (each run
    lists them), not that stage's manifest, so an upstream re-run that leaves them as they were (a reworded
    partition report) leaves it up to date. Such a stage records the files it read, by hash, as its inputs."""
    outputs: tuple[str, ...] = ()
    """Its main outputs, relative to its directory (besides its manifest)."""
    per_target: bool = False
    """Built once per target arch rather than once per model."""
    cacheable: bool = True
    """Whether the artifact cache stores its outputs: not when a rebuild costs about what a restore does (fetch
    links files, bundle copies them); the stages after it are restored all the same, its manifest being identical."""
    defer: tuple[str, ...] = ()
    """Outputs (fnmatch patterns of their paths; ``*``: all) that a cache hit may leave in the cache when no task of
    the run reads its files ("without the bytes"): big outputs that only the entries of later stages read, never a
    file another task depends on by name or reads to be declared. The files are fetched (and hash-checked) when a
    task that reads them must run, or when the task is asked for by name."""
    links: bool = True
    """Whether the cache may hard-link its outputs to blobs: not for a stage whose outputs are copies a user may
    edit (the bundle ships them)."""
    reads: tuple[str, ...] | None = None
    """Those of ``upstream`` whose files, not only manifests, its entry reads (None: all): what must be fetched
    before it runs when they were restored without the bytes."""
    tools: frozenset[Tool] = frozenset()
    """External tools it calls; their versions enter its key."""
    doc: str = ""

    def __post_init__(self) -> None:
        if self.manifest.stage != self.name:
            raise ValueError(f"stage {self.name}: its manifest model is the {self.manifest.stage!r} stage's")
        if not set(self.reads or ()) <= set(self.upstream):
            raise ValueError(f"stage {self.name}: reads {self.reads} must be upstream stages")
        if not set(self.upstream_files) <= set(self.upstream):
            raise ValueError(f"stage {self.name}: upstream_files {self.upstream_files} must be upstream stages")
