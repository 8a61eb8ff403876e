"""Errors raised by mnnbuild. Every message names the file, the field and what was expected."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


class MnnbuildError(Exception):
    """Base class for every error mnnbuild raises on bad input or a failed stage: its message is one line naming the
    file and field and what was expected; each class below says what to do about it."""


class SpecError(MnnbuildError):
    """A model spec (TOML) is invalid. Fix the field the message names (``models/*.toml``; see docs/specs.md)."""


class ModelDirError(MnnbuildError):
    """A model directory is missing files or has invalid contents. Export the model again (llmexport) or point the
    spec's source at a complete export."""


class MNNFormatError(MnnbuildError):
    """A `.mnn` file or its weight file cannot be read or written. Export it again; a truncated weight file is the usual
    cause."""


class QnnError(MnnbuildError):
    """A QNN library is missing or a QNN API call failed. Install onnxruntime-qnn (or set QNN_SDK_ROOT to a QAIRT SDK);
    a failed call names the graph or op to look at."""


class StageError(MnnbuildError):
    """A stage could not produce its outputs (raised by a stage's own module, at the stage boundary; what the
    library code under it detects has its own type below). Fix what the message names and run the stage again."""


class UpstreamError(MnnbuildError):
    """What an upstream stage left is not what it should be (a manifest, a file it lists, a graph description):
    run that stage again (``doit clean <stage>:<model>`` first if it is up to date)."""


class ManifestMissing(UpstreamError):
    """A stage's manifest is not there: the stage has not run, or failed (a failed verify leaves its report only). Run
    the stage (its doit task) first."""


class ForeignModelError(MnnbuildError):
    """A file made for another model than the one it is used with (a graph dir copied from another model's
    partition, a twin built from other weights). Build it again from this model (``doit clean`` its task)."""


class ToleranceError(MnnbuildError):
    """A built artifact is off its reference beyond the tolerance (verify's verdict: numbers, tokens, structure). Read
    ``verify.txt`` (the message names it): it says which graph, op or token differs (docs/verify.md)."""


class UnsafePathError(MnnbuildError):
    """A path read from a cache entry, manifest or model directory would leave the directory it belongs to. Nothing is
    written: remove the file the message names (a cache entry is discarded by itself)."""


class OutputError(MnnbuildError):
    """An output cannot be written where it belongs (read-only or full file system, no permission). Free space, or set
    MNNBUILD_ARTIFACTS to a writable directory."""


class SettingsError(MnnbuildError):
    """An ``MNNBUILD_*`` environment variable has a value mnnbuild cannot use (empty, a URL, a file, the project
    itself, a log level that is none). Set it as the message says, or unset it for the default."""


class CacheError(MnnbuildError):
    """The cache a command names is unusable or not an mnnbuild cache (commands only: a build warns instead). Name an
    absolute directory or fsspec URL (``MNNBUILD_CACHE``, ``--url``), install the fsspec backend its scheme needs, or
    set ``MNNBUILD_CACHE=off``; a directory that holds other files is never used nor pruned."""


class Unavailable(MnnbuildError):
    """The files of a stage dir restored without them cannot be had from the cache (`materialize`): ``problem`` says
    why; ``said``: a warning said so already in this run (a blob found bad, a remote tier gone). A build makes the dir
    again by itself; elsewhere, run the build again."""

    def __init__(self, out_dir: Path, problem: str, said: bool) -> None:
        super().__init__(f"{out_dir}: restored without its files, which could not be fetched ({problem})")
        self.problem = problem
        self.said = said


class ClusterError(MnnbuildError):
    """The Dask cluster ``MNNBUILD_SCHEDULER`` names cannot run a task: the scheduler does not answer, a worker's code,
    MNN or QNN differs from this machine's (it refuses the task), a worker cannot reach the shared cache, or no worker
    has the memory a task declares. Make the workers' environment match (same mnnbuild checkout, same MNN and
    onnxruntime-qnn), give them the shared cache (``MNNBUILD_CACHE_REMOTE``), or unset ``MNNBUILD_SCHEDULER`` to build
    on this machine."""


class ChildDiedError(MnnbuildError):
    """A child process ended (was killed, crashed) before it sent what was waited for. Read the output the message
    quotes; killed for memory, run fewer tasks at once (``doit -n 1``)."""


class LoweringError(MnnbuildError):
    """An MNN op cannot be lowered to QNN, or a graph description is inconsistent. An op the support check should have
    kept on the CPU is a bug to report with the op the message names; an inconsistent description, run the partition
    again."""


class PatchError(MnnbuildError):
    """A conformance patch is malformed or does not apply to the given MNN source. Fix the patch the message names, or
    use the MNN source revision it was written for."""


class BoundaryError(MnnbuildError):
    """compilefornpu (or generateIO) could not cut the model. Read its output in the message; the MNN build conform uses
    must be the one the model was exported for."""


class ConformError(MnnbuildError):
    """The conformance run could not run (missing bundle, a driver crash). Build the bundle first (``doit
    bundle:<model>-<arch>``), or read the driver's output the message quotes."""


class ConformDirError(MnnbuildError):
    """A directory conform would write into is not one conform made. Name a new directory, or one conform made."""


class ConformBuildError(MnnbuildError):
    """MNN's runtime could not be built for the conformance run. Install what the message names (cmake, a C++
    compiler) or point conform at an MNN source tree that builds."""


class RuntimeBundleError(MnnbuildError):
    """Base class: a bundle cannot be loaded or run (`mnnbuild_runtime`). Build the bundle again (``doit
    bundle:<model>-<arch>``); a copy edited by hand is refused."""


class BundleError(RuntimeBundleError):
    """A bundle file is missing or its contents (config, ``qnn/llm.mnn``, plugin attributes) are invalid. Build the
    bundle again; the message names the file and attribute."""


class PluginShapeError(RuntimeBundleError):
    """A plugin's live input shapes match none of the shapes in its ``allInputShape``. Ask for a prompt or prefill
    length the bundle was built for (spec field ``prefill_lengths``), or build it for that length."""


class BinaryCheckError(RuntimeBundleError):
    """A plugin's context binary does not match its plugin attributes, cannot be read, or cannot be run. Build the
    context binaries again (``doit context:<model>-<arch>``) with the QNN the runtime loads."""


def error_line(exc: BaseException) -> str:
    """The one line a failure is reported with: the error's type and its message (`MnnbuildError` messages name the
    file and field; a pydantic ValidationError, its multi-line dump, becomes each field's problem)."""
    if callable(getattr(exc, "errors", None)) and isinstance(getattr(exc, "title", None), str):
        return f"{type(exc).__name__}: invalid {exc.title}: {field_problems(exc)}"  # type: ignore[attr-defined]
    return f"{type(exc).__name__}: {exc}"


def field_problem(err: Mapping[str, Any]) -> str:
    """One pydantic validation error (an item of ``ValidationError.errors()``) as one line: ``field '<loc>': <what
    was expected> (got <value>)``."""
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    shown = repr(err.get("input"))
    if len(shown) > 60:  # a list of a thousand lengths stays one readable line
        shown = shown[:57] + "..."
    got = f" (got {shown})" if err["type"] not in ("missing",) and "input" in err and err["loc"] else ""
    return f"field {loc!r}: {msg}{got}"


def field_problems(exc: Any) -> str:
    """A pydantic ``ValidationError`` (or any other error) as one line: each field's problem (`field_problem`)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return " ".join(str(exc).split()) or type(exc).__name__
    return "; ".join(field_problem(e) for e in errors(include_url=False))
