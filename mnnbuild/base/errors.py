"""Errors raised by mnnbuild. Every message names the file, the field and what was expected."""

from __future__ import annotations


class MnnbuildError(Exception):
    """Base class for every error mnnbuild raises on bad input or a failed stage."""


class SpecError(MnnbuildError):
    """A model spec (TOML) is invalid."""


class ModelDirError(MnnbuildError):
    """A model directory is missing files or has invalid contents."""


class MNNFormatError(MnnbuildError):
    """A `.mnn` file or its weight file cannot be read or written."""


class QnnError(MnnbuildError):
    """A QNN library is missing or a QNN API call failed."""


class StageError(MnnbuildError):
    """A stage could not produce its outputs (raised by a stage's own module, at the stage boundary; what the
    library code under it detects has its own type below)."""


class UpstreamError(MnnbuildError):
    """What an upstream stage left is not what it should be (a manifest, a file it lists, a graph description):
    run that stage again."""


class ManifestMissing(UpstreamError):
    """A stage's manifest is not there: the stage has not run, or failed (a failed verify leaves its report only)."""


class ForeignModelError(MnnbuildError):
    """A file made for another model than the one it is used with (a graph dir copied from another model's
    partition, a twin built from other weights)."""


class ToleranceError(MnnbuildError):
    """A built artifact is off its reference beyond the tolerance (verify's verdict: numbers, tokens, structure)."""


class UnsafePathError(MnnbuildError):
    """A path read from a cache entry, manifest or model directory would leave the directory it belongs to."""


class OutputError(MnnbuildError):
    """An output cannot be written where it belongs (read-only or full file system, no permission)."""


class SettingsError(MnnbuildError):
    """An ``MNNBUILD_*`` environment variable has a value mnnbuild cannot use (empty, a URL, a file, the project
    itself, a log level that is none)."""
