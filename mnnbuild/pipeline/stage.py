"""A stage declared as data (as doit's Task and DVC's Stage are): what the DAG needs to know to run it.

Each stage module ends with one ``STAGE = Stage(...)``: its name, entry function, Inputs / Params /
Manifest models, where it is placed (once per model, per model part, per target or per plugin), how a
model spec becomes its Params, whether its outputs can be restored from the cache, and which external
tools it calls. Its edges are its Inputs model: every field annotated ``Annotated[Path, From("partition")]``
holds an upstream stage's directory, and `mnnbuild.dag` derives the stage's upstream, file_dep and the
directories it is handed from those annotations. The stage itself knows nothing about doit.

A declaration that does not match its entry function's signature (or an Inputs field annotation that is
not a directory) fails when the stage module is imported.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from mnnbuild.pipeline.manifest import Manifest

M = TypeVar("M", bound=Manifest)
Tool = Literal["MNN", "QNN"]
Placement = Literal["model", "part", "target", "plugin"]
"""Where a stage's runs sit: once per model (``<model>/<dir>``), once per model part (a VL model's encoder gets
``<model>/visual/<dir>``), once per target (``<model>/<arch>/<dir>``) or once per plugin of a target
(``<model>/<arch>/<dir>/<plugin>``)."""
Reads = Literal["manifest", "files", "dir"]

COORDINATES = ("model", "target", "binary", "graphs")
"""Inputs fields the DAG fills from where a run sits: the spec's name, the target arch, and (per-plugin stages) the
plugin's binary and graph dirs."""


@dataclass(frozen=True)
class From:
    """An Inputs field's annotation: the field holds upstream stage ``stage``'s directory (``Path``, or
    ``Path | None`` for a part the model may not have)."""

    stage: str
    part: str | None = None
    """Of a per-part upstream stage: which part's directory (``"visual"``: a VL model's encoder; None for a model
    without one). None: the run's own part (the language model's, for a run of the whole model)."""
    reads: Reads = "manifest"
    """What the run depends on: the upstream manifest, by content (``"manifest"``); only the files each run lists as
    read (``"files"``: an upstream re-run that leaves them as they were, such as a reworded partition report, leaves
    it up to date; the stage records the files it read, by hash, as its inputs); or nothing but the directory
    (``"dir"``: the page report reads every stage's cost records, not its outputs)."""
    files: tuple[str, ...] = ()
    """Files in that directory the run depends on besides (the page report: ``verify.json``, which a failed verify
    leaves without a manifest)."""
    contents: bool = True
    """Whether the run reads the upstream's files, not only its manifest: restored from the cache without the bytes
    (`Stage.defer`), they are fetched before it runs (verify reads the contexts' manifests only)."""


@dataclass(frozen=True)
class At:
    """Where one run of a stage sits: the target (per-target and per-plugin stages), the model part (per-part and
    per-plugin stages: ``llm`` or ``visual``) and the plugin (per-plugin stages: its binary and graph dirs)."""

    arch: str | None = None
    part: str | None = None
    binary: str | None = None
    graphs: tuple[str, ...] = ()


class StageInputs(BaseModel):
    """Base of a stage's Inputs: what it is built from. ``From``-annotated fields locate upstream outputs.

    ``upstream`` holds the upstream manifests the DAG has already read and validated, by directory; a
    stage asks for them with `manifest`, which reads the file itself only when called outside the DAG
    (tests, scripts). It is not part of the inputs' identity.
    """

    model_config = ConfigDict(frozen=True)

    upstream: Mapping[str, Any] = Field(default_factory=dict, exclude=True, repr=False)

    def manifest(self, cls: type[M], directory: Path) -> M:
        found = self.upstream.get(str(Path(directory)))
        return found if isinstance(found, cls) else cls.read(Path(directory))


def edges_of(inputs: type[BaseModel]) -> dict[str, From]:
    """An Inputs model's edges: field name -> the ``From`` annotation of each upstream directory field."""
    found = {}
    for name, info in inputs.model_fields.items():
        marks = [m for m in info.metadata if isinstance(m, From)]
        if len(marks) > 1:
            raise TypeError(f"{inputs.__name__}.{name}: more than one From annotation")
        if marks:
            found[name] = marks[0]
    return found


def _is_path(annotation: Any, optional: bool) -> bool:
    if annotation is Path:
        return True
    args = typing.get_args(annotation)
    is_union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return optional and is_union and set(args) == {Path, type(None)}


@dataclass(frozen=True)
class Stage:
    """One stage of the chain."""

    name: str
    entry: Callable[[Any, Any, Path], Manifest]
    """``(inputs, params, out_dir) -> Manifest``; writes ``out_dir`` atomically."""
    inputs: type[StageInputs]
    params: type[BaseModel]
    manifest: type[Manifest]
    params_of: Callable[[Any, At], BaseModel]
    """``(spec, at) -> Params``: what the spec asks of this run."""
    describe: Callable[[Any, At], str]
    """``(spec, at) -> str``: the doc of this run's task (``doit list``)."""
    placement: Placement = "model"
    fields_of: Callable[[Any, At], Mapping[str, Any]] | None = None
    """``(spec, at) -> {field: value}``: the Inputs fields that are neither upstream directories nor where the run
    sits (`COORDINATES`), e.g. the bundle's device directory name."""
    outputs: tuple[str, ...] = ()
    """Its main outputs, relative to its directory (besides its manifest)."""
    dir: str = ""
    """Its directory's name (default: the stage's)."""
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
    tools: frozenset[Tool] = frozenset()
    """External tools it calls; their versions enter its key."""
    versions: Callable[[], Mapping[str, str]] | None = None
    """Versions beyond the declared tools' and the stage's own code (the page report: its template and the
    libraries that draw it, which are not Python modules of ours); they enter its key."""
    reads_source: bool = False
    """Reads the model from outside the artifact root (fetch): a local source's files are its file_dep, an HF
    source's lock its up-to-date check."""
    symlinks: bool = False
    """Its outputs are links to files elsewhere (fetch: to the model's files), checked as links."""
    guards: Mapping[str, str] = field(default_factory=dict)
    """Inputs directory field -> a subdirectory of it whose files must still be the ones the upstream manifest
    records: checked at every up-to-date check, and a changed file is never answered from the cache (verify: a
    bundle file replaced after bundling must not pass as verified; the cache key sees only manifests)."""
    leaves_on_failure: str | None = None
    """A file a failed run leaves in its directory, without a manifest (verify's report): its origin record then
    says the run failed."""
    after_failure_of: str | None = None
    """Also runs when that stage fails having left its `leaves_on_failure` file (the page report of a failed
    verify: doit runs no task whose dependency failed, but runs the failed task's teardown)."""
    default: bool = False
    """A bare ``doit`` runs this stage's tasks of the default model (verify and report: a fresh clone builds, proves
    and reports the shipped tiny model)."""
    group_default_only: bool = False
    """``doit <stage>`` runs the default model's tasks only (``doit verify``: the shipped tiny model's)."""
    doc: str = ""
    """What ``doit list`` says of the stage's task group."""

    def __post_init__(self) -> None:
        if not self.dir:
            object.__setattr__(self, "dir", self.name)
        if self.manifest.stage != self.name:
            raise TypeError(f"stage {self.name}: its manifest model is the {self.manifest.stage!r} stage's")
        if not issubclass(self.inputs, StageInputs):
            raise TypeError(f"stage {self.name}: inputs {self.inputs.__name__} must derive from StageInputs")
        self._check_entry()
        self._check_edges()

    def _check_entry(self) -> None:
        """The entry function's signature is ``(inputs: <inputs>, params: <params>, out_dir: Path) -> <manifest>``;
        ``params_of`` returns the declared Params (when annotated)."""
        where = f"stage {self.name}: entry {self.entry.__qualname__}"
        try:
            hints = typing.get_type_hints(self.entry)
        except NameError as exc:
            raise TypeError(f"{where}: its annotations do not resolve ({exc})") from None
        parameters = list(inspect.signature(self.entry).parameters.values())
        names = [p.name for p in parameters[:3]]
        if len(names) != 3 or any(p.default is inspect.Parameter.empty for p in parameters[3:]):
            raise TypeError(f"{where} takes {[p.name for p in parameters]}; expected (inputs, params, out_dir)")
        expected = [self.inputs, self.params, Path]
        got = [hints.get(n) for n in names]
        if got != expected or hints.get("return") is not self.manifest:
            want = ", ".join(t.__name__ for t in expected)
            raise TypeError(f"{where} is not ({want}) -> {self.manifest.__name__} as declared")
        try:
            made = typing.get_type_hints(self.params_of).get("return")
        except NameError as exc:
            raise TypeError(f"stage {self.name}: params_of's annotations do not resolve ({exc})") from None
        if made is not None and made is not self.params:
            raise TypeError(f"stage {self.name}: params_of returns {made}, not the declared {self.params.__name__}")

    def _check_edges(self) -> None:
        fields = self.inputs.model_fields
        for name, edge in self.edges.items():
            if not _is_path(fields[name].annotation, optional=edge.part is not None):
                raise TypeError(f"stage {self.name}: {self.inputs.__name__}.{name} (From {edge.stage}) must be a Path")
            if edge.stage == self.name:
                raise TypeError(f"stage {self.name}: {self.inputs.__name__}.{name} reads the stage itself")
        plugin = {"binary", "graphs"} <= fields.keys()
        if plugin != (self.placement == "plugin"):
            raise TypeError(f"stage {self.name}: a per-plugin stage, and only one, has Inputs fields binary, graphs")
        if "target" in fields and self.placement not in ("target", "plugin"):
            raise TypeError(f"stage {self.name}: Inputs field 'target' on a stage not placed per target")
        left = [
            n
            for n, f in fields.items()
            if f.is_required() and n not in self.edges and n not in COORDINATES and n != "upstream"
        ]
        if left and self.fields_of is None:
            raise TypeError(f"stage {self.name}: Inputs fields {left} are set by no From, coordinate or fields_of")

    @property
    def edges(self) -> dict[str, From]:
        return edges_of(self.inputs)

    @property
    def upstream(self) -> tuple[str, ...]:
        """Stages whose outputs it depends on (by manifest or by the files it lists), in declaration order."""
        return tuple(dict.fromkeys(e.stage for e in self.edges.values() if e.reads != "dir"))

    @property
    def upstream_files(self) -> tuple[str, ...]:
        """Those of ``upstream`` it depends on only through the files it reads (`From.reads` ``"files"``)."""
        return tuple(dict.fromkeys(e.stage for e in self.edges.values() if e.reads == "files"))

    @property
    def reads(self) -> tuple[str, ...]:
        """Those of ``upstream`` whose files, not only manifests, its entry reads (`From.contents`): what must be
        fetched before it runs when they were restored without the bytes."""
        return tuple(dict.fromkeys(e.stage for e in self.edges.values() if e.reads != "dir" and e.contents))

    @property
    def per_target(self) -> bool:
        return self.placement in ("target", "plugin")
