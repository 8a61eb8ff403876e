"""A stage declared as data (as doit's Task and DVC's Stage are): what the DAG needs to know to run it.

Each stage module ends with one ``STAGE = Stage(...)``: its name, entry function, Inputs / Params /
Manifest models, where it is placed (once per model, per model part, per target or per plugin), how a
model spec becomes its Params, whether its outputs can be restored from the cache, and which external
tools it calls. Its edges are its Inputs model: every field annotated ``Annotated[Path, From(PartitionManifest)]``
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

from mnnbuild.pipeline.manifest import FileRecord, Manifest, qnn_build_id, tool_versions

M = TypeVar("M", bound=Manifest)
Tool = Literal["MNN", "QNN"]
Placement = Literal["model", "part", "target", "plugin"]
"""Where a stage's runs sit: once per model (``<model>/<dir>``), once per model part (a VL model's encoder gets
``<model>/visual/<dir>``), once per target (``<model>/<arch>/<dir>``) or once per plugin of a target
(``<model>/<arch>/<dir>/<plugin>``)."""
Reads = Literal["manifest", "files", "dir"]

UPDATE_DOC = "Move a Hugging Face model's lock to what its revision resolves to now (then fetch again)."
"""What ``doit list`` and the stage table say of ``update:<model>`` (a stage's `Stage.update`)."""

COORDINATES = ("model", "target", "binary", "graphs")
"""Inputs fields the DAG fills from where a run sits: the spec's name, the target arch, and (per-plugin stages) the
plugin's binary and graph dirs."""


def _entry_hints(entry: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of an entry's ``(inputs, params, out_dir)`` and return, the ones a declaration reads.

    Only those: a further keyword parameter may name a type imported for type checkers only (the partition's
    ``support``, the QNN lowering's op check, whose module loads numpy and flatbuffers when the stage runs, not at
    every doit start)."""
    read = {*list(inspect.signature(entry).parameters)[:3], "return"}
    own = {name: hint for name, hint in getattr(entry, "__annotations__", {}).items() if name in read}
    return typing.get_type_hints(types.SimpleNamespace(__annotations__=own), globalns=getattr(entry, "__globals__", {}))


@dataclass(frozen=True)
class From:
    """An Inputs field's annotation: the field holds the directory of the upstream stage that writes ``upstream``
    (its manifest type: ``From(PartitionManifest)``), a ``Path``, or ``Path | None`` for a part the model may not
    have."""

    upstream: type[Manifest]
    """The upstream stage's manifest type: the stage it names (`Manifest.stage`) and the file its dir holds."""
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

    @property
    def stage(self) -> str:
        """The upstream stage's name (its manifest's `Manifest.stage`)."""
        return self.upstream.stage


@dataclass(frozen=True)
class At:
    """Where one run of a stage sits: the target (per-target and per-plugin stages), the model part (per-part and
    per-plugin stages: ``llm`` or ``visual``) and the plugin (per-plugin stages: its binary and graph dirs)."""

    arch: str | None = None
    part: str | None = None
    binary: str | None = None
    graphs: tuple[str, ...] = ()
    cost: int = field(default=0, compare=False)
    """Of a plugin: the elements of the weights and constants its graphs hold (`Plugin.cost`), what its binary needs
    memory for (`Stage.memory`); not part of where it sits."""


@dataclass(frozen=True)
class Plugin:
    """One plugin a stage dir names (`FanOut`): its binary, its graph dirs, the records of the files its runs read
    of that dir, and what it costs to build (the biggest start first)."""

    binary: str
    graphs: tuple[str, ...]
    reads: tuple[FileRecord, ...] = ()
    cost: int = 0


@dataclass(frozen=True)
class FanOut:
    """Declared by the stage whose output says which plugins a model part has (the partition): the per-plugin
    stages run once per plugin of each of its dirs, created once it ran."""

    binaries: Callable[[Path], Mapping[str, list[str]]]
    """``(stage dir) -> {binary: graph dirs}``; an `MnnbuildError` while the dir names none."""
    plugins: Callable[[Path], list[Plugin]]
    """``(stage dir) -> plugins``, with the records of what their runs read of the dir, each confined to it."""


@dataclass(frozen=True)
class Ending:
    """What the run's ending says of a stage's dirs the run touched."""

    summary: Callable[[Path], str | None] | None = None
    """``(stage dir) -> one line`` (the partition: what runs where), None when there is nothing to say."""
    product: bool = False
    """What a run makes for the user (the bundle): named with its files' size, or where it is when it stayed in the
    cache, and how to push it."""
    page: str | None = None
    """A page in the stage dir the ending links (the page report)."""


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
    """One stage of the chain. Its types are its entry's annotations and its name its manifest's `Manifest.stage`:
    declared once, where they are used (a declaration may still name them, checked against the entry)."""

    entry: Callable[[Any, Any, Path], Manifest]
    """``(inputs, params, out_dir) -> Manifest``; writes ``out_dir`` atomically."""
    params_of: Callable[[Any, At], BaseModel]
    """``(spec, at) -> Params``: what the spec asks of this run."""
    describe: Callable[[Any, At], str]
    """``(spec, at) -> str``: the doc of this run's task (``doit list``)."""
    name: str = ""
    """Default: its manifest's `Manifest.stage`."""
    inputs: type[StageInputs] = StageInputs
    """Default (the base class): the entry's ``inputs`` annotation; so are ``params`` and ``manifest`` (its return)."""
    params: type[BaseModel] = BaseModel
    manifest: type[Manifest] = Manifest
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
    pinned: Callable[[Path, Path], bool] | None = None
    """Of a stage that `reads_source`: ``(lock file, stage dir) -> bool``, whether the dir still holds what the lock
    pins (an HF source's commit): its up-to-date check."""
    update: Callable[[Any, Path, tuple[str, ...]], object] | None = None
    """Of a stage that `reads_source`: ``(source, lock file, files)``, moves the lock to what the source resolves to
    now (``doit update:<model>``)."""
    fan_out: FanOut | None = None
    """The per-plugin fan-out its output declares (the partition's plugins)."""
    ending: Ending = Ending()
    """What the run's ending says of its dirs."""
    guards: Mapping[str, str] = field(default_factory=dict)
    """Inputs directory field -> a subdirectory of it whose files must still be the ones the upstream manifest
    records: checked at every up-to-date check, and a changed file is never answered from the cache (verify: a
    bundle file replaced after bundling must not pass as verified; the cache key sees only manifests)."""
    intact: Callable[[Path, list[FileRecord], Mapping[str, list[int]]], bool] | None = None
    """With `guards`: ``(dir, its manifest's outputs, trusted stamps) -> bool``, whether a guarded dir holds the files
    its manifest lists and nothing else (files with a trusted stamp need no hash)."""
    leaves_on_failure: str | None = None
    """A file a failed run leaves in its directory, without a manifest (verify's report): its origin record then
    says the run failed."""
    after_failure_of: str | None = None
    """Also runs when that stage fails having left its `leaves_on_failure` file (the page report of a failed
    verify: doit runs no task whose dependency failed, but runs the failed task's teardown)."""
    memory: Callable[[At], int] | None = None
    """``(at) -> bytes``: the memory a run holds beyond its process's own (QNN keeps ~16 bytes per weight while it
    serializes a context); a cluster task asks for a worker that has it. None: the process's own only."""
    default: bool = False
    """A bare ``doit`` runs this stage's tasks of the default model (verify and report: a fresh clone builds, proves
    and reports the shipped tiny model)."""
    group_default_only: bool = False
    """``doit <stage>`` runs the default model's tasks only (``doit verify``: the shipped tiny model's)."""
    doc: str = ""
    """What ``doit list`` says of the stage's task group, and the stage table of the README and docs/design.md
    (`mnnbuild.pipeline.chain.Chain.table`). A per-plugin stage's first clause (to its first comma) names what one
    plugin's subtasks make."""
    mirrors: str = ""
    """The upstream MNN tool whose work the stage does (``compilefornpu``), for the stage table."""

    def __post_init__(self) -> None:
        self._types_from_entry()
        if not self.name:
            object.__setattr__(self, "name", self.manifest.stage)
        if not self.dir:
            object.__setattr__(self, "dir", self.name)
        if self.manifest.stage != self.name:
            raise TypeError(f"stage {self.name}: its manifest model is the {self.manifest.stage!r} stage's")
        if not issubclass(self.inputs, StageInputs):
            raise TypeError(f"stage {self.name}: inputs {self.inputs.__name__} must derive from StageInputs")
        if self.guards and self.intact is None:
            raise TypeError(f"stage {self.name}: guards without an intact check")
        self._check_entry()
        self._check_edges()

    def _types_from_entry(self) -> None:
        """What a declaration leaves out, from its entry's annotations ``(inputs, params, out_dir) -> manifest``."""
        where = f"stage {self.name or '?'}: entry {self.entry.__qualname__}"
        try:
            hints = _entry_hints(self.entry)
        except NameError as exc:
            raise TypeError(f"{where}: its annotations do not resolve ({exc})") from None
        names = list(inspect.signature(self.entry).parameters)[:2]
        found = {
            "inputs": hints.get(names[0]) if names else None,
            "params": hints.get(names[1]) if len(names) > 1 else None,
            "manifest": hints.get("return"),
        }
        for attr, base in (("inputs", StageInputs), ("params", BaseModel), ("manifest", Manifest)):
            if getattr(self, attr) is not base:
                continue  # declared: checked against the entry by `_check_entry`
            hint = found[attr]
            if not (isinstance(hint, type) and issubclass(hint, base) and hint is not base):
                raise TypeError(f"{where}: its {attr} annotation {hint!r} is no {base.__name__} model")
            object.__setattr__(self, attr, hint)

    def _check_entry(self) -> None:
        """The entry function's signature is ``(inputs: <inputs>, params: <params>, out_dir: Path) -> <manifest>``;
        ``params_of`` returns the declared Params (when annotated)."""
        where = f"stage {self.name}: entry {self.entry.__qualname__}"
        try:
            hints = _entry_hints(self.entry)
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

    def key_tools(self) -> dict[str, str]:
        """The versions of what it calls that enter its task key: mnnbuild's, MNN's and the QNN build's when it calls
        them, and its own `versions`."""
        tools = tool_versions(mnn="MNN" in self.tools, qnn=qnn_build_id() if "QNN" in self.tools else None)
        if self.versions is not None:
            tools.update(self.versions())
        return tools

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
